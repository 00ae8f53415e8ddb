"""Shared adapter runtime: the backend side of the Muster API, for every adapter.

A concrete adapter (fake bare-metal agent, Slurm, Kubernetes) implements the small
:class:`Backend` protocol -- *what the cluster looks like* and *how to apply a decision* -- and
hands it to :class:`BackendRuntime`, which does all the talking to the server::

    runtime = BackendRuntime(backend, server="127.0.0.1:50051", name="rack-a", kind="fake-agent")
    # or the servers of a replicated deployment: server="a:50051,b:50051,c:50051" (or a list)
    backend.attach(runtime)            # optional: lets the backend queue deltas
    await runtime.run()                # until runtime.stop() or cancellation

The pieces: :mod:`adapters.backend` (the protocol, :class:`Outcome`, :class:`Rejected`),
:mod:`adapters.ledger` (decision dedup), :mod:`adapters.outbox` (acks and deltas in order) and
:mod:`adapters.retry` (the reconnect backoff); what an adapter needs is importable from here.

What the runtime does, per connection ("session"):

1. ``RegisterBackend`` (name, kind, labels). The reply's ``server_id`` keys the decision ledger: a
   server that lost its state restarts decision ids, so a new ``server_id`` clears the ledger.
2. ``SyncSnapshot`` with ``await backend.list_nodes()`` and ``await backend.list_tasks()`` (the
   full current state, including tasks still running from before a disconnect).
3. Flushes the outbox (acks and deltas queued while disconnected, in their original order).
4. Runs, in one anyio task group: the decision reader (``StreamDecisionBatches`` with
   ``after_decision_id`` = the highest decision id this runtime has applied and had acknowledged,
   and ``max_batch``; ``StreamDecisions`` from a server that lacks it), the applier, the
   outbox sender, and the heartbeat.

Heartbeat (docs/operations.md, dead backends)
    The server declares a backend it has not heard from for its grace period silent: its nodes
    NotReady, its tasks Unknown, lost after a longer timeout. So every ``heartbeat_seconds`` (what
    the server asks for in its RegisterBackend / Heartbeat replies: a quarter of its grace;
    ``heartbeat_interval`` from a server that does not say) the runtime calls ``Heartbeat``. A
    reply with ``resync`` (the server had declared this backend silent) ends the session and a new
    one starts at once: register and a full SyncSnapshot, so what the backend still runs is adopted
    and what it no longer runs is lost. A server without Heartbeat (UNIMPLEMENTED) is not asked
    again in that session.

Any RPC failure ends the session; the runtime reconnects with exponential backoff and full
jitter (``backoff_initial`` doubling up to ``backoff_max``; reset after a successful sync) and
re-syncs. ``stop()`` ends :meth:`BackendRuntime.run` cleanly.

Replicated servers (docs/ha.md)
    ``server`` may list several addresses. Only the leader serves backends: a follower refuses
    with UNAVAILABLE and names the leader in the ``muster-leader`` trailing metadata. A session
    that ends with UNAVAILABLE or a dropped connection moves to the leader so named (even an
    address not in the list; after a short delay, ``backoff_initial`` at most), else to the next
    address; a session ended by another error stays on its server. Every new server gets the
    whole session: register, snapshot, the outbox, then decisions after the last acknowledged
    id. The replicas share one store and so one ``server_id``: the ledger is kept across the
    switch, and a decision id the last server delivered and the new one resends is re-acked,
    never applied twice.

Terms
    Each decision carries the leadership term of the server that issued it (0 from an
    unreplicated server). The ledger keeps the highest term seen (persisted by a
    :class:`FileDecisionLedger`, so a restarted adapter still knows it). A decision of a lower
    term comes from a deposed leader that has not noticed yet: it is not applied, the runtime
    logs ``decision.stale_term`` with both terms and acknowledges it *rejected*, with a reason
    naming the terms (recorded in the ledger like any outcome, so a resend gets the same answer).
    Rejecting rather than dropping gives the decision an end: the server returns the task to
    Pending and a current leader decides again, instead of the stale decision staying
    unacknowledged until a leader resends it, which the runtime would refuse again. A term-0
    decision is accepted only while no higher term has been seen. A decision already applied is
    re-acknowledged with its outcome whatever its term (that outcome is the truth).

Decisions and acks
    Every decision is acknowledged exactly once per application. The runtime never applies a
    decision id twice: it keeps a :class:`DecisionLedger` of outcomes; a decision it has already
    applied (resent after a reconnect) is re-acknowledged with the remembered outcome. Pass a
    :class:`FileDecisionLedger` to remember outcomes across a restart of the adapter itself.
    A bind whose ``deadline`` has passed is rejected without reaching the backend (the server
    has already expired it and returned the task to Pending).

    The ledger is told which ids are about to be applied (``ledger.begin``, durable in a
    :class:`FileDecisionLedger`) *before* the backend sees them. An adapter killed while applying
    restarts with those ids in doubt; when the server resends one, the runtime asks the backend's
    optional ``recall_outcomes(decisions) -> list[Outcome | None]`` what became of it: an
    :class:`Outcome` is acknowledged as is (never applied again), ``None`` (the backend never
    applied it) lets it be applied now. A backend without ``recall_outcomes`` gets an in-doubt
    decision rejected, never applied a second time (the snapshot it sent at sync told the server
    what actually runs). A runtime whose ledger was restored from a file asks the server for every
    unacknowledged decision (``after_decision_id`` 0) until its first burst, so outcomes recorded
    just before a crash whose acks never left are acknowledged too.

Batching (gangs)
    Decisions arrive in batches of what the server had ready, and the runtime hands them to the
    backend in *bursts*: everything already received, plus whatever arrives within
    ``batch_linger`` seconds, split into runs of one ``cycle_id`` (stream order is kept). A backend that must place a gang
    atomically (Slurm: one allocation for all binds of a job) implements the optional
    ``apply_batch(decisions) -> list[Outcome]``; otherwise the runtime calls ``apply_bind`` /
    ``apply_evict`` for each decision in order. :func:`group_by_job` helps split a burst per job.

Deltas
    The backend reports changes with :meth:`BackendRuntime.report_task_status`,
    :meth:`upsert_node`, :meth:`remove_node`, :meth:`upsert_foreign_task`,
    :meth:`remove_foreign_task`. They are queued (never lost while disconnected) and sent in
    batches of up to ``max_batch``. Deltas queued while a decision is being applied are sent
    *after* that decision's ack, so the server sees "bind acknowledged" before "task Running".
    A batch the server refuses as a whole (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION) is
    retried one item at a time and the offending items are dropped with a log line
    (:mod:`adapters.outbox`).

Tracing
    Decisions carry the server's W3C trace context (``Decision.trace_context``: the cycle's
    ``apply`` span). With a ``tracer_provider``, or an OTLP endpoint in the standard ``OTEL_*``
    variables, each ``apply_bind`` / ``apply_evict`` call (or ``apply_batch`` call) runs in a span
    that continues that trace, so the cycle and its application on the cluster are one trace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import grpc
import structlog
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from opentelemetry import trace

from adapters.backend import APPLIED, Backend, Outcome, Rejected, group_by_job
from adapters.ledger import DecisionLedger, FileDecisionLedger
from adapters.outbox import Outbox
from adapters.retry import Backoff
from muster import transport
from muster.tracing import extract, provider_from_env
from muster.transport import AddressBook, ClientTls, leader_hint
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

# What an adapter needs, importable from one place (docs/agent.md).
__all__ = [
    "APPLIED",
    "Backend",
    "BackendRuntime",
    "DecisionLedger",
    "FileDecisionLedger",
    "Outcome",
    "Rejected",
    "group_by_job",
]

log = structlog.get_logger("muster.adapter")


class BackendRuntime:
    """Connects a :class:`Backend` to a Muster server; see the module docstring."""

    def __init__(
        self,
        backend: Backend,
        *,
        server: str | Sequence[str],
        name: str,
        kind: str = "fake-agent",
        labels: dict[str, str] | None = None,
        ledger: DecisionLedger | None = None,
        backoff_initial: float = 0.2,
        backoff_max: float = 5.0,
        max_attempts: int | None = None,
        batch_linger: float = 0.05,
        max_batch: int = 500,
        flush_interval: float = 0.05,
        channel_factory: Callable[[str], grpc.aio.Channel] | None = None,
        tls: ClientTls | None = None,
        token: str | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        heartbeat_interval: float = 5.0,
    ) -> None:
        self.backend = backend
        self.book = AddressBook(server)
        # The configured servers as one stable string (an agent tags its processes with it).
        self.server = ",".join(self.book.addresses)
        self.name = name
        self.kind = kind
        self.labels = dict(labels or {})
        self.ledger = ledger if ledger is not None else DecisionLedger()
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        # How often the server in use is asked whether it still leads, and how long it has to
        # answer (a stopped server's stream stays open and silent).
        self.liveness_interval = 1.0
        self.liveness_timeout = 2.0
        # Heartbeats to the server: this often unless the server asks for another interval.
        self.heartbeat_interval = heartbeat_interval
        self._heartbeat_seconds = heartbeat_interval
        self.heartbeats = 0  # answered heartbeats, for tests
        self.resyncs = 0  # sessions ended because the server asked for a full snapshot
        self.max_attempts = max_attempts
        self.batch_linger = batch_linger
        self.max_batch = max_batch
        self.flush_interval = flush_interval
        self._channel_factory = channel_factory or (
            lambda address: transport.channel(address, tls, token=token)
        )
        self._outbox = Outbox(name, max_batch=max_batch, flush_interval=flush_interval)
        self._stop = anyio.Event()
        self._ready = anyio.Event()
        self.connected = False
        self.server_id = ""
        self.sessions = 0  # successful syncs, for tests and logs
        self.applied_count = 0
        # A ledger restored from a file may hold outcomes whose acks died with the last run: ask
        # for every unacknowledged decision until the first burst has been applied.
        self._recovering = len(self.ledger) > 0 or self.ledger.doubtful > 0
        # Tracing: a given provider, else one from OTEL_* (built in run()), else none (no spans).
        self._tracer_provider = tracer_provider
        self._tracer: trace.Tracer | None = (
            tracer_provider.get_tracer("muster.adapter") if tracer_provider else None
        )

    # -- deltas -------------------------------------------------------------------------------

    def report_task_status(
        self,
        task_id: str,
        status: pb.TaskStatus,
        *,
        node: str = "",
        message: str = "",
        exit_code: int = 0,
    ) -> None:
        update = pb.TaskStatusUpdate(
            task_id=task_id, status=status, node=node, message=message, exit_code=exit_code
        )
        self._outbox.put_delta(pb.Delta(task_status=update))

    def send_task_log(self, task_id: str, data: bytes, *, eof: bool = False) -> None:
        """New output of a task (``muster logs``), in order."""
        self._outbox.put_delta(
            pb.Delta(task_log=pb.TaskLogChunk(task_id=task_id, data=data, eof=eof))
        )

    def upsert_node(self, node: pb.Node) -> None:
        self._outbox.put_delta(pb.Delta(node_upserted=node))

    def remove_node(self, name: str) -> None:
        self._outbox.put_delta(pb.Delta(node_removed=name))

    def upsert_foreign_task(self, task: pb.BackendTask) -> None:
        self._outbox.put_delta(pb.Delta(foreign_task_upserted=task))

    def remove_foreign_task(self, task_id: str) -> None:
        self._outbox.put_delta(pb.Delta(foreign_task_removed=task_id))

    @property
    def pending_outbox(self) -> int:
        return self._outbox.pending

    @property
    def address(self) -> str:
        """The server address in use now (or tried next)."""
        return self.book.current

    @property
    def highest_term(self) -> int:
        """The highest leadership term seen in a decision (0: none or unreplicated servers)."""
        return self.ledger.term

    # -- lifecycle ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to return (safe to call from any task on the loop)."""
        self._stop.set()

    async def wait_ready(self) -> None:
        """Wait until the first successful register + snapshot."""
        await self._ready.wait()

    async def run(self) -> None:
        """Connect, sync, serve decisions; reconnect with backoff until :meth:`stop`."""
        owned_provider = self._open_tracing()
        try:
            await self._run_sessions()
        finally:
            if owned_provider is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(owned_provider.shutdown)

    def _open_tracing(self) -> Any:
        """An OTLP provider from the standard OTEL_* variables when none was given (or None)."""
        if self._tracer_provider is not None:
            return None
        provider = provider_from_env(f"muster-adapter-{self.kind}")
        if provider is not None:
            self._tracer = provider.get_tracer("muster.adapter")
        return provider

    async def _run_sessions(self) -> None:
        # Full jitter in [cap/2, cap], so a restarted server is not hit by every adapter at once.
        backoff = Backoff(
            initial=self.backoff_initial, factor=2.0, max=self.backoff_max, jitter=0.5
        )
        async with anyio.create_task_group() as tg:

            async def watch_stop() -> None:
                await self._stop.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(watch_stop)
            while not self._stop.is_set():
                synced = False
                address = self.book.start(leader_only=True)
                hinted = False
                try:
                    synced = await self._session(address)
                except ResyncRequested:
                    self.resyncs += 1
                    log.info("resync requested by the server", backend=self.name, server=address)
                    hinted = True  # a new session at once: register and a full snapshot
                except LeaderMoved as moved:
                    log.info("leader moved", backend=self.name, server=address, leader=moved.leader)
                    self.book.follow(moved.leader)
                    hinted = True
                except grpc.aio.AioRpcError as exc:
                    log.info(
                        "disconnected",
                        backend=self.name,
                        server=address,
                        code=exc.code().name,
                        details=exc.details(),
                        leader=leader_hint(exc),
                    )
                    if exc.code() in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,  # a server that stopped answering
                    ):
                        following = self.book.failed(address, exc)
                        hinted = following == leader_hint(exc)
                except (OSError, anyio.EndOfStream) as exc:
                    log.info("disconnected", backend=self.name, server=address, error=repr(exc))
                    self.book.failed(address, exc)  # a dropped connection: the next server
                except Exception:  # a bug in one session must not end the adapter
                    log.exception("session failed", backend=self.name, server=address)
                finally:
                    self.connected = False
                if self._stop.is_set():
                    break
                if synced:
                    backoff.reset()  # failures are counted from the last good session
                if self.max_attempts is not None and backoff.attempts >= self.max_attempts:
                    log.error("giving up", backend=self.name, attempts=backoff.attempts)
                    break
                delay = backoff.next()
                if hinted:
                    # The leader is named: go there soon (a short wait still stops a ping-pong
                    # between two servers that each name the other from spinning).
                    delay = min(delay, self.backoff_initial)
                log.info(
                    "reconnecting",
                    backend=self.name,
                    server=self.book.current,
                    attempt=backoff.attempts,
                    delay=round(delay, 3),
                )
                await anyio.sleep(delay)
            tg.cancel_scope.cancel()

    async def _session(self, address: str) -> bool:
        """One connection, to ``address``. Returns True if it got as far as a successful sync."""
        channel = self._channel_factory(address)
        synced = False
        try:
            stub = pb_grpc.SchedulerStub(channel)
            reply = await stub.RegisterBackend(
                pb.RegisterBackendRequest(name=self.name, kind=self.kind, labels=self.labels),
                timeout=self.liveness_timeout * 4,  # a stopped server must not hold us
            )
            self.server_id = reply.server_id
            self._heartbeat_seconds = reply.heartbeat_seconds or self.heartbeat_interval
            if self.ledger.bind_server(reply.server_id):
                log.warning(
                    "server identity changed: forgetting applied decisions", backend=self.name
                )
                self.ledger.flush()
            nodes = list(await self.backend.list_nodes())
            tasks = list(await self.backend.list_tasks())
            await stub.SyncSnapshot(
                pb.SyncSnapshotRequest(backend=self.name, nodes=nodes, tasks=tasks)
            )
            synced = True
            self.sessions += 1
            self.connected = True
            self.book.answered(address, leader=True)
            log.info(
                "synced",
                backend=self.name,
                server=address,
                server_id=reply.server_id,
                nodes=len(nodes),
                tasks=len(tasks),
            )
            await self._outbox.flush(stub)
            self._ready.set()
            send, receive = anyio.create_memory_object_stream[pb.Decision](10_000)
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._read_decisions, stub, send)
                    tg.start_soon(self._apply_decisions, receive)
                    tg.start_soon(self._outbox.run, stub)
                    tg.start_soon(self._check_leader, stub, address)
                    tg.start_soon(self._heartbeat, stub)
            except BaseExceptionGroup as group:
                raise _first_error(group) from None
        finally:
            with anyio.CancelScope(shield=True):
                await channel.close(grace=None)
        return synced

    async def _check_leader(self, stub: pb_grpc.SchedulerStub, address: str) -> None:
        """The server in use still answers, and still leads. A stopped or cut-off server keeps
        its connection open and its decision stream silent (nothing ends it: gRPC keepalive
        pings did not, here), and a deposed one may serve on until its lease check fails: ask it
        every ``liveness_interval`` (bounded by ``liveness_timeout``) and end the session when it
        does not answer, or names another leader."""
        while True:
            await anyio.sleep(self.liveness_interval)
            try:
                reply = await stub.ListServers(
                    pb.ListServersRequest(), timeout=self.liveness_timeout
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return  # a server from before replication: its stream tells
                raise
            if reply.leader and reply.leader != address:
                raise LeaderMoved(reply.leader)

    async def _heartbeat(self, stub: pb_grpc.SchedulerStub) -> None:
        """Tell the server this backend is alive, every ``heartbeat_seconds`` (its module docstring).
        Raises ``ResyncRequested`` when the server wants a full snapshot."""
        while True:
            await anyio.sleep(self._heartbeat_seconds)
            try:
                reply = await stub.Heartbeat(
                    pb.HeartbeatRequest(backend=self.name), timeout=self.liveness_timeout
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.info("heartbeat unimplemented by the server", backend=self.name)
                    return  # a server from before Heartbeat: its other RPCs are all it gets
                raise
            self.heartbeats += 1
            if reply.heartbeat_seconds > 0:
                self._heartbeat_seconds = reply.heartbeat_seconds
            if reply.resync:
                raise ResyncRequested

    # -- decisions ----------------------------------------------------------------------------

    async def _read_decisions(
        self, stub: pb_grpc.SchedulerStub, send: ObjectSendStream[pb.Decision]
    ) -> None:
        request = pb.StreamDecisionsRequest(
            backend=self.name, after_decision_id=self._resume_after(), max_batch=self.max_batch
        )
        async with send:
            try:
                await _forward(stub.StreamDecisionBatches(request), send)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                # A server from before StreamDecisionBatches: the same feed, one decision a message.
                log.info(
                    "decision batches unimplemented; reading one decision per message",
                    backend=self.name,
                )
                await _forward(stub.StreamDecisions(request), send)
        # The server ended the stream (e.g. it is shutting down): treat as a disconnect.
        raise anyio.EndOfStream

    def _resume_after(self) -> int:
        # Resume after the highest applied id only once nothing is waiting to be acked; otherwise
        # ask for everything unacknowledged and let the ledger answer the duplicates.
        if self._outbox.has_acks() or self._recovering:
            return 0
        return self.ledger.high_water

    async def _apply_decisions(self, receive: ObjectReceiveStream[pb.Decision]) -> None:
        async with receive:
            while True:
                burst = [await receive.receive()]
                await self.gather(receive, burst)
                # Shielded: a lost connection must not interrupt a half-applied decision (the
                # outcome would be unknown and the decision re-applied on reconnect).
                with anyio.CancelScope(shield=True):
                    for run in self.runs(burst):
                        await self._apply_run(run)
                # The server resends what is unacknowledged first: after a burst, the ledger's
                # cursor is good again.
                self._recovering = False

    async def gather(
        self, receive: ObjectReceiveStream[pb.Decision], burst: list[pb.Decision]
    ) -> None:
        """Add to ``burst`` what arrives within ``batch_linger`` (up to ``max_batch``). An adapter
        may shape its bursts differently by overriding this and :meth:`runs`."""
        with anyio.move_on_after(self.batch_linger):
            while len(burst) < self.max_batch:
                burst.append(await receive.receive())

    def runs(self, burst: list[pb.Decision]) -> list[list[pb.Decision]]:
        """A gathered burst split into the runs handed to the backend one after the other."""
        return runs_by_cycle(burst)

    async def _apply_run(self, decisions: list[pb.Decision]) -> None:
        todo: list[pb.Decision] = []
        doubtful: list[pb.Decision] = []
        acks: list[pb.DecisionAck] = []
        outcomes: dict[int, Outcome] = {}
        seen: set[int] = set()
        stale: dict[int, int] = {}  # decision id -> the higher term seen before it, in stream order
        for decision in decisions:
            known = self.ledger.get(decision.id)
            if decision.term < self.ledger.term:
                if known is None and decision.id not in seen:
                    stale[decision.id] = self.ledger.term
            else:
                self.ledger.observe_term(decision.term)
            if known is not None or decision.id in seen:
                # Already applied: re-ack with the remembered outcome, never apply twice.
                prior = known or APPLIED
                acks.append(
                    pb.DecisionAck(
                        decision_id=decision.id, applied=prior.applied, reason=prior.reason
                    )
                )
                log.debug("duplicate decision re-acked", backend=self.name, decision=decision.id)
                continue
            seen.add(decision.id)
            if self.ledger.in_doubt(decision.id):
                doubtful.append(decision)
            todo.append(decision)
        with self._outbox.acks_first(acks):
            if doubtful:
                outcomes.update(await self._recall(doubtful))
            fresh: list[pb.Decision] = []
            for decision in todo:
                if decision.id in outcomes:
                    continue  # recalled: an earlier run applied it (or not), whatever its term
                if decision.id in stale:
                    outcomes[decision.id] = self._refuse_stale(decision, stale[decision.id])
                    continue
                if _expired(decision):
                    outcomes[decision.id] = Outcome.reject(
                        "deadline passed before the backend received it"
                    )
                    continue
                fresh.append(decision)
            if fresh:
                # Durable before any side effect: a crash from here on leaves these ids in doubt.
                self.ledger.begin(d.id for d in fresh)
                for decision, result in zip(fresh, await self._call_backend(fresh), strict=True):
                    outcomes[decision.id] = result
            for decision in decisions:
                outcome = outcomes.pop(decision.id, None)
                if outcome is None:
                    continue
                self.ledger.record(decision.id, outcome)
                self.applied_count += 1
                acks.append(
                    pb.DecisionAck(
                        decision_id=decision.id, applied=outcome.applied, reason=outcome.reason
                    )
                )
                log.info(
                    "decision",
                    backend=self.name,
                    id=decision.id,
                    cycle=decision.cycle_id,
                    action=decision.WhichOneof("action"),
                    task=_task_of(decision),
                    applied=outcome.applied,
                    reason=outcome.reason,
                )
            self.ledger.flush()

    def _refuse_stale(self, decision: pb.Decision, highest: int) -> Outcome:
        """A decision of a replaced leader: not applied, logged, acknowledged rejected."""
        log.warning(
            "decision.stale_term",
            backend=self.name,
            id=decision.id,
            task=_task_of(decision),
            term=decision.term,
            highest_term=highest,
        )
        return Outcome.reject(
            f"stale leadership term {decision.term}: a leader of term {highest} has been seen, "
            "so this decision's leader was replaced; not applied"
        )

    async def _recall(self, decisions: list[pb.Decision]) -> dict[int, Outcome]:
        """Outcomes of decisions an earlier run began applying (in doubt), by id; a decision the
        backend says it never applied is left out (it is applied now like a new one)."""
        recall = getattr(self.backend, "recall_outcomes", None)
        unknown = Outcome.reject(
            "not applied again: the adapter stopped while applying it and cannot tell its outcome"
        )
        if recall is None:
            log.warning(
                "decisions in doubt rejected (the backend cannot recall outcomes)",
                backend=self.name,
                ids=[d.id for d in decisions],
            )
            return {d.id: unknown for d in decisions}
        try:
            answers = list(await recall(decisions))
            if len(answers) != len(decisions):
                raise RuntimeError("recall_outcomes must return one answer per decision")
        except Exception:  # never guess "not applied": that could apply it twice
            log.exception("recall_outcomes failed", backend=self.name)
            return {d.id: unknown for d in decisions}
        recalled: dict[int, Outcome] = {}
        for decision, answer in zip(decisions, answers, strict=True):
            if answer is not None:
                recalled[decision.id] = answer
            log.info(
                "decision in doubt",
                backend=self.name,
                id=decision.id,
                task=_task_of(decision),
                recalled=answer is not None,
                applied=answer.applied if answer else None,
            )
        return recalled

    async def _call_backend(self, decisions: list[pb.Decision]) -> list[Outcome]:
        if self._tracer is None or not hasattr(self.backend, "apply_batch"):
            return await self._call_backend_untraced(decisions)
        # One span per batch, continuing the server's trace (a run shares the cycle's apply span).
        with self._traced("apply_batch", decisions) as span:
            outcomes = await self._call_backend_untraced(decisions)
            _record_outcomes(span, outcomes)
            return outcomes

    def _traced(self, name: str, decisions: list[pb.Decision]) -> Any:
        """A span continuing the trace context the server put in the (first) decision."""
        assert self._tracer is not None
        first = decisions[0]
        attributes: dict[str, Any] = {
            "muster.backend": self.name,
            "muster.cycle.id": first.cycle_id,
            "muster.decisions": len(decisions),
            "muster.decision.ids": [d.id for d in decisions[:32]],
            "muster.tasks": [_task_of(d) for d in decisions[:32]],
        }
        action = first.WhichOneof("action")
        if len(decisions) == 1 and action:
            attributes["muster.node"] = getattr(first, action).node
        return self._tracer.start_as_current_span(
            name,
            context=extract(first.trace_context),
            kind=trace.SpanKind.CONSUMER,
            attributes=attributes,
        )

    async def _call_backend_untraced(self, decisions: list[pb.Decision]) -> list[Outcome]:
        apply_batch = getattr(self.backend, "apply_batch", None)
        if apply_batch is not None:
            try:
                outcomes = list(await apply_batch(decisions))
            except Rejected as exc:
                return [Outcome.reject(str(exc))] * len(decisions)
            except Exception as exc:  # a backend bug rejects, never kills the runtime
                log.exception("apply_batch failed", backend=self.name)
                return [Outcome.reject(f"backend error: {exc}")] * len(decisions)
            if len(outcomes) != len(decisions):
                raise RuntimeError("apply_batch must return one Outcome per decision")
            return outcomes
        return [await self._apply_one(decision) for decision in decisions]

    async def _apply_one(self, decision: pb.Decision) -> Outcome:
        if self._tracer is None:
            return await self._apply_one_untraced(decision)
        with self._traced(f"apply_{decision.WhichOneof('action')}", [decision]) as span:
            outcome = await self._apply_one_untraced(decision)
            _record_outcomes(span, [outcome])
            return outcome

    async def _apply_one_untraced(self, decision: pb.Decision) -> Outcome:
        action = decision.WhichOneof("action")
        try:
            if action == "bind":
                result = await self.backend.apply_bind(decision)
            elif action == "evict":
                result = await self.backend.apply_evict(decision)
            else:
                return Outcome.reject(f"unknown decision action {action!r}")
        except Rejected as exc:
            return Outcome.reject(str(exc))
        except Exception as exc:  # see _call_backend
            log.exception("apply failed", backend=self.name, decision=decision.id)
            return Outcome.reject(f"backend error: {exc}")
        return result if isinstance(result, Outcome) else APPLIED


class ResyncRequested(Exception):
    """The server declared this backend silent and wants its whole state again: a new session."""


class LeaderMoved(Exception):
    """The server in use names another leader: the session moves there."""

    def __init__(self, leader: str) -> None:
        super().__init__(f"the leader is now {leader}")
        self.leader = leader


def _first_error(group: BaseExceptionGroup) -> BaseException:
    """The first real error of a task group failure (cancellations are consequences)."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_error(exc)
        if not isinstance(exc, anyio.get_cancelled_exc_class()):
            return exc
    return group


async def _forward(call: Any, send: ObjectSendStream[pb.Decision]) -> None:
    """Every decision a feed's messages carry (a DecisionBatch's, or a Decision itself), in order;
    the call is cancelled when this ends."""
    try:
        async for message in call:
            for decision in (
                message.decisions if isinstance(message, pb.DecisionBatch) else (message,)
            ):
                await send.send(decision)
    finally:
        call.cancel()


def runs_by_cycle(decisions: list[pb.Decision]) -> list[list[pb.Decision]]:
    """A burst split into runs of consecutive decisions of one cycle (stream order kept)."""
    runs: list[list[pb.Decision]] = []
    for decision in decisions:
        if runs and runs[-1][0].cycle_id == decision.cycle_id:
            runs[-1].append(decision)
        else:
            runs.append([decision])
    return runs


def _expired(decision: pb.Decision) -> bool:
    if decision.WhichOneof("action") != "bind" or not decision.HasField("deadline"):
        return False
    deadline = decision.deadline.seconds + decision.deadline.nanos / 1e9
    return deadline > 0 and time.time() > deadline


def _record_outcomes(span: trace.Span, outcomes: list[Outcome]) -> None:
    rejected = [o.reason for o in outcomes if not o.applied]
    span.set_attribute("muster.decisions.rejected", len(rejected))
    if rejected:
        span.set_status(trace.Status(trace.StatusCode.ERROR, rejected[0] or "rejected"))


def _task_of(decision: pb.Decision) -> str:
    action = decision.WhichOneof("action")
    return getattr(decision, action).task_id if action else ""
