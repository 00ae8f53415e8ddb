"""Task output kept in the state store (server.service.logs): bounded per task with the oldest
bytes dropped and counted, written through the state's write batches, read back after a restart,
and the same bytes whatever the moment a read happens (not yet written, being written, written,
forgotten from memory and read back from the store)."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_test_helpers import gang, node, send_statuses

from muster.v1 import muster_pb2 as pb
from server.service import commands, ingest
from server.service.api import queries
from server.service.decisions import DecisionLog
from server.service.logs import TaskLogs
from server.service.state import ClusterState
from server.service.store import SqliteStore, WriteBatch
from server.service.tables import StateTables

LIMIT = 4096  # segments of 1 KiB
SEG = LIMIT // 4


def write(store: SqliteStore, batch: WriteBatch) -> None:
    """What StoreWriter.flush does with a drained batch."""
    store.write(batch)
    for written in batch.after_write:
        written()


def stored_bytes(path: Path, task_id: str) -> tuple[int, int]:
    """(segments, bytes) the store holds of a task's output."""
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT count(*), coalesce(sum(length(data)), 0) FROM task_log_chunks WHERE task_id = ?",
            (task_id,),
        ).fetchone()
    return int(rows[0]), int(rows[1])


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(db_path)
    yield s
    s.close()


def new_state(store: SqliteStore) -> ClusterState:
    state = ClusterState(DecisionLog(bind_timeout=30), archive=store)
    state.task_logs.per_task = LIMIT
    state.restore(store.load())
    return state


def running_job(state: ClusterState, store: SqliteStore, job_id: str = "j") -> list[str]:
    """A job of two tasks running on backend a; their ids."""
    ingest.register_backend(state, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(state, pb.SyncSnapshotRequest(backend="a", nodes=[node("n0")]))
    commands.submit_job(state, gang(job_id, replicas=2, cpu="1"))
    tasks = [t.uid for t in state.jobs[job_id].tasks]
    # The backend reports them running (as after a bind): the server takes its word.
    send_statuses(
        state,
        "a",
        [pb.TaskStatusUpdate(task_id=t, status=pb.TASK_STATUS_RUNNING, node="n0") for t in tasks],
    )
    write(store, state.commit())
    return tasks


def send(state: ClusterState, task: str, data: bytes, eof: bool = False) -> None:
    ingest.send_deltas(
        state,
        pb.SendDeltasRequest(
            backend="a",
            deltas=[pb.Delta(task_log=pb.TaskLogChunk(task_id=task, data=data, eof=eof))],
        ),
    )


def logs_of(state: ClusterState, job_id: str = "j") -> dict[str, pb.TaskLog]:
    reply = queries.get_task_logs(state, pb.GetTaskLogsRequest(job_id=job_id))
    return {entry.task_id: entry for entry in reply.logs}


def test_output_is_bounded_per_task_with_the_oldest_dropped_and_counted(
    store: SqliteStore, db_path: Path
) -> None:
    state = new_state(store)
    t0, t1 = running_job(state, store)
    full = b"".join(f"line {i:05d}\n".encode() for i in range(1000))  # 11,000 bytes
    for start in range(0, len(full), 700):
        send(state, t0, full[start : start + 700])
        write(store, state.commit())
    send(state, t1, b"short\n", eof=True)
    write(store, state.commit())

    logs = logs_of(state)
    kept = logs[t0]
    assert kept.size == len(full)
    assert not kept.eof
    assert kept.dropped_bytes == len(full) - LIMIT
    assert kept.truncated
    assert kept.data == full[-LIMIT:]
    assert (logs[t1].data, logs[t1].eof, logs[t1].dropped_bytes) == (b"short\n", True, 0)
    segments, held = stored_bytes(db_path, t0)
    assert held <= LIMIT + SEG
    assert segments <= LIMIT // SEG + 1


def test_output_survives_a_restart_and_goes_on_where_it_was(
    store: SqliteStore, db_path: Path
) -> None:
    state = new_state(store)
    t0, _t1 = running_job(state, store)
    first = bytes(range(256)) * 20  # 5,120 bytes, every byte value
    send(state, t0, first)
    write(store, state.commit())
    before = logs_of(state)
    store.close()

    again = SqliteStore(db_path)
    try:
        restarted = new_state(again)
        assert logs_of(restarted) == before
        # The task writes on: its index is read back from the store, the bound still holds.
        send(restarted, t0, b"after the restart\n", eof=True)
        write(again, restarted.commit())
        kept = logs_of(restarted)[t0]
        whole = first + b"after the restart\n"
        assert kept.data == whole[-LIMIT:]
        assert kept.dropped_bytes == len(whole) - LIMIT
        assert kept.eof
        assert kept.size == len(whole)
    finally:
        again.close()


def test_output_not_yet_written_is_read_from_memory(store: SqliteStore) -> None:
    state = new_state(store)
    t0, _t1 = running_job(state, store)
    send(state, t0, b"a" * 3000)
    write(store, state.commit())
    send(state, t0, b"b" * 500)  # not committed yet
    assert logs_of(state)[t0].data == b"a" * 3000 + b"b" * 500
    batch = state.commit()  # drained, being written
    send(state, t0, b"c" * 2000)
    assert logs_of(state)[t0].data == (b"a" * 3000 + b"b" * 500 + b"c" * 2000)[-LIMIT:]
    write(store, batch)
    write(store, state.commit())
    assert logs_of(state)[t0].data == (b"a" * 3000 + b"b" * 500 + b"c" * 2000)[-LIMIT:]


@pytest.mark.parametrize("seed", range(12))
def test_what_is_read_is_always_the_tail_of_what_was_written(tmp_path: Path, seed: int) -> None:
    """Random chunk sizes (some larger than the bound), random moments of draining and writing,
    an index forgotten and read back: every read is a suffix of all the output, at most the
    bound, not much less once there is more, and the store holds at most a segment more."""
    rng = random.Random(seed)
    store = SqliteStore(tmp_path / "state.db")
    try:
        logs = TaskLogs(per_task=LIMIT, tasks=1, store=store)
        full = {"j/w-0": bytearray(), "j/w-1": bytearray()}
        in_flight: list[WriteBatch] = []
        for step in range(300):
            task = rng.choice(list(full))
            size = rng.choice([0, 1, 7, 100, 900, 1024, 1500, 3000, 5000, 9000])
            data = bytes(rng.getrandbits(8) for _ in range(size))
            logs.prepare(task)
            logs.append(task, data, eof=rng.random() < 0.1)
            full[task] += data
            roll = rng.random()
            if roll < 0.4:
                batch = WriteBatch()
                logs.drain(batch)
                in_flight.append(batch)
            if in_flight and (roll > 0.6 or len(in_flight) > 3):
                write(store, in_flight.pop(0))  # in order, as the writer does
            for name, whole in full.items():
                out = logs.get(name)
                if out is None:
                    assert not whole
                    continue
                assert out.size == len(whole), (step, name)
                assert bytes(out.data) == bytes(whole[out.start :]), (step, name)
                assert len(out.data) <= LIMIT
                assert len(out.data) >= min(len(whole), LIMIT) - SEG
        while in_flight:
            write(store, in_flight.pop(0))
        batch = WriteBatch()
        logs.drain(batch)
        write(store, batch)
        for name, whole in full.items():
            segments, held = stored_bytes(tmp_path / "state.db", name)
            assert held <= LIMIT + SEG
            assert segments <= LIMIT // SEG + 2
            out = TaskLogs(per_task=LIMIT, store=store).get(name)  # from the store alone
            assert out is not None
            assert bytes(out.data) == bytes(whole[out.start :])
    finally:
        store.close()


def test_a_reload_forgets_unwritten_output_indexes(store: SqliteStore) -> None:
    state = new_state(store)
    t0, _t1 = running_job(state, store)
    send(state, t0, b"kept\n")
    write(store, state.commit())
    send(state, t0, b"never written\n")
    StateTables.reset(state)  # the tables, as a replica that lost its lease reloads them
    state.reset()
    state.restore(store.load())
    assert logs_of(state)[t0].data == b"kept\n"
