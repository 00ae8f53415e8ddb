"""PostgreSQL as the durable store, for servers that run replicated.

``PostgresStore`` implements the same ``Store`` protocol as ``SqliteStore`` (same rows, same
semantics) and adds what several servers sharing one database need:

* a leader lease (one row, ``lease``), taken and renewed on the database's clock, whose ``term``
  grows with every change of holder. A leader's writes are fenced: each write transaction first
  locks the lease row ``FOR SHARE`` if (and only if) the writer still holds it with its term, so
  a takeover (an ``UPDATE`` of that row) waits for the write in progress, and every commit of
  term T precedes the first moment term T+1 exists;
* a change feed for warm followers: every row of the six state tables carries ``seq``, drawn from
  one sequence on every insert or update (a deleted queue is a tombstone with a new seq), and a
  write sends ``NOTIFY muster_changes`` at commit. With one writer at a time (the fence), seq
  order is commit order, so "every row with seq > S" read in one snapshot never skips a row;
* a registry of replicas (``replicas``) for status pages.

The schema is versioned (``schema_migrations``, ``MIGRATIONS``): migrations run at open inside a
transaction holding an advisory lock, so servers starting together apply them once; a database
migrated by a newer server is refused.

Connections (psycopg, sync; each used under its own lock, from worker threads or the event loop):
the writer (transactions: writes, ``load``, the feed, decision states), the archive reader (quick
reads on the event loop, with a statement timeout), the lease connection (lease and heartbeat
calls are never queued behind a write in Python) and, for followers, a LISTEN connection. A
connection found lost is dropped and opened again on the next call (a call on a connection that
turns out to be dead is retried once on a new one); a call that cannot reach the database raises
``StoreUnavailable``. A write is one transaction: applied whole or not at all.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import threading
from collections.abc import Callable, Collection, Container, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import psycopg
import structlog
from google.protobuf.message import DecodeError
from psycopg import conninfo, pq
from psycopg.rows import TupleRow

from server.service.records import BackendRecord, DecisionRow, JobStatusRecord, TaskRecord
from server.service.store import (
    HOLDING_SQL,
    JOB_SELECT,
    LOG_BYTES,
    LOG_INDEX,
    LOG_SELECT,
    TASK_SELECT,
    TASK_TALLY,
    TERMINAL_SQL,
    FinishedJob,
    HistoryQuery,
    JobPageQuery,
    NotLeader,
    StateFileError,
    StoredJob,
    StoredState,
    StoredTaskLog,
    StoreUnavailable,
    WriteBatch,
    _finished_jobs,
    _log_bytes,
    _log_index,
    _says_more_than_submitted,
    _stored_job,
    _stored_log,
    _task_record,
)

Conn = psycopg.Connection[TupleRow]
T = TypeVar("T")

log = structlog.get_logger("muster.store")

LEASE_NAME = "scheduler"
NOTIFY_CHANNEL = "muster_changes"
# pg_advisory_xact_lock key serializing migrations across servers ("muster" + 1).
MIGRATION_LOCK = 0x6D7573746572_01
# Reads on the event loop and lease calls must come back quickly or fail: a database that stops
# answering must not hang the server.
READ_TIMEOUT_MS = 5000
LEASE_TIMEOUT_MS = 5000
# How long a lease attempt waits for a write holding the lease row, and, once the stalled
# holder's sessions were ended, for the database to let the row go.
LEASE_LOCK_WAIT_MS = 500
LEASE_TAKEOVER_WAIT_MS = 3000


def replica_application_name(replica_id: str, where: str) -> str:
    """The ``application_name`` of a replica's sessions: a successor ends them by it when the
    replica stalls inside a write after its lease expired."""
    return f"{replica_application_prefix(replica_id)}{where}"[:63]


def replica_application_prefix(replica_id: str) -> str:
    return f"muster/{replica_id}@"


# Rows per round trip when streaming a load through a server-side cursor.
LOAD_CHUNK = 20_000

STATE_TABLES = ("meta", "queues", "jobs", "tasks", "decisions", "backends")
# The tables whose rows the change feed carries (STATE_TABLES as version 1 made them, and the task
# output summaries of version 3).
FEED_TABLES = (*STATE_TABLES, "task_logs")

# Version 1: the SQLite tables (bytea blobs, bigint ids, double precision times), each row with
# its change seq, plus the lease and the replica registry.
SCHEMA_V1 = f"""
CREATE SEQUENCE muster_change_seq;
CREATE TABLE meta (
    key text PRIMARY KEY, value text NOT NULL,
    seq bigint NOT NULL DEFAULT nextval('muster_change_seq'));
CREATE TABLE queues (
    name text PRIMARY KEY, spec bytea NOT NULL, deleted boolean NOT NULL DEFAULT false,
    seq bigint NOT NULL DEFAULT nextval('muster_change_seq'));
CREATE TABLE jobs (
    id text PRIMARY KEY, creation_index bigint NOT NULL, spec bytea NOT NULL, status text NOT NULL,
    queue text NOT NULL DEFAULT '', namespace text NOT NULL DEFAULT '',
    phase integer NOT NULL DEFAULT 0, finish_time double precision NOT NULL DEFAULT 0,
    owner text NOT NULL DEFAULT '',
    seq bigint NOT NULL DEFAULT nextval('muster_change_seq'));
CREATE INDEX jobs_by_index ON jobs (creation_index);
CREATE INDEX jobs_finished ON jobs (phase, finish_time);
CREATE TABLE tasks (
    id text PRIMARY KEY, job_id text NOT NULL, status integer NOT NULL, node text, backend text,
    devices text NOT NULL, message text NOT NULL, exit_code bigint NOT NULL,
    seq bigint NOT NULL DEFAULT nextval('muster_change_seq'));
CREATE INDEX tasks_by_job ON tasks (job_id);
CREATE TABLE decisions (
    id bigint PRIMARY KEY, backend text NOT NULL, cycle_id bigint NOT NULL, task_id text NOT NULL,
    kind text NOT NULL, payload bytea NOT NULL, state text NOT NULL, reason text NOT NULL,
    deadline double precision NOT NULL,
    seq bigint NOT NULL DEFAULT nextval('muster_change_seq'));
CREATE INDEX decisions_pending ON decisions (state) WHERE state = 'pending';
CREATE TABLE backends (
    name text PRIMARY KEY, kind text NOT NULL, labels text NOT NULL,
    last_decision_id bigint NOT NULL,
    seq bigint NOT NULL DEFAULT nextval('muster_change_seq'));
{"".join(f"CREATE INDEX {t}_by_seq ON {t} (seq);" for t in STATE_TABLES)}
CREATE TABLE lease (
    name text PRIMARY KEY, holder text NOT NULL, address text NOT NULL, term bigint NOT NULL,
    expires_at timestamptz NOT NULL, renewed_at timestamptz NOT NULL);
INSERT INTO lease (name, holder, address, term, expires_at, renewed_at)
    VALUES ('{LEASE_NAME}', '', '', 0, to_timestamp(0), to_timestamp(0));
CREATE TABLE replicas (
    id text PRIMARY KEY, address text NOT NULL, role text NOT NULL, term bigint NOT NULL,
    last_seen timestamptz NOT NULL, lag_seconds double precision NOT NULL);
"""

# Version 2: a fractional task's shared GPU in a column of its own (rows written before keep it
# in devices; ``TaskRecord.read_legacy_shared_gpu`` reads them).
SCHEMA_V2 = "ALTER TABLE tasks ADD COLUMN gpu_group text NOT NULL DEFAULT '';"

# In order; a version, once released, never changes (a later change is a new version).
# Version 3: task output (server.service.logs) -- a summary row per task, in the change feed so
# followers wake the streams following it, and its kept bytes in segments (not in the feed: a
# follower reads them when asked) -- and the history's order (finish time).
SCHEMA_V3 = """
CREATE TABLE task_logs (
    task_id text PRIMARY KEY, job_id text NOT NULL, written bigint NOT NULL,
    dropped bigint NOT NULL, eof boolean NOT NULL,
    seq bigint NOT NULL DEFAULT nextval('muster_change_seq'));
CREATE INDEX task_logs_by_job ON task_logs (job_id);
CREATE INDEX task_logs_by_seq ON task_logs (seq);
CREATE TABLE task_log_chunks (
    task_id text NOT NULL, chunk bigint NOT NULL, start bigint NOT NULL, data bytea NOT NULL,
    PRIMARY KEY (task_id, chunk));
CREATE INDEX jobs_by_finish ON jobs (finish_time, creation_index);
"""

MIGRATIONS: list[tuple[int, str]] = [(1, SCHEMA_V1), (2, SCHEMA_V2), (3, SCHEMA_V3)]
SCHEMA_VERSION = MIGRATIONS[-1][0]

# Upserts. What never changes after the first write (a job's spec and creation index, a task's
# job, a decision's payload) is not rewritten, and a row whose values did not change is not
# updated at all: no new row version, no new seq, nothing for followers to read.
META_UPSERT = (
    "INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE "
    "SET value = excluded.value, seq = excluded.seq WHERE meta.value <> excluded.value"
)
QUEUE_DELETE = (
    "UPDATE queues SET deleted = true, spec = ''::bytea, seq = nextval('muster_change_seq') "
    "WHERE name = %s AND NOT deleted"
)
QUEUE_UPSERT = (
    "INSERT INTO queues (name, spec) VALUES (%s, %s) ON CONFLICT (name) DO UPDATE "
    "SET spec = excluded.spec, deleted = false, seq = excluded.seq "
    "WHERE queues.deleted OR queues.spec <> excluded.spec"
)
JOB_UPSERT = (
    "INSERT INTO jobs (id, creation_index, spec, status, queue, namespace, phase, finish_time, owner) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE "
    "SET status = excluded.status, queue = excluded.queue, namespace = excluded.namespace, "
    "phase = excluded.phase, finish_time = excluded.finish_time, owner = excluded.owner, "
    "seq = excluded.seq WHERE (jobs.status, jobs.queue, jobs.namespace, jobs.phase, "
    "jobs.finish_time, jobs.owner) IS DISTINCT FROM (excluded.status, excluded.queue, "
    "excluded.namespace, excluded.phase, excluded.finish_time, excluded.owner)"
)
TASK_UPSERT = (
    "INSERT INTO tasks (id, job_id, status, node, backend, devices, message, exit_code, gpu_group) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE "
    "SET status = excluded.status, node = excluded.node, backend = excluded.backend, "
    "devices = excluded.devices, message = excluded.message, exit_code = excluded.exit_code, "
    "gpu_group = excluded.gpu_group, seq = excluded.seq WHERE (tasks.status, tasks.node, "
    "tasks.backend, tasks.devices, tasks.message, tasks.exit_code, tasks.gpu_group) "
    "IS DISTINCT FROM (excluded.status, excluded.node, excluded.backend, excluded.devices, "
    "excluded.message, excluded.exit_code, excluded.gpu_group)"
)
DECISION_UPSERT = (
    "INSERT INTO decisions (id, backend, cycle_id, task_id, kind, payload, state, reason, deadline) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE "
    "SET state = excluded.state, reason = excluded.reason, deadline = excluded.deadline, "
    "seq = excluded.seq WHERE (decisions.state, decisions.reason, decisions.deadline) "
    "IS DISTINCT FROM (excluded.state, excluded.reason, excluded.deadline)"
)
BACKEND_UPSERT = (
    "INSERT INTO backends (name, kind, labels, last_decision_id) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, labels = excluded.labels, "
    "last_decision_id = excluded.last_decision_id, seq = excluded.seq "
    "WHERE (backends.kind, backends.labels, backends.last_decision_id) "
    "IS DISTINCT FROM (excluded.kind, excluded.labels, excluded.last_decision_id)"
)
FENCE_CHECK = (
    f"SELECT 1 FROM lease WHERE name = '{LEASE_NAME}' AND holder = %s AND term = %s "
    "AND expires_at > clock_timestamp() FOR SHARE"
)
DECISION_COLUMNS = "id, backend, cycle_id, task_id, kind, payload, state, reason, deadline"
# The feed: per table, the rows after a seq, in seq order (seq last in every row).
FEED_QUERIES = {
    "meta": "SELECT key, value, seq FROM meta",
    "queues": "SELECT name, spec, deleted, seq FROM queues",
    "jobs": "SELECT id, creation_index, spec, status, seq FROM jobs",
    "tasks": (
        "SELECT id, job_id, status, node, backend, devices, message, exit_code, gpu_group, seq "
        "FROM tasks"
    ),
    "decisions": f"SELECT {DECISION_COLUMNS}, seq FROM decisions",
    "backends": "SELECT name, kind, labels, last_decision_id, seq FROM backends",
    "task_logs": "SELECT task_id, seq FROM task_logs",
}
TASK_LOG_UPSERT = (
    "INSERT INTO task_logs (task_id, job_id, written, dropped, eof) VALUES (%s, %s, %s, %s, %s) "
    "ON CONFLICT (task_id) DO UPDATE SET written = excluded.written, dropped = excluded.dropped, "
    "eof = excluded.eof, seq = excluded.seq WHERE (task_logs.written, task_logs.dropped, "
    "task_logs.eof) IS DISTINCT FROM (excluded.written, excluded.dropped, excluded.eof)"
)
# Appended in SQL: a segment's earlier bytes are not sent again.
LOG_CHUNK_APPEND = (
    "INSERT INTO task_log_chunks (task_id, chunk, start, data) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (task_id, chunk) DO UPDATE SET data = task_log_chunks.data || excluded.data"
)
LOG_CHUNK_TRIM = "DELETE FROM task_log_chunks WHERE task_id = %s AND chunk < %s"
MAX_SEQ = "SELECT GREATEST(0, {})".format(
    ", ".join(f"(SELECT max(seq) FROM {t})" for t in FEED_TABLES)
)
LEASE_COLUMNS = (
    "holder, address, term, expires_at > clock_timestamp(), "
    "extract(epoch FROM expires_at - clock_timestamp())::float8, "
    "extract(epoch FROM renewed_at)::float8"
)
LEASE_TAKE = (
    "UPDATE lease SET holder = %(holder)s, address = %(address)s, "
    "term = CASE WHEN holder = %(holder)s THEN term ELSE term + 1 END, "
    "expires_at = clock_timestamp() + make_interval(secs => %(duration)s), "
    "renewed_at = clock_timestamp() "
    f"WHERE name = '{LEASE_NAME}' AND (holder = %(holder)s OR expires_at < clock_timestamp()) "
    f"RETURNING {LEASE_COLUMNS}"
)
LEASE_READ = f"SELECT {LEASE_COLUMNS} FROM lease WHERE name = '{LEASE_NAME}'"
LEASE_RELEASE = (
    "UPDATE lease SET expires_at = clock_timestamp() "
    f"WHERE name = '{LEASE_NAME}' AND holder = %s AND expires_at > clock_timestamp()"
)
REPLICA_UPSERT = (
    "INSERT INTO replicas (id, address, role, term, last_seen, lag_seconds) "
    "VALUES (%s, %s, %s, %s, clock_timestamp(), %s) ON CONFLICT (id) DO UPDATE "
    "SET address = excluded.address, role = excluded.role, term = excluded.term, "
    "last_seen = excluded.last_seen, lag_seconds = excluded.lag_seconds"
)


@dataclass(frozen=True)
class Fence:
    """Who may write: the lease holder's replica id and the term it holds the lease in."""

    holder: str
    term: int


@dataclass(frozen=True)
class Lease:
    holder: str  # replica id of the holder ("" if never held)
    address: str  # the holder's advertised gRPC address
    term: int  # grows by one on every change of holder
    valid: bool  # expires_at > now() on the database clock
    expires_in: float  # seconds until expiry on the database clock (negative: expired)
    renewed_at: float  # unix seconds (database clock) of the last acquire / renew


@dataclass(frozen=True)
class ReplicaRow:
    id: str
    address: str
    role: str
    term: int
    last_seen: float  # unix seconds, database clock
    lag_seconds: float


@dataclass
class StoredChanges:
    seq: int  # every row with change seq <= this is included; pass it to the next call
    meta: dict[str, str]
    queues: dict[str, bytes | None]  # None: the queue was deleted
    jobs: list[StoredJob]  # job rows that changed (their .tasks is []: task changes are in .tasks)
    tasks: list[TaskRecord]
    decisions: list[DecisionRow]
    backends: list[BackendRecord]
    more: bool  # not everything up to the current end was returned (call again)
    task_logs: list[str] = field(default_factory=list)  # tasks whose output grew (or ended)


def _pg_one_of(column: str, values: list[Any]) -> tuple[str, list[Any]]:
    """``column`` is one of ``values`` (one array parameter)."""
    return (f"{column} = ANY(%s::{'integer' if column == 'phase' else 'text'}[])", [values])


# -- DSNs: shown without their password ---------------------------------------------------------

_KV_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URI_PASSWORD = re.compile(r"^([a-z][a-z0-9+.-]*://[^:@/?#]*:)([^@/?#]*)(@)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&]password=)([^&#]*)", re.IGNORECASE)


def mask_password(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***`` (URI user info, ``?password=`` or a
    ``password=`` keyword): what may appear in a message or a log line."""
    if "://" in dsn:
        dsn = _URI_PASSWORD.sub(r"\1***\3", dsn)
        return _QUERY_PASSWORD.sub(r"\1***", dsn)
    return _KV_PASSWORD.sub(r"\1***", dsn)


def _passwords(dsn: str) -> list[str]:
    """The password a DSN carries, in the spellings a message could repeat it in."""
    found: list[str] = []
    try:
        value = conninfo.conninfo_to_dict(dsn).get("password")
    except psycopg.Error:
        value = None
    if value:
        found.append(str(value))
    if "://" in dsn:
        raw = urlsplit(dsn).password
        if raw:
            found += [raw, unquote(raw)]
    return sorted({p for p in found if p}, key=len, reverse=True)


def _describe(dsn: str) -> str:
    """user@host:port/dbname, as libpq would resolve the defaults; never the password."""
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        raise StateFileError(f"not a valid PostgreSQL URI: {mask_password(dsn)}") from None
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = str(params.get("port") or "5432")
    user = str(params.get("user") or "")
    db = str(params.get("dbname") or user or "postgres")
    return f"{user + '@' if user else ''}{host}:{port}/{db}"


class _Link:
    """One connection, opened on first use and again after it was lost; used under ``lock``."""

    def __init__(self, role: str, open_conn: Callable[[], Conn]) -> None:
        self.role = role
        self.lock = threading.Lock()
        self.conn: Conn | None = None
        self._open = open_conn

    def get(self) -> Conn:
        if self.conn is None:
            self.conn = self._open()
        return self.conn

    def drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def settle(self) -> None:
        """After a failed call: roll back what is open, or drop a connection that is unusable."""
        conn = self.conn
        if conn is None:
            return
        if conn.closed or conn.broken:
            self.drop()
            return
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            try:
                conn.rollback()
            except psycopg.Error:
                self.drop()


class PostgresStore:
    """The ``Store`` protocol on PostgreSQL, plus the lease, the change feed and the replica
    registry replicated servers use (see the module docstring)."""

    def __init__(
        self,
        dsn: str,
        *,
        application_name: str = "muster-server",
        connect_timeout: float = 5.0,
        write_idle_timeout: float = 2.0,
    ) -> None:
        """Connect and bring the schema up to date; ``StateFileError`` (one line, naming
        host, port and database, never the password) if that cannot be done.

        ``write_idle_timeout``: a write transaction whose client goes quiet this long (a process
        paused or cut off mid-write) is ended by the database, releasing the lease row it holds
        FOR SHARE: otherwise a leader paused inside a write would stop every takeover for as
        long as it stays paused. Keep it under the lease duration."""
        self.write_idle_timeout = write_idle_timeout
        self._dsn = dsn
        self.target = _describe(dsn)
        self._secrets = _passwords(dsn)
        self.application_name = application_name
        self.connect_timeout = connect_timeout
        # Set by the leader: every write then checks, in its transaction, that it still holds it.
        self.fence: Fence | None = None
        self._closed = False
        self._writer = _Link("writer", lambda: self._connect(autocommit=False, writer=True))
        self._reader = _Link(
            "reader", lambda: self._connect(autocommit=True, timeout_ms=READ_TIMEOUT_MS)
        )
        self._leases = _Link(
            "lease", lambda: self._connect(autocommit=True, timeout_ms=LEASE_TIMEOUT_MS)
        )
        self._listener = _Link("listen", self._connect_listener)
        try:
            conn = self._connect(autocommit=False, writer=True)
        except psycopg.Error as exc:
            raise StateFileError(
                f"cannot connect to PostgreSQL at {self.target}: {self._message(exc)}"
            ) from None
        try:
            self._migrate(conn)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, psycopg.Error):
                raise StateFileError(
                    f"cannot use PostgreSQL database {self.target} as a Muster store: "
                    f"{self._message(exc)}"
                ) from None
            raise
        self._writer.conn = conn

    # -- connections -------------------------------------------------------------------------

    def _message(self, exc: BaseException) -> str:
        """An error as one line, without the DSN's password."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _connect(
        self, *, autocommit: bool, timeout_ms: int | None = None, writer: bool = False
    ) -> Conn:
        conn = psycopg.connect(
            self._dsn,
            autocommit=autocommit,
            application_name=self.application_name,
            connect_timeout=max(1, math.ceil(self.connect_timeout)),
            # A database host that vanishes (no RST) is noticed in seconds, not hours.
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
        )
        settings = []
        if timeout_ms is not None:
            settings.append(f"SET statement_timeout = {int(timeout_ms)}")
        if writer:
            idle_ms = max(1, int(self.write_idle_timeout * 1000))
            settings.append(f"SET idle_in_transaction_session_timeout = {idle_ms}")
        if settings:
            try:
                for statement in settings:  # written in: SET does not take bind parameters
                    conn.execute(statement)
                if not autocommit:
                    conn.commit()
            except BaseException:
                conn.close()
                raise
        return conn

    def _connect_listener(self) -> Conn:
        conn = self._connect(autocommit=True)
        try:
            conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _unavailable(self, what: str, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(
            f"PostgreSQL at {self.target} unavailable ({what}): {self._message(exc)}"
        )

    def _call(
        self,
        link: _Link,
        what: str,
        fn: Callable[[Conn], T],
        *,
        retry: Callable[[], bool] | None = None,
    ) -> T:
        """``fn`` on ``link``'s connection, under its lock. A connection that turns out to be dead
        when reused (the database restarted, or cut it) is replaced and ``fn`` run once more,
        unless ``retry`` says that is no longer safe; otherwise ``StoreUnavailable``."""
        with link.lock:
            self._check_open()
            for attempt in range(2):
                reused = link.conn is not None
                try:
                    conn = link.get()
                except psycopg.Error as exc:
                    raise self._unavailable(what, exc) from None
                try:
                    return fn(conn)
                except psycopg.OperationalError as exc:
                    lost = conn.closed or conn.broken
                    link.settle()
                    if lost and reused and attempt == 0 and (retry is None or retry()):
                        log.info(
                            "store.reconnect",
                            database=self.target,
                            connection=link.role,
                            error=self._message(exc),
                        )
                        continue
                    raise self._unavailable(what, exc) from None
                except BaseException:
                    link.settle()
                    raise
            raise AssertionError("unreachable")  # the loop returns or raises

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable(f"the store for PostgreSQL at {self.target} is closed")

    # -- schema ------------------------------------------------------------------------------

    def _migrate(self, conn: Conn) -> None:
        """Apply the migrations this database lacks, in order, in one transaction; refuse a
        database a newer server has migrated."""
        try:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            # Looked up first: CREATE ... IF NOT EXISTS needs the CREATE privilege even when the
            # table exists, which a server's role may lack once the schema is in place.
            row = conn.execute("SELECT to_regclass('schema_migrations') IS NULL").fetchone()
            if row is not None and row[0]:
                conn.execute(
                    "CREATE TABLE schema_migrations "
                    "(version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
                )
            applied = {v for (v,) in conn.execute("SELECT version FROM schema_migrations")}
            newest = max(applied, default=0)
            if newest > SCHEMA_VERSION:
                raise StateFileError(
                    f"PostgreSQL database {self.target} has Muster schema version {newest}, "
                    f"newer than this server knows (version {SCHEMA_VERSION}): run a newer server"
                )
            for version, sql in MIGRATIONS:
                if version in applied:
                    continue
                conn.execute(sql.encode())  # several statements: no parameters
                conn.execute(
                    "INSERT INTO schema_migrations (version, applied_at) VALUES (%s, now())",
                    (version,),
                )
                log.info("store.migrated", database=self.target, version=version)
            conn.commit()
        except BaseException:
            if not conn.closed:
                conn.rollback()
            raise

    def schema_version(self) -> int:
        """The newest migration applied to the database."""

        def run(conn: Conn) -> int:
            try:
                row = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
            finally:
                conn.rollback()
            return int(row[0]) if row and row[0] is not None else 0

        return self._call(self._writer, "schema version", run)

    # -- the Store protocol ------------------------------------------------------------------

    def check(self) -> None:
        """Nothing to check while open (no file to lose); ``StoreUnavailable`` once closed."""
        self._check_open()

    def write(self, batch: WriteBatch) -> None:
        """One transaction (fenced when ``fence`` is set: ``NotLeader``, nothing written, if the
        lease is no longer held with that term); ``StoreUnavailable`` if the database cannot be
        reached. If the connection is lost while the commit is under way, whether it was applied
        is unknown (``StoreUnavailable``): it is applied whole or not at all."""
        if batch.empty():
            return
        fence = self.fence
        commit_sent = False

        def run(conn: Conn) -> None:
            nonlocal commit_sent
            with conn.cursor() as cur:
                if fence is not None:
                    # FOR SHARE: a takeover (an UPDATE of the lease row) waits for this commit.
                    cur.execute(FENCE_CHECK, (fence.holder, fence.term))
                    if cur.fetchone() is None:
                        conn.rollback()
                        raise NotLeader(
                            f"{fence.holder} no longer holds the leader lease of term "
                            f"{fence.term}: the change was not saved"
                        )
                with conn.pipeline():
                    self._write_rows(cur, batch)
            commit_sent = True
            conn.commit()

        self._call(self._writer, "write", run, retry=lambda: not commit_sent)

    @staticmethod
    def _write_rows(cur: psycopg.Cursor[TupleRow], batch: WriteBatch) -> None:
        if batch.meta:
            cur.executemany(META_UPSERT, list(batch.meta.items()))
        if batch.deleted_queues:  # before the upserts: a queue deleted and created again lives
            cur.executemany(QUEUE_DELETE, [(n,) for n in sorted(batch.deleted_queues)])
        if batch.queues:
            cur.executemany(QUEUE_UPSERT, list(batch.queues.items()))
        if batch.jobs:
            cur.executemany(JOB_UPSERT, list(batch.jobs.values()))
        if batch.tasks:
            cur.executemany(TASK_UPSERT, list(batch.tasks.values()))
        if batch.decisions:
            cur.executemany(DECISION_UPSERT, list(batch.decisions.values()))
        if batch.backends:
            cur.executemany(BACKEND_UPSERT, list(batch.backends.values()))
        if batch.log_chunks:
            cur.executemany(LOG_CHUNK_APPEND, batch.log_chunks)
        if batch.log_trims:
            cur.executemany(LOG_CHUNK_TRIM, list(batch.log_trims.items()))
        if batch.task_logs:
            cur.executemany(TASK_LOG_UPSERT, list(batch.task_logs.values()))
        # Delivered at commit (and not at all on rollback): followers wake and read the feed.
        cur.execute("SELECT pg_notify(%s, '')", (NOTIFY_CHANNEL,))

    def load(self, finished_before: float | None = None) -> StoredState:
        """Everything a restart needs, from one snapshot, with the feed seq it includes;
        ``StateFileError`` if a row cannot be read back, ``StoreUnavailable`` if the database
        cannot be reached."""
        try:
            return self._call(self._writer, "load", lambda conn: self._load(conn, finished_before))
        except (ValueError, TypeError, KeyError, DecodeError) as exc:
            raise StateFileError(
                f"PostgreSQL database {self.target} holds a row that cannot be read: "
                f"{type(exc).__name__}: {exc}"
            ) from None

    def _load(self, conn: Conn, finished_before: float | None) -> StoredState:
        try:
            # One snapshot for every table and the seq: the feed continues exactly after it.
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            with conn.cursor(binary=True) as cur:
                row = cur.execute(MAX_SEQ).fetchone()
                seq = int(row[0]) if row else 0
                meta: dict[str, str] = dict(cur.execute("SELECT key, value FROM meta"))
                queues = {
                    name: bytes(spec)
                    for name, spec in cur.execute("SELECT name, spec FROM queues WHERE NOT deleted")
                }
                backends = [
                    BackendRecord(name, kind, json.loads(labels), last)
                    for name, kind, labels, last in cur.execute(
                        "SELECT name, kind, labels, last_decision_id FROM backends"
                    )
                ]
            live = "TRUE"
            params: tuple[Any, ...] = ()
            if finished_before is not None:
                live = (
                    f"(j.phase NOT IN ({TERMINAL_SQL}) OR j.finish_time >= %s OR EXISTS "
                    f"(SELECT 1 FROM tasks h WHERE h.job_id = j.id AND h.status IN ({HOLDING_SQL})))"
                )
                params = (finished_before,)
            # Without a cutoff every task is wanted: no join (a task of no job is never read).
            task_query = (
                f"{TASK_SELECT}"
                if finished_before is None
                else "SELECT t.id, t.job_id, t.status, t.node, t.backend, t.devices, t.message, "
                f"t.exit_code, t.gpu_group FROM tasks t JOIN jobs j ON j.id = t.job_id WHERE {live}"
            )
            tasks_by_job: dict[str, list[TaskRecord]] = {}
            for t in _stream(conn, "muster_load_tasks", task_query, params):
                if _says_more_than_submitted(t):
                    task = _task_record(t)
                    tasks_by_job.setdefault(task.job_id, []).append(task)
            jobs = [
                StoredJob(
                    id=job_id,
                    creation_index=idx,
                    spec=spec,
                    status=JobStatusRecord.from_json(status),
                    tasks=tasks_by_job.get(job_id, []),
                )
                for job_id, idx, spec, status in _stream(
                    conn,
                    "muster_load_jobs",
                    f"SELECT id, creation_index, spec, status FROM jobs j WHERE {live} "
                    "ORDER BY creation_index",
                    params,
                )
            ]
            pending = [
                DecisionRow(*row)
                for row in _stream(
                    conn,
                    "muster_load_decisions",
                    f"SELECT {DECISION_COLUMNS} FROM decisions WHERE state = 'pending' ORDER BY id",
                    (),
                )
            ]
        finally:
            conn.rollback()
        return StoredState(meta, queues, jobs, pending, backends, seq=seq)

    def decision_states(self, ids: list[int]) -> dict[int, tuple[str, str, bytes]]:
        if not ids:
            return {}

        def run(conn: Conn) -> dict[int, tuple[str, str, bytes]]:
            try:
                with conn.cursor(binary=True) as cur:
                    cur.execute(
                        "SELECT id, backend, state, payload FROM decisions "
                        "WHERE id = ANY(%s::bigint[])",
                        (ids,),
                    )
                    return {i: (b, s, bytes(p)) for i, b, s, p in cur}
            finally:
                conn.rollback()

        return self._call(self._writer, "decision states", run)

    # -- the archive: jobs no longer in memory -----------------------------------------------

    def job(self, job_id: str) -> StoredJob | None:
        def run(conn: Conn) -> StoredJob | None:
            with conn.cursor(binary=True) as cur:
                row = cur.execute(f"{JOB_SELECT} WHERE id = %s", (job_id,)).fetchone()
                if row is None:
                    return None
                tasks = [
                    _task_record(t)
                    for t in cur.execute(f"{TASK_SELECT} WHERE job_id = %s", (job_id,))
                ]
            return _stored_job(row, tasks)

        return self._call(self._reader, "job read", run)

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
            param="%s",
            one_of=_pg_one_of,
        )

        def run(conn: Conn) -> list[StoredJob]:
            with conn.cursor(binary=True) as cur:
                picked = page.pick(
                    lambda start: cur.execute(page.scan, page.params(start)).fetchall(),
                    after_index,
                    skip,
                )
                if not picked:
                    return []
                rows = cur.execute(f"{JOB_SELECT} WHERE id = ANY(%s::text[])", (picked,)).fetchall()
                tasks: dict[str, list[TaskRecord]] = {}
                for t in cur.execute(f"{TASK_SELECT} WHERE job_id = ANY(%s::text[])", (picked,)):
                    task = _task_record(t)
                    tasks.setdefault(task.job_id, []).append(task)
            rows.sort(key=lambda r: r[1])
            return [_stored_job(r, tasks.get(r[0], [])) for r in rows]

        return self._call(self._reader, "jobs read", run)

    # -- task output and the history ------------------------------------------------------------

    def task_log(self, task_id: str) -> StoredTaskLog | None:
        def run(conn: Conn) -> StoredTaskLog | None:
            with conn.cursor(binary=True) as cur:
                return _log_index(cur.execute(LOG_INDEX, (task_id,)).fetchall())

        return self._call(self._reader, "task output read", run)

    def task_logs_of_job(self, job_id: str) -> dict[str, StoredTaskLog]:
        def run(conn: Conn) -> dict[str, StoredTaskLog]:
            with conn.cursor(binary=True) as cur:
                rows = cur.execute(f"{LOG_SELECT} WHERE job_id = %s", (job_id,)).fetchall()
            return {row[0]: _stored_log(row, []) for row in rows}

        return self._call(self._reader, "task output read", run)

    def task_log_bytes(self, task_id: str, start: int, end: int) -> tuple[int, bytes]:
        def run(conn: Conn) -> tuple[int, bytes]:
            with conn.cursor(binary=True) as cur:
                rows = cur.execute(LOG_BYTES, (task_id, end, start)).fetchall()
            return _log_bytes(rows, start, end)

        return self._call(self._reader, "task output read", run)

    def finished_jobs(self, query: HistoryQuery) -> list[FinishedJob]:
        sql, params = query.sql("%s", _pg_one_of)

        def run(conn: Conn) -> list[FinishedJob]:
            with conn.cursor(binary=True) as cur:
                rows = cur.execute(sql, params).fetchall()
                if not rows:
                    return []
                tallies = cur.execute(
                    f"{TASK_TALLY} WHERE job_id = ANY(%s::text[]) GROUP BY job_id, status, exit_code",
                    ([r[0] for r in rows],),
                ).fetchall()
            return _finished_jobs(rows, tallies)

        return self._call(self._reader, "history read", run)

    # -- the change feed ---------------------------------------------------------------------

    def changes_since(self, seq: int, limit: int = 10_000) -> StoredChanges:
        """The rows written after ``seq``, in seq order, at most ``limit`` in all. The returned
        ``seq`` covers everything returned and nothing is ever skipped: when the page is cut, it
        is cut at one seq for every table (``more``). Nothing new: ``seq`` comes back unchanged."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")

        def run(conn: Conn) -> dict[str, list[TupleRow]]:
            try:
                # One snapshot: a row committed between two tables' reads cannot be half seen.
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                cursors = {t: conn.cursor(binary=True) for t in FEED_TABLES}
                try:
                    with conn.pipeline():
                        for table, cur in cursors.items():
                            # limit + 1 per table: enough to know where to cut (see below).
                            cur.execute(
                                f"{FEED_QUERIES[table]} WHERE seq > %s ORDER BY seq LIMIT %s",
                                (seq, limit + 1),
                            )
                    return {t: cur.fetchall() for t, cur in cursors.items()}
                finally:
                    for cur in cursors.values():
                        cur.close()
            finally:
                conn.rollback()

        fetched = self._call(self._writer, "change feed", run)
        seqs = sorted(row[-1] for rows in fetched.values() for row in rows)
        # Seqs are unique across tables (one sequence). Cutting at the limit-th smallest keeps
        # exactly ``limit`` rows, and each table has all its rows up to the cut among the
        # first ``limit + 1`` it returned (else more than ``limit`` rows would be below it).
        more = len(seqs) > limit
        end = seqs[limit - 1] if more else (seqs[-1] if seqs else seq)

        def upto(table: str) -> list[TupleRow]:
            return [row for row in fetched[table] if row[-1] <= end]

        return StoredChanges(
            seq=end,
            meta={key: value for key, value, _s in upto("meta")},
            queues={
                name: None if deleted else bytes(spec) for name, spec, deleted, _s in upto("queues")
            },
            jobs=[
                StoredJob(job_id, idx, bytes(spec), JobStatusRecord.from_json(status), [])
                for job_id, idx, spec, status, _s in upto("jobs")
            ],
            tasks=[_task_record(row[:-1]) for row in upto("tasks")],
            decisions=[DecisionRow(*row[:-1]) for row in upto("decisions")],
            backends=[
                BackendRecord(name, kind, json.loads(labels), last)
                for name, kind, labels, last, _s in upto("backends")
            ],
            more=more,
            task_logs=[task_id for task_id, _s in upto("task_logs")],
        )

    def wait_for_change(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a write's notification; True if one came (all
        pending ones are consumed). The first call, and a call that finds the listening
        connection lost (it is replaced), return True at once: a notification may have been
        missed while nobody listened. ``StoreUnavailable`` if the database cannot be reached."""
        link = self._listener
        with link.lock:
            self._check_open()
            if link.conn is not None:
                conn = link.conn
                try:
                    got = bool(list(conn.notifies(timeout=max(0.0, timeout), stop_after=1)))
                    if got:
                        for _pending in conn.notifies(timeout=0.0):
                            pass
                    return got
                except psycopg.OperationalError as exc:
                    link.drop()
                    log.info(
                        "store.reconnect",
                        database=self.target,
                        connection=link.role,
                        error=self._message(exc),
                    )
            try:
                link.get()
            except psycopg.Error as exc:
                raise self._unavailable("listen", exc) from None
            return True

    # -- the leader lease --------------------------------------------------------------------

    def try_lease(self, holder: str, address: str, duration: float) -> Lease:
        """Take the lease if it is free or expired, or renew it if ``holder`` holds it (one
        statement, on the database clock); then the lease as it stands, whoever holds it. Waits
        while a fenced write is under way (its FOR SHARE lock), at most the lease connection's
        statement timeout (then ``StoreUnavailable``)."""
        if not holder:
            raise ValueError("a lease holder needs a non-empty replica id")

        params = {"holder": holder, "address": address, "duration": float(duration)}

        def take(conn: Conn, wait_ms: int) -> TupleRow | None:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = {int(wait_ms)}")
                return conn.execute(LEASE_TAKE, params).fetchone()

        def run(conn: Conn) -> Lease:
            try:
                row = take(conn, LEASE_LOCK_WAIT_MS)
            except psycopg.errors.LockNotAvailable:
                # A write holds the lease row (FOR SHARE). Of a live leader: it ends in
                # milliseconds, try again next round. Of a holder whose lease has expired: it is
                # paused or cut off inside that write, and would hold it as long as it stays so
                # (the database cannot tell a stalled pipeline from a slow one). End its
                # sessions -- the fence, done by the database -- and take the lease.
                row = None
                lease = _lease(conn.execute(LEASE_READ).fetchone())
                if lease.holder and lease.holder != holder and not lease.valid:
                    ended = conn.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE application_name LIKE %s AND pid <> pg_backend_pid()",
                        (f"{replica_application_prefix(lease.holder)}%",),
                    ).fetchone()
                    log.warning(
                        "store.stalled_holder_fenced",
                        holder=lease.holder,
                        term=lease.term,
                        sessions=ended[0] if ended else 0,
                    )
                    try:
                        row = take(conn, LEASE_TAKEOVER_WAIT_MS)
                    except psycopg.errors.LockNotAvailable:
                        row = None
            if row is None:  # held by another: a fresh statement sees the row as it is now
                row = conn.execute(LEASE_READ).fetchone()
            return _lease(row)

        return self._call(self._leases, "lease", run)

    def release_lease(self, holder: str) -> None:
        """If ``holder`` holds the lease, expire it now (same term): a follower takes it at once."""
        self._call(self._leases, "lease", lambda conn: conn.execute(LEASE_RELEASE, (holder,)))

    def read_lease(self) -> Lease:
        return self._call(
            self._leases, "lease", lambda conn: _lease(conn.execute(LEASE_READ).fetchone())
        )

    # -- replicas ----------------------------------------------------------------------------

    def heartbeat(self, row: ReplicaRow) -> None:
        """Record ``row`` (``last_seen`` is the database's now, not ``row.last_seen``)."""
        self._call(
            self._leases,
            "heartbeat",
            lambda conn: conn.execute(
                REPLICA_UPSERT,
                (row.id, row.address, row.role, row.term, float(row.lag_seconds)),
            ),
        )

    def replicas(self) -> list[ReplicaRow]:
        def run(conn: Conn) -> list[ReplicaRow]:
            return [
                ReplicaRow(*r)
                for r in conn.execute(
                    "SELECT id, address, role, term, extract(epoch FROM last_seen)::float8, "
                    "lag_seconds FROM replicas ORDER BY id"
                )
            ]

        return self._call(self._leases, "replicas", run)

    def forget_replica(self, replica_id: str) -> None:
        self._call(
            self._leases,
            "replicas",
            lambda conn: conn.execute("DELETE FROM replicas WHERE id = %s", (replica_id,)),
        )

    def close(self) -> None:
        """Close every connection (a ``wait_for_change`` under way is waited for first)."""
        self._closed = True
        for link in (self._writer, self._reader, self._leases, self._listener):
            with link.lock:
                link.drop()


def _lease(row: TupleRow | None) -> Lease:
    if row is None:  # the migration creates the row; only a hand-edited database lacks it
        raise StateFileError("the PostgreSQL store has no scheduler lease row")
    holder, address, term, valid, expires_in, renewed_at = row
    return Lease(holder, address, int(term), bool(valid), float(expires_in), float(renewed_at))


def _stream(conn: Conn, name: str, query: str, params: tuple[Any, ...]) -> Iterator[TupleRow]:
    """Rows of ``query`` through a server-side cursor, ``LOAD_CHUNK`` per round trip, binary: a
    million rows never sit in memory twice and bytea needs no hex decoding."""
    with conn.cursor(name, binary=True) as cur:
        cur.itersize = LOAD_CHUNK
        cur.execute(query, params)
        yield from cur
