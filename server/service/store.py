"""Durable state: the ``Store`` protocol and its embedded SQLite implementation.

What survives a restart: queues, jobs (spec as serialized proto) with their phase, conditions and
task statuses, the decision log with each decision's outcome, backend registrations, and the
id counters (next decision id, next cycle id, job creation index) plus the server id. Nodes are not
stored: adapters re-send them (RegisterBackend + SyncSnapshot) after a restart.

The state hands the store ``WriteBatch``es (rows already serialized on the event loop); the store
writes each in one transaction. ``SqliteStore`` writes through one connection; the caller serializes
writes (one at a time, from a worker thread), so it is opened with ``check_same_thread=False``.

Finished jobs leave the server's memory after a retention period (``retention.drop_finished``)
and are then answered from here: ``job`` and ``jobs_page`` (the ``JobArchive`` protocol) read
through a second connection, synchronously on the event loop. A primary-key or indexed-range read
costs well under a millisecond, less than a hop to a worker thread, and WAL lets it run while a
write is under way. ``load`` leaves out the jobs that finished before a cutoff, so a restart does
not bring every finished job back into memory.

The state file, its ``-wal`` / ``-shm`` companions and a directory created for them are private
to the server's user (0600 / 0700): job specs may carry commands and annotations.

One server per file: ``SqliteStore`` holds an exclusive ``flock`` on ``PATH.lock`` from open to
close (``StateLock``; the operating system drops it when the process dies, however it dies), and
the lock file names the holder for the refusal message. A file that is not a Muster state
database is refused at open, before anything is written to it (``StateFileError``). While the
server runs, every write first checks that the path still names the file opened: a state file
deleted or replaced under the server would otherwise take every later write with it, unseen
(``StateFileLost``, a ``DomainError``: the RPC that wanted the write fails, nothing is
acknowledged).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Container, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import anyio
import structlog
from google.protobuf.message import DecodeError

from muster.phases import TERMINAL_PHASES
from muster.v1 import muster_pb2 as pb
from server.model import TaskStatus
from server.service.errors import DomainError, ErrorCode
from server.service.records import (
    BackendRecord,
    DecisionRow,
    JobStatusRecord,
    TaskRecord,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS queues (name TEXT PRIMARY KEY, spec BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, creation_index INTEGER NOT NULL, spec BLOB NOT NULL, status TEXT NOT NULL,
    queue TEXT NOT NULL DEFAULT '', namespace TEXT NOT NULL DEFAULT '', phase INTEGER NOT NULL DEFAULT 0,
    finish_time REAL NOT NULL DEFAULT 0, owner TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY, job_id TEXT NOT NULL, status INTEGER NOT NULL, node TEXT, backend TEXT,
    devices TEXT NOT NULL, message TEXT NOT NULL, exit_code INTEGER NOT NULL,
    gpu_group TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS tasks_by_job ON tasks (job_id);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY, backend TEXT NOT NULL, cycle_id INTEGER NOT NULL, task_id TEXT NOT NULL,
    kind TEXT NOT NULL, payload BLOB NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL,
    deadline REAL NOT NULL);
CREATE INDEX IF NOT EXISTS decisions_pending ON decisions (state) WHERE state = 'pending';
CREATE TABLE IF NOT EXISTS backends (
    name TEXT PRIMARY KEY, kind TEXT NOT NULL, labels TEXT NOT NULL, last_decision_id INTEGER NOT NULL);
"""
# After the columns exist (a store written before they did gains them in _migrate).
INDEXES = """
CREATE INDEX IF NOT EXISTS jobs_by_index ON jobs (creation_index);
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs (phase, finish_time);
"""
# Columns the jobs table gained for reading jobs that are no longer in memory: name -> definition.
JOB_COLUMNS = {
    "queue": "TEXT NOT NULL DEFAULT ''",
    "namespace": "TEXT NOT NULL DEFAULT ''",
    "phase": "INTEGER NOT NULL DEFAULT 0",
    "finish_time": "REAL NOT NULL DEFAULT 0",
    "owner": "TEXT NOT NULL DEFAULT ''",
}
# Columns the tasks table gained: name -> definition. A row written before has the default, and
# ``TaskRecord.read_legacy_shared_gpu`` reads the shared GPU it kept in devices.
TASK_COLUMNS = {"gpu_group": "TEXT NOT NULL DEFAULT ''"}
TERMINAL_SQL = ",".join(str(int(p)) for p in sorted(TERMINAL_PHASES))
# A finished job whose tasks may still hold a node (an eviction not yet acknowledged) stays live.
HOLDING_SQL = ",".join(
    str(int(s))
    for s in (
        TaskStatus.BINDING,
        TaskStatus.BOUND,
        TaskStatus.RUNNING,
        TaskStatus.RELEASING,
        TaskStatus.UNKNOWN,
    )
)
JOB_SELECT = "SELECT id, creation_index, spec, status FROM jobs"
# What a Muster state database may hold, and the columns each table has had from the start: a
# file with other tables (or views), or one of these without its columns, is something else.
MUSTER_TABLES = {
    "meta": {"key", "value"},
    "queues": {"name", "spec"},
    "jobs": {"id", "creation_index", "spec", "status"},
    "tasks": {"id", "job_id", "status", "node", "backend", "devices", "message", "exit_code"},
    "decisions": {
        "id",
        "backend",
        "cycle_id",
        "task_id",
        "kind",
        "payload",
        "state",
        "reason",
        "deadline",
    },
    "backends": {"name", "kind", "labels", "last_decision_id"},
    "task_logs": {"task_id", "job_id", "written", "dropped", "eof"},
    "task_log_chunks": {"task_id", "chunk", "start", "data"},
}
# Task output (server.service.logs) and the history's order (finish time): tables and an index a
# store written before they existed gains at open (all ``IF NOT EXISTS``). A task's output is a
# summary row (bytes written, bytes dropped from the front, eof) and its kept bytes in segments
# (``chunk`` numbers grow; ``start`` is the offset of a segment's first byte in the whole output).
LOG_SCHEMA = """
CREATE TABLE IF NOT EXISTS task_logs (
    task_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, written INTEGER NOT NULL,
    dropped INTEGER NOT NULL, eof INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS task_logs_by_job ON task_logs (job_id);
CREATE TABLE IF NOT EXISTS task_log_chunks (
    task_id TEXT NOT NULL, chunk INTEGER NOT NULL, start INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (task_id, chunk));
CREATE INDEX IF NOT EXISTS jobs_by_finish ON jobs (finish_time, creation_index);
"""
LOCK_SUFFIX = ".lock"

log = structlog.get_logger("muster.store")


class StateFileError(Exception):
    """The state file cannot be used: it is not a Muster state database, or cannot be opened."""


class StateFileInUse(StateFileError):
    """Another process (another server) holds the state file's lock."""


class StateFileLost(DomainError):
    """The state file was deleted or replaced while the server ran: no write can be saved."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.FAILED_PRECONDITION, message)


class NotLeader(DomainError):
    """A fenced write found the leader lease lost (taken over or expired): nothing was written."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.UNAVAILABLE, message)


class StoreUnavailable(DomainError):
    """The database could not be reached (or did not answer in time) for a read or a write."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.UNAVAILABLE, message)


def is_postgres_uri(state: str) -> bool:
    """Whether ``--state`` names a PostgreSQL database rather than a SQLite file."""
    return state.lower().startswith(("postgresql://", "postgres://"))


def open_store(
    state: str, *, application_name: str = "muster-server", lease_duration: float = 3.0
) -> Store:
    """The store ``state`` names: a PostgreSQL URI, or else a SQLite file path (or ``:memory:``).
    ``lease_duration``: the replicas' lease; a write stalled for two thirds of it is ended."""
    if is_postgres_uri(state):
        # Imported here: pgstore imports this module.
        from server.service.pgstore import PostgresStore

        return PostgresStore(
            state,
            application_name=application_name,
            write_idle_timeout=lease_duration * 2 / 3,
        )
    return SqliteStore(state)


@dataclass(slots=True)  # (a restart holds a million of them at once)
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
    # The last change-feed sequence the load includes (PostgreSQL; SQLite has no feed: 0). A
    # follower reads the feed from here on.
    seq: int = 0


@dataclass
class WriteBatch:
    meta: dict[str, str] = field(default_factory=dict)
    queues: dict[str, bytes] = field(default_factory=dict)
    deleted_queues: set[str] = field(default_factory=set)
    # id -> (id, creation index, spec, status json, queue, namespace, phase, finish time, owner)
    jobs: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    tasks: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    decisions: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    backends: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # Task output (server.service.logs): per task its summary row (task id, job id, bytes
    # written, bytes dropped, eof); bytes appended to its segments (task id, chunk, start, data),
    # in order; per task the first segment it keeps (older ones are deleted).
    task_logs: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    log_chunks: list[tuple[Any, ...]] = field(default_factory=list)
    log_trims: dict[str, int] = field(default_factory=dict)
    # Run on the event loop once the batch is written (never if the write fails): decisions are
    # sent to backends only when durable.
    after_write: list[Callable[[], None]] = field(default_factory=list)

    def empty(self) -> bool:
        return not (
            self.meta
            or self.queues
            or self.deleted_queues
            or self.jobs
            or self.tasks
            or self.decisions
            or self.backends
            or self.task_logs
            or self.log_chunks
            or self.log_trims
        )


class JobArchive(Protocol):
    """Reads of jobs that left the server's memory (called on the event loop)."""

    def job(self, job_id: str) -> StoredJob | None: ...

    def jobs_page(
        self,
        after_index: int,
        queue: str,
        namespace: str,
        phases: Iterable[int],
        limit: int,
        *,
        before_index: int | None = None,
        skip: Container[str] = (),
        owner: str = "",
        readable: tuple[Collection[str], str] | None = None,
    ) -> list[StoredJob]:
        """Up to ``limit`` jobs created after ``after_index`` (and before ``before_index``)
        matching the filters (empty: any) and whose id is not in ``skip``, in creation order."""
        ...


class Store(JobArchive, Protocol):
    def load(self, finished_before: float | None = None) -> StoredState:
        """Everything a restart needs; jobs that ended before ``finished_before`` (and hold no
        node) are left out: they are answered through the ``JobArchive`` reads."""
        ...

    def write(self, batch: WriteBatch) -> None:
        """One transaction; ``StateFileLost`` (nothing written) once the state file is gone."""
        ...

    def check(self) -> None:
        """``StateFileLost`` if the state file was deleted or replaced since it was opened."""
        ...

    def decision_states(self, ids: list[int]) -> dict[int, tuple[str, str, bytes]]:
        """id -> (backend, state, serialized pb.Decision) for the ids that exist."""
        ...

    def close(self) -> None: ...


def _private_file(path: Path) -> None:
    """Create ``path`` readable by its owner only, or take group / other access off an existing one."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


class StateLock:
    """An exclusive ``flock`` on ``<state>.lock`` for as long as the store is open.

    A lock, not the file's existence, says who holds it: the kernel releases it when the holding
    process exits or is killed, so a server that crashed leaves nothing to clean up (its lock file
    stays, with its details, and is simply locked again). The holder writes
    ``{"program", "pid", "host", "since"}`` into it for the refusal message of the next one, and
    removes it when it lets go.
    """

    def __init__(self, state_path: str, program: str = "muster-server") -> None:
        self.state_path = state_path
        self.path = state_path + LOCK_SUFFIX
        fd = self._acquire()
        self._fd: int | None = fd
        try:
            if os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, 0o600)
            record = {
                "program": program,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        except BaseException:
            self.release()
            raise

    def _acquire(self) -> int:
        # The holder removes the file when it lets go: a lock taken on a file that has since been
        # removed (or replaced) is no lock, so it is taken again on what the path names now.
        for _attempt in range(100):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise StateFileError(f"cannot lock state file {self.state_path}: {exc}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _lock_holder(fd)
                os.close(fd)
                raise StateFileInUse(
                    f"state file {self.state_path} is in use by {holder} (lock file {self.path}); "
                    "stop that server first, or give this one another --state"
                ) from None
            except OSError as exc:  # e.g. a file system without locks
                os.close(fd)
                raise StateFileError(f"cannot lock state file {self.state_path}: {exc}") from None
            except BaseException:
                os.close(fd)
                raise
            st = os.fstat(fd)
            if _file_identity(self.path) == (st.st_dev, st.st_ino):
                return fd
            os.close(fd)
        raise StateFileError(
            f"cannot lock state file {self.state_path}: {self.path} keeps changing"
        )

    def release(self) -> None:
        """Remove the lock file, then let go of the lock (in that order: see ``_acquire``)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            finally:
                os.close(fd)


def _lock_holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it into the lock file."""
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode() or "null")
        return f"{record['program']} pid {record['pid']} on host {record['host']} since {record['since']}"
    except (OSError, ValueError, TypeError, KeyError):
        return "another process (which has not written its details)"


def _file_identity(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of ``path``; None if nothing is there."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_dev, st.st_ino


def _not_muster(path: str, why: str) -> StateFileError:
    return StateFileError(f"state file {path} is not a Muster state database ({why})")


def _sqlite_error(path: str, exc: sqlite3.Error) -> StateFileError:
    """A start-up SQLite error as one line: a damaged or foreign file, or one that cannot be opened."""
    name = getattr(exc, "sqlite_errorname", "")
    if name in ("SQLITE_NOTADB", "SQLITE_CORRUPT") or type(exc) is sqlite3.DatabaseError:
        return _not_muster(path, f"sqlite: {exc}")
    return StateFileError(
        f"cannot use state file {path}: sqlite: {exc}" + (f" ({name})" if name else "")
    )


def _check_muster_database(db: sqlite3.Connection, path: str) -> None:
    """Refuse a file that is not a Muster state database (an empty one is a new store). Only reads."""
    objects = db.execute(
        "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    foreign = sorted(name for kind, name in objects if kind != "table" or name not in MUSTER_TABLES)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise _not_muster(path, f"it has tables Muster does not use: {shown}")
    for _kind, table in objects:
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        missing = MUSTER_TABLES[table] - have
        if missing:
            raise _not_muster(path, f"its {table} table has no {', '.join(sorted(missing))} column")


# A tasks row as ``TaskRecord.row`` writes a task as submitted (Pending, nothing else said), less
# its first two columns (uid and job id).
_SUBMITTED_ROW_TAIL = TaskRecord("", "", "", 0).row()[2:]


def _says_more_than_submitted(row: tuple[Any, ...]) -> bool:
    """Whether a tasks row holds anything a task made fresh from its job's spec would not (a
    status, a node, a message ...). A restart keeps only those rows: the job builds the others
    from its spec when they are used, so a million waiting jobs bring no task rows into memory.
    A row whose id is not its job's (``job/role-index``) is kept too, so that reading it refuses
    the damaged row as before."""
    if row[2:] != _SUBMITTED_ROW_TAIL:
        return True
    uid, job_id = row[0], row[1]
    index = uid.rpartition("-")[2]
    return not (
        uid.startswith(job_id)
        and uid[len(job_id) : len(job_id) + 1] == "/"
        and index.isascii()
        and index.isdigit()
    )


def _task_record(row: tuple[Any, ...]) -> TaskRecord:
    uid, job_id, status, node, backend, devices, message, exit_code, gpu_group = row
    role, _, index = uid[len(job_id) + 1 :].rpartition("-")
    return TaskRecord(
        uid=uid,
        job_id=job_id,
        role=role,
        index=int(index),
        status=TaskStatus(status),
        node=node,
        backend=backend or "",
        devices=json.loads(devices) if devices != "[]" else [],  # most tasks hold no device
        message=message,
        exit_code=exit_code,
        gpu_group=gpu_group,
    )


TASK_SELECT = (
    "SELECT id, job_id, status, node, backend, devices, message, exit_code, gpu_group FROM tasks"
)


class SqliteStore:
    """SQLite in WAL mode: one connection for writes (one thread at a time, the caller's lock) and
    one for the archive reads on the event loop (the same one, under a lock, for ``:memory:``)."""

    def __init__(self, path: str | Path) -> None:
        """Open (or create) the state file; ``StateFileInUse`` if another process has it open,
        ``StateFileError`` if it is not a Muster state database or cannot be opened."""
        self.path = str(path)
        self._lock: StateLock | None = None
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file opened
        self._lost: str | None = None  # why writes are refused, once the file is gone
        memory = self.path == ":memory:"
        if not memory:
            file = Path(self.path)
            if not file.parent.exists():
                file.parent.mkdir(mode=0o700, parents=True)
                file.parent.chmod(0o700)  # mkdir's mode is filtered by the umask
            self._lock = StateLock(self.path)  # before anything reads or writes the file
        try:
            self._open(memory)
        except BaseException:
            if self._lock is not None:
                self._lock.release()
            raise

    def _open(self, memory: bool) -> None:
        existing = not memory and os.path.exists(self.path) and os.path.getsize(self.path) > 0
        if not memory and not existing:
            # SQLite gives the -wal and -shm files the database file's permissions.
            _private_file(Path(self.path))
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise _sqlite_error(self.path, exc) from None
        try:
            if existing:  # look before changing anything: a foreign file is left as it was
                _check_muster_database(self._db, self.path)
                _private_file(Path(self.path))
                for suffix in ("-wal", "-shm"):
                    companion = Path(self.path + suffix)
                    if companion.exists():
                        _private_file(companion)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=OFF")
            self._db.executescript(SCHEMA)
            self._migrate()
            self._db.executescript(INDEXES)
            self._db.executescript(LOG_SCHEMA)
        except sqlite3.Error as exc:
            self._db.close()
            raise _sqlite_error(self.path, exc) from None
        except BaseException:
            self._db.close()
            raise
        self._write_lock = threading.Lock()
        if memory:  # a second connection would open another, empty database
            self._reader, self._read_lock = self._db, self._write_lock
        else:
            self._identity = _file_identity(self.path)
            self._reader = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._reader.execute("PRAGMA query_only=ON")
            self._read_lock = threading.Lock()

    def _migrate(self) -> None:
        """Give a jobs table written before the archive columns existed those columns, filled in,
        and a tasks table the columns it gained since (their defaults)."""
        have_tasks = {row[1] for row in self._db.execute("PRAGMA table_info(tasks)")}
        for name, definition in TASK_COLUMNS.items():
            if name not in have_tasks:  # one statement: atomic on its own
                self._db.execute(f"ALTER TABLE tasks ADD COLUMN {name} {definition}")
        have = {row[1] for row in self._db.execute("PRAGMA table_info(jobs)")}
        missing = [name for name in JOB_COLUMNS if name not in have]
        if not missing:
            return
        db = self._db
        db.execute("BEGIN")
        try:
            for name in missing:
                db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {JOB_COLUMNS[name]}")
            rows = []
            for job_id, spec_blob, status_json in db.execute(
                "SELECT id, spec, status FROM jobs"
            ).fetchall():
                spec = pb.JobSpec.FromString(spec_blob)
                status = JobStatusRecord.from_json(status_json)
                rows.append(
                    (
                        spec.queue,
                        spec.namespace,
                        status.phase,
                        status.finish_time,
                        spec.owner,
                        job_id,
                    )
                )
            db.executemany(
                "UPDATE jobs SET queue = ?, namespace = ?, phase = ?, finish_time = ?, owner = ? WHERE id = ?",
                rows,
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def load(self, finished_before: float | None = None) -> StoredState:
        """Everything a restart needs; ``StateFileError`` if the file cannot be read back (damaged,
        or rows that are not Muster's)."""
        with self._write_lock:
            try:
                return self._load(finished_before)
            except sqlite3.Error as exc:
                raise _sqlite_error(self.path, exc) from None
            except (ValueError, TypeError, KeyError, DecodeError) as exc:
                raise _not_muster(
                    self.path, f"a row cannot be read: {type(exc).__name__}: {exc}"
                ) from None

    def _load(self, finished_before: float | None) -> StoredState:
        db = self._db
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        queues = {name: bytes(spec) for name, spec in db.execute("SELECT name, spec FROM queues")}
        live = "1"
        params: tuple[Any, ...] = ()
        if finished_before is not None:
            live = (
                f"(j.phase NOT IN ({TERMINAL_SQL}) OR j.finish_time >= ? OR EXISTS "
                f"(SELECT 1 FROM tasks h WHERE h.job_id = j.id AND h.status IN ({HOLDING_SQL})))"
            )
            params = (finished_before,)
        tasks_by_job: dict[str, list[TaskRecord]] = {}
        for row in db.execute(
            f"SELECT t.id, t.job_id, t.status, t.node, t.backend, t.devices, t.message, t.exit_code, "
            f"t.gpu_group FROM tasks t JOIN jobs j ON j.id = t.job_id WHERE {live}",
            params,
        ):
            if _says_more_than_submitted(row):
                task = _task_record(row)
                tasks_by_job.setdefault(task.job_id, []).append(task)
        jobs = [
            StoredJob(
                id=job_id,
                creation_index=idx,
                spec=bytes(spec),
                status=JobStatusRecord.from_json(status),
                tasks=tasks_by_job.get(job_id, []),
            )
            for job_id, idx, spec, status in db.execute(
                f"SELECT id, creation_index, spec, status FROM jobs j WHERE {live} ORDER BY creation_index",
                params,
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

    def check(self) -> None:
        """``StateFileLost`` if the path no longer names the file opened (deleted, or another file
        moved over it): what is written would go to an unlinked inode, lost at exit. Costs one
        ``stat``; once lost, always lost (logged once)."""
        if self._lost is None and self._identity is not None:
            now = _file_identity(self.path)
            if now != self._identity:
                what = "deleted" if now is None else "replaced by another file"
                self._lost = (
                    f"state file {self.path} was {what} while the server ran: changes can no longer "
                    "be saved; restart the server"
                )
                log.error(
                    "store.state_file_lost",
                    path=self.path,
                    change=what,
                    effect="writes refused (FAILED_PRECONDITION), no cycles; restart the server",
                )
        if self._lost is not None:
            raise StateFileLost(self._lost)

    @property
    def lost(self) -> str | None:
        """Why writes are refused (the state file is gone), or None."""
        return self._lost

    def write(self, batch: WriteBatch) -> None:
        if batch.empty():
            return
        with self._write_lock:
            self.check()
            self._write(batch)

    def _write(self, batch: WriteBatch) -> None:
        # Rows change in place (upsert), not delete-and-insert (REPLACE): no index churn, and what
        # never changes after the first write (a job's spec and creation index -- a job id comes with
        # one spec --, a task's job, a decision's payload) is not written again.
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
                db.executemany(
                    "DELETE FROM queues WHERE name = ?", [(n,) for n in batch.deleted_queues]
                )
            if batch.queues:
                db.executemany(
                    "INSERT OR REPLACE INTO queues (name, spec) VALUES (?, ?)", batch.queues.items()
                )
            if batch.jobs:
                db.executemany(
                    "INSERT INTO jobs (id, creation_index, spec, status, queue, namespace, phase, finish_time, owner) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET status = excluded.status, "
                    "queue = excluded.queue, namespace = excluded.namespace, phase = excluded.phase, "
                    "finish_time = excluded.finish_time, owner = excluded.owner",
                    batch.jobs.values(),
                )
            if batch.tasks:
                db.executemany(
                    "INSERT INTO tasks (id, job_id, status, node, backend, devices, message, exit_code, "
                    "gpu_group) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
                    "status = excluded.status, node = excluded.node, backend = excluded.backend, "
                    "devices = excluded.devices, message = excluded.message, "
                    "exit_code = excluded.exit_code, gpu_group = excluded.gpu_group",
                    batch.tasks.values(),
                )
            if batch.decisions:
                db.executemany(
                    "INSERT INTO decisions (id, backend, cycle_id, task_id, kind, payload, state, reason, deadline) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET state = excluded.state, "
                    "reason = excluded.reason, deadline = excluded.deadline",
                    batch.decisions.values(),
                )
            if batch.backends:
                db.executemany(
                    "INSERT OR REPLACE INTO backends (name, kind, labels, last_decision_id) VALUES (?, ?, ?, ?)",
                    batch.backends.values(),
                )
            if batch.log_chunks or batch.log_trims or batch.task_logs:
                self._write_logs(batch)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _write_logs(self, batch: WriteBatch) -> None:
        db = self._db
        # Appended in SQL: a segment's earlier bytes are not sent again. (|| makes text of two
        # blobs, byte for byte; the cast makes it a blob again, so length() counts bytes.)
        db.executemany(
            "INSERT INTO task_log_chunks (task_id, chunk, start, data) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(task_id, chunk) DO UPDATE SET "
            "data = CAST(task_log_chunks.data || excluded.data AS BLOB)",
            batch.log_chunks,
        )
        db.executemany(
            "DELETE FROM task_log_chunks WHERE task_id = ? AND chunk < ?", batch.log_trims.items()
        )
        db.executemany(
            "INSERT INTO task_logs (task_id, job_id, written, dropped, eof) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(task_id) DO UPDATE SET written = excluded.written, "
            "dropped = excluded.dropped, eof = excluded.eof",
            batch.task_logs.values(),
        )

    def decision_states(self, ids: list[int]) -> dict[int, tuple[str, str, bytes]]:
        out: dict[int, tuple[str, str, bytes]] = {}
        with self._write_lock:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for i, backend, state, payload in self._db.execute(
                    f"SELECT id, backend, state, payload FROM decisions WHERE id IN ({marks})",
                    chunk,
                ):
                    out[i] = (backend, state, bytes(payload))
        return out

    # -- the archive: jobs no longer in memory ----------------------------------------------------

    def job(self, job_id: str) -> StoredJob | None:
        with self._read_lock:
            row = self._reader.execute(f"{JOB_SELECT} WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                return None
            tasks = [
                _task_record(t)
                for t in self._reader.execute(f"{TASK_SELECT} WHERE job_id = ?", (job_id,))
            ]
        return _stored_job(row, tasks)

    def jobs_page(
        self,
        after_index: int,
        queue: str,
        namespace: str,
        phases: Iterable[int],
        limit: int,
        *,
        before_index: int | None = None,
        skip: Container[str] = (),
        owner: str = "",
        readable: tuple[Collection[str], str] | None = None,
    ) -> list[StoredJob]:
        """``readable``: (queues, user) -- only jobs of those queues or owned by that user."""
        page = JobPageQuery.build(
            queue,
            namespace,
            phases,
            limit,
            before_index=before_index,
            owner=owner,
            readable=readable,
            param="?",
            one_of=_sqlite_one_of,
        )
        with self._read_lock:
            picked = page.pick(
                lambda start: self._reader.execute(page.scan, page.params(start)).fetchall(),
                after_index,
                skip,
            )
            if not picked:
                return []
            rows: list[tuple[Any, ...]] = []
            tasks: dict[str, list[TaskRecord]] = {}
            for part in _chunks(picked, 500):
                marks = ",".join("?" * len(part))
                rows += self._reader.execute(f"{JOB_SELECT} WHERE id IN ({marks})", part).fetchall()
                for t in self._reader.execute(f"{TASK_SELECT} WHERE job_id IN ({marks})", part):
                    task = _task_record(t)
                    tasks.setdefault(task.job_id, []).append(task)
        rows.sort(key=lambda r: r[1])
        return [_stored_job(r, tasks.get(r[0], [])) for r in rows]

    # -- task output and the history --------------------------------------------------------------

    def task_log(self, task_id: str) -> StoredTaskLog | None:
        with self._read_lock:
            rows = self._reader.execute(LOG_INDEX.replace("%s", "?"), (task_id,)).fetchall()
        return _log_index(rows)

    def task_logs_of_job(self, job_id: str) -> dict[str, StoredTaskLog]:
        with self._read_lock:
            rows = self._reader.execute(f"{LOG_SELECT} WHERE job_id = ?", (job_id,)).fetchall()
        return {row[0]: _stored_log(row, []) for row in rows}

    def task_log_bytes(self, task_id: str, start: int, end: int) -> tuple[int, bytes]:
        with self._read_lock:
            rows = self._reader.execute(
                LOG_BYTES.replace("%s", "?"), (task_id, end, start)
            ).fetchall()
        return _log_bytes(rows, start, end)

    def finished_jobs(self, query: HistoryQuery) -> list[FinishedJob]:
        sql, params = query.sql("?", _sqlite_one_of)
        with self._read_lock:
            rows = self._reader.execute(sql, params).fetchall()
            tallies: list[tuple[Any, ...]] = []
            for part in _chunks([r[0] for r in rows], 500):
                marks = ",".join("?" * len(part))
                tallies += self._reader.execute(
                    f"{TASK_TALLY} WHERE job_id IN ({marks}) GROUP BY job_id, status, exit_code",
                    part,
                ).fetchall()
        return _finished_jobs(rows, tallies)

    def close(self) -> None:
        try:
            with self._read_lock:
                if self._reader is not self._db:
                    self._reader.close()
            with self._write_lock:
                self._db.close()
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None


@dataclass(frozen=True)
class JobPageQuery:
    """The id scan behind ``JobArchive.jobs_page``, for either store: the filters as SQL in the
    store's parameter style, and the loop that picks ids a chunk at a time. Ids come first (the
    index alone), so the skipped ones -- the jobs still in memory -- cost no decoding."""

    scan: str  # SELECT id, creation_index ... WHERE creation_index > PARAM ... LIMIT PARAM
    filters: tuple[Any, ...]
    limit: int
    chunk: int

    @classmethod
    def build(
        cls,
        queue: str,
        namespace: str,
        phases: Iterable[int],
        limit: int,
        *,
        before_index: int | None,
        owner: str,
        readable: tuple[Collection[str], str] | None,
        param: str,
        one_of: Callable[[str, list[Any]], tuple[str, list[Any]]],
    ) -> JobPageQuery:
        """``param``: the placeholder; ``one_of(column, values)``: "column is one of values" as
        SQL and its parameters."""
        where = [f"creation_index > {param}"]
        filters: list[Any] = []
        if readable is not None:
            among, values = one_of("queue", sorted(readable[0]))
            where.append(f"({among} OR (owner <> '' AND owner = {param}))")
            filters.extend([*values, readable[1]])
        for column, value in (("owner", owner), ("queue", queue), ("namespace", namespace)):
            if value:
                where.append(f"{column} = {param}")
                filters.append(value)
        if before_index is not None:
            where.append(f"creation_index < {param}")
            filters.append(before_index)
        wanted = sorted({int(p) for p in phases})
        if wanted:
            among, values = one_of("phase", wanted)
            where.append(among)
            filters.extend(values)
        scan = (
            f"SELECT id, creation_index FROM jobs WHERE {' AND '.join(where)} "
            f"ORDER BY creation_index LIMIT {param}"
        )
        return cls(scan, tuple(filters), limit, max(2 * limit, 100))

    def params(self, after_index: int) -> list[Any]:
        return [after_index, *self.filters, self.chunk]

    def pick(
        self,
        fetch: Callable[[int], list[Any]],
        after_index: int,
        skip: Container[str],
    ) -> list[str]:
        """Up to ``limit`` ids not in ``skip``, in creation order; ``fetch(after)`` runs the scan."""
        picked: list[str] = []
        while len(picked) < self.limit:
            ids = fetch(after_index)
            for job_id, _index in ids:
                if job_id not in skip:
                    picked.append(job_id)
                    if len(picked) == self.limit:
                        return picked
            if len(ids) < self.chunk:
                break
            after_index = ids[-1][1]
        return picked


def _sqlite_one_of(column: str, values: list[Any]) -> tuple[str, list[Any]]:
    """``column`` is one of ``values``, in SQLite's parameter style."""
    return (f"{column} IN ({','.join('?' * len(values))})", list(values))


def _stored_job(row: tuple[Any, ...], tasks: list[TaskRecord]) -> StoredJob:
    job_id, idx, spec, status = row
    return StoredJob(job_id, idx, bytes(spec), JobStatusRecord.from_json(status), tasks)


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# -- task output and the history: reads for both stores -----------------------------------------

LOG_SELECT = "SELECT task_id, job_id, written, dropped, eof FROM task_logs"
# A task's summary with its segments (chunk, start), in one statement: they match.
LOG_INDEX = (
    "SELECT l.task_id, l.job_id, l.written, l.dropped, l.eof, c.chunk, c.start FROM task_logs l "
    "LEFT JOIN task_log_chunks c ON c.task_id = l.task_id WHERE l.task_id = %s ORDER BY c.chunk"
)
# The segments holding bytes of [start, end) (parameters: task, end, start), in order.
LOG_BYTES = (
    "SELECT start, data FROM task_log_chunks WHERE task_id = %s AND start < %s "
    "AND start + length(data) > %s ORDER BY chunk"
)
TASK_TALLY = "SELECT job_id, status, exit_code, count(*) FROM tasks"


@dataclass
class StoredTaskLog:
    """A task's output as the store has it: its summary and (``task_log`` only) its segments."""

    task_id: str
    job_id: str
    written: int  # bytes the task wrote in all
    dropped: int  # the oldest bytes no longer kept
    eof: bool
    segments: list[tuple[int, int]] = field(default_factory=list)  # (chunk, start), in order


@runtime_checkable
class TaskLogStore(Protocol):
    """Reads of task output (server.service.logs), on the event loop: an indexed read of at most
    the bound per task."""

    def task_log(self, task_id: str) -> StoredTaskLog | None: ...

    def task_logs_of_job(self, job_id: str) -> dict[str, StoredTaskLog]:
        """The summaries (no segments) of the job's tasks that wrote output."""
        ...

    def task_log_bytes(self, task_id: str, start: int, end: int) -> tuple[int, bytes]:
        """The stored bytes of ``[start, end)``: (where they start, the bytes). They start later
        than ``start`` when the oldest were dropped meanwhile."""
        ...


def _stored_log(row: tuple[Any, ...], segments: list[tuple[Any, ...]]) -> StoredTaskLog:
    task_id, job_id, written, dropped, eof = row
    return StoredTaskLog(
        task_id,
        job_id,
        int(written),
        int(dropped),
        bool(eof),
        [(int(c), int(s)) for c, s in segments],
    )


def _log_index(rows: list[tuple[Any, ...]]) -> StoredTaskLog | None:
    if not rows:
        return None
    segments = [(r[5], r[6]) for r in rows if r[5] is not None]
    return _stored_log(rows[0][:5], segments)


def _log_bytes(rows: list[tuple[Any, ...]], start: int, end: int) -> tuple[int, bytes]:
    """The bytes of ``[start, end)`` in the segments ``rows`` (start, data), up to a gap; where
    they start (``end`` when none is stored)."""
    out = bytearray()
    first: int | None = None
    for seg_start, data in rows:
        at = int(seg_start)
        if first is None:
            first = max(start, at)
        elif at != first + len(out):
            break  # not contiguous: segments trimmed meanwhile
        wanted = first + len(out)
        out += bytes(data)[wanted - at : end - at]
    return (end, b"") if first is None else (first, bytes(out))


@dataclass(frozen=True)
class HistoryQuery:
    """Finished jobs for ``ListJobHistory``, in (finish time, creation index) order, after a
    position and within the filters; either store's SQL from it (``sql``)."""

    phases: tuple[int, ...]  # terminal phases
    finished_after: float | None = None
    finished_before: float | None = None
    queue: str = ""
    namespace: str = ""
    owner: str = ""
    readable: tuple[tuple[str, ...], str] | None = None  # (queues, user) of a read scope
    after: tuple[float, int] | None = None  # the last (finish time, creation index) of a page
    limit: int = 100

    def sql(
        self, param: str, one_of: Callable[[str, list[Any]], tuple[str, list[Any]]]
    ) -> tuple[str, list[Any]]:
        among, params = one_of("phase", sorted(self.phases))
        where = [among]
        if self.finished_after is not None:
            where.append(f"finish_time >= {param}")
            params.append(self.finished_after)
        if self.finished_before is not None:
            where.append(f"finish_time < {param}")
            params.append(self.finished_before)
        for column, value in (("queue", self.queue), ("namespace", self.namespace)):
            if value:
                where.append(f"{column} = {param}")
                params.append(value)
        if self.owner:
            where.append(f"owner = {param}")
            params.append(self.owner)
        if self.readable is not None:
            queues, values = one_of("queue", sorted(self.readable[0]))
            where.append(f"({queues} OR (owner <> '' AND owner = {param}))")
            params.extend([*values, self.readable[1]])
        if self.after is not None:
            where.append(
                f"(finish_time > {param} OR (finish_time = {param} AND creation_index > {param}))"
            )
            params.extend([self.after[0], self.after[0], self.after[1]])
        params.append(self.limit)
        return (
            f"SELECT id, creation_index, spec, status, finish_time FROM jobs WHERE "
            f"{' AND '.join(where)} ORDER BY finish_time, creation_index LIMIT {param}",
            params,
        )


@dataclass
class FinishedJob:
    """A finished job as the history reads it: the job (no task rows) and its tasks counted."""

    job: StoredJob
    finish_time: float
    statuses: dict[int, int]  # task status -> tasks
    exit_codes: dict[int, int]  # exit code -> tasks that ended Succeeded or Failed with it


@runtime_checkable
class JobHistoryArchive(Protocol):
    def finished_jobs(self, query: HistoryQuery) -> list[FinishedJob]:
        """Up to ``query.limit`` finished jobs after ``query.after``, in (finish time, creation
        index) order."""
        ...


def _finished_jobs(
    rows: list[tuple[Any, ...]], tallies: list[tuple[Any, ...]]
) -> list[FinishedJob]:
    statuses: dict[str, dict[int, int]] = {}
    codes: dict[str, dict[int, int]] = {}
    ended = (int(TaskStatus.SUCCEEDED), int(TaskStatus.FAILED))
    for job_id, status, exit_code, count in tallies:
        by_status = statuses.setdefault(job_id, {})
        by_status[int(status)] = by_status.get(int(status), 0) + int(count)
        if int(status) in ended:
            by_code = codes.setdefault(job_id, {})
            by_code[int(exit_code)] = by_code.get(int(exit_code), 0) + int(count)
    return [
        FinishedJob(
            _stored_job((job_id, idx, spec, status), []),
            float(finish),
            statuses.get(job_id, {}),
            codes.get(job_id, {}),
        )
        for job_id, idx, spec, status, finish in rows
    ]


class StoreWriter:
    """Serializes store access from async code: one batch at a time, in a worker thread.

    The batch is drained from the state inside the lock, so batches reach the store in the order
    their changes happened and a later batch always carries the newer value of a row.
    """

    def __init__(self, store: Store) -> None:

        self.store = store
        self._lock = anyio.Lock()
        # Called once, on the event loop, when a flush first finds the state file gone (e.g. to
        # turn the health service NOT_SERVING).
        self.on_lost: Callable[[StateFileLost], None] | None = None
        self._lost_reported = False
        # Called on the event loop when a write is refused or fails for another reason (a
        # replica that lost its lease, a database out of reach): the batch was drained, so memory
        # now holds changes the store does not (server.service.replica reloads).
        self.on_failed: Callable[[Exception], None] | None = None
        # Set by a failed write, cleared by ``reset`` once the state was reloaded: the failed
        # batch took rows other callers changed too (they wait on the lock, then find nothing to
        # write); none of them may be told its change was saved.
        self._broken: DomainError | None = None

    async def flush(self, drain: Callable[[], WriteBatch]) -> None:
        """Drain and write; ``StateFileLost`` (a DomainError: FAILED_PRECONDITION to an RPC) once
        the state file is gone, checked before anything is drained: no change is taken as saved."""
        async with self._lock:
            if self._broken is not None:
                raise self._broken
            try:
                self.store.check()
                batch = drain()
                if not batch.empty():
                    await anyio.to_thread.run_sync(self.store.write, batch)
                for written in batch.after_write:
                    written()
            except StateFileLost as exc:
                if not self._lost_reported:
                    self._lost_reported = True
                    if self.on_lost is not None:
                        self.on_lost(exc)
                raise
            except DomainError as exc:
                self._broken = DomainError(
                    exc.code,
                    f"{exc.message} (changes since the last saved state are not saved: "
                    "retry, on the leader)",
                )
                if self.on_failed is not None:
                    self.on_failed(exc)
                raise

    def reset(self) -> None:
        """The state was reloaded from the store: writes may go on."""
        self._broken = None

    async def decision_states(self, ids: list[int]) -> dict[int, tuple[str, str, bytes]]:

        if not ids:
            return {}
        async with self._lock:
            return await anyio.to_thread.run_sync(self.store.decision_states, ids)

    async def close(self) -> None:
        async with self._lock:
            self.store.close()
