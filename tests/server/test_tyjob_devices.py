"""Server state for TYJobs (validation, Leader restarts, cleanPodPolicy, stage), device ids from
cycle to bind decision to store, and job owners (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_test_helpers import node, rl, send_statuses

from muster.v1 import muster_pb2 as pb
from server.config import DEFAULT_CONFIG_YAML, load_config
from server.model import CycleResult, JobOutcome, PodGroupPhase, TaskStatus
from server.scheduler import SchedulerCore
from server.service import commands, ingest, snapshot
from server.service.api import queries
from server.service.apply import apply
from server.service.decisions import DecisionLog
from server.service.errors import DomainError
from server.service.state import ClusterState
from server.service.store import SqliteStore

ASCEND = "huawei.com/Ascend910"


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def npu_node(name: str, bad: tuple[int, ...] = ()) -> pb.Node:
    n = node(name, cpu="64", memory="256Gi")
    n.allocatable.quantities[ASCEND] = "8"
    for i in range(8):
        n.devices.add(id=f"Ascend910-{i}", type=ASCEND, group=str(i // 4), healthy=i not in bad)
    return n


@pytest.fixture
def state() -> ClusterState:
    c = ClusterState(DecisionLog(bind_timeout=30), clock=Clock())
    ingest.register_backend(c, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(
        c, pb.SyncSnapshotRequest(backend="a", nodes=[npu_node("n0", bad=(0,)), node("c0")])
    )
    return c


def tyjob(job_id: str, workers: int = 2, **ty: object) -> pb.JobSpec:
    return pb.JobSpec(
        id=job_id,
        task_groups=[
            pb.TaskGroup(role="leader", replicas=1, request=rl(cpu="1")),
            pb.TaskGroup(role="actor", replicas=workers, request=rl(cpu="1")),
        ],
        tyjob=pb.TYJob(**ty),  # type: ignore[arg-type]
    )


def run_cycle(state: ClusterState, config: str | None = None) -> CycleResult:
    capture = snapshot.capture(state)
    core = SchedulerCore(load_config(config or DEFAULT_CONFIG_YAML))
    result = core.run_cycle(capture.materialize(), capture.cycle_id)
    apply(state, capture, result)
    return result


def report(state: ClusterState, task_id: str, status: int, exit_code: int = 0) -> None:
    send_statuses(
        state, "a", [pb.TaskStatusUpdate(task_id=task_id, status=status, exit_code=exit_code)]
    )


# -- TYJob validation ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (tyjob("j", leader_role="learner"), "job.tyjob.leader_role: a TYJob has one Leader"),
        (
            tyjob("j", min_workers_num=3),
            "job.tyjob.min_workers_num: 3 must be between 0 and the job's 2 workers",
        ),
        (tyjob("j", restart_limit=-1), "job.tyjob.restart_limit"),
        (tyjob("j", clean_pod_policy="Some"), "job.tyjob.clean_pod_policy: 'Some' is not one of"),
        (
            tyjob("j", scheduler_policy=pb.TYSchedulerPolicy(basic_policy="Binpack")),
            "job.tyjob.scheduler_policy.basic_policy: 'Binpack'",
        ),
        (
            tyjob("j", scheduler_policy=pb.TYSchedulerPolicy(job_queue_policy="FIFO")),
            "job.tyjob.scheduler_policy.job_queue_policy: 'FIFO'",
        ),
    ],
)
def test_invalid_tyjobs_are_refused_naming_the_field(
    state: ClusterState, spec: pb.JobSpec, needle: str
) -> None:
    with pytest.raises(DomainError) as err:
        commands.submit_job(state, spec)
    assert needle in err.value.message
    assert "j" not in state.jobs
    spec = tyjob("k")
    spec.priority = 11
    with pytest.raises(DomainError, match="1 to 10"):
        commands.submit_job(state, spec)


def test_tyjob_defaults_make_the_gang_the_leader_and_min_workers(state: ClusterState) -> None:
    job, _ = commands.submit_job(state, tyjob("j", workers=3))
    assert job.spec.priority == 5
    assert job.spec.min_member == 2
    assert dict(job.spec.min_task_member) == {"leader": 1}
    assert job.spec.tyjob.restart_limit == 3
    assert job.spec.tyjob.clean_pod_policy == "All"
    assert job.spec.tyjob.scheduler_policy.basic_policy == "Gang"
    assert job.status.stage == "Pending"
    assert job.status.schedule_state == "Unscheduled"


# -- Leader restarts, cleanPodPolicy, stage ----------------------------------------------------------
def bind_and_run(state: ClusterState, job_id: str) -> None:
    run_cycle(state)
    for t in state.jobs[job_id].tasks:
        if t.status == TaskStatus.BINDING:
            report(state, t.uid, pb.TASK_STATUS_RUNNING)


def test_a_failed_leader_restarts_up_to_its_limit_then_the_job_fails(state: ClusterState) -> None:
    commands.submit_job(state, tyjob("j", restart_limit=2))
    bind_and_run(state, "j")
    view = queries.get_job(state, "j")
    assert view.status.stage == "Running"
    assert view.status.schedule_state == "ScheduledSucceed"
    for restart in (1, 2):
        report(state, "j/leader-0", pb.TASK_STATUS_FAILED, exit_code=3)
        leader = state.jobs["j"].tasks[0]
        assert leader.status == TaskStatus.PENDING
        assert f"restart {restart} of 2" in leader.message
        view = queries.get_job(state, "j")
        assert view.status.stage == "Rescheduling"
        assert view.status.leader_restarts == restart
        assert view.status.phase != pb.JOB_PHASE_FAILED
        bind_and_run(state, "j")  # placed and running again
        assert state.jobs["j"].tasks[0].status == TaskStatus.RUNNING
    report(
        state, "j/leader-0", pb.TASK_STATUS_FAILED, exit_code=3
    )  # the third failure: over the limit
    view = queries.get_job(state, "j")
    assert view.status.phase == pb.JOB_PHASE_FAILED
    assert view.status.stage == "Failed"
    # cleanPodPolicy All: the workers are stopped.
    assert [t.status for t in state.jobs["j"].tasks[1:]] == [TaskStatus.RELEASING] * 2


@pytest.mark.parametrize(
    ("policy", "workers_after"), [("All", TaskStatus.RELEASING), ("None", TaskStatus.RUNNING)]
)
def test_the_leaders_success_ends_the_job_and_clean_pod_policy_decides_the_workers(
    state: ClusterState, policy: str, workers_after: TaskStatus
) -> None:
    commands.submit_job(state, tyjob("j", clean_pod_policy=policy))
    bind_and_run(state, "j")
    report(state, "j/leader-0", pb.TASK_STATUS_SUCCEEDED)
    view = queries.get_job(state, "j")
    assert view.status.phase == pb.JOB_PHASE_COMPLETED
    assert view.status.stage == "Succeeded"
    assert [t.status for t in state.jobs["j"].tasks[1:]] == [workers_after] * 2
    if policy == "None":  # kept pods still hold their node for the next cycles
        foreign = {t.uid for t in snapshot.capture(state).materialize().foreign_tasks}
        assert foreign == {"j/actor-0", "j/actor-1"}


# -- device ids ------------------------------------------------------------------------------------
NPU_CONFIG = """
actions: "enqueue, allocate"
tiers:
- plugins: [{name: priority}, {name: gang}]
- plugins: [{name: predicates}, {name: nodeorder}, {name: huaweiNPU}]
"""


def npu_job(job_id: str, chips: int) -> pb.JobSpec:
    request = rl(cpu="1")
    request.quantities[ASCEND] = str(chips)
    return pb.JobSpec(id=job_id, task_groups=[pb.TaskGroup(role="w", replicas=1, request=request)])


def test_device_ids_go_from_the_cycle_to_the_bind_decision_and_survive_a_restart(
    state: ClusterState, tmp_path: Path
) -> None:
    commands.submit_job(state, npu_job("one", 1))
    commands.submit_job(state, npu_job("four", 4))
    result = run_cycle(state, NPU_CONFIG)
    # Chip 0 is broken: ring 0 has 3 healthy chips; 1 chip goes there (table B: 3~4), 4 take ring 1.
    assert result.bind_devices == {
        "one/w-0": ["Ascend910-1"],
        "four/w-0": [f"Ascend910-{i}" for i in range(4, 8)],
    }
    binds = {p.row.task_id: p for p in state.decisions.pending.values() if p.row.kind == "bind"}
    assert set(binds) == {"one/w-0", "four/w-0"}
    assert queries.get_job(state, "four").tasks[0].devices == [
        f"Ascend910-{i}" for i in range(4, 8)
    ]
    n0 = next(n for n in queries.list_nodes(state, "").nodes if n.node.name == "n0")
    assert dict(n0.device_holders) == {
        "Ascend910-1": "one/w-0",
        **{f"Ascend910-{i}": "four/w-0" for i in range(4, 8)},
    }
    assert [d.healthy for d in n0.node.devices] == [False] + [True] * 7
    # The next cycle sees them held: a 2-chip job gets ring 0's last two, never a held chip.
    commands.submit_job(state, npu_job("two", 2))
    assert run_cycle(state, NPU_CONFIG).bind_devices == {"two/w-0": ["Ascend910-2", "Ascend910-3"]}
    # The store keeps them, and a restarted server schedules around them.
    store = SqliteStore(str(tmp_path / "s.db"))
    try:
        store.write(state.commit())
        stored = store.job("four")
        assert stored is not None
        assert stored.tasks[0].devices == [f"Ascend910-{i}" for i in range(4, 8)]
        again = ClusterState(DecisionLog(bind_timeout=30), clock=Clock())
        again.restore(store.load())
        held = {
            t.uid: t.devices for j in snapshot.capture(again).materialize().jobs for t in j.tasks
        }
        assert held["four/w-0"] == [f"Ascend910-{i}" for i in range(4, 8)]
        # The agent comes back with its running tasks (reporting no ids: the server keeps its own).
        ingest.register_backend(again, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
        tasks = [
            pb.BackendTask(
                task_id="four/w-0", node="n0", status=pb.TASK_STATUS_RUNNING, request=rl(cpu="1")
            )
        ]
        tasks += [
            pb.BackendTask(task_id=t, node="n0", status=pb.TASK_STATUS_SUCCEEDED)
            for t in ("one/w-0", "two/w-0")
        ]
        ingest.sync_snapshot(
            again,
            pb.SyncSnapshotRequest(backend="a", nodes=[npu_node("n0", bad=(0,))], tasks=tasks),
        )
        commands.submit_job(again, npu_job("after", 2))
        # Ring 1 is still four's (kept across the restart), so 2 chips come from ring 0; had the ids
        # been lost, four would have been given the lowest free chips (1-4) and this job ring 1's.
        assert run_cycle(again, NPU_CONFIG).bind_devices == {
            "after/w-0": ["Ascend910-1", "Ascend910-2"]
        }
    finally:
        store.close()


def test_apply_drops_a_bind_whose_device_was_taken_meanwhile(state: ClusterState) -> None:
    commands.submit_job(state, npu_job("late", 1))
    capture = snapshot.capture(state)
    result = CycleResult(
        capture.cycle_id, binds={"late/w-0": "n0"}, bind_devices={"late/w-0": ["Ascend910-5"]}
    )
    result.jobs["late"] = JobOutcome(PodGroupPhase.RUNNING)
    # Between capture and apply the backend reports a task of its own on that chip.
    ingest.send_deltas(
        state,
        pb.SendDeltasRequest(
            backend="a",
            deltas=[
                pb.Delta(
                    foreign_task_upserted=pb.BackendTask(
                        task_id="other",
                        node="n0",
                        request=rl(cpu="1"),
                        status=pb.TASK_STATUS_RUNNING,
                        devices=["Ascend910-5"],
                    )
                )
            ],
        ),
    )
    stats = apply(state, capture, result)
    assert stats.dropped_binds == 1
    assert state.jobs["late"].tasks[0].status == TaskStatus.PENDING


# -- owners ----------------------------------------------------------------------------------------
def test_owner_filter_reads_the_store_for_jobs_that_left_memory(
    state: ClusterState, tmp_path: Path
) -> None:
    store = SqliteStore(str(tmp_path / "s.db"))
    try:
        for job_id, owner in (("a1", "alice"), ("b1", "bob"), ("a2", "alice")):
            commands.submit_job(
                state,
                pb.JobSpec(
                    id=job_id, task_groups=[pb.TaskGroup(role="w", replicas=1, request=rl(cpu="1"))]
                ),
                owner=owner,
            )
        store.write(state.commit())
        state.jobs.archive = store
        del state.jobs["a1"]  # as retention does for a finished job
        page = queries.list_jobs(state, pb.ListJobsRequest(owner="alice"))
        assert [j.spec.id for j in page.jobs] == ["a1", "a2"]
        assert [j.spec.owner for j in page.jobs] == ["alice", "alice"]
    finally:
        store.close()
