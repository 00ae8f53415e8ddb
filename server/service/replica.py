"""Replicated servers: one leader schedules, the followers keep a warm copy and answer reads.

Every ``muster-server`` given the same PostgreSQL ``--state`` is a replica of one deployment
(docs/ha.md). Which one leads is a lease row in the database (``PostgresStore.try_lease``): held
for ``lease_duration`` seconds on the database's clock, renewed every ``renew_interval``, and its
term grows by one on every change of holder.

Safety does not rest on timing. A leader's store carries its fence (replica id, term); every write
checks, inside its own transaction, that the lease is still held at that term, and the row lock
that check takes makes a takeover wait for the write to commit. So every commit of term T precedes
term T+1, and a leader that was paused, partitioned or slow commits nothing once it lost the lease.
Decisions are sent only once written (``DecisionLog.release``) and carry the term, so a backend
never acts on a decision the next leader does not know, and refuses the old leader's late ones.

A follower reads the change feed (``changes_since``, woken by LISTEN/NOTIFY) into its
``ClusterState``, so a takeover is: the lease expires, the follower wins it, catches up the last
rows, adopts the pending decisions (its term, bind deadlines restarted: the grace backends get to
reconnect) and starts cycling. A leader that loses its lease, or whose write fails, stops cycling,
reloads its state from the store (its memory may hold changes that were never written) and
follows. SIGTERM hands the lease over at once (``handover``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum

import anyio
import structlog

from server.service.audit import audit
from server.service.errors import DomainError
from server.service.liveness import start_liveness
from server.service.observability import Telemetry
from server.service.pgstore import Fence, Lease, PostgresStore, ReplicaRow, StoredChanges
from server.service.retention import drop_finished
from server.service.state import ClusterState
from server.service.store import StoredState, StoreWriter

log = structlog.get_logger("muster.replica")

# A replica not heard from for this many heartbeats is left out of ListServers.
STALE_HEARTBEATS = 10


class Role(Enum):
    FOLLOWER = "follower"
    LEADER = "leader"


@dataclass(frozen=True)
class ReplicaOptions:
    replica_id: str
    address: str  # the gRPC address other replicas and clients reach this one at
    lease_duration: float = 3.0
    renew_interval: float = 1.0
    heartbeat_interval: float = 1.0
    job_retention: float = 600.0


class Replica:
    """This server's part in the deployment: campaigns for the lease, leads or follows."""

    def __init__(
        self,
        store: PostgresStore,
        state: ClusterState,
        writer: StoreWriter,
        options: ReplicaOptions,
        *,
        lead: Callable[[], Awaitable[None]],
        on_meta: Callable[[dict[str, str]], None] = lambda _meta: None,
        on_demoted: Callable[[], None] = lambda: None,
        telemetry: Telemetry | None = None,
    ) -> None:
        """``lead`` runs the cycle loop (until cancelled); ``on_meta`` sees meta rows the leader
        wrote (the active configuration); ``on_demoted`` ends what a leader serves (decision
        streams) when it stops leading."""
        self.store = store
        self.state = state
        self.writer = writer
        self.options = options
        self.id = options.replica_id
        self.address = options.address
        self._lead = lead
        self._on_meta = on_meta
        self._on_demoted = on_demoted
        self.telemetry = telemetry
        self.role = Role.FOLLOWER
        self.term = 0  # the term held (leader) or last seen
        self.leader_address = ""
        self.applied_seq = 0
        self.caught_up_at = time.time()
        self._renewed_at = float("-inf")  # monotonic start of the last successful renewal
        self._lead_scope: anyio.CancelScope | None = None
        self._feed_lock = anyio.Lock()
        self._demote = anyio.Event()  # a write failed: stop leading
        self._demote_reason = ""
        self._stopping = False
        store.fence = Fence(self.id, 0)  # term 0 is never held: a follower's write is refused
        writer.on_failed = self.write_failed

    @property
    def leading(self) -> bool:
        return self.role is Role.LEADER

    def lag_seconds(self) -> float:
        return 0.0 if self.leading else max(0.0, time.time() - self.caught_up_at)

    def started_from(self, stored: StoredState) -> None:
        """The state was restored from ``stored``: follow the feed from there, writing nothing."""
        self.applied_seq = stored.seq
        self.caught_up_at = time.time()
        self.state.forget_changes()  # restore() marks deadlines and counters; a follower writes nothing

    def write_failed(self, exc: Exception) -> None:
        """A write was refused (lease lost) or the store unreachable: memory may now hold
        changes the store does not; stop leading and reload."""
        if self.leading and not self._demote.is_set():
            self._demote_reason = f"{type(exc).__name__}: {exc}"
            self._demote.set()

    # -- running --------------------------------------------------------------------------------

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._campaign, tg)
            tg.start_soon(self._follow)
            tg.start_soon(self._heartbeat)

    async def handover(self) -> None:
        """Graceful stop: stop cycling, write what is pending, give the lease up at once."""
        self._stopping = True
        if self._lead_scope is not None:
            self._lead_scope.cancel()
        if self.leading:
            try:
                await self.writer.flush(self.state.commit)
            except DomainError as exc:
                log.warning("replica.final_write_failed", error=str(exc))
            await anyio.to_thread.run_sync(self.store.release_lease, self.id)
            self._became("follower", f"handed over (term {self.term})")
            self.role = Role.FOLLOWER
        with contextlib.suppress(DomainError):
            await anyio.to_thread.run_sync(self.store.forget_replica, self.id)

    async def _campaign(self, tg: anyio.abc.TaskGroup) -> None:
        opts = self.options
        while not self._stopping:
            with anyio.move_on_after(opts.renew_interval):
                await self._demote.wait()
            if self._stopping:
                return
            if self._demote.is_set():
                await self._step_down(self._demote_reason)
            started = time.monotonic()
            try:
                lease = await anyio.to_thread.run_sync(
                    self.store.try_lease, self.id, self.address, opts.lease_duration
                )
            except DomainError as exc:  # the store is unreachable
                log.warning("replica.lease_unreachable", error=str(exc), role=self.role.value)
                if self.leading and time.monotonic() - self._renewed_at >= opts.lease_duration:
                    await self._step_down(f"lease not renewed for {opts.lease_duration} s: {exc}")
                continue
            if self._stopping:
                return
            if lease.holder == self.id and lease.valid:
                self._renewed_at = started
                if not self.leading:
                    await self._take_over(lease, tg)
                elif lease.term != self.term:  # it expired, another held it, we took it back
                    await self._step_down(f"term moved from {self.term} to {lease.term}")
            else:
                if self.leading:
                    await self._step_down(f"lease held by {lease.address or lease.holder}")
                self._seen(lease)

    def _seen(self, lease: Lease) -> None:
        self.term = max(self.term, lease.term)
        # A valid lease naming this address but not this replica is a previous process's on the
        # same address (restarted): no leader to name until it expires.
        named = lease.valid and (lease.address != self.address or lease.holder == self.id)
        self.leader_address = lease.address if named else ""

    async def _take_over(self, lease: Lease, tg: anyio.abc.TaskGroup) -> None:
        started = time.perf_counter()
        async with self._feed_lock:
            # Everything committed before the lease changed hands is readable now: the takeover
            # waited for any write still holding the old term's lease row.
            await self._catch_up()
            self.store.fence = Fence(self.id, lease.term)
            self.term = lease.term
            self.state.decisions.adopt(lease.term, self.state.clock())
            self.state.ensure_default_queues()  # the first leader of a new store writes them
            # Every backend's clock starts now: none is declared silent for the time before.
            start_liveness(self.state)
            try:
                await self.writer.flush(self.state.commit)  # the adopted decisions, at our term
            except DomainError as exc:
                log.warning("replica.takeover_failed", error=str(exc))
                await self._reload()
                return
            self.role = Role.LEADER
            self.leader_address = self.address
            self._demote = anyio.Event()
        seconds = time.perf_counter() - started
        self._became("leader", f"term {lease.term}", catch_up_seconds=round(seconds, 4))
        tg.start_soon(self._leading)

    async def _leading(self) -> None:
        with anyio.CancelScope() as scope:
            self._lead_scope = scope
            await self._lead()
            # The loop ended by itself: it stops on a failed write (handled by write_failed).
        self._lead_scope = None

    async def _step_down(self, reason: str) -> None:
        if not self.leading:
            return
        self.role = Role.FOLLOWER
        self.store.fence = Fence(self.id, 0)
        if self._lead_scope is not None:
            self._lead_scope.cancel()
        self._on_demoted()
        self._became("follower", reason)
        async with self._feed_lock:
            await self._reload()
        self._demote = anyio.Event()

    async def _reload(self) -> None:
        """Back to what the store has: memory may hold changes that were never written."""
        while True:
            try:
                stored = await anyio.to_thread.run_sync(
                    self.store.load, time.time() - self.options.job_retention
                )
                break
            except DomainError as exc:
                log.warning("replica.reload_failed", error=str(exc))
                await anyio.sleep(self.options.renew_interval)
        self.state.reset()
        self.state.restore(stored)
        self._on_meta(stored.meta)
        self.started_from(stored)
        self.writer.reset()

    def _became(self, role: str, why: str, **extra: float) -> None:
        log.info("replica.role", role=role, term=self.term, reason=why, replica=self.id, **extra)
        audit(f"replica:{self.id}", "Lease", role.upper(), f"{self.address} {why}")
        if self.telemetry is not None:
            self.telemetry.leadership(role == "leader", self.term)

    # -- following ------------------------------------------------------------------------------

    async def _follow(self) -> None:
        while not self._stopping:
            if self.leading:
                await anyio.sleep(self.options.renew_interval)
                continue
            try:
                async with self._feed_lock:
                    if self.leading:
                        continue
                    more = await self._catch_up_once()
                if not more:
                    await anyio.to_thread.run_sync(
                        self.store.wait_for_change, 0.5, abandon_on_cancel=True
                    )
            except DomainError as exc:
                log.warning("replica.feed_unreachable", error=str(exc))
                await anyio.sleep(self.options.renew_interval)

    async def _catch_up(self) -> None:
        while await self._catch_up_once():
            pass

    async def _catch_up_once(self) -> bool:
        asked = time.time()
        changes = await anyio.to_thread.run_sync(self.store.changes_since, self.applied_seq)
        self._apply(changes)
        if not changes.more:
            self.caught_up_at = asked
            drop_finished(self.state)
        return changes.more

    def _apply(self, changes: StoredChanges) -> None:
        if changes.seq == self.applied_seq:
            return
        self.state.absorb(
            meta=changes.meta,
            queues=changes.queues,
            jobs=changes.jobs,
            tasks=changes.tasks,
            decisions=changes.decisions,
            backends=changes.backends,
        )
        if changes.meta:
            self._on_meta(changes.meta)
        # Streams following task output read it from the store: wake those whose tasks wrote or
        # changed (a task's end ends its stream).
        self.state.task_logs.notify([*changes.task_logs, *(t.uid for t in changes.tasks)])
        self.applied_seq = changes.seq

    async def _heartbeat(self) -> None:
        while not self._stopping:
            row = ReplicaRow(
                self.id, self.address, self.role.value, self.term, 0.0, self.lag_seconds()
            )
            try:
                await anyio.to_thread.run_sync(self.store.heartbeat, row)
            except DomainError as exc:
                log.debug("replica.heartbeat_failed", error=str(exc))
            await anyio.sleep(self.options.heartbeat_interval)

    def servers(self) -> tuple[list[ReplicaRow], Lease]:
        """The live replicas (heard from recently), this one as it is now (blocking: call from a
        worker thread)."""
        rows = self.store.replicas()
        lease = self.store.read_lease()
        now = time.time()
        window = STALE_HEARTBEATS * self.options.heartbeat_interval
        live = []
        for r in rows:
            if r.id == self.id or now - r.last_seen > window:
                continue
            # The lease says who leads; a heartbeat may be a second old.
            role = "leader" if lease.valid and r.id == lease.holder else "follower"
            live.append(ReplicaRow(r.id, r.address, role, r.term, r.last_seen, r.lag_seconds))
        seen = lease.renewed_at if self.leading else now
        me = ReplicaRow(self.id, self.address, self.role.value, self.term, seen, self.lag_seconds())
        return sorted([me, *live], key=lambda r: (r.role != "leader", r.address)), lease
