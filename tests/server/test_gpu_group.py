"""KAI GPU sharing's shared GPU (``gpu_group``) as a field of its own: from the cycle to the bind
decision, the task record, the store and the API, and back after a restart; and what was written
before the field existed (a fractional task's shared GPU as the one entry of ``devices``): stored
task rows (SQLite and PostgreSQL), backends' snapshots and decisions still pending (no network)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from server_test_helpers import node, rl

from muster.devices import NVIDIA_GPU, shared_gpu
from muster.v1 import muster_pb2 as pb
from server.config import load_config
from server.model import CycleResult, TaskStatus
from server.scheduler import SchedulerCore
from server.service import commands, ingest, snapshot, validate
from server.service.api import queries
from server.service.apply import apply
from server.service.decisions import DecisionLog
from server.service.records import JobStatusRecord, TaskRecord
from server.service.state import ClusterState
from server.service.store import SqliteStore, Store, StoredState

KAI_CONFIG = (Path(__file__).resolve().parents[2] / "examples" / "config-kai.yaml").read_text()


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def gpu_node(name: str, gpus: int = 1) -> pb.Node:
    n = node(name, cpu="8", memory="32Gi")
    n.allocatable.quantities[NVIDIA_GPU] = str(gpus)  # device ids made up: "0", "1" ...
    return n


def new_state() -> ClusterState:
    c = ClusterState(DecisionLog(bind_timeout=30), clock=Clock())
    ingest.register_backend(c, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(c, pb.SyncSnapshotRequest(backend="a", nodes=[gpu_node("g0")]))
    return c


def shared_job(job_id: str, fraction: float, replicas: int = 1) -> pb.JobSpec:
    group = pb.TaskGroup(role="w", replicas=replicas, request=rl(cpu="1"), gpu_fraction=fraction)
    return pb.JobSpec(id=job_id, task_groups=[group])


def whole_job(job_id: str) -> pb.JobSpec:
    request = rl(cpu="1")
    request.quantities[NVIDIA_GPU] = "1"
    return pb.JobSpec(id=job_id, task_groups=[pb.TaskGroup(role="w", replicas=1, request=request)])


def run_cycle(state: ClusterState) -> CycleResult:
    capture = snapshot.capture(state)
    result = SchedulerCore(load_config(KAI_CONFIG)).run_cycle(
        capture.materialize(), capture.cycle_id
    )
    apply(state, capture, result)
    return result


def binds(state: ClusterState) -> dict[str, pb.BindDecision]:
    return {
        p.row.task_id: p.decision.bind
        for p in state.decisions.pending.values()
        if p.row.kind == "bind"
    }


def placed(state: ClusterState) -> dict[str, tuple[list[str], list[str]]]:
    """Task -> (whole devices, shared GPUs) as the next cycle sees them."""
    return {
        t.uid: (t.devices, t.gpu_groups)
        for j in snapshot.capture(state).materialize().jobs
        for t in j.tasks
        if t.node
    }


def test_shared_gpu_helper_reads_both_encodings() -> None:
    assert shared_gpu("0", [], 0.5) == ("0", [])
    assert shared_gpu("", ["0"], 0.5) == ("0", [])  # before gpu_group existed
    assert shared_gpu("", ["0"], 0.0) == ("", ["0"])  # a whole device stays one
    assert shared_gpu("", ["0", "1"], 0.5) == ("", ["0", "1"])  # never one GPU: left as it is
    assert shared_gpu("", [], 0.5) == ("", [])


def test_the_shared_gpu_goes_from_the_cycle_to_gpu_group_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    state = new_state()
    commands.submit_job(state, shared_job("half", 0.5, replicas=2))
    assert run_cycle(state).bind_gpu_groups == {"half/w-0": ["0"], "half/w-1": ["0"]}
    for bind in binds(state).values():
        assert (bind.gpu_group, list(bind.devices), bind.gpu_fraction) == ("0", [], 0.5)
    view = queries.get_job(state, "half")
    assert [(t.gpu_group, list(t.devices)) for t in view.tasks] == [("0", [])] * 2
    g0 = queries.list_nodes(state, "").nodes[0]
    assert dict(g0.device_holders) == {"0": "half/w-1"}  # a shared GPU is held, as before
    assert placed(state) == {"half/w-0": ([], ["0"]), "half/w-1": ([], ["0"])}
    store = SqliteStore(str(tmp_path / "s.db"))
    try:
        store.write(state.commit())
        stored = store.job("half")
        assert stored is not None
        assert [(t.gpu_group, t.devices) for t in stored.tasks] == [("0", [])] * 2
        again = ClusterState(DecisionLog(bind_timeout=30), clock=Clock())
        again.restore(store.load())
        assert placed(again) == {"half/w-0": ([], ["0"]), "half/w-1": ([], ["0"])}
        # The GPU is full: neither a third share nor a whole GPU fits beside the two halves.
        ingest.register_backend(again, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
        running = [
            pb.BackendTask(
                task_id=f"half/w-{i}",
                node="g0",
                status=pb.TASK_STATUS_RUNNING,
                request=rl(cpu="1"),
                gpu_fraction=0.5,
                gpu_group="0",
            )
            for i in range(2)
        ]
        ingest.sync_snapshot(
            again, pb.SyncSnapshotRequest(backend="a", nodes=[gpu_node("g0")], tasks=running)
        )
        assert [again.tasks[f"half/w-{i}"].gpu_group for i in range(2)] == ["0", "0"]
        commands.submit_job(again, shared_job("third", 0.3))
        commands.submit_job(again, whole_job("whole"))
        assert run_cycle(again).binds == {}
    finally:
        store.close()


def test_a_released_task_shares_no_gpu_any_more() -> None:
    state = new_state()
    commands.submit_job(state, shared_job("half", 0.5))
    run_cycle(state)
    rec = state.tasks["half/w-0"]
    assert rec.gpu_group == "0"
    state.to_pending(rec, "lost")
    assert (rec.gpu_group, rec.devices, rec.node) == ("", [], None)


# -- what was written before gpu_group existed ------------------------------------------------------


def _old_rows() -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """A fractional task and a whole-GPU task as a server before gpu_group stored them (both
    naming GPU "0" in devices: the fraction tells them apart): job rows and task rows (without
    the gpu_group column)."""
    jobs, tasks = [], []
    for index, (spec, node_name) in enumerate(
        [(shared_job("half", 0.5), "g0"), (whole_job("whole"), "g1")], start=1
    ):
        valid = validate.normalize_job(spec)
        st = JobStatusRecord(phase=pb.JOB_PHASE_RUNNING)
        jobs.append(
            (
                valid.spec.id,
                index,
                valid.spec.SerializeToString(deterministic=True),
                st.to_json(),
                "default",
                valid.spec.namespace,
                int(st.phase),
                0.0,
                "",
            )
        )
        rec = TaskRecord(
            f"{valid.spec.id}/w-0",
            valid.spec.id,
            "w",
            0,
            TaskStatus.RUNNING,
            node_name,
            "a",
            devices=["0"],
        )
        tasks.append(rec.row()[:8])  # the columns a task row had then
    return jobs, tasks


def _write_old_sqlite(path: Path) -> None:
    SqliteStore(path).close()  # today's schema, then back to the tasks table of before
    jobs, tasks = _old_rows()
    db = sqlite3.connect(path)
    try:
        db.execute("ALTER TABLE tasks DROP COLUMN gpu_group")
        db.executemany(f"INSERT INTO jobs VALUES ({', '.join('?' * 9)})", jobs)
        db.executemany(
            "INSERT INTO tasks (id, job_id, status, node, backend, devices, message, exit_code) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            tasks,
        )
        db.commit()
    finally:
        db.close()


def _write_old_postgres(dsn: str) -> None:
    from server.service.pgstore import SCHEMA_V1

    jobs, tasks = _old_rows()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA_V1.encode())
        conn.execute(
            "CREATE TABLE schema_migrations "
            "(version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute("INSERT INTO schema_migrations (version) VALUES (1)")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO jobs (id, creation_index, spec, status, queue, namespace, phase, "
                f"finish_time, owner) VALUES ({', '.join(['%s'] * 9)})",
                jobs,
            )
            cur.executemany(
                "INSERT INTO tasks (id, job_id, status, node, backend, devices, message, "
                f"exit_code) VALUES ({', '.join(['%s'] * 8)})",
                tasks,
            )


@pytest.fixture(params=["sqlite", "postgres"])
def old_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Opens (today's server) a store an older server wrote, migrating it."""
    opened: list[Store] = []
    if request.param == "sqlite":
        path = tmp_path / "old.db"
        _write_old_sqlite(path)

        def open_one() -> Store:
            opened.append(SqliteStore(path))
            return opened[-1]
    else:
        from server.service.pgstore import PostgresStore

        dsn: str = request.getfixturevalue("pg_dsn")
        _write_old_postgres(dsn)

        def open_one() -> Store:
            opened.append(PostgresStore(dsn, application_name="muster-test-gpu-group"))
            return opened[-1]

    yield open_one
    for store in opened:
        store.close()


def test_a_task_row_stored_before_gpu_group_is_read_as_sharing_its_gpu(
    old_store: Callable[[], Store],
) -> None:
    store = old_store()
    loaded: StoredState = store.load()
    rows = {t.uid: (t.gpu_group, t.devices) for j in loaded.jobs for t in j.tasks}
    assert rows == {"half/w-0": ("", ["0"]), "whole/w-0": ("", ["0"])}  # as written
    state = ClusterState(DecisionLog(bind_timeout=30), clock=Clock())
    state.restore(loaded)
    half, whole = state.tasks["half/w-0"], state.tasks["whole/w-0"]
    assert (half.gpu_group, half.devices) == ("0", [])  # its fraction says: a shared GPU
    assert (whole.gpu_group, whole.devices) == ("", ["0"])
    assert queries.get_job(state, "half").tasks[0].gpu_group == "0"
    # Written again in today's form, it reads back so without any help.
    state.tasks["half/w-0"].message = "seen"
    state.changes.tasks.add("half/w-0")
    store.write(state.commit())
    again = {t.uid: (t.gpu_group, t.devices) for j in store.load().jobs for t in j.tasks}
    assert again["half/w-0"] == ("0", [])


def test_backends_naming_the_shared_gpu_in_devices_are_still_understood() -> None:
    state = new_state()
    commands.submit_job(state, shared_job("half", 0.5))
    run_cycle(state)
    # An agent before gpu_group reports the task with its GPU in devices, and a foreign pod so.
    old = pb.BackendTask(
        task_id="half/w-0",
        node="g0",
        status=pb.TASK_STATUS_RUNNING,
        request=rl(cpu="1"),
        devices=["0"],
        gpu_fraction=0.5,
    )
    foreign = pb.BackendTask(
        task_id="pod-x",
        node="g0",
        status=pb.TASK_STATUS_RUNNING,
        request=rl(cpu="1"),
        foreign_task=True,
        devices=["0"],
        gpu_fraction=0.25,
    )
    ingest.sync_snapshot(
        state, pb.SyncSnapshotRequest(backend="a", nodes=[gpu_node("g0")], tasks=[old, foreign])
    )
    rec = state.tasks["half/w-0"]
    assert (rec.gpu_group, rec.devices) == ("0", [])
    seen = snapshot.capture(state).materialize().foreign_tasks
    assert [(t.name, t.devices, t.gpu_groups) for t in seen] == [("pod-x", [], ["0"])]
    # The foreign share counts: 0.5 + 0.25 leave 0.25 of GPU "0", so a 0.3 share does not fit.
    commands.submit_job(state, shared_job("more", 0.3))
    assert run_cycle(state).binds == {}


def test_a_late_ack_of_a_bind_issued_before_gpu_group_keeps_the_shared_gpu() -> None:
    state = new_state()
    commands.submit_job(state, shared_job("half", 0.5))
    run_cycle(state)
    (pending,) = [p for p in state.decisions.pending.values() if p.row.kind == "bind"]
    decision = pb.Decision()
    decision.CopyFrom(pending.decision)
    assert ingest.expire(state, now=decision.deadline.seconds + 1) == 1
    rec = state.tasks["half/w-0"]
    assert (rec.status, rec.gpu_group) == (TaskStatus.PENDING, "")
    # The decision as an older server issued (and stored) it, read back from the store.
    decision.bind.ClearField("gpu_group")
    decision.bind.devices[:] = ["0"]
    state.decisions.recent.pop(decision.id)
    settled = {decision.id: ("a", "expired", decision.SerializeToString())}
    late = pb.DecisionAck(decision_id=decision.id, applied=True)
    ingest.ack(state, pb.AckDecisionsRequest(backend="a", acks=[late]), settled)
    assert (rec.status, rec.gpu_group, rec.devices) == (TaskStatus.BOUND, "0", [])
