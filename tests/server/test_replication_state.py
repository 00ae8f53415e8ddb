"""The state-side pieces replicated servers stand on: decisions reach backends only once written
(never when the write fails), a new leader adopts the pending decisions at its term, and a
follower's copy absorbs the leader's rows with events for its watchers."""

from __future__ import annotations

import anyio
import pytest

from muster.v1 import muster_pb2 as pb
from server.model import TaskStatus
from server.service.decisions import DecisionLog
from server.service.errors import unavailable
from server.service.records import JobStatusRecord, TaskRecord
from server.service.state import ClusterState
from server.service.store import StoredJob, StoreWriter, WriteBatch
from server.service.tables import new_job_record


class MemoryStore:
    """Records batches; ``fail`` makes the next write raise (as a fenced write refused)."""

    def __init__(self) -> None:
        self.batches: list[WriteBatch] = []
        self.fail = False

    def check(self) -> None: ...

    def write(self, batch: WriteBatch) -> None:
        if self.fail:
            raise unavailable("no longer holds the lease")
        self.batches.append(batch)

    def close(self) -> None: ...


def bind(log: DecisionLog, task: str = "j/w-0") -> pb.Decision:
    return log.issue("rack", 1, task, bind=pb.BindDecision(task_id=task, job_id="j", node="n1"))


async def test_a_decision_is_sent_only_once_written() -> None:
    state = ClusterState()
    writer = StoreWriter(MemoryStore())  # type: ignore[arg-type]
    sub = state.decisions.subscribe("rack", 0)
    decision = bind(state.decisions)
    with pytest.raises(anyio.WouldBlock):
        sub.receive.receive_nowait()  # issued, not written: nothing sent
    # A subscriber arriving now is not handed it either (its backlog is what was written).
    late = state.decisions.subscribe("rack", 0)
    with pytest.raises(anyio.WouldBlock):
        late.receive.receive_nowait()
    await writer.flush(state.commit)
    assert sub.receive.receive_nowait().id == decision.id
    assert late.receive.receive_nowait().id == decision.id


async def test_a_decision_whose_write_failed_is_never_sent() -> None:
    state = ClusterState()
    store = MemoryStore()
    writer = StoreWriter(store)  # type: ignore[arg-type]
    failures: list[Exception] = []
    writer.on_failed = failures.append
    sub = state.decisions.subscribe("rack", 0)
    bind(state.decisions)
    store.fail = True
    with pytest.raises(Exception, match="lease"):
        await writer.flush(state.commit)
    assert len(failures) == 1  # the replica is told: it reloads from the store
    store.fail = False
    writer.reset()
    await writer.flush(state.commit)
    with pytest.raises(anyio.WouldBlock):
        sub.receive.receive_nowait()


def test_a_new_leader_adopts_pending_decisions_at_its_term() -> None:
    log = DecisionLog(bind_timeout=30)
    log.term = 3
    old = bind(log)
    log.take_unsent()
    log.drain_rows()
    log.adopt(4, now=1000.0)
    assert log.term == 4
    assert log.pending[old.id].decision.term == 4
    assert log.pending[old.id].row.deadline == 1030.0  # the grace: a full bind timeout from now
    rows = log.drain_rows()  # written again, with the term
    assert pb.Decision.FromString(rows[0][5]).term == 4
    assert [d.id for d in log.take_unsent()] == [old.id]  # and sent again once written
    assert bind(log).term == 4


def test_a_follower_absorbs_rows_and_tells_its_watchers() -> None:
    leader = ClusterState()
    spec = pb.JobSpec(
        id="j",
        queue="default",
        namespace="default",
        task_groups=[
            pb.TaskGroup(role="w", replicas=2, request=pb.ResourceList(quantities={"cpu": "1"}))
        ],
    )
    rec = new_job_record(spec, 1, JobStatusRecord(phase=pb.JOB_PHASE_PENDING))
    stored = StoredJob("j", 1, rec.spec_bytes, rec.status, [])
    follower = ClusterState()
    watched = follower.watch.subscribe(lambda _e: True)
    follower.absorb(
        meta={"next_decision_id": "7", "next_creation_index": "2"},
        queues={"gpu": pb.Queue(name="gpu", parent="root").SerializeToString()},
        jobs=[stored],
        tasks=[],
        decisions=[],
        backends=[],
    )
    assert "j" in follower.jobs
    assert "j" in follower.active_jobs
    assert "gpu" in follower.queues
    assert follower.decisions.next_id == 7
    assert watched.receive.receive_nowait().type == pb.JobEvent.TYPE_ADDED
    task = TaskRecord("j/w-0", "j", "w", 0, status=TaskStatus.RUNNING, node="n1", backend="rack")
    follower.absorb(
        meta={},
        queues={"gpu": None},
        jobs=[StoredJob("j", 1, rec.spec_bytes, JobStatusRecord(phase=pb.JOB_PHASE_RUNNING), [])],
        tasks=[task],
        decisions=[],
        backends=[],
    )
    assert "gpu" not in follower.queues
    assert follower.tasks["j/w-0"].status == TaskStatus.RUNNING
    assert follower.jobs["j"].tasks[0] is follower.tasks["j/w-0"]
    assert follower.jobs["j"].status.phase == pb.JOB_PHASE_RUNNING
    event = watched.receive.receive_nowait()
    assert event.type == pb.JobEvent.TYPE_MODIFIED
    assert not follower.changes.jobs
    assert not follower.changes.tasks
    assert leader.jobs == {}  # (the leader's state is its own)


async def test_after_a_failed_write_nothing_is_reported_saved_until_reloaded() -> None:
    """A failed batch took every pending change, those of callers still waiting to flush too:
    they must hear it failed (found in a failover run: a submission acknowledged, never saved)."""
    state = ClusterState()
    store = MemoryStore()
    writer = StoreWriter(store)  # type: ignore[arg-type]
    state.set_meta("submitted-by-a-waiting-call", "1")
    store.fail = True
    with pytest.raises(Exception, match="lease"):
        await writer.flush(state.commit)
    store.fail = False
    # The waiting caller's flush finds nothing left to write: it must not return as saved.
    with pytest.raises(Exception, match="not saved"):
        await writer.flush(state.commit)
    assert store.batches == []
    writer.reset()  # the replica reloaded its state from the store
    await writer.flush(state.commit)


def test_every_backend_and_write_rpc_is_leader_only() -> None:
    """One table says what a follower refuses (clients route by it too): every backend call and
    every change must be in it, or a follower would take a write it cannot save."""
    from muster.transport import LEADER_ONLY
    from server.service.rpc import AUDITED, RPC_VERBS

    backend = {name for name, (verb, _q) in RPC_VERBS.items() if verb == "backend"}
    assert backend <= LEADER_ONLY
    assert set(AUDITED) <= LEADER_ONLY
