"""What only the PostgreSQL store has: versioned migrations, the leader lease and write fencing,
the change feed, reconnection after a cut connection, the replica registry. (The ``Store``
contract itself is in test_store_backends.py, run against SQLite and PostgreSQL.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from pgserver import PostgresServer
from test_store_backends import decision, job_row, status, task, task_rows

from muster.v1 import muster_pb2 as pb
from server.model import TaskStatus
from server.service.errors import ErrorCode
from server.service.pgstore import (
    SCHEMA_VERSION,
    Fence,
    PostgresStore,
    ReplicaRow,
    StoredChanges,
    mask_password,
)
from server.service.records import BackendRecord
from server.service.store import (
    NotLeader,
    StateFileError,
    StoreUnavailable,
    WriteBatch,
    is_postgres_uri,
    open_store,
)

WAIT = 20.0  # safety bound for waits; never part of a verdict


@pytest.fixture
def stores(pg_dsn: str) -> Iterator[Callable[..., PostgresStore]]:
    """Opens stores on the test's database (each its own connections), closed afterwards."""
    opened: list[PostgresStore] = []

    def open_one(app: str = "muster-test") -> PostgresStore:
        opened.append(PostgresStore(pg_dsn, application_name=app))
        return opened[-1]

    yield open_one
    for store in opened:
        store.close()


def sql(dsn: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True, application_name="muster-test-probe") as conn:
        cur = conn.execute(query, params or None)
        return list(cur.fetchall()) if cur.description else []


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def waiting_on_a_lock(dsn: str, app: str) -> bool:
    """Whether a connection of ``app`` is blocked on a lock right now."""
    rows = sql(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
        "AND wait_event_type = 'Lock'",
        (app,),
    )
    return bool(rows[0][0])


def job_status(store: PostgresStore, job_id: str) -> int | None:
    job = store.job(job_id)
    return None if job is None else job.status.phase


class Thread(threading.Thread):
    """A thread that keeps its target's result or exception."""

    def __init__(self, target: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._fn = target
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - kept for the test to assert on
            self.error = exc


# -- opening and migrations -----------------------------------------------------------------------


def test_open_store_picks_the_backend_by_uri(pg_dsn: str, tmp_path: Any) -> None:
    assert is_postgres_uri("postgresql://u@h/db")
    assert is_postgres_uri("POSTGRES://h/db")
    assert not is_postgres_uri(str(tmp_path / "state.db"))
    assert not is_postgres_uri(":memory:")
    store = open_store(pg_dsn, application_name="muster-test-open")
    try:
        assert isinstance(store, PostgresStore)
        assert store.application_name == "muster-test-open"
    finally:
        store.close()
    sqlite = open_store(str(tmp_path / "state.db"))
    try:
        assert type(sqlite).__name__ == "SqliteStore"
    finally:
        sqlite.close()


def test_migrations_are_applied_once_and_reopening_changes_nothing(
    pg_dsn: str, stores: Callable[..., PostgresStore]
) -> None:
    store = stores()
    versions = sql(pg_dsn, "SELECT version FROM schema_migrations ORDER BY version")
    assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    store.write(WriteBatch(meta={"k": "v"}))
    store.close()
    again = stores()
    assert sql(pg_dsn, "SELECT version FROM schema_migrations ORDER BY version") == versions
    assert again.load().meta == {"k": "v"}
    assert again.schema_version() == SCHEMA_VERSION
    assert sql(pg_dsn, "SELECT holder, term FROM lease") == [("", 0)]


def test_a_database_migrated_by_a_newer_server_is_refused(
    pg_dsn: str, stores: Callable[..., PostgresStore]
) -> None:
    stores().close()
    sql(pg_dsn, "INSERT INTO schema_migrations (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    with pytest.raises(StateFileError) as info:
        stores()
    message = str(info.value)
    assert str(SCHEMA_VERSION + 1) in message
    assert f"version {SCHEMA_VERSION}" in message
    assert "\n" not in message


def test_servers_opening_a_new_database_together_all_succeed(
    pg_dsn: str, stores: Callable[..., PostgresStore]
) -> None:
    barrier = threading.Barrier(4)

    def open_one() -> PostgresStore:
        barrier.wait(WAIT)
        return stores()

    threads = [Thread(open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert [t.error for t in threads] == [None] * 4
    assert sql(pg_dsn, "SELECT count(*) FROM schema_migrations") == [(SCHEMA_VERSION,)]
    assert sql(pg_dsn, "SELECT count(*) FROM lease") == [(1,)]


def test_a_role_without_create_privilege_opens_a_migrated_database(
    pg_dsn: str, stores: Callable[..., PostgresStore]
) -> None:
    stores().close()  # migrated by the owner
    role = f"app_{pg_dsn.rsplit('/', 1)[1]}"
    sql(pg_dsn, f"CREATE ROLE {role} LOGIN")
    try:
        sql(pg_dsn, "REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        sql(pg_dsn, f"GRANT USAGE ON SCHEMA public TO {role}")
        sql(
            pg_dsn, f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}"
        )
        sql(pg_dsn, f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
        store = PostgresStore(pg_dsn.replace("muster@", f"{role}@"), application_name="app")
        try:
            store.write(WriteBatch(meta={"k": "v"}, queues={"q": b"Q"}))
            assert store.load().meta == {"k": "v"}
        finally:
            store.close()
    finally:
        sql(pg_dsn, f"DROP OWNED BY {role}")
        sql(pg_dsn, f"DROP ROLE {role}")


def test_a_database_with_foreign_tables_of_the_same_names_is_refused(pg_dsn: str) -> None:
    sql(pg_dsn, "CREATE TABLE jobs (x integer)")
    with pytest.raises(StateFileError, match="cannot use PostgreSQL database .* as a Muster store"):
        PostgresStore(pg_dsn)
    # Nothing of the failed migration stays behind (one transaction).
    assert sql(pg_dsn, "SELECT to_regclass('meta') IS NULL, to_regclass('schema_migrations')") == [
        (True, None)
    ]


def test_an_unreachable_database_is_named_in_one_line_without_its_password() -> None:
    from pgserver import free_port

    port = free_port()  # nothing listens there
    with pytest.raises(StateFileError) as info:
        PostgresStore(f"postgresql://muster:s3cr%21t@127.0.0.1:{port}/state", connect_timeout=2)
    message = str(info.value)
    assert f"127.0.0.1:{port}/state" in message
    assert "muster@" in message
    assert "s3cr" not in message
    assert "\n" not in message


def test_mask_password_hides_every_spelling() -> None:
    assert mask_password("postgresql://u:pw@h:5/db") == "postgresql://u:***@h:5/db"
    assert mask_password("postgres://u:p%40w@h/db?sslmode=require&password=x") == (
        "postgres://u:***@h/db?sslmode=require&password=***"
    )
    assert mask_password("postgresql://u@h/db") == "postgresql://u@h/db"
    assert mask_password("host=h password='a b' user=u") == "host=h password=*** user=u"
    assert mask_password("host=h password=secret") == "host=h password=***"


# -- the lease ------------------------------------------------------------------------------------


def test_taking_an_expired_lease_bumps_the_term_and_renewal_keeps_it(
    stores: Callable[..., PostgresStore],
) -> None:
    store = stores()
    before = store.read_lease()
    assert (before.holder, before.term, before.valid) == ("", 0, False)
    lease = store.try_lease("A", "a:1", 30.0)
    assert (lease.holder, lease.address, lease.term, lease.valid) == ("A", "a:1", 1, True)
    assert 29.0 < lease.expires_in <= 30.0
    assert abs(lease.renewed_at - time.time()) < 5.0
    time.sleep(0.05)
    renewed = store.try_lease("A", "a:2", 60.0)
    assert (renewed.holder, renewed.address, renewed.term) == ("A", "a:2", 1)
    assert renewed.renewed_at > lease.renewed_at
    assert renewed.expires_in > 59.0
    assert store.read_lease().term == 1


def test_another_holder_cannot_take_a_valid_lease(stores: Callable[..., PostgresStore]) -> None:
    a, b = stores("muster-test-a"), stores("muster-test-b")
    a.try_lease("A", "a:1", 30.0)
    seen = b.try_lease("B", "b:1", 30.0)
    assert (seen.holder, seen.address, seen.term, seen.valid) == ("A", "a:1", 1, True)
    assert b.read_lease().holder == "A"


def test_expiry_on_the_database_clock_lets_another_take_it_with_the_next_term(
    stores: Callable[..., PostgresStore],
) -> None:
    a, b = stores("muster-test-a"), stores("muster-test-b")
    a.try_lease("A", "a:1", 0.3)
    assert b.try_lease("B", "b:1", 30.0).holder == "A"
    wait_until(lambda: not b.read_lease().valid, "the lease to expire")
    assert b.read_lease().expires_in < 0
    taken = b.try_lease("B", "b:1", 30.0)
    assert (taken.holder, taken.address, taken.term, taken.valid) == ("B", "b:1", 2, True)
    # The old holder cannot renew a lease that changed hands.
    assert a.try_lease("A", "a:1", 30.0).holder == "B"


def test_release_hands_the_lease_over_at_once(stores: Callable[..., PostgresStore]) -> None:
    a, b = stores("muster-test-a"), stores("muster-test-b")
    a.try_lease("A", "a:1", 60.0)
    b.release_lease("B")  # not the holder: nothing happens
    assert a.read_lease().valid
    a.release_lease("A")
    released = a.read_lease()
    assert (released.holder, released.term, released.valid) == ("A", 1, False)
    taken = b.try_lease("B", "b:1", 60.0)
    assert (taken.holder, taken.term, taken.valid) == ("B", 2, True)


def test_a_lease_holder_needs_an_id(stores: Callable[..., PostgresStore]) -> None:
    with pytest.raises(ValueError, match="a lease holder needs a non-empty replica id"):
        stores().try_lease("", "a:1", 10.0)


# -- fencing --------------------------------------------------------------------------------------


def test_a_fenced_write_after_a_takeover_raises_not_leader_and_writes_nothing(
    stores: Callable[..., PostgresStore],
) -> None:
    a, b = stores("muster-test-a"), stores("muster-test-b")
    lease = a.try_lease("A", "a:1", 0.5)
    a.fence = Fence("A", lease.term)
    a.write(WriteBatch(meta={"k": "1"}, jobs={"j": job_row("j", 1)}))
    wait_until(lambda: not b.read_lease().valid, "the lease to expire")
    assert b.try_lease("B", "b:1", 30.0).term == 2
    with pytest.raises(NotLeader) as info:
        a.write(
            WriteBatch(
                meta={"k": "2"},
                queues={"q": b"Q"},
                jobs={"j": job_row("j", 1, phase=pb.JOB_PHASE_RUNNING)},
                tasks=task_rows(task("j", 0)),
            )
        )
    assert info.value.code is ErrorCode.UNAVAILABLE
    loaded = b.load()
    assert loaded.meta == {"k": "1"}
    assert loaded.queues == {}
    assert [j.status.phase for j in loaded.jobs] == [pb.JOB_PHASE_PENDING]
    assert loaded.jobs[0].tasks == []
    # The store still works for the new leader, and for the old one once it holds a fence again.
    b.fence = Fence("B", 2)
    b.write(WriteBatch(meta={"k": "3"}))
    a.fence = None
    a.write(WriteBatch(meta={"k": "4"}))
    assert b.load().meta == {"k": "4"}


def test_a_fence_needs_the_holder_and_its_term_and_a_valid_lease(
    stores: Callable[..., PostgresStore],
) -> None:
    a = stores()
    a.try_lease("A", "a:1", 30.0)
    for fence in (Fence("A", 2), Fence("B", 1)):
        a.fence = fence
        with pytest.raises(NotLeader):
            a.write(WriteBatch(meta={"k": "x"}))
    a.fence = Fence("A", 1)
    a.write(WriteBatch(meta={"k": "ok"}))
    a.release_lease("A")  # expired, same holder and term: still refused
    with pytest.raises(NotLeader):
        a.write(WriteBatch(meta={"k": "late"}))
    assert a.load().meta == {"k": "ok"}


def test_a_takeover_waits_for_the_fenced_write_in_progress(
    pg_dsn: str, stores: Callable[..., PostgresStore]
) -> None:
    a, b = stores("muster-test-leader"), stores("muster-test-follower")
    lease = a.try_lease("A", "a:1", 1.5)
    a.fence = Fence("A", lease.term)
    a.write(WriteBatch(jobs={"j": job_row("j", 1)}))
    # Another session locks the job row: A's next write passes its fence check, then waits.
    with psycopg.connect(pg_dsn, application_name="muster-test-blocker") as blocker:
        blocker.execute("SELECT 1 FROM jobs WHERE id = 'j' FOR UPDATE")
        writing = Thread(
            lambda: a.write(
                WriteBatch(
                    meta={"by": "A"}, jobs={"j": job_row("j", 1, phase=pb.JOB_PHASE_RUNNING)}
                )
            )
        )
        writing.start()
        wait_until(lambda: waiting_on_a_lock(pg_dsn, "muster-test-leader"), "A's write to block")
        wait_until(lambda: not b.read_lease().valid, "A's lease to expire (mid-write)")
        taking = Thread(lambda: b.try_lease("B", "b:1", 30.0))
        taking.start()
        # The takeover waits on the lease row A's write holds FOR SHARE ...
        wait_until(lambda: waiting_on_a_lock(pg_dsn, "muster-test-follower"), "B to wait")
        assert taking.is_alive()
        assert writing.is_alive()
        blocker.rollback()
    # ... and goes through once that write committed, with the next term.
    writing.join(WAIT)
    taking.join(WAIT)
    assert writing.error is None, writing.error
    assert taking.error is None, taking.error
    assert (taking.result.holder, taking.result.term) == ("B", 2)
    assert job_status(b, "j") == pb.JOB_PHASE_RUNNING
    assert b.load().meta == {"by": "A"}
    with pytest.raises(NotLeader):
        a.write(WriteBatch(meta={"by": "A again"}))


# -- the change feed ------------------------------------------------------------------------------


def full_batch() -> WriteBatch:
    return WriteBatch(
        meta={"server_id": "s", "next_cycle_id": "2"},
        queues={"q1": b"Q1", "q2": b"Q2"},
        jobs={"j1": job_row("j1", 1), "j2": job_row("j2", 2)},
        tasks=task_rows(task("j1", 0), task("j1", 1), task("j2", 0)),
        decisions={1: decision(1).row()},
        backends={"a": ("a", "slurm", "{}", 0)},
    )


def test_changes_since_returns_exactly_the_changed_rows_in_order(
    stores: Callable[..., PostgresStore],
) -> None:
    leader, follower = stores("muster-test-a"), stores("muster-test-b")
    assert follower.changes_since(0) == StoredChanges(0, {}, {}, [], [], [], [], False)
    leader.write(full_batch())
    first = follower.changes_since(0)
    assert first.seq > 0
    assert not first.more
    assert first.meta == {"server_id": "s", "next_cycle_id": "2"}
    assert first.queues == {"q1": b"Q1", "q2": b"Q2"}
    assert [(j.id, j.creation_index, j.tasks) for j in first.jobs] == [("j1", 1, []), ("j2", 2, [])]
    assert first.jobs[0].spec == job_row("j1", 1)[2]
    assert [t.uid for t in first.tasks] == ["j1/worker-0", "j1/worker-1", "j2/worker-0"]
    assert first.decisions == [decision(1)]
    assert first.backends == [BackendRecord("a", "slurm", {}, 0)]
    # Nothing since: the same seq back, nothing in it.
    assert follower.changes_since(first.seq) == StoredChanges(
        first.seq, {}, {}, [], [], [], [], False
    )
    # Only what changed; rows written again unchanged are not changes.
    running = task("j1", 1, TaskStatus.RUNNING, "n1")
    leader.write(
        WriteBatch(
            meta={"server_id": "s", "next_cycle_id": "3"},
            queues={"q1": b"Q1"},
            jobs={
                "j2": job_row("j2", 2, phase=pb.JOB_PHASE_RUNNING),
                "j1": job_row("j1", 1),
            },
            tasks=task_rows(task("j1", 0), running),
            decisions={1: decision(1, "applied").row()},
        )
    )
    second = follower.changes_since(first.seq)
    assert second.seq > first.seq
    assert not second.more
    assert second.meta == {"next_cycle_id": "3"}
    assert second.queues == {}
    assert [(j.id, j.status.phase) for j in second.jobs] == [("j2", pb.JOB_PHASE_RUNNING)]
    assert second.tasks == [running]
    assert [(d.id, d.state) for d in second.decisions] == [(1, "applied")]
    assert second.backends == []
    # Rows come in the order they were written (seq order), not by key.
    leader.write(WriteBatch(jobs={"j9": job_row("j9", 9)}))
    leader.write(WriteBatch(jobs={"j3": job_row("j3", 3)}))
    leader.write(WriteBatch(jobs={"j1": job_row("j1", 1, phase=pb.JOB_PHASE_FAILED)}))
    assert [j.id for j in follower.changes_since(second.seq).jobs] == ["j9", "j3", "j1"]


def test_deleted_queues_come_through_the_feed_as_none(stores: Callable[..., PostgresStore]) -> None:
    store = stores()
    store.write(WriteBatch(queues={"a": b"A", "b": b"B"}))
    seq = store.changes_since(0).seq
    store.write(WriteBatch(deleted_queues={"a"}))
    deleted = store.changes_since(seq)
    assert deleted.queues == {"a": None}
    store.write(WriteBatch(queues={"a": b"A2"}))
    assert store.changes_since(deleted.seq).queues == {"a": b"A2"}
    store.write(WriteBatch(deleted_queues={"b", "never"}))
    assert store.changes_since(0).queues == {"a": b"A2", "b": None}
    assert store.load().queues == {"a": b"A2"}


def all_rows(changes: StoredChanges) -> list[tuple[str, str]]:
    return (
        [("meta", k) for k in changes.meta]
        + [("queue", k) for k in changes.queues]
        + [("job", j.id) for j in changes.jobs]
        + [("task", t.uid) for t in changes.tasks]
        + [("decision", str(d.id)) for d in changes.decisions]
        + [("backend", b.name) for b in changes.backends]
    )


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 7])
def test_paging_the_feed_never_skips_a_row(
    stores: Callable[..., PostgresStore], limit: int
) -> None:
    """Tables whose seqs interleave: a page cut in one table is cut at the same seq in all."""
    store = stores()
    for i in range(6):
        store.write(
            WriteBatch(
                meta={f"m{i % 2}": str(i)},
                jobs={f"j{i}": job_row(f"j{i}", i + 1)},
                tasks=task_rows(task(f"j{i}", 0), task(f"j{i}", 1)) if i % 2 else {},
                decisions={i: decision(i).row()} if i % 3 == 0 else {},
                queues={f"q{i}": b"Q"} if i == 4 else {},
            )
        )
    everything = store.changes_since(0)
    assert not everything.more
    expected = sorted(all_rows(everything))
    seen: list[tuple[str, str]] = []
    seq, pages = 0, 0
    while True:
        page = store.changes_since(seq, limit)
        pages += 1
        rows = all_rows(page)
        assert len(rows) <= limit
        assert rows or not page.more
        assert page.seq >= seq
        seen += rows
        seq = page.seq
        if not page.more:
            break
        assert pages < 100
    assert sorted(seen) == expected
    assert len(seen) == len(expected)
    assert seq == everything.seq
    assert pages >= len(expected) // limit


def test_the_feed_continues_from_a_load(stores: Callable[..., PostgresStore]) -> None:
    leader, follower = stores("muster-test-a"), stores("muster-test-b")
    leader.write(full_batch())
    loaded = follower.load()
    assert loaded.seq == follower.changes_since(0).seq > 0
    assert follower.changes_since(loaded.seq).seq == loaded.seq
    leader.write(WriteBatch(jobs={"j3": job_row("j3", 3)}))
    changes = follower.changes_since(loaded.seq)
    assert [j.id for j in changes.jobs] == ["j3"]
    assert all_rows(changes) == [("job", "j3")]


def test_wait_for_change_wakes_on_a_write_from_another_store(
    stores: Callable[..., PostgresStore],
) -> None:
    leader, follower = stores("muster-test-a"), stores("muster-test-b")
    # The first call listens from now on; it cannot know what it missed before, so: True.
    assert follower.wait_for_change(0.01) is True
    assert follower.wait_for_change(0.05) is False
    waiter = Thread(lambda: follower.wait_for_change(WAIT))
    started = time.monotonic()
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive()
    leader.write(WriteBatch(meta={"k": "1"}))
    waiter.join(WAIT)
    assert waiter.error is None
    assert waiter.result is True
    assert time.monotonic() - started < WAIT / 2
    # Writes while nobody waits are noticed by the next wait, which takes all of them.
    leader.write(WriteBatch(meta={"k": "2"}))
    leader.write(WriteBatch(meta={"k": "3"}))
    time.sleep(0.2)  # both notifications reach the listening connection
    assert follower.wait_for_change(WAIT) is True
    assert follower.wait_for_change(0.05) is False
    # A batch that writes nothing and a fenced write refused send nothing.
    leader.write(WriteBatch())
    leader.fence = Fence("nobody", 1)
    with pytest.raises(NotLeader):
        leader.write(WriteBatch(meta={"k": "4"}))
    assert follower.wait_for_change(0.2) is False


# -- connection loss ------------------------------------------------------------------------------


def test_a_cut_connection_is_replaced_and_the_store_works_on(
    postgres_server: PostgresServer, pg_dsn: str, stores: Callable[..., PostgresStore]
) -> None:
    store = stores("muster-test-cut")
    other = stores("muster-test-other")
    store.write(WriteBatch(meta={"k": "1"}, jobs={"j1": job_row("j1", 1)}))
    assert store.job("j1") is not None
    assert store.try_lease("A", "a:1", 30).holder == "A"
    store.heartbeat(ReplicaRow("A", "a:1", "leader", 1, 0.0, 0.0))
    assert store.wait_for_change(0.01) is True  # opens the listening connection
    assert postgres_server.terminate("muster-test-cut") == 4
    batch = WriteBatch(
        meta={"k": "2"},
        jobs={"j2": job_row("j2", 2)},
        tasks=task_rows(task("j2", 0, TaskStatus.RUNNING, "n0")),
    )
    try:
        store.write(batch)
        written = True
    except StoreUnavailable:
        written = False
    loaded = other.load()
    if written:
        assert loaded.meta == {"k": "2"}
        assert [j.id for j in loaded.jobs] == ["j1", "j2"]
        assert len(loaded.jobs[1].tasks) == 1
    else:
        assert loaded.meta == {"k": "1"}
        assert [j.id for j in loaded.jobs] == ["j1"]
    # Every connection works again.
    store.write(WriteBatch(meta={"k": "3"}))
    assert other.load().meta == {"k": "3"}
    assert store.job("j1") is not None
    assert store.load().meta == {"k": "3"}
    assert store.try_lease("A", "a:1", 30).term == 1
    assert [r.id for r in store.replicas()] == ["A"]
    # The listening connection is replaced; what it missed meanwhile is unknown: True.
    assert store.wait_for_change(0.01) is True
    assert store.wait_for_change(0.01) is False
    other.write(WriteBatch(meta={"k": "4"}))
    assert store.wait_for_change(WAIT) is True


def test_a_write_cut_mid_transaction_is_not_half_applied(
    postgres_server: PostgresServer, pg_dsn: str, stores: Callable[..., PostgresStore]
) -> None:
    store = stores("muster-test-cut")
    store.write(WriteBatch(jobs={"held": job_row("held", 1)}))
    batch = WriteBatch(
        meta={"k": "new"},
        jobs={"held": job_row("held", 1, phase=pb.JOB_PHASE_RUNNING), "fresh": job_row("fresh", 2)},
    )
    with psycopg.connect(pg_dsn, application_name="muster-test-blocker") as blocker:
        blocker.execute("SELECT 1 FROM jobs WHERE id = 'held' FOR UPDATE")
        writing = Thread(lambda: store.write(batch))
        writing.start()
        # Cut it each time it waits inside its transaction (meta already written), until it
        # gives up (it retries once on a new connection).
        deadline = time.monotonic() + WAIT
        while writing.is_alive() and time.monotonic() < deadline:
            if waiting_on_a_lock(pg_dsn, "muster-test-cut"):
                postgres_server.terminate("muster-test-cut")
            time.sleep(0.02)
        writing.join(WAIT)
        blocker.rollback()
    assert isinstance(writing.error, StoreUnavailable), writing.error
    assert writing.error.code is ErrorCode.UNAVAILABLE
    loaded = stores("muster-test-reader").load()
    assert loaded.meta == {}
    assert [(j.id, j.status.phase) for j in loaded.jobs] == [("held", pb.JOB_PHASE_PENDING)]
    store.write(batch)
    assert {j.id for j in store.load().jobs} == {"held", "fresh"}


def test_a_database_that_is_down_makes_calls_unavailable_until_it_is_back(
    postgres_server: PostgresServer,  # only for its skip when PostgreSQL is missing
) -> None:
    # With fsync: an immediate stop is a crash, and a crash must not lose a commit.
    with PostgresServer(fast=False) as pg:
        store = PostgresStore(pg.dsn, application_name="muster-test-down", connect_timeout=2)
        try:
            store.write(WriteBatch(meta={"k": "1"}, jobs={"j": job_row("j", 1)}))
            pg.stop("immediate")
            calls: list[Callable[[], object]] = [
                lambda: store.write(WriteBatch(meta={"k": "2"})),
                store.load,
                lambda: store.job("j"),
                lambda: store.jobs_page(0, "", "", [], 10),
                lambda: store.changes_since(0),
                lambda: store.decision_states([1]),
                lambda: store.try_lease("A", "a:1", 10),
                store.replicas,
                lambda: store.wait_for_change(0.01),
            ]
            for call in calls:
                with pytest.raises(StoreUnavailable) as info:
                    call()
                assert "127.0.0.1" in info.value.message
            pg.start()
            store.write(WriteBatch(meta={"k": "3"}))
            assert store.load().meta == {"k": "3"}
            assert store.job("j") is not None
            assert store.try_lease("A", "a:1", 10).holder == "A"
        finally:
            store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        store.write(WriteBatch(meta={"k": "4"}))


# -- replicas -------------------------------------------------------------------------------------


def test_replicas_heartbeat_list_and_forget(stores: Callable[..., PostgresStore]) -> None:
    store = stores()
    assert store.replicas() == []
    store.heartbeat(ReplicaRow("b", "b:1", "follower", 1, 0.0, 0.5))
    store.heartbeat(ReplicaRow("a", "a:1", "leader", 1, 12345.0, 0.0))
    first = store.replicas()
    assert [(r.id, r.address, r.role, r.term, r.lag_seconds) for r in first] == [
        ("a", "a:1", "leader", 1, 0.0),
        ("b", "b:1", "follower", 1, 0.5),
    ]
    assert all(abs(r.last_seen - time.time()) < 5.0 for r in first)  # the database's now
    time.sleep(0.05)
    store.heartbeat(ReplicaRow("b", "b:2", "leader", 2, 0.0, 0.0))
    b = store.replicas()[1]
    assert (b.address, b.role, b.term) == ("b:2", "leader", 2)
    assert b.last_seen > first[1].last_seen
    store.forget_replica("a")
    store.forget_replica("unknown")
    assert [r.id for r in store.replicas()] == ["b"]


def test_load_reports_the_feed_seq_and_sqlite_reports_zero(
    stores: Callable[..., PostgresStore], tmp_path: Any
) -> None:
    store = stores()
    assert store.load().seq == 0
    store.write(WriteBatch(meta={"a": "1"}, jobs={"j": job_row("j", 1, st=status(1))}))
    seq = store.load().seq
    assert seq == store.changes_since(0).seq
    assert seq >= 2
    from server.service.store import SqliteStore

    sqlite = SqliteStore(tmp_path / "s.db")
    try:
        sqlite.write(WriteBatch(meta={"a": "1"}))
        assert sqlite.load().seq == 0
    finally:
        sqlite.close()
