"""Durable state: the ``Store`` protocol and its embedded SQLite implementation.

What survives a restart: queues, jobs (spec as serialized proto) with their phase, conditions and
task statuses, the decision log with each decision's outcome, backend registrations, and the
id counters (next decision id, next cycle id, job creation index) plus the server id. Nodes are not
stored: adapters re-send them (RegisterBackend + SyncSnapshot) after a restart.

The state hands the store ``WriteBatch``es (rows already serialized on the event loop); the store
writes each in one transaction. ``SqliteStore`` uses a single connection; the caller serializes
access (one write at a time, from a worker thread), so the connection is opened with
``check_same_thread=False``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio

from server.model import TaskStatus
from server.records import BackendRecord, DecisionRow, JobStatusRecord, TaskRecord

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS queues (name TEXT PRIMARY KEY, spec BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, creation_index INTEGER NOT NULL, spec BLOB NOT NULL, status TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY, job_id TEXT NOT NULL, status INTEGER NOT NULL, node TEXT, backend TEXT,
    devices TEXT NOT NULL, message TEXT NOT NULL, exit_code INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS tasks_by_job ON tasks (job_id);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY, backend TEXT NOT NULL, cycle_id INTEGER NOT NULL, task_id TEXT NOT NULL,
    kind TEXT NOT NULL, payload BLOB NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL,
    deadline REAL NOT NULL);
CREATE INDEX IF NOT EXISTS decisions_pending ON decisions (state) WHERE state = 'pending';
CREATE TABLE IF NOT EXISTS backends (
    name TEXT PRIMARY KEY, kind TEXT NOT NULL, labels TEXT NOT NULL, last_decision_id INTEGER NOT NULL);
"""


@dataclass
class StoredJob:
    id: str
    creation_index: int
    spec: bytes
    status: JobStatusRecord
    tasks: list[TaskRecord]


@dataclass
class StoredState:
    meta: dict[str, str]
    queues: dict[str, bytes]
    jobs: list[StoredJob]
    pending_decisions: list[DecisionRow]
    backends: list[BackendRecord]


@dataclass
class WriteBatch:
    meta: dict[str, str] = field(default_factory=dict)
    queues: dict[str, bytes] = field(default_factory=dict)
    deleted_queues: set[str] = field(default_factory=set)
    jobs: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # id -> (id, idx, spec, status)
    tasks: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    decisions: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    backends: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def empty(self) -> bool:
        return not (
            self.meta
            or self.queues
            or self.deleted_queues
            or self.jobs
            or self.tasks
            or self.decisions
            or self.backends
        )


class Store(Protocol):
    def load(self) -> StoredState: ...

    def write(self, batch: WriteBatch) -> None: ...

    def decision_states(self, ids: list[int]) -> dict[int, tuple[str, str, bytes]]:
        """id -> (backend, state, serialized pb.Decision) for the ids that exist."""
        ...

    def close(self) -> None: ...


class SqliteStore:
    """SQLite in WAL mode; one connection, accessed by one thread at a time (caller's lock)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=OFF")
        self._db.executescript(SCHEMA)

    def load(self) -> StoredState:
        db = self._db
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        queues = {name: bytes(spec) for name, spec in db.execute("SELECT name, spec FROM queues")}
        tasks_by_job: dict[str, list[TaskRecord]] = {}
        for uid, job_id, status, node, backend, devices, message, exit_code in db.execute(
            "SELECT id, job_id, status, node, backend, devices, message, exit_code FROM tasks"
        ):
            role, _, index = uid[len(job_id) + 1 :].rpartition("-")
            tasks_by_job.setdefault(job_id, []).append(
                TaskRecord(
                    uid=uid,
                    job_id=job_id,
                    role=role,
                    index=int(index),
                    status=TaskStatus(status),
                    node=node,
                    backend=backend or "",
                    devices=json.loads(devices),
                    message=message,
                    exit_code=exit_code,
                )
            )
        jobs = [
            StoredJob(
                id=job_id,
                creation_index=idx,
                spec=bytes(spec),
                status=JobStatusRecord.from_json(status),
                tasks=tasks_by_job.get(job_id, []),
            )
            for job_id, idx, spec, status in db.execute(
                "SELECT id, creation_index, spec, status FROM jobs ORDER BY creation_index"
            )
        ]
        pending = [
            DecisionRow(i, b, c, t, k, bytes(p), s, r, d)
            for i, b, c, t, k, p, s, r, d in db.execute(
                "SELECT id, backend, cycle_id, task_id, kind, payload, state, reason, deadline "
                "FROM decisions WHERE state = 'pending' ORDER BY id"
            )
        ]
        backends = [
            BackendRecord(name, kind, json.loads(labels), last)
            for name, kind, labels, last in db.execute(
                "SELECT name, kind, labels, last_decision_id FROM backends"
            )
        ]
        return StoredState(meta, queues, jobs, pending, backends)

    def write(self, batch: WriteBatch) -> None:
        if batch.empty():
            return
        db = self._db
        db.execute("BEGIN")
        try:
            if batch.meta:
                db.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    batch.meta.items(),
                )
            if batch.deleted_queues:
                db.executemany("DELETE FROM queues WHERE name = ?", [(n,) for n in batch.deleted_queues])
            if batch.queues:
                db.executemany("INSERT OR REPLACE INTO queues (name, spec) VALUES (?, ?)", batch.queues.items())
            if batch.jobs:
                db.executemany(
                    "INSERT OR REPLACE INTO jobs (id, creation_index, spec, status) VALUES (?, ?, ?, ?)",
                    batch.jobs.values(),
                )
            if batch.tasks:
                db.executemany(
                    "INSERT OR REPLACE INTO tasks (id, job_id, status, node, backend, devices, message, "
                    "exit_code) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    batch.tasks.values(),
                )
            if batch.decisions:
                db.executemany(
                    "INSERT OR REPLACE INTO decisions (id, backend, cycle_id, task_id, kind, payload, state, "
                    "reason, deadline) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    batch.decisions.values(),
                )
            if batch.backends:
                db.executemany(
                    "INSERT OR REPLACE INTO backends (name, kind, labels, last_decision_id) VALUES (?, ?, ?, ?)",
                    batch.backends.values(),
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def decision_states(self, ids: list[int]) -> dict[int, tuple[str, str, bytes]]:
        out: dict[int, tuple[str, str, bytes]] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for i, backend, state, payload in self._db.execute(
                f"SELECT id, backend, state, payload FROM decisions WHERE id IN ({marks})", chunk
            ):
                out[i] = (backend, state, bytes(payload))
        return out

    def close(self) -> None:
        self._db.close()


class StoreWriter:
    """Serializes store access from async code: one batch at a time, in a worker thread.

    The batch is drained from the state inside the lock, so batches reach the store in the order
    their changes happened and a later batch always carries the newer value of a row.
    """

    def __init__(self, store: Store) -> None:

        self.store = store
        self._lock = anyio.Lock()

    async def flush(self, drain: Callable[[], WriteBatch]) -> None:

        async with self._lock:
            batch = drain()
            if not batch.empty():
                await anyio.to_thread.run_sync(self.store.write, batch)

    async def decision_states(self, ids: list[int]) -> dict[int, tuple[str, str, bytes]]:

        if not ids:
            return {}
        async with self._lock:
            return await anyio.to_thread.run_sync(self.store.decision_states, ids)

    async def close(self) -> None:
        async with self._lock:
            self.store.close()
