"""Backend liveness on the state, with a fake clock (no network): a silent backend's nodes go
NotReady and its tasks Unknown after the grace period, its tasks are lost after the eviction
timeout (the gang is placed again whole, elsewhere), and a backend that answers again is adopted
or has its stale copies stopped. docs/operations.md, "Dead backends"."""

from __future__ import annotations

import pytest
from server_test_helpers import gang, node, send_statuses

from muster.v1 import muster_pb2 as pb
from server.config import DEFAULT_CONFIG_YAML, load_config
from server.model import CycleResult, TaskStatus
from server.scheduler import SchedulerCore
from server.service import commands, ingest, snapshot
from server.service.api import queries
from server.service.apply import apply
from server.service.decisions import DecisionLog
from server.service.liveness import Liveness, start_liveness
from server.service.observability.metrics import StateCollector
from server.service.state import ClusterState
from server.service.views import job_proto

GRACE, EVICTION = 40.0, 300.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def state(clock: Clock) -> ClusterState:
    """Backend ``a`` with nodes a0, a1 and backend ``b`` with b0, b1 (4 cpu each)."""
    s = ClusterState(
        DecisionLog(bind_timeout=30), clock=clock, liveness=Liveness(GRACE, EVICTION, clock=clock)
    )
    for backend in ("a", "b"):
        ingest.register_backend(s, pb.RegisterBackendRequest(name=backend, kind="fake-agent"))
        ingest.sync_snapshot(
            s,
            pb.SyncSnapshotRequest(
                backend=backend, nodes=[node(f"{backend}0"), node(f"{backend}1")]
            ),
        )
    return s


def cycle(state: ClusterState) -> CycleResult:
    capture = snapshot.capture(state)
    result = SchedulerCore(load_config(DEFAULT_CONFIG_YAML)).run_cycle(
        capture.materialize(), capture.cycle_id
    )
    apply(state, capture, result)
    return result


def pending_decisions(state: ClusterState, backend: str, kind: str) -> list[pb.Decision]:
    return [
        p.decision
        for p in state.decisions.pending.values()
        if p.row.backend == backend and p.row.kind == kind
    ]


def run_on(state: ClusterState, backend: str) -> None:
    """``backend`` applies every bind pending for it and reports the tasks Running."""
    binds = pending_decisions(state, backend, "bind")
    ingest.ack(
        state,
        pb.AckDecisionsRequest(
            backend=backend, acks=[pb.DecisionAck(decision_id=d.id, applied=True) for d in binds]
        ),
        {},
    )
    send_statuses(
        state,
        backend,
        [
            pb.TaskStatusUpdate(
                task_id=d.bind.task_id, status=pb.TASK_STATUS_RUNNING, node=d.bind.node
            )
            for d in binds
        ],
    )


def beat(state: ClusterState, backend: str) -> pb.HeartbeatResponse:
    return ingest.heartbeat(state, pb.HeartbeatRequest(backend=backend))


def advance(state: ClusterState, clock: Clock, seconds: float, *alive: str) -> None:
    """Time passes; the ``alive`` backends heartbeat every 10 s; liveness is checked each second."""
    end = clock.now + seconds
    while clock.now < end:
        clock.now = min(end, clock.now + 1.0)
        if clock.now % 10 == 0:
            for backend in alive:
                beat(state, backend)
        ingest.expire(state)
        ingest.check_liveness(state)


def tasks(state: ClusterState, job_id: str) -> list[tuple[TaskStatus, str | None]]:
    return [(t.status, t.node) for t in state.jobs[job_id].tasks]


def views(state: ClusterState) -> dict[str, pb.NodeView]:
    return {v.node.name: v for v in queries.list_nodes(state, "").nodes}


def start_on_a(state: ClusterState, job_id: str = "g", replicas: int = 2) -> None:
    """A gang of one-node tasks placed on ``a`` (``b`` cordoned meanwhile) and running there."""
    for name in ("b0", "b1"):
        ingest.send_deltas(
            state,
            pb.SendDeltasRequest(
                backend="b",
                deltas=[pb.Delta(node_upserted=node(name, unschedulable=True))],
            ),
        )
    commands.submit_job(state, gang(job_id, replicas=replicas, cpu="4"))
    cycle(state)
    run_on(state, "a")
    for name in ("b0", "b1"):
        ingest.send_deltas(
            state, pb.SendDeltasRequest(backend="b", deltas=[pb.Delta(node_upserted=node(name))])
        )
    assert {n for _s, n in tasks(state, job_id)} == {"a0", "a1"}
    assert {s for s, _n in tasks(state, job_id)} == {TaskStatus.RUNNING}


def test_register_tells_the_heartbeat_interval(state: ClusterState) -> None:
    reply = ingest.register_backend(state, pb.RegisterBackendRequest(name="c", kind="fake-agent"))
    assert reply.heartbeat_seconds == GRACE / 4 == 10.0
    assert beat(state, "c") == pb.HeartbeatResponse(heartbeat_seconds=10.0)


def test_silence_past_the_grace_makes_nodes_not_ready_and_tasks_unknown(
    state: ClusterState, clock: Clock
) -> None:
    start_on_a(state)
    advance(state, clock, 2 * GRACE, "a", "b")  # heartbeats: nothing changes
    beat(state, "a")
    advance(state, clock, GRACE - 1, "b")  # a silent for less than the grace
    assert not any(v.node.not_ready for v in views(state).values())
    advance(state, clock, 4, "b")
    shown = views(state)
    assert [n for n, v in shown.items() if v.node.not_ready] == ["a0", "a1"]
    assert shown["a0"].not_ready_reason.startswith("backend a silent for 4")
    assert shown["a0"].not_ready_reason.endswith("s (grace 40 s)")
    assert shown["b0"].not_ready_reason == ""
    assert {s for s, _n in tasks(state, "g")} == {TaskStatus.UNKNOWN}
    assert {n for _s, n in tasks(state, "g")} == {"a0", "a1"}  # still holding their nodes
    assert state.jobs["g"].tasks[0].message.startswith("backend a silent for")
    status = job_proto(state.jobs["g"]).status
    # Never reported running on a node no one runs; the gang holds until the tasks are lost.
    assert (status.running, status.unknown, status.phase) == (0, 2, pb.JOB_PHASE_RUNNING)
    # The core sees them running where they were, on nodes it may not use.
    snap = snapshot.capture(state).materialize()
    assert {t.status for j in snap.jobs for t in j.tasks} == {TaskStatus.RUNNING}
    assert {n.name: n.ready for n in snap.nodes} == {
        "a0": False,
        "a1": False,
        "b0": True,
        "b1": True,
    }


def test_nothing_new_is_bound_to_a_silent_backend(state: ClusterState, clock: Clock) -> None:
    advance(state, clock, GRACE + 1, "b")
    commands.submit_job(state, gang("new", replicas=2, cpu="1"))
    cycle(state)
    assert {n for _s, n in tasks(state, "new")} <= {"b0", "b1"}
    assert pending_decisions(state, "a", "bind") == []


def test_a_bind_to_a_backend_that_went_silent_expires_and_is_placed_elsewhere(
    state: ClusterState, clock: Clock
) -> None:
    """The issue's case: bound to a dead rack before the grace ran out, the task is Unknown (never
    Running), its bind expires at its deadline (not re-sent, not re-placed there), and the next
    cycle places it on the live backend."""
    for name in ("b0", "b1"):
        ingest.send_deltas(
            state,
            pb.SendDeltasRequest(
                backend="b", deltas=[pb.Delta(node_upserted=node(name, unschedulable=True))]
            ),
        )
    advance(state, clock, GRACE - 5, "b")  # a is dying: no call since the start
    commands.submit_job(state, gang("late", replicas=1, cpu="1"))
    cycle(state)
    (bind,) = pending_decisions(state, "a", "bind")
    for name in ("b0", "b1"):
        ingest.send_deltas(
            state, pb.SendDeltasRequest(backend="b", deltas=[pb.Delta(node_upserted=node(name))])
        )
    advance(state, clock, 10, "b")
    assert tasks(state, "late") == [(TaskStatus.UNKNOWN, bind.bind.node)]
    assert job_proto(state.jobs["late"]).status.running == 0
    advance(state, clock, 30, "b")  # past the bind's deadline
    assert bind.id not in state.decisions.pending
    assert tasks(state, "late") == [(TaskStatus.PENDING, None)]
    cycle(state)
    assert tasks(state, "late")[0][1] in ("b0", "b1")
    assert pending_decisions(state, "a", "bind") == []


def test_lost_after_the_eviction_timeout_the_gang_is_placed_again_elsewhere(
    state: ClusterState, clock: Clock
) -> None:
    start_on_a(state)
    advance(state, clock, GRACE + 1, "b")
    advance(state, clock, EVICTION - 2, "b")
    assert {s for s, _n in tasks(state, "g")} == {TaskStatus.UNKNOWN}
    advance(state, clock, 2, "b")
    assert tasks(state, "g") == [(TaskStatus.PENDING, None)] * 2
    assert state.jobs["g"].tasks[0].message.startswith("lost: backend a silent for")
    assert "(task eviction timeout 300 s)" in state.jobs["g"].tasks[0].message
    assert state.jobs["g"].status.phase == pb.JOB_PHASE_INQUEUE
    assert set(state.liveness.lost) == {"g/worker-0", "g/worker-1"}
    cycle(state)
    assert {(s, n) for s, n in tasks(state, "g")} == {
        (TaskStatus.BINDING, "b0"),
        (TaskStatus.BINDING, "b1"),
    }
    run_on(state, "b")
    assert {s for s, _n in tasks(state, "g")} == {TaskStatus.RUNNING}
    assert views(state)["a0"].node.not_ready  # until a answers


def test_a_job_cancelled_while_its_backend_is_silent_ends_when_its_tasks_are_lost(
    state: ClusterState, clock: Clock
) -> None:
    start_on_a(state)
    advance(state, clock, GRACE + 1, "b")
    commands.cancel_job(state, "g")
    assert {s for s, _n in tasks(state, "g")} == {TaskStatus.RELEASING}
    assert len(pending_decisions(state, "a", "evict")) == 2  # delivered if a comes back
    advance(state, clock, EVICTION, "b")
    assert {s for s, _n in tasks(state, "g")} == {TaskStatus.CANCELLED}
    assert pending_decisions(state, "a", "evict") == []
    assert state.jobs["g"].status.phase == pb.JOB_PHASE_CANCELLED


def test_back_before_the_eviction_timeout_its_running_tasks_are_adopted(
    state: ClusterState, clock: Clock
) -> None:
    start_on_a(state)
    issued = state.decisions.next_id
    advance(state, clock, GRACE + 30, "b")
    assert {s for s, _n in tasks(state, "g")} == {TaskStatus.UNKNOWN}
    reply = beat(state, "a")  # a partition healed, or a paused agent resumed
    assert reply.resync
    assert not any(v.node.not_ready for v in views(state).values())
    assert {s for s, _n in tasks(state, "g")} == {TaskStatus.RUNNING}
    assert state.jobs["g"].tasks[0].message == ""
    ingest.sync_snapshot(
        state,
        pb.SyncSnapshotRequest(
            backend="a",
            nodes=[node("a0"), node("a1")],
            tasks=[
                pb.BackendTask(task_id=t.uid, node=t.node or "", status=pb.TASK_STATUS_RUNNING)
                for t in state.jobs["g"].tasks
            ],
        ),
    )
    assert not beat(state, "a").resync
    assert {(s, n) for s, n in tasks(state, "g")} == {
        (TaskStatus.RUNNING, "a0"),
        (TaskStatus.RUNNING, "a1"),
    }
    assert state.decisions.next_id == issued  # nothing bound or evicted again: no duplicate
    cycle(state)
    assert state.decisions.next_id == issued
    advance(state, clock, EVICTION + GRACE, "a", "b")
    assert {s for s, _n in tasks(state, "g")} == {TaskStatus.RUNNING}


def test_back_without_a_task_it_ran_loses_that_task(state: ClusterState, clock: Clock) -> None:
    start_on_a(state)
    advance(state, clock, GRACE + 1, "b")
    ingest.register_backend(state, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(  # restarted: it runs only worker-0 now
        state,
        pb.SyncSnapshotRequest(
            backend="a",
            nodes=[node("a0"), node("a1")],
            tasks=[pb.BackendTask(task_id="g/worker-0", node="a0", status=pb.TASK_STATUS_RUNNING)],
        ),
    )
    (w0, w1) = state.jobs["g"].tasks
    assert (w1.status, w1.message) == (
        TaskStatus.PENDING,
        "lost: not reported by backend a at sync",
    )
    assert w0.status == TaskStatus.RELEASING  # the gang broke: placed again whole


def test_back_after_its_tasks_were_lost_its_stale_copies_are_stopped(
    state: ClusterState, clock: Clock
) -> None:
    start_on_a(state)
    advance(state, clock, GRACE + EVICTION + 1, "b")
    cycle(state)
    run_on(state, "b")
    now_on_b = tasks(state, "g")
    assert {n for _s, n in now_on_b} == {"b0", "b1"}
    # a comes back still running the old copies: a delta first, then its snapshot.
    send_statuses(
        state,
        "a",
        [pb.TaskStatusUpdate(task_id="g/worker-0", status=pb.TASK_STATUS_RUNNING, node="a0")],
    )
    ingest.sync_snapshot(
        state,
        pb.SyncSnapshotRequest(
            backend="a",
            nodes=[node("a0"), node("a1")],
            tasks=[
                pb.BackendTask(task_id="g/worker-0", node="a0", status=pb.TASK_STATUS_RUNNING),
                pb.BackendTask(task_id="g/worker-1", node="a1", status=pb.TASK_STATUS_RUNNING),
            ],
        ),
    )
    assert tasks(state, "g") == now_on_b  # the job's record is untouched
    stops = sorted(
        (d.evict.task_id, d.evict.node, d.evict.reason)
        for d in pending_decisions(state, "a", "evict")
    )
    assert stops == [("g/worker-0", "a0", "lost"), ("g/worker-1", "a1", "lost")]
    assert not any(v.node.not_ready for v in views(state).values())
    # Reported again before the evictions are applied: nothing more is issued.
    ingest.sync_snapshot(
        state,
        pb.SyncSnapshotRequest(
            backend="a",
            nodes=[node("a0"), node("a1")],
            tasks=[pb.BackendTask(task_id="g/worker-0", node="a0")],
        ),
    )
    assert len(pending_decisions(state, "a", "evict")) == 2
    assert set(state.liveness.lost) == {"g/worker-0"}  # worker-1's copy is gone
    ingest.ack(
        state,
        pb.AckDecisionsRequest(
            backend="a",
            acks=[
                pb.DecisionAck(decision_id=d.id, applied=True)
                for d in pending_decisions(state, "a", "evict")
            ],
        ),
        {},
    )
    assert state.liveness.lost == {}
    assert tasks(state, "g") == now_on_b


def test_a_lost_task_still_pending_is_not_adopted_back(state: ClusterState, clock: Clock) -> None:
    start_on_a(state)
    for name in ("b0", "b1"):  # nowhere else to go
        ingest.send_deltas(
            state,
            pb.SendDeltasRequest(
                backend="b", deltas=[pb.Delta(node_upserted=node(name, unschedulable=True))]
            ),
        )
    advance(state, clock, GRACE + EVICTION + 1, "b")
    assert tasks(state, "g") == [(TaskStatus.PENDING, None)] * 2
    ingest.sync_snapshot(
        state,
        pb.SyncSnapshotRequest(
            backend="a",
            nodes=[node("a0"), node("a1")],
            tasks=[pb.BackendTask(task_id="g/worker-0", node="a0", status=pb.TASK_STATUS_RUNNING)],
        ),
    )
    assert tasks(state, "g") == [(TaskStatus.PENDING, None)] * 2
    assert [d.evict.task_id for d in pending_decisions(state, "a", "evict")] == ["g/worker-0"]


def test_the_backends_own_not_ready_is_kept(state: ClusterState, clock: Clock) -> None:
    ingest.send_deltas(
        state,
        pb.SendDeltasRequest(
            backend="a", deltas=[pb.Delta(node_upserted=node("a0", not_ready=True))]
        ),
    )
    assert views(state)["a0"].not_ready_reason == "reported by backend a"
    advance(state, clock, GRACE + 1, "b")
    assert views(state)["a0"].not_ready_reason.startswith("backend a silent")
    beat(state, "a")
    shown = views(state)
    assert shown["a0"].node.not_ready
    assert shown["a0"].not_ready_reason == "reported by backend a"
    assert not shown["a1"].node.not_ready


def test_every_backend_call_is_contact(state: ClusterState, clock: Clock) -> None:
    for call in (
        lambda: ingest.send_deltas(state, pb.SendDeltasRequest(backend="a")),
        lambda: ingest.check_acks(state, pb.AckDecisionsRequest(backend="a")),
        lambda: ingest.check_stream(state, pb.StreamDecisionsRequest(backend="a")),
        lambda: beat(state, "a"),
    ):
        advance(state, clock, GRACE - 1, "b")
        call()
    assert not views(state)["a0"].node.not_ready


def test_a_new_leader_starts_every_clock_and_forgets_unknown(
    state: ClusterState, clock: Clock
) -> None:
    """Liveness is derived: a server that starts (or takes over the lead) with tasks a previous
    leader left Unknown starts them Running again, declares no backend silent before a grace of
    its own, and then loses them only an eviction timeout after that."""
    start_on_a(state)
    advance(state, clock, GRACE + 1, "b")
    assert {s for s, _n in tasks(state, "g")} == {TaskStatus.UNKNOWN}
    start_liveness(state)
    assert {s for s, _n in tasks(state, "g")} == {TaskStatus.RUNNING}
    assert state.liveness.contacts == {}
    advance(state, clock, GRACE - 1, "b")
    assert {s for s, _n in tasks(state, "g")} == {TaskStatus.RUNNING}
    advance(state, clock, 2, "b")
    assert {s for s, _n in tasks(state, "g")} == {TaskStatus.UNKNOWN}


def test_unknown_is_stored_and_counts_as_holding_a_node(state: ClusterState, clock: Clock) -> None:
    start_on_a(state)
    state.commit()
    advance(state, clock, GRACE + 1, "b")
    batch = state.commit()
    assert {row[2] for row in batch.tasks.values()} == {int(TaskStatus.UNKNOWN)}
    assert views(state)["a0"].task_count == 1


def test_silent_backends_are_counted_in_the_metrics(state: ClusterState, clock: Clock) -> None:
    def silent() -> float:
        for metric in StateCollector(state, dict).collect():
            if metric.name == "muster_backends_silent":
                return sum(s.value for s in metric.samples)
        raise AssertionError("no muster_backends_silent series")

    assert silent() == 0
    advance(state, clock, GRACE + 1, "b")
    assert silent() == 1
    beat(state, "a")
    assert silent() == 0


def test_a_backend_that_came_back_is_watched_again(state: ClusterState, clock: Clock) -> None:
    start_on_a(state)
    advance(state, clock, GRACE + EVICTION + 1, "b")
    ingest.register_backend(state, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(state, pb.SyncSnapshotRequest(backend="a", nodes=[node("a0"), node("a1")]))
    for name in ("b0", "b1"):  # the gang goes back to a
        ingest.send_deltas(
            state,
            pb.SendDeltasRequest(
                backend="b", deltas=[pb.Delta(node_upserted=node(name, unschedulable=True))]
            ),
        )
    cycle(state)
    run_on(state, "a")
    assert {(s, n) for s, n in tasks(state, "g")} == {
        (TaskStatus.RUNNING, "a0"),
        (TaskStatus.RUNNING, "a1"),
    }
    advance(state, clock, GRACE + 1, "b")
    assert {s for s, _n in tasks(state, "g")} == {TaskStatus.UNKNOWN}
    advance(state, clock, EVICTION, "b")
    assert tasks(state, "g") == [(TaskStatus.PENDING, None)] * 2
