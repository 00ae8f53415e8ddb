"""Bounded memory: finished jobs leave memory after the retention and are answered from the store
(GetJob, ListJobs, Explain, resubmission), a restart does not load them back, and the state file
is private. Time is an injected clock; nothing here sleeps to make time pass."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from server_test_helpers import gang, node, register, rpc_error, send_statuses, wait_for

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.model import CycleResult, JobOutcome, PodGroupPhase, TaskStatus
from server.service import commands, ingest, snapshot
from server.service.api import queries
from server.service.app import ServerOptions, start_server
from server.service.apply import apply
from server.service.decisions import DecisionLog
from server.service.errors import DomainError, ErrorCode
from server.service.retention import commit_and_drop_finished, drop_finished
from server.service.state import ClusterState
from server.service.store import SqliteStore

RETENTION = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "state.db")
    yield s
    s.close()


@pytest.fixture
def state(clock: Clock, store: SqliteStore) -> ClusterState:
    c = ClusterState(DecisionLog(bind_timeout=30), clock=clock, retention=RETENTION, archive=store)
    ingest.register_backend(c, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(
        c, pb.SyncSnapshotRequest(backend="a", nodes=[node(f"n{i}") for i in range(4)])
    )
    store.write(c.commit())
    return c


def flush(state: ClusterState, store: SqliteStore) -> list[str]:
    """What the loop's expiry tick does (under the writer's lock): commit, write, drop. Returns the
    ids of jobs no longer in memory afterwards that were before."""
    before = set(state.jobs)
    store.write(commit_and_drop_finished(state))
    return sorted(before - set(state.jobs))


def bind_and_ack(state: ClusterState, job_id: str) -> None:
    capture = snapshot.capture(state)
    result = CycleResult(capture.cycle_id)
    for i, t in enumerate(state.jobs[job_id].tasks):
        result.binds[t.uid] = f"n{i % 4}"
    result.jobs[job_id] = JobOutcome(PodGroupPhase.RUNNING)
    apply(state, capture, result)
    ids = [
        p.row.id for p in state.decisions.pending.values() if p.row.task_id.startswith(f"{job_id}/")
    ]
    ingest.ack(
        state,
        pb.AckDecisionsRequest(
            backend="a", acks=[pb.DecisionAck(decision_id=i, applied=True) for i in ids]
        ),
        {},
    )


def finish(state: ClusterState, job_id: str, status: int = pb.TASK_STATUS_SUCCEEDED) -> None:
    send_statuses(
        state,
        "a",
        [
            pb.TaskStatusUpdate(task_id=t.uid, status=status, exit_code=0)  # type: ignore[arg-type]
            for t in state.jobs[job_id].tasks
        ],
    )


def complete(state: ClusterState, job_id: str) -> None:
    bind_and_ack(state, job_id)
    finish(state, job_id)
    assert state.jobs[job_id].status.phase == pb.JOB_PHASE_COMPLETED


def all_pages(state: ClusterState, **filters: object) -> list[list[pb.Job]]:
    """Every page of ListJobs with these filters (bounded: at most 100 pages)."""
    pages: list[list[pb.Job]] = []
    token = ""
    for _ in range(100):
        resp = queries.list_jobs(state, pb.ListJobsRequest(page_token=token, **filters))  # type: ignore[arg-type]
        pages.append(list(resp.jobs))
        token = resp.next_page_token
        if not token:
            return pages
    raise AssertionError("ListJobs did not end within 100 pages")


def error_of(call: object, *args: object) -> tuple[ErrorCode, str]:
    with pytest.raises(DomainError) as info:
        call(*args)  # type: ignore[operator]
    return info.value.code, info.value.message


def test_finished_job_leaves_memory_after_retention_and_answers_the_same(
    state: ClusterState, store: SqliteStore, clock: Clock
) -> None:
    commands.submit_job(state, gang("done", replicas=2, cpu="1"))
    commands.submit_job(state, gang("active", replicas=2, cpu="1"))
    flush(state, store)
    complete(state, "done")
    bind_and_ack(state, "active")
    assert flush(state, store) == []
    before = queries.get_job(state, "done")
    explain_before = queries.explain(state, "done")
    list_before = queries.list_jobs(state, pb.ListJobsRequest())

    clock.now += RETENTION - 1
    assert flush(state, store) == []  # not yet: retention not over
    clock.now += 2
    assert flush(state, store) == ["done"]
    assert "done" not in state.jobs
    assert "active" in state.jobs
    assert list(state.active_jobs) == ["active"]
    assert not [uid for uid in state.tasks if uid.startswith("done/")]
    assert not [uid for uid in state.task_job if uid.startswith("done/")]
    assert "done" not in state.finished

    assert queries.get_job(state, "done") == before
    assert queries.explain(state, "done") == explain_before
    archived = state.jobs.get("done")
    assert archived is not None
    assert [t.uid for t in archived.template.tasks] == [
        "done/worker-0",
        "done/worker-1",
    ]
    assert queries.list_jobs(state, pb.ListJobsRequest()) == list_before
    # Still unknown ids are still NOT_FOUND.
    assert error_of(queries.get_job, state, "never")[0] == ErrorCode.NOT_FOUND


def test_list_jobs_merges_memory_and_store_with_filters_and_pages(
    state: ClusterState, store: SqliteStore, clock: Clock
) -> None:
    commands.create_queue(state, pb.Queue(name="team"))
    # Interleave jobs that will leave memory with jobs that stay, in two queues and namespaces.
    for i in range(12):
        commands.submit_job(
            state,
            gang(
                f"j{i:02d}",
                replicas=1,
                cpu="1",
                queue="team" if i % 3 else "default",
                namespace="ns" if i % 2 else "",
            ),
        )
    flush(state, store)
    for i in (0, 1, 4, 5, 8, 9):
        commands.cancel_job(state, f"j{i:02d}")
    for i in (2, 6):
        complete(state, f"j{i:02d}")
    flush(state, store)
    cases: list[dict[str, object]] = [
        {},
        {"page_size": 1},
        {"page_size": 3},
        {"phases": [pb.JOB_PHASE_CANCELLED], "page_size": 2},
        {"phases": [pb.JOB_PHASE_PENDING, pb.JOB_PHASE_COMPLETED], "page_size": 2},
        {"queue": "team", "page_size": 2},
        {"namespace": "ns", "queue": "team"},
        {"queue": "nobody"},
    ]
    before = [all_pages(state, **case) for case in cases]
    # The active index (what cycles and ListQueues walk) holds exactly the jobs not over.
    assert (
        list(state.active_jobs)
        == [r.id for r in state.jobs.values() if r.active]
        == ["j03", "j07", "j10", "j11"]
    )
    clock.now += RETENTION + 1
    assert flush(state, store) == ["j00", "j01", "j02", "j04", "j05", "j06", "j08", "j09"]
    assert sorted(state.jobs) == ["j03", "j07", "j10", "j11"]
    after = [all_pages(state, **case) for case in cases]
    assert after == before
    assert [j.spec.id for page in before[0] for j in page] == [f"j{i:02d}" for i in range(12)]
    # A job submitted after the drop comes after them all, and a job still in memory that changes
    # is listed with its new state.
    commands.submit_job(state, gang("later", replicas=1, cpu="1"))
    commands.cancel_job(state, "j03")
    ids = [(j.spec.id, j.status.phase) for page in all_pages(state, page_size=5) for j in page]
    assert ids[-1] == ("later", pb.JOB_PHASE_PENDING)
    assert ("j03", pb.JOB_PHASE_CANCELLED) in ids
    assert len(ids) == 13


def test_a_job_id_that_left_memory_cannot_be_submitted_again(
    state: ClusterState, store: SqliteStore, clock: Clock
) -> None:
    spec = gang("once", replicas=1, cpu="1")
    first, created = commands.submit_job(state, spec)
    assert created
    commands.cancel_job(state, "once")
    flush(state, store)
    same_before = commands.submit_job(state, spec)
    other = gang("once", replicas=2, cpu="1")
    refused_before = error_of(commands.submit_job, state, other)
    cancel_before = commands.cancel_job(state, "once")
    clock.now += RETENTION + 1
    assert flush(state, store) == ["once"]

    assert commands.submit_job(state, spec) == same_before  # idempotent: (the job, created=False)
    assert same_before[1] is False
    assert error_of(commands.submit_job, state, other) == refused_before
    assert refused_before[0] == ErrorCode.ALREADY_EXISTS
    assert commands.cancel_job(state, "once") == cancel_before
    assert "once" not in state.jobs  # answering did not bring it back into memory


def test_a_finished_job_stays_while_its_tasks_hold_a_node_or_a_change_is_unwritten(
    state: ClusterState, store: SqliteStore, clock: Clock
) -> None:
    commands.submit_job(state, gang("held", replicas=2, cpu="1"))
    flush(state, store)
    bind_and_ack(state, "held")
    commands.cancel_job(state, "held")  # tasks Releasing until the backend acks the evictions
    flush(state, store)
    clock.now += RETENTION + 1
    assert flush(state, store) == []
    assert [t.status for t in state.jobs["held"].tasks] == [TaskStatus.RELEASING] * 2
    evictions = [p.row.id for p in state.decisions.pending.values() if p.row.kind == "evict"]
    ingest.ack(
        state,
        pb.AckDecisionsRequest(
            backend="a", acks=[pb.DecisionAck(decision_id=i, applied=True) for i in evictions]
        ),
        {},
    )
    # The acks changed the tasks: they must reach the store before the job may leave memory.
    assert drop_finished(state) == []
    assert flush(state, store) == []  # this batch carries the change; the next call drops it
    assert flush(state, store) == ["held"]
    assert [t.status for t in queries.get_job(state, "held").tasks] == [
        pb.TASK_STATUS_CANCELLED
    ] * 2


def test_without_a_store_nothing_leaves_memory(clock: Clock) -> None:
    state = ClusterState(clock=clock, retention=RETENTION)
    commands.submit_job(state, gang("x", replicas=1, cpu="1"))
    commands.cancel_job(state, "x")
    state.commit()
    clock.now += RETENTION * 10
    assert drop_finished(state) == []
    assert "x" in state.jobs


def test_late_bind_ack_for_a_job_that_left_memory_is_undone(
    state: ClusterState, store: SqliteStore, clock: Clock
) -> None:
    commands.submit_job(state, gang("late", replicas=1, cpu="1"))
    capture = snapshot.capture(state)
    apply(state, capture, CycleResult(capture.cycle_id, binds={"late/worker-0": "n0"}))
    bind_id = next(iter(state.decisions.pending))
    clock.now += 31
    ingest.expire(state)  # the bind expires: the task is Pending again
    commands.cancel_job(state, "late")
    flush(state, store)
    clock.now += RETENTION + 1
    assert flush(state, store) == ["late"]
    settled = store.decision_states([bind_id])
    ingest.ack(
        state,
        pb.AckDecisionsRequest(
            backend="a", acks=[pb.DecisionAck(decision_id=bind_id, applied=True)]
        ),
        settled,
    )
    undo = [p.decision.evict for p in state.decisions.pending.values() if p.row.kind == "evict"]
    assert [(e.task_id, e.node, e.reason) for e in undo] == [
        ("late/worker-0", "n0", "bind-expired")
    ]


def test_restart_does_not_load_jobs_that_left_memory(
    state: ClusterState, store: SqliteStore, clock: Clock, tmp_path: Path
) -> None:
    commands.submit_job(state, gang("old", replicas=1, cpu="1"))
    commands.submit_job(state, gang("recent", replicas=1, cpu="1"))
    commands.submit_job(state, gang("running", replicas=1, cpu="1"))
    commands.submit_job(state, gang("releasing", replicas=1, cpu="1"))
    flush(state, store)
    commands.cancel_job(state, "old")
    bind_and_ack(state, "running")
    bind_and_ack(state, "releasing")
    commands.cancel_job(state, "releasing")  # ended, but its task still holds n-something
    flush(state, store)
    clock.now += RETENTION + 1
    commands.cancel_job(state, "recent")
    flush(state, store)
    old = queries.get_job(state, "old")
    store.close()

    again_store = SqliteStore(tmp_path / "state.db")
    try:
        again = ClusterState(clock=clock, retention=RETENTION, archive=again_store)
        again.restore(again_store.load(finished_before=clock.now - RETENTION))
        assert sorted(again.jobs) == ["recent", "releasing", "running"]
        assert list(again.active_jobs) == ["running"]
        assert "old/worker-0" not in again.tasks
        assert queries.get_job(again, "old") == old
        assert list(again.finished) == ["releasing", "recent"]
        everything = again_store.load()
        assert sorted(j.id for j in everything.jobs) == ["old", "recent", "releasing", "running"]
        # The creation counter continues after every job, loaded or not.
        job, _ = commands.submit_job(again, gang("next", replicas=1, cpu="1"))
        assert again.jobs["next"].creation_index == 5
    finally:
        again_store.close()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_state_files_are_private(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)
    try:
        path = tmp_path / "fresh" / "dir" / "muster.db"
        s = SqliteStore(path)
        s.write(ClusterState().commit())
        assert mode(path.parent) == 0o700
        assert mode(path) == 0o600
        for suffix in ("-wal", "-shm"):
            companion = Path(f"{path}{suffix}")
            assert companion.exists(), suffix
            assert mode(companion) == 0o600, suffix
        s.close()
        # A state file from before (world-readable) is made private when opened.
        loose = tmp_path / "loose.db"
        sqlite3.connect(loose).close()
        loose.chmod(0o644)
        SqliteStore(loose).close()
        assert mode(loose) == 0o600
    finally:
        os.umask(old_umask)


def test_a_store_written_before_the_archive_columns_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    spec = pb.JobSpec(id="legacy", queue="team", namespace="ns", owner="carol")
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, creation_index INTEGER NOT NULL, spec BLOB NOT NULL, "
        "status TEXT NOT NULL)"
    )
    status = json.dumps(
        {
            "phase": pb.JOB_PHASE_COMPLETED,
            "sched_phase": "Completed",
            "cancelled": False,
            "conditions": [],
            "explanation": None,
            "times": [1.0, 2.0, 3.0],
        }
    )
    db.execute(
        "INSERT INTO jobs VALUES (?, ?, ?, ?)", ("legacy", 1, spec.SerializeToString(), status)
    )
    db.commit()
    db.close()
    s = SqliteStore(path)
    try:
        page = s.jobs_page(0, "team", "ns", [pb.JOB_PHASE_COMPLETED], 10)
        assert [j.id for j in page] == ["legacy"]
        assert s.jobs_page(0, "other", "", [], 10) == []
        assert [j.id for j in s.jobs_page(0, "", "", [], 10, owner="carol")] == [
            "legacy"
        ]  # owner filled in
        assert s.jobs_page(0, "", "", [], 10, owner="dave") == []
        assert s.load(finished_before=10.0).jobs == []  # finished at t=3: not loaded
    finally:
        s.close()


async def test_server_drops_finished_jobs_and_answers_them_over_grpc(tmp_path: Path) -> None:
    clock = Clock()
    opts = ServerOptions(
        listen="127.0.0.1:0",
        state=str(tmp_path / "m.db"),
        cycle_period=3600.0,
        job_retention=RETENTION,
        expire_interval=0.05,
    )
    handle = await start_server(opts)
    try:
        handle.state.clock = clock  # the loop's expiry tick asks the state's clock
        async with grpc.aio.insecure_channel(handle.address) as channel:
            stub = pb_grpc.SchedulerStub(channel)
            await register(stub, nodes=[node("n0")])
            spec = gang("g", replicas=1, cpu="100", queue="default")  # never fits: stays Pending
            await stub.SubmitJob(pb.SubmitJobRequest(job=spec))
            await stub.CancelJob(pb.CancelJobRequest(id="g"))
            before = await stub.GetJob(pb.GetJobRequest(id="g"))
            listed = await stub.ListJobs(pb.ListJobsRequest())
            clock.now += RETENTION + 1

            async def gone() -> bool:
                return "g" not in handle.state.jobs

            await wait_for(gone, "the cancelled job to leave memory")
            assert await stub.GetJob(pb.GetJobRequest(id="g")) == before
            assert await stub.ListJobs(pb.ListJobsRequest()) == listed
            again = await stub.SubmitJob(pb.SubmitJobRequest(job=spec))
            assert again.job == before
            assert not again.created
            other = pb.JobSpec()
            other.CopyFrom(spec)
            other.task_groups[0].replicas = 2
            err = await rpc_error(stub.SubmitJob(pb.SubmitJobRequest(job=other)))
            assert err.code() == grpc.StatusCode.ALREADY_EXISTS
            assert "job.id" in (err.details() or "")
            watch = stub.WatchJobs(pb.WatchJobsRequest(job_id="g", send_initial=True))
            first = await watch.read()
            watch.cancel()
            assert first.job == before
    finally:
        await handle.stop()
