"""A job's scheduling conditions over real cycles (the core, then apply, no network): a condition
that stops holding turns False rather than lingering, Scheduled and Unschedulable never hold at
once, and a job that can never run as things stand is Unsatisfiable until they change."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_test_helpers import gang, node, rl, send_statuses

from muster.conditions import job_reason
from muster.v1 import muster_pb2 as pb
from server.config import DEFAULT_CONFIG_YAML, load_config
from server.model import CycleResult
from server.scheduler import SchedulerCore
from server.service import commands, ingest, snapshot
from server.service.api import queries
from server.service.apply import apply
from server.service.decisions import DecisionLog
from server.service.state import ClusterState

KAI_CONFIG = (Path(__file__).resolve().parents[2] / "examples" / "config-kai.yaml").read_text()
PROFILES = {"volcano": DEFAULT_CONFIG_YAML, "kai": KAI_CONFIG}


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def new_state(*nodes: pb.Node) -> ClusterState:
    c = ClusterState(DecisionLog(bind_timeout=30), clock=Clock())
    ingest.register_backend(c, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(c, pb.SyncSnapshotRequest(backend="a", nodes=list(nodes)))
    return c


def run_cycle(state: ClusterState, profile: str) -> CycleResult:
    capture = snapshot.capture(state)
    result = SchedulerCore(load_config(PROFILES[profile])).run_cycle(
        capture.materialize(), capture.cycle_id
    )
    apply(state, capture, result)
    return result


def report(state: ClusterState, *tasks: str, status: int) -> None:
    """The backend reports ``tasks`` at ``status`` (their binds acknowledged first)."""
    acks = [
        pb.DecisionAck(decision_id=p.row.id, applied=True)
        for p in list(state.decisions.pending.values())
        if p.row.task_id in tasks and p.row.kind == "bind"
    ]
    if acks:
        ingest.ack(state, pb.AckDecisionsRequest(backend="a", acks=acks), {})
    send_statuses(state, "a", [pb.TaskStatusUpdate(task_id=t, status=status) for t in tasks])


def conditions(state: ClusterState, job_id: str) -> dict[str, pb.Condition]:
    view = queries.get_job(state, job_id)
    conds = {c.type: c for c in view.status.conditions}
    assert len(conds) == len(view.status.conditions)  # one per type
    return conds


def holding(state: ClusterState, job_id: str) -> set[str]:
    return {t for t, c in conditions(state, job_id).items() if c.status == "True"}


@pytest.mark.parametrize("profile", list(PROFILES))
def test_a_job_that_waited_is_no_longer_unschedulable_once_it_runs(profile: str) -> None:
    state = new_state(node("n0", cpu="4"))
    commands.submit_job(state, gang("hog", replicas=1, cpu="4"))
    run_cycle(state, profile)
    report(state, "hog/worker-0", status=pb.TASK_STATUS_RUNNING)
    commands.submit_job(state, gang("waiter", replicas=2, cpu="2"))
    run_cycle(state, profile)
    assert "Unschedulable" in holding(state, "waiter")
    assert "Scheduled" not in holding(state, "waiter")
    waited = conditions(state, "waiter")["Unschedulable"]

    report(state, "hog/worker-0", status=pb.TASK_STATUS_SUCCEEDED)  # its room frees
    result = run_cycle(state, profile)
    assert sorted(result.binds) == ["waiter/worker-0", "waiter/worker-1"]
    conds = conditions(state, "waiter")
    assert conds["Scheduled"].status == "True"
    unschedulable = conds["Unschedulable"]
    assert (unschedulable.status, unschedulable.reason) == ("False", "Placed")
    assert unschedulable.last_transition_time.ToSeconds() >= waited.last_transition_time.ToSeconds()
    assert job_reason(queries.get_job(state, "waiter").status.conditions) == ("", "")
    assert queries.explain(state, "waiter").gate == "none"

    # Running: later cycles keep it so, nothing contradicts it.
    report(state, "waiter/worker-0", "waiter/worker-1", status=pb.TASK_STATUS_RUNNING)
    scheduled_at = conds["Scheduled"].last_transition_time
    run_cycle(state, profile)
    conds = conditions(state, "waiter")
    assert holding(state, "waiter") == {"Scheduled"}
    assert conds["Scheduled"].last_transition_time == scheduled_at


@pytest.mark.parametrize("profile", list(PROFILES))
def test_a_running_job_whose_extra_tasks_wait_is_scheduled_not_unschedulable(profile: str) -> None:
    state = new_state(node("n0", cpu="4"))
    commands.submit_job(state, gang("elastic", replicas=3, cpu="3", min_member=1))
    for _ in range(2):
        assert holding(state, "elastic") <= {"Scheduled"}
        run_cycle(state, profile)
        report(state, "elastic/worker-0", status=pb.TASK_STATUS_RUNNING)
    assert holding(state, "elastic") == {"Scheduled"}
    assert queries.get_job(state, "elastic").status.phase == pb.JOB_PHASE_RUNNING
    waits = conditions(state, "elastic").get("Unschedulable")
    if profile == "kai":  # KAI says why its other tasks wait: kept, on a False condition
        assert waits is not None
        assert (waits.status, waits.reason) == ("False", "Placed")
        assert waits.message.startswith("the gang is placed; tasks beyond its minimum wait: ")


def test_a_gang_that_comes_apart_is_no_longer_scheduled() -> None:
    state = new_state(node("n0", cpu="4"), node("n1", cpu="4"))
    commands.submit_job(state, gang("pair", replicas=2, cpu="4"))
    run_cycle(state, "volcano")
    report(state, "pair/worker-0", "pair/worker-1", status=pb.TASK_STATUS_RUNNING)
    run_cycle(state, "volcano")
    assert holding(state, "pair") == {"Scheduled"}
    # n1 goes: its task is lost, the gang is broken, and it cannot be placed whole again.
    ingest.send_deltas(
        state, pb.SendDeltasRequest(backend="a", deltas=[pb.Delta(node_removed="n1")])
    )
    for p in list(state.decisions.pending.values()):  # the gang's other task is evicted
        if p.row.kind == "evict":
            ingest.ack(
                state,
                pb.AckDecisionsRequest(
                    backend="a", acks=[pb.DecisionAck(decision_id=p.row.id, applied=True)]
                ),
                {},
            )
    run_cycle(state, "volcano")
    conds = conditions(state, "pair")
    assert holding(state, "pair") == {"Unschedulable"}
    assert (conds["Scheduled"].status, conds["Scheduled"].reason) == ("False", "Unschedulable")


@pytest.mark.parametrize(
    ("profile", "limit"), [("volcano", "capability cpu 4"), ("kai", "limit cpu 4")]
)
def test_more_than_the_queue_capability_is_unsatisfiable_until_the_queue_grows(
    profile: str, limit: str
) -> None:
    state = new_state(node("n0", cpu="8"), node("n1", cpu="8"))
    commands.create_queue(state, pb.Queue(name="ml", capability=rl(cpu="4")))
    commands.submit_job(state, gang("train", replicas=2, cpu="3", queue="ml"))
    result = run_cycle(state, profile)
    assert not result.binds
    conds = conditions(state, "train")
    never = conds["Unsatisfiable"]
    assert (never.status, never.reason) == ("True", "ExceedsQueueCapability")
    assert never.message == (
        f"job train requests cpu 6 for the 2 tasks it needs at once > queue ml {limit}"
    )
    assert conds["Unschedulable"].status == "True"  # it still waits, pending
    assert job_reason(queries.get_job(state, "train").status.conditions)[0] == (
        "ExceedsQueueCapability"
    )
    exp = queries.explain(state, "train")
    assert exp.gate == "unsatisfiable"
    assert exp.summary == never.message
    assert queries.get_job(state, "train").status.phase in (
        pb.JOB_PHASE_PENDING,
        pb.JOB_PHASE_INQUEUE,
    )

    run_cycle(state, profile)  # checked again every cycle: the same, nothing changes
    assert conditions(state, "train")["Unsatisfiable"] == never

    commands.update_queue(state, pb.Queue(name="ml", capability=rl(cpu="8")))
    result = run_cycle(state, profile)
    assert sorted(result.binds) == ["train/worker-0", "train/worker-1"]
    conds = conditions(state, "train")
    assert (conds["Unsatisfiable"].status, conds["Unsatisfiable"].reason) == ("False", "Fits")
    assert holding(state, "train") == {"Scheduled"}


@pytest.mark.parametrize("profile", list(PROFILES))
def test_a_label_no_node_has_is_unsatisfiable_until_a_node_has_it(profile: str) -> None:
    state = new_state(node("n0", cpu="4"))
    job = gang("a100", replicas=1, cpu="1")
    job.task_groups[0].node_selector["gpu"] = "a100"
    commands.submit_job(state, job)
    run_cycle(state, profile)
    never = conditions(state, "a100")["Unsatisfiable"]
    assert (never.status, never.reason) == ("True", "NoMatchingNode")
    assert never.message.startswith(
        "task a100-worker-0 can never run on this cluster: no node has label gpu=a100"
    )

    labelled = node("n1", cpu="4")
    labelled.labels["gpu"] = "a100"
    ingest.send_deltas(
        state, pb.SendDeltasRequest(backend="a", deltas=[pb.Delta(node_upserted=labelled)])
    )
    result = run_cycle(state, profile)
    assert result.binds == {"a100/worker-0": "n1"}
    assert conditions(state, "a100")["Unsatisfiable"].status == "False"
    assert holding(state, "a100") == {"Scheduled"}
