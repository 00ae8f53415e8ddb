"""ListJobHistory (``muster history``): finished jobs from memory and from the store's archive,
filtered and paged by finish time, with their accounting -- requested (request x elapsed) and used
(request x the time each task held its node) quantity-seconds, exit codes. Time is an injected
clock; each step is flushed as the server does after every call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from server_test_helpers import gang, node, rl, send_statuses

from muster.v1 import muster_pb2 as pb
from server.model import CycleResult, JobOutcome, PodGroupPhase
from server.service import commands, ingest, snapshot
from server.service.api.history import list_job_history
from server.service.api.queries import ReadScope
from server.service.apply import apply
from server.service.decisions import DecisionLog
from server.service.errors import DomainError, ErrorCode
from server.service.retention import commit_and_drop_finished
from server.service.state import ClusterState
from server.service.store import SqliteStore

RETENTION = 60.0
T0 = 1_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

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
        c, pb.SyncSnapshotRequest(backend="a", nodes=[node(f"n{i}", cpu="8") for i in range(4)])
    )
    flush(c, store)
    return c


def flush(state: ClusterState, store: SqliteStore) -> None:
    batch = commit_and_drop_finished(state)
    store.write(batch)
    for written in batch.after_write:
        written()


def bind_and_ack(state: ClusterState, job_id: str) -> None:
    capture = snapshot.capture(state)
    result = CycleResult(capture.cycle_id)
    for i, t in enumerate(state.jobs[job_id].tasks):
        result.binds[t.uid] = f"n{i % 4}"
    result.jobs[job_id] = JobOutcome(PodGroupPhase.RUNNING)
    apply(state, capture, result)
    ids = [p.row.id for p in state.decisions.pending.values() if p.row.task_id.startswith(job_id)]
    ingest.ack(
        state,
        pb.AckDecisionsRequest(
            backend="a", acks=[pb.DecisionAck(decision_id=i, applied=True) for i in ids]
        ),
        {},
    )


def end(state: ClusterState, job_id: str, codes: list[int]) -> None:
    send_statuses(
        state,
        "a",
        [
            pb.TaskStatusUpdate(
                task_id=t.uid,
                status=pb.TASK_STATUS_SUCCEEDED if code == 0 else pb.TASK_STATUS_FAILED,
                exit_code=code,
            )
            for t, code in zip(state.jobs[job_id].tasks, codes, strict=True)
        ],
    )


def run_job(
    state: ClusterState,
    store: SqliteStore,
    clock: Clock,
    job_id: str,
    *,
    owner: str = "ann",
    queue: str = "default",
    codes: tuple[int, ...] = (0, 0),
    cpu: str = "2",
    ran: float = 100.0,
    gpu: str = "",
) -> None:
    """Submit, place (bind acknowledged), run ``ran`` seconds, end with ``codes``."""
    request = rl(cpu=cpu, **({"nvidia_com/gpu": gpu} if gpu else {}))
    spec = pb.JobSpec(
        id=job_id,
        queue=queue,
        task_groups=[pb.TaskGroup(role="w", replicas=len(codes), request=request)],
    )
    commands.submit_job(state, spec, owner=owner)
    flush(state, store)
    clock.now += 5  # waits before it is placed: not used, not elapsed
    bind_and_ack(state, job_id)
    flush(state, store)
    clock.now += ran
    end(state, job_id, list(codes))
    flush(state, store)


def history(state: ClusterState, **fields: object) -> list[pb.JobAccounting]:
    """Every page (page size 2 unless given), checking each page's token."""
    out: list[pb.JobAccounting] = []
    request = pb.ListJobHistoryRequest(**{"page_size": 2, **fields})  # type: ignore[arg-type]
    for _ in range(100):
        reply = list_job_history(state, request)
        out.extend(reply.jobs)
        if not reply.next_page_token:
            return out
        request.page_token = reply.next_page_token
    raise AssertionError("no end within 100 pages")


def ts(seconds: float) -> pb.ListJobHistoryRequest:
    request = pb.ListJobHistoryRequest()
    request.finished_after.FromNanoseconds(int(seconds * 1e9))
    return request


def test_accounting_of_a_finished_job(
    state: ClusterState, store: SqliteStore, clock: Clock
) -> None:
    run_job(state, store, clock, "train", codes=(0, 3), cpu="2", ran=100.0, gpu="1")
    commands.submit_job(state, gang("waiting", replicas=1, cpu="1"))  # never ends: not listed
    flush(state, store)
    [entry] = history(state)
    assert entry.job_id == "train"
    assert entry.owner == "ann"
    assert entry.queue == "default"
    assert entry.phase == pb.JOB_PHASE_FAILED
    assert (entry.tasks, entry.succeeded, entry.failed, entry.cancelled) == (2, 1, 1, 0)
    assert dict(entry.exit_codes) == {0: 1, 3: 1}
    assert entry.finish_time.seconds == int(T0 + 105)
    elapsed = entry.elapsed_seconds
    assert 0 < elapsed <= 100.0
    # Requested: 2 tasks x 2 cpu (1 GPU) x elapsed; used: what they held while bound/running.
    assert entry.requested["cpu"] == pytest.approx(2 * 2 * elapsed)
    assert entry.requested["nvidia.com/gpu"] == pytest.approx(2 * 1 * elapsed)
    assert entry.used["cpu"] == pytest.approx(2 * 2 * 100.0)
    assert entry.used["nvidia.com/gpu"] == pytest.approx(2 * 100.0)
    assert "failed (exit code 3)" in entry.reason


def test_history_reads_jobs_that_left_memory_with_filters_and_pages(
    state: ClusterState, store: SqliteStore, clock: Clock
) -> None:
    commands.create_queue(state, pb.Queue(name="ml"))
    for i in range(7):
        run_job(
            state,
            store,
            clock,
            f"j{i}",
            owner="ann" if i % 2 else "bob",
            queue="ml" if i % 3 == 0 else "default",
            codes=(0,) if i != 4 else (1,),
            ran=10.0 + i,
        )
    commands.submit_job(state, gang("c", replicas=1, cpu="1"), owner="bob")
    flush(state, store)
    clock.now += 1
    commands.cancel_job(state, "c")
    flush(state, store)
    before = history(state)
    assert [e.job_id for e in before] == [*(f"j{i}" for i in range(7)), "c"]  # by finish time
    assert [e.phase for e in before][-1] == pb.JOB_PHASE_CANCELLED
    finish = {e.job_id: e.finish_time.seconds + e.finish_time.nanos / 1e9 for e in before}

    clock.now += RETENTION + 1
    flush(state, store)
    assert not any(job_id in state.jobs for job_id in finish)  # all in the archive only
    after = history(state)
    assert after == before  # the same answer from the store alone
    assert history(state, page_size=1) == before == history(state, page_size=1000)

    def ids(**fields: object) -> list[str]:
        return [e.job_id for e in history(state, **fields)]

    assert ids(owner="ann") == ["j1", "j3", "j5"]
    assert ids(queue="ml") == ["j0", "j3", "j6"]
    assert ids(queue="ml", owner="bob") == ["j0", "j6"]
    assert ids(phases=[pb.JOB_PHASE_FAILED]) == ["j4"]
    assert ids(phases=[pb.JOB_PHASE_CANCELLED, pb.JOB_PHASE_FAILED]) == ["j4", "c"]
    since = pb.ListJobHistoryRequest()
    since.finished_after.FromNanoseconds(int(finish["j3"] * 1e9))
    until = pb.ListJobHistoryRequest()
    until.finished_before.FromNanoseconds(int(finish["j5"] * 1e9))
    assert ids(finished_after=since.finished_after) == ["j3", "j4", "j5", "j6", "c"]
    assert ids(finished_before=until.finished_before) == ["j0", "j1", "j2", "j3", "j4"]
    assert ids(
        finished_after=since.finished_after, finished_before=until.finished_before, page_size=1
    ) == ["j3", "j4"]
    # A read scope: the queues a rule lets the caller read, and their own jobs.
    scoped = list_job_history(
        state, pb.ListJobHistoryRequest(), ReadScope(frozenset({"ml"}), "ann")
    )
    assert [e.job_id for e in scoped.jobs] == ["j0", "j1", "j3", "j5", "j6"]


def test_history_refuses_bad_arguments(state: ClusterState) -> None:
    def code(**fields: object) -> ErrorCode:
        with pytest.raises(DomainError) as info:
            list_job_history(state, pb.ListJobHistoryRequest(**fields))  # type: ignore[arg-type]
        return info.value.code

    assert code(phases=[pb.JOB_PHASE_RUNNING]) == ErrorCode.INVALID_ARGUMENT
    assert code(page_size=-1) == ErrorCode.INVALID_ARGUMENT
    assert code(page_token="nope") == ErrorCode.INVALID_ARGUMENT
    late, early = ts(T0 + 10), ts(T0)
    assert (
        code(finished_after=late.finished_after, finished_before=early.finished_after)
        == ErrorCode.INVALID_ARGUMENT
    )


def test_a_page_token_is_bound_to_its_filters(
    state: ClusterState, store: SqliteStore, clock: Clock
) -> None:
    for i in range(3):
        run_job(state, store, clock, f"k{i}", codes=(0,))
    first = list_job_history(state, pb.ListJobHistoryRequest(page_size=1))
    assert first.next_page_token
    with pytest.raises(DomainError, match="different filters"):
        list_job_history(
            state,
            pb.ListJobHistoryRequest(page_size=1, owner="x", page_token=first.next_page_token),
        )


def test_without_a_store_the_finished_jobs_in_memory_are_listed(clock: Clock) -> None:
    state = ClusterState(DecisionLog(bind_timeout=30), clock=clock)
    for job_id in ("b", "a"):
        commands.submit_job(state, gang(job_id, replicas=1, cpu="1"))
        clock.now += 1
        commands.cancel_job(state, job_id)
    state.commit()
    reply = list_job_history(state, pb.ListJobHistoryRequest(page_size=1))
    assert [e.job_id for e in reply.jobs] == ["b"]
    assert reply.next_page_token
    rest = list_job_history(
        state, pb.ListJobHistoryRequest(page_size=1, page_token=reply.next_page_token)
    )
    assert [e.job_id for e in rest.jobs] == ["a"]
    assert not rest.next_page_token
