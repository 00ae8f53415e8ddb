"""The ``Store`` contract, run against both implementations: SQLite (a file) and PostgreSQL (a
fresh database of a throwaway cluster). Rows are built the way ``ClusterState`` builds them
(``TaskRecord.row()``, ``DecisionRow.row()``, the documented job and backend tuples)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from server_test_helpers import gang

from muster.v1 import muster_pb2 as pb
from server.model import PodGroupPhase, TaskStatus
from server.service.records import BackendRecord, DecisionRow, JobStatusRecord, TaskRecord
from server.service.store import SqliteStore, StateFileError, Store, StoredJob, WriteBatch

Opener = Callable[[], Store]

PENDING = pb.JOB_PHASE_PENDING
RUNNING = pb.JOB_PHASE_RUNNING
COMPLETED = pb.JOB_PHASE_COMPLETED
FAILED = pb.JOB_PHASE_FAILED


@pytest.fixture(params=["sqlite", "postgres"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens a store on the same place each call (the caller closes it: SQLite allows one open
    store per file)."""
    opened: list[Store] = []
    if request.param == "sqlite":
        path = tmp_path / "state.db"

        def open_one() -> Store:
            opened.append(SqliteStore(path))
            return opened[-1]
    else:
        from server.service.pgstore import PostgresStore

        dsn: str = request.getfixturevalue("pg_dsn")

        def open_one() -> Store:
            opened.append(PostgresStore(dsn, application_name="muster-test-contract"))
            return opened[-1]

    yield open_one
    for store in opened:
        store.close()


@pytest.fixture
def store(opener: Opener) -> Store:
    return opener()


def reopen(store: Store, opener: Opener) -> Store:
    store.close()
    return opener()


def status(phase: int, finish: float = 0.0, **kw: Any) -> JobStatusRecord:
    return JobStatusRecord(phase=phase, finish_time=finish, **kw)


def job_row(
    job_id: str,
    index: int,
    *,
    phase: int = PENDING,
    finish: float = 0.0,
    queue: str = "default",
    namespace: str = "",
    owner: str = "",
    replicas: int = 2,
    st: JobStatusRecord | None = None,
) -> tuple[Any, ...]:
    """(id, creation index, spec, status json, queue, namespace, phase, finish time, owner)"""
    spec = gang(job_id, replicas=replicas, cpu="1", queue=queue, namespace=namespace, owner=owner)
    record = st or status(phase, finish)
    return (
        job_id,
        index,
        spec.SerializeToString(deterministic=True),
        record.to_json(),
        queue,
        namespace,
        int(record.phase),
        record.finish_time,
        owner,
    )


def task(
    job_id: str,
    i: int,
    st: TaskStatus = TaskStatus.PENDING,
    node: str | None = None,
    **kw: Any,
) -> TaskRecord:
    return TaskRecord(
        f"{job_id}/worker-{i}", job_id, "worker", i, st, node, "a" if node else "", **kw
    )


def task_rows(*tasks: TaskRecord) -> dict[str, tuple[Any, ...]]:
    return {t.uid: t.row() for t in tasks}


def decision(
    i: int, state: str = "pending", payload: bytes = b"", deadline: float = 0.0
) -> DecisionRow:
    body = payload or pb.Decision(id=i, backend="a").SerializeToString()
    return DecisionRow(i, "a", 7, f"j{i}/worker-0", "bind", body, state, "", deadline)


def backend_row(b: BackendRecord) -> tuple[Any, ...]:
    return (b.name, b.kind, json.dumps(b.labels), b.last_decision_id)


def ids(jobs: list[StoredJob]) -> list[str]:
    return [j.id for j in jobs]


# -- round trip -----------------------------------------------------------------------------------


def test_every_row_kind_round_trips(store: Store, opener: Opener) -> None:
    cond_status = status(
        RUNNING,
        sched_phase=PodGroupPhase.RUNNING,
        submit_time=10.5,
        start_time=11.25,
        explanation={"gate": "x", "summary": "y"},
        schedule_state="s",
        leader_restarts=2,
    )
    jobs = {
        "j1": job_row("j1", 1, st=cond_status, queue="team", namespace="ns", owner="alice"),
        "j2": job_row("j2", 2),
    }
    tasks = [
        task("j1", 0, TaskStatus.RUNNING, "n0", devices=["gpu0", "gpu1"], message="m", exit_code=3),
        task("j1", 1, TaskStatus.BINDING, "n1"),
        task("j2", 0, message="bind refused"),  # Pending, with something to say
        task("j2", 1),  # as submitted: not read back (the job builds it from its spec)
    ]
    decisions = [decision(1), decision(2, "applied"), decision(3, deadline=99.5)]
    backends = [BackendRecord("a", "slurm", {"site": "x"}, 3), BackendRecord("b", "k8s", {}, 0)]
    store.write(
        WriteBatch(
            meta={"server_id": "s-1", "next_cycle_id": "8"},
            queues={"team": pb.Queue(name="team", weight=2).SerializeToString(), "q2": b"\x00\xff"},
            jobs=jobs,
            tasks=task_rows(*tasks),
            decisions={d.id: d.row() for d in decisions},
            backends={b.name: backend_row(b) for b in backends},
        )
    )
    store = reopen(store, opener)
    loaded = store.load()
    assert loaded.meta == {"server_id": "s-1", "next_cycle_id": "8"}
    assert loaded.queues == {
        "team": pb.Queue(name="team", weight=2).SerializeToString(),
        "q2": b"\x00\xff",
    }
    assert ids(loaded.jobs) == ["j1", "j2"]
    j1 = loaded.jobs[0]
    assert type(j1.spec) is bytes
    assert j1.spec == jobs["j1"][2]
    assert j1.creation_index == 1
    assert j1.status == cond_status
    assert sorted(j1.tasks, key=lambda t: t.uid) == tasks[:2]
    assert loaded.jobs[1].tasks == [tasks[2]]
    # Only pending decisions come back, in id order, every field as written.
    assert loaded.pending_decisions == [decisions[0], decisions[2]]
    assert sorted(loaded.backends, key=lambda b: b.name) == backends
    assert store.decision_states([1, 2, 3, 99]) == {
        1: ("a", "pending", decisions[0].payload),
        2: ("a", "applied", decisions[1].payload),
        3: ("a", "pending", decisions[2].payload),
    }
    assert store.decision_states([]) == {}


def test_an_empty_store_loads_empty(store: Store) -> None:
    store.write(WriteBatch())  # nothing to write: nothing happens
    loaded = store.load(finished_before=1e12)
    assert (loaded.meta, loaded.queues, loaded.jobs) == ({}, {}, [])
    assert (loaded.pending_decisions, loaded.backends) == ([], [])


def test_deleted_queues_are_gone_and_can_be_created_again(store: Store, opener: Opener) -> None:
    store.write(WriteBatch(queues={"a": b"A1", "b": b"B1", "c": b"C1"}))
    store.write(WriteBatch(deleted_queues={"a", "never-existed"}))
    assert store.load().queues == {"b": b"B1", "c": b"C1"}
    # Deleted and created again in one batch (the state drops it from deleted_queues; the store
    # deletes first in any case), and deleted then re-created in two.
    store.write(WriteBatch(queues={"b": b"B2"}, deleted_queues={"b", "c"}))
    store.write(WriteBatch(queues={"a": b"A2"}))
    store = reopen(store, opener)
    assert store.load().queues == {"a": b"A2", "b": b"B2"}


# -- upserts --------------------------------------------------------------------------------------


def test_rows_are_updated_in_place_and_what_never_changes_is_not_rewritten(
    store: Store, opener: Opener
) -> None:
    first = job_row("j", 5, queue="q1")
    store.write(
        WriteBatch(
            jobs={"j": first},
            tasks=task_rows(task("j", 0), task("j", 1)),
            decisions={1: decision(1, payload=b"P1").row()},
            backends={"a": backend_row(BackendRecord("a", "slurm", {"x": "1"}, 1))},
            meta={"k": "1"},
        )
    )
    # The same ids again: another spec and index (never rewritten), new status and columns.
    other = job_row("j", 9, phase=RUNNING, queue="q2", namespace="ns", owner="bob", replicas=5)
    moved = task("j", 0, TaskStatus.RUNNING, "n3", devices=["d"], message="ok", exit_code=1)
    store.write(
        WriteBatch(
            jobs={"j": other},
            tasks=task_rows(moved),
            decisions={1: decision(1, "applied", payload=b"P2").row()},
            backends={"a": backend_row(BackendRecord("a", "k8s", {"y": "2"}, 4))},
            meta={"k": "2"},
        )
    )
    store = reopen(store, opener)
    loaded = store.load()
    (job,) = loaded.jobs
    assert job.spec == first[2]
    assert job.creation_index == 5
    assert job.status.phase == RUNNING
    assert job.tasks == [moved]  # (task 1 is as submitted: not read back)
    assert loaded.pending_decisions == []
    assert store.decision_states([1]) == {1: ("a", "applied", b"P1")}
    assert loaded.backends == [BackendRecord("a", "k8s", {"y": "2"}, 4)]
    assert loaded.meta == {"k": "2"}
    # The filter columns follow the status write: the archive finds the job under its new queue.
    assert ids(store.jobs_page(0, "q2", "ns", [RUNNING], 10, owner="bob")) == ["j"]
    assert store.jobs_page(0, "q1", "", [], 10) == []


def test_a_damaged_task_row_is_refused_even_when_it_says_nothing_else(
    store: Store, opener: Opener
) -> None:
    """A restart skips task rows as submitted, but not one whose id is not its job's: reading it
    refuses the store, as it did before rows were skipped."""
    damaged = TaskRecord("j1-garbage", "j1", "worker", 0)
    store.write(WriteBatch(jobs={"j1": job_row("j1", 1)}, tasks=task_rows(damaged)))
    with pytest.raises(StateFileError, match="cannot be read"):
        reopen(store, opener).load()


# -- load's cutoff --------------------------------------------------------------------------------


def test_load_leaves_out_jobs_finished_before_the_cutoff_unless_a_task_holds_a_node(
    store: Store,
) -> None:
    jobs = {
        "active": job_row("active", 1, phase=RUNNING),
        "old": job_row("old", 2, phase=COMPLETED, finish=100.0),
        "recent": job_row("recent", 3, phase=FAILED, finish=1000.0),
        "holding": job_row("holding", 4, phase=COMPLETED, finish=100.0),
        "released": job_row("released", 5, phase=COMPLETED, finish=100.0),
        "at-cutoff": job_row("at-cutoff", 6, phase=COMPLETED, finish=500.0),
    }
    tasks = [
        task("active", 0, TaskStatus.RUNNING, "n0"),
        task("old", 0, TaskStatus.SUCCEEDED),
        task("holding", 0, TaskStatus.SUCCEEDED),
        task("holding", 1, TaskStatus.RELEASING, "n1"),  # an eviction not yet acknowledged
        task("released", 0, TaskStatus.FAILED),
        task("recent", 0, TaskStatus.FAILED),
    ]
    store.write(WriteBatch(jobs=jobs, tasks=task_rows(*tasks)))
    kept = store.load(finished_before=500.0)
    assert ids(kept.jobs) == ["active", "recent", "holding", "at-cutoff"]
    holding = next(j for j in kept.jobs if j.id == "holding")
    assert sorted(t.uid for t in holding.tasks) == ["holding/worker-0", "holding/worker-1"]
    assert [t.uid for t in kept.jobs[0].tasks] == ["active/worker-0"]
    everything = store.load()
    assert ids(everything.jobs) == ["active", "old", "recent", "holding", "released", "at-cutoff"]
    assert sum(len(j.tasks) for j in everything.jobs) == len(tasks)


# -- the archive reads ----------------------------------------------------------------------------


@pytest.fixture
def archive(store: Store) -> Store:
    """Ten jobs; creation order differs from id order."""
    specs = [
        # id, index, queue, namespace, owner, phase
        ("j0", 10, "a", "x", "alice", COMPLETED),
        ("j1", 3, "a", "y", "bob", FAILED),
        ("j2", 7, "b", "x", "", COMPLETED),
        ("j3", 1, "b", "y", "alice", RUNNING),
        ("j4", 5, "a", "x", "carol", COMPLETED),
        ("j5", 2, "c", "x", "bob", PENDING),
        ("j6", 8, "a", "y", "alice", COMPLETED),
        ("j7", 4, "c", "y", "", FAILED),
        ("j8", 9, "b", "x", "bob", COMPLETED),
        ("j9", 6, "a", "x", "alice", COMPLETED),
    ]
    jobs = {
        i: job_row(i, idx, queue=q, namespace=ns, owner=o, phase=p, finish=1.0)
        for i, idx, q, ns, o, p in specs
    }
    tasks = [task(i, k, TaskStatus.SUCCEEDED) for i, *_ in specs for k in range(2)]
    store.write(WriteBatch(jobs=jobs, tasks=task_rows(*tasks)))
    return store


def test_job_reads_a_stored_job_with_its_tasks(archive: Store) -> None:
    job = archive.job("j4")
    assert job is not None
    assert (job.id, job.creation_index, job.status.phase) == ("j4", 5, COMPLETED)
    assert pb.JobSpec.FromString(job.spec).queue == "a"
    assert sorted(t.uid for t in job.tasks) == ["j4/worker-0", "j4/worker-1"]
    assert all(t.status == TaskStatus.SUCCEEDED for t in job.tasks)
    assert archive.job("nope") is None


def test_jobs_page_is_in_creation_order_and_pages_with_after_index(archive: Store) -> None:
    # By creation index: j3 j5 j1 j7 j4 j9 j2 j6 j8 j0
    assert ids(archive.jobs_page(0, "", "", [], 100)) == [
        "j3", "j5", "j1", "j7", "j4", "j9", "j2", "j6", "j8", "j0",
    ]  # fmt: skip
    first = archive.jobs_page(0, "", "", [], 4)
    assert ids(first) == ["j3", "j5", "j1", "j7"]
    assert ids(archive.jobs_page(first[-1].creation_index, "", "", [], 4)) == [
        "j4",
        "j9",
        "j2",
        "j6",
    ]
    assert ids(archive.jobs_page(9, "", "", [], 4)) == ["j0"]
    assert archive.jobs_page(10, "", "", [], 4) == []
    page = archive.jobs_page(0, "", "", [], 3)
    assert all(len(j.tasks) == 2 for j in page)


def test_jobs_page_filters(archive: Store) -> None:
    def page(**kw: Any) -> list[str]:
        args: dict[str, Any] = {"queue": "", "namespace": "", "phases": [], "limit": 100}
        args.update(kw)
        after = args.pop("after", 0)
        return ids(archive.jobs_page(after, **args))

    assert page(queue="a") == ["j1", "j4", "j9", "j6", "j0"]
    assert page(namespace="y") == ["j3", "j1", "j7", "j6"]
    assert page(queue="a", namespace="x") == ["j4", "j9", "j0"]
    assert page(phases=[FAILED]) == ["j1", "j7"]
    assert page(phases=[FAILED, RUNNING, PENDING]) == ["j3", "j5", "j1", "j7"]
    assert page(owner="alice") == ["j3", "j9", "j6", "j0"]
    assert page(before_index=5) == ["j3", "j5", "j1", "j7"]
    assert page(after=2, before_index=7) == ["j1", "j7", "j4", "j9"]
    # readable: jobs of the listed queues, or owned by the user (an empty owner is nobody's).
    assert page(readable=({"c"}, "alice")) == ["j3", "j5", "j7", "j9", "j6", "j0"]
    assert page(readable=(set(), "")) == []
    assert page(readable=(set(), "bob"), queue="b") == ["j8"]


def test_jobs_page_skips_ids_and_still_fills_the_page(archive: Store) -> None:
    skip = {"j3", "j5", "j1", "j4"}
    assert ids(archive.jobs_page(0, "", "", [], 3, skip=skip)) == ["j7", "j9", "j2"]
    assert ids(archive.jobs_page(0, "a", "", [COMPLETED], 2, skip={"j4"})) == ["j9", "j6"]
    everything = {f"j{i}" for i in range(10)}
    assert archive.jobs_page(0, "", "", [], 5, skip=everything) == []


def test_jobs_page_skip_beyond_the_first_scan_chunk(store: Store) -> None:
    """More skipped jobs than one scan reads (at least 100): the scan continues after them."""
    jobs = {
        f"k{i:03d}": job_row(f"k{i:03d}", i + 1, phase=COMPLETED, finish=1.0) for i in range(150)
    }
    store.write(WriteBatch(jobs=jobs))
    skip = {f"k{i:03d}" for i in range(140)}
    assert ids(store.jobs_page(0, "", "", [], 5, skip=skip)) == [f"k{i}" for i in range(140, 145)]


def test_decision_states_answer_the_ids_that_exist(store: Store) -> None:
    store.write(
        WriteBatch(
            decisions={
                i: decision(i, "applied" if i % 2 else "pending").row() for i in range(1, 1201)
            }
        )
    )
    wanted = list(range(0, 1300, 7))
    states = store.decision_states(wanted)
    assert sorted(states) == [i for i in wanted if 1 <= i <= 1200]
    assert states[7] == ("a", "applied", decision(7).payload)
    assert states[14][1] == "pending"
