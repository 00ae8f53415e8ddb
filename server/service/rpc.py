"""The gRPC service ``muster.v1.Scheduler``.

Each handler validates and applies its request through ``ingest`` (backends), ``commands`` (jobs
and queues) or ``api.queries`` (reads) on the ``ClusterState`` -- synchronously, so atomically --
then persists the resulting changes before it answers. This is the one place where domain errors
(``server.service.errors.DomainError``) become gRPC status codes; any other exception is logged and
answered with INTERNAL: a bad request never takes the server down.
"""

from __future__ import annotations

import contextvars
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import anyio
import grpc
import structlog

from muster.transport import LEADER_METADATA, LEADER_ONLY
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service import commands, control, ingest, validate
from server.service.api import queries
from server.service.api.follow import prepare_follow
from server.service.api.history import list_job_history
from server.service.audit import audit
from server.service.auth import Policy, Principal, bearer_token, certificate_names, peer_name
from server.service.decisions import DECISION_BATCH, DECISION_BATCH_BYTES
from server.service.errors import (
    DomainError,
    ErrorCode,
    denied,
    invalid,
    precondition,
    unauthenticated,
    unavailable,
)
from server.service.loop import ConfigManager, CycleLoop, priority_classes_of
from server.service.replica import Replica
from server.service.state import ClusterState
from server.service.store import StoreWriter
from server.simulate import ScenarioError, simulate_text

log = structlog.get_logger("muster.service")

R = TypeVar("R")

STATUS_CODES: dict[ErrorCode, grpc.StatusCode] = {
    code: grpc.StatusCode[code.name] for code in ErrorCode
}


def _job_queue(state: ClusterState, job_id: str) -> str:
    """The queue of the job, or of the array's elements, ``job_id`` names ("" when none)."""
    return control.queue_and_owners(state, job_id)[0]


# What each RPC needs under an auth policy (server/service/auth.py): its verb, and for submit / cancel the
# queue it acts on. One table, so a new RPC without an entry fails the test that checks them all.
RPC_VERBS: dict[str, tuple[str, Callable[[ClusterState, Any], str | list[str]] | None]] = {
    **dict.fromkeys(
        (
            "RegisterBackend",
            "SyncSnapshot",
            "SendDeltas",
            "StreamDecisions",
            "StreamDecisionBatches",
            "AckDecisions",
            "Heartbeat",
        ),
        ("backend", None),
    ),
    "SubmitJob": ("submit", lambda state, req: req.job.queue or "default"),
    "SubmitJobs": ("submit", lambda state, req: sorted({j.queue or "default" for j in req.jobs})),
    "CancelJob": ("cancel", lambda state, req: _job_queue(state, req.id)),
    # Job control is authorized as cancel is: its owner (cancel-own) or the cancel right.
    **{
        name: ("cancel", lambda state, req: _job_queue(state, req.id))
        for name in ("HoldJob", "ReleaseJob", "RequeueJob")
    },
    **dict.fromkeys(
        (
            "GetJob",
            "ListJobs",
            "WatchJobs",
            "Explain",
            "ListQueues",
            "ListNodes",
            "GetConfig",
            "Simulate",
            "GetTaskLogs",
            "WatchTaskLogs",
            "ListJobHistory",
            "ListServers",
        ),
        ("read", None),
    ),
    **dict.fromkeys(("CreateQueue", "UpdateQueue", "DeleteQueue"), ("manage-queues", None)),
    "UpdateConfig": ("configure", None),
}
# Calls that change state: each gets an audit line (who, what, result).
AUDITED = frozenset(
    {
        "RegisterBackend",
        "SyncSnapshot",
        "SendDeltas",
        "AckDecisions",
        "SubmitJob",
        "SubmitJobs",
        "CancelJob",
        "HoldJob",
        "ReleaseJob",
        "RequeueJob",
        "CreateQueue",
        "UpdateQueue",
        "DeleteQueue",
        "UpdateConfig",
    }
)


# What only the leader of replicated servers answers (docs/ha.md; clients send these to the leader
# first): a follower refuses them UNAVAILABLE, naming the leader (trailing metadata).

# Simulate runs at most this many cycles (a scenario's config.cycles is bounded alike).
MAX_SIMULATED_CYCLES = 1000

# Refusals audited for every RPC, reads and streams included.
REFUSALS = frozenset({ErrorCode.UNAUTHENTICATED, ErrorCode.PERMISSION_DENIED})
# RPCs answered from jobs: under an auth policy a caller reads the jobs of the queues a rule lets
# them read, and their own.
# (the request field naming the job; empty: no job named, as a WatchJobs of every job).
JOB_READS = {
    "GetJob": "id",
    "Explain": "job_id",
    "GetTaskLogs": "job_id",
    "WatchTaskLogs": "job_id",
    "WatchJobs": "job_id",
}

# Who makes the current call (each RPC runs in its own task, so its own context).
CALLER: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "muster_caller", default=None
)
# Without an auth policy a client may say who it is (unverified; the CLI sends $USER).
USER_CLAIM = "x-muster-user"


async def refuse(
    context: grpc.aio.ServicerContext[Any, Any],
    who: str,
    rpc: str,
    exc: DomainError,
    *,
    audited: bool,
) -> NoReturn:
    """End a call that ``exc`` refused with its status (naming the leader when it does), audited
    when ``audited`` or when it is a refusal (``REFUSALS``: audited for every RPC)."""
    if audited or exc.code in REFUSALS:
        audit(who, rpc, STATUS_CODES[exc.code].name, exc.message)
    if exc.leader:
        context.set_trailing_metadata(((LEADER_METADATA, exc.leader),))
    await context.abort(STATUS_CODES[exc.code], exc.message)
    raise AssertionError("unreachable")  # abort() always raises


def unary(handler: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """Map a DomainError to its status; anything unexpected to INTERNAL (logged), never a crash."""

    name = handler.__name__

    @functools.wraps(handler)
    async def wrapper(
        self: SchedulerService, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> R:
        who = peer_name(context.auth_context())
        try:
            principal = self.identify(name, context)
            CALLER.set(principal)
            if principal is not None:
                who = principal.name
            validate.check_bounds(request)
            self.authorize(name, principal, request)
            self.check_leader(name)
            reply = await handler(self, request, context)
            if name in AUDITED:
                audit(who, name, "OK")
            return reply
        except DomainError as exc:
            await refuse(context, who, name, exc, audited=name in AUDITED)
        except (anyio.get_cancelled_exc_class(), grpc.aio.AbortError):
            raise
        except Exception as exc:
            log.exception("rpc.failed", rpc=handler.__name__)
            await context.abort(
                grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
            )
        raise AssertionError("unreachable")  # abort() always raises

    return wrapper


class SchedulerService(pb_grpc.SchedulerServicer):
    def __init__(
        self,
        state: ClusterState,
        writer: StoreWriter,
        loop: CycleLoop,
        configs: ConfigManager,
        *,
        bind_backends: bool = False,
        policy: Policy | None = None,
    ) -> None:
        self.state = state
        self.writer = writer
        self.loop = loop
        self.configs = configs
        # Under mutual TLS a backend's certificate names it: it may act only as that backend,
        # and only one decision stream per backend may be open at a time.
        self.bind_backends = bind_backends
        self.policy = policy  # None: no authentication (loopback development default)
        self._streams: dict[str, int] = {}
        self._closing = anyio.Event()
        # Replicated servers (server/service/replica.py); None: this server is the only one.
        self.replica: Replica | None = None
        self.address = ""  # where clients reach this server (set once it listens)

    def check_leader(self, rpc: str) -> None:
        """UNAVAILABLE, naming the leader, for a call only the leader answers made to a follower."""
        replica = self.replica
        if replica is None or replica.leading or rpc not in LEADER_ONLY:
            return
        leader = replica.leader_address
        where = f"the leader is {leader}" if leader else "no leader is elected yet: retry"
        raise unavailable(
            f"this server ({replica.address}) is a follower; {rpc} goes to the leader: {where}",
            leader=leader,
        )

    def end_decision_streams(self) -> None:
        """This server stopped leading: its backends go and find the new leader."""
        self.state.decisions.close_all()

    def identify(self, rpc: str, context: grpc.aio.ServicerContext[Any, Any]) -> Principal | None:
        """Who calls under the auth policy (None without one): the bearer token's user, or the
        identity the policy maps the client certificate to. A certificate the policy does not
        name identifies nobody; a token and a certificate naming different identities are refused."""
        if self.policy is None:
            return None
        metadata = context.invocation_metadata() or ()
        by_cert = self.policy.from_certificate(context.auth_context())
        token = bearer_token(metadata)
        by_token = self.policy.authenticate(metadata) if token else None
        if token and by_token is None:
            raise unauthenticated("authorization: the bearer token is not valid")
        if by_cert is not None and by_token is not None:
            # They agree when they name one user, or the backend and the token of its name.
            if (by_cert.backend or by_cert.user) != by_token.user:
                raise unauthenticated(
                    f"authorization: the client certificate identifies {by_cert.name!r} but the token "
                    f"{by_token.name!r}; send one identity"
                )
            return by_cert if by_cert.backend else by_token
        who = by_token or by_cert
        if who is None:
            raise unauthenticated(
                "authorization: a valid bearer token is required (metadata 'authorization: Bearer ...'), "
                "or a client certificate the auth policy maps to an identity"
            )
        return who

    def _owner_of(self, job_id: str) -> str | None:
        """Who owns the job (or every element of the array) ``job_id`` names; None: nobody known."""
        _, owners = control.queue_and_owners(self.state, job_id)
        return next(iter(owners)) if len(owners) == 1 and "" not in owners else None

    def _controller(
        self, context: grpc.aio.ServicerContext[Any, Any], job_id: str
    ) -> tuple[str, bool, bool]:
        """Who acts on job ``job_id`` (HoldJob, ReleaseJob, RequeueJob): their name, whether their
        hold is an admin hold (they are known and not the job's owner), and whether they may
        release an admin hold (the cancel right in the job's queue under an auth policy; anyone
        without one)."""
        by = self.owner(context)
        admin_hold = bool(by) and by != (self._owner_of(job_id) or "")
        principal = CALLER.get()
        if self.policy is None or principal is None:
            return by, admin_hold, True
        return (
            by,
            admin_hold,
            self.policy.allows(principal, "cancel", _job_queue(self.state, job_id)),
        )

    def owner(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """Who owns what this call submits: the authenticated user; without an auth policy, the
        caller's unverified ``x-muster-user`` claim ("" when none)."""
        principal = CALLER.get()
        if principal is not None:
            return principal.user
        if self.policy is not None:
            return ""
        for key, value in context.invocation_metadata() or ():
            if key == USER_CLAIM and isinstance(value, str):
                return value[:253]
        return ""

    def authorize(self, rpc: str, who: Principal | None, request: Any) -> None:
        """DomainError when the policy does not let ``who`` make this call."""
        if self.policy is None or who is None:
            return
        verb, queue_of = RPC_VERBS[rpc]
        if verb == "backend":
            self._authorize_backend(rpc, who, request)
            return
        queues = queue_of(self.state, request) if queue_of is not None else ""
        for queue in [queues] if isinstance(queues, str) else queues:
            if (
                verb == "cancel"
                and self._owner_of(request.id) == who.user
                and self.policy.allows(who, "cancel-own", queue)
            ):
                continue
            if not self.policy.allows(who, verb, queue):
                where = f" in queue {queue!r}" if queue_of is not None else ""
                raise denied(f"user {who.name!r} may not {verb}{where}")
        if rpc in JOB_READS:
            rec = self.state.jobs.get(getattr(request, JOB_READS[rpc]))
            if rec is not None and not self.may_read(who, rec.spec.queue, rec.spec.owner):
                raise denied(f"user {who.name!r} may not read jobs in queue {rec.spec.queue!r}")

    def _authorize_backend(self, rpc: str, who: Principal, request: Any) -> None:
        assert self.policy is not None
        backend = request.name if rpc == "RegisterBackend" else request.backend
        field = "name" if rpc == "RegisterBackend" else "backend"
        if who.backend:  # a backend certificate: that backend, and no other
            if backend != who.backend:
                raise denied(
                    f"{field}: this certificate is for backend {who.backend!r}, not for backend {backend!r}"
                )
            return
        if not self.policy.allows(who, "backend"):
            raise denied(f"user {who.name!r} may not backend")
        if backend != who.user:  # a backend token acts for the backend of its user name only
            raise denied(f"{field}: the token is for {who.user!r}, not for backend {backend!r}")

    def may_read(self, who: Principal | None, queue: str, owner: str) -> bool:
        """Whether ``who`` may read a job of ``queue`` submitted by ``owner``: a rule granting read
        in the queue, or their own job."""
        scope = self.read_scope(who)
        return scope is None or scope.allows(queue, owner)

    def read_scope(self, who: Principal | None) -> queries.ReadScope | None:
        """What ListJobs / WatchJobs may show ``who`` (None: everything)."""
        if self.policy is None or who is None:
            return None
        readable = self.policy.readable_queues(who)
        return None if readable is None else queries.ReadScope(readable, who.user)

    async def _admit_stream(
        self,
        rpc: str,
        request: Any,
        context: grpc.aio.ServicerContext[Any, Any],
        prepare: Callable[[Principal | None], R],
        *,
        audit_every: bool = False,
    ) -> R:
        """A streaming call's checks, those ``unary`` makes for the others: who calls, whether
        they may, the request's bounds, whether this replica serves it; then ``prepare`` (the
        stream's own checks and setup, given the caller) and its answer. A ``DomainError`` aborts
        the call with its status, audited when it is a refusal (``audit_every``: every outcome,
        as for a backend's decision feed)."""
        who = peer_name(context.auth_context())
        try:
            principal = self.identify(rpc, context)
            who = principal.name if principal is not None else who
            self.authorize(rpc, principal, request)
            validate.check_bounds(request)
            self.check_leader(rpc)
            prepared = prepare(principal)
        except DomainError as exc:
            await refuse(context, who, rpc, exc, audited=audit_every)
        if audit_every:
            audit(who, rpc, "OK")
        return prepared

    def _as_backend(
        self, context: grpc.aio.ServicerContext[Any, Any], backend: str, field: str
    ) -> None:
        """Without an auth policy, mutual TLS still binds a backend to its certificate's CN (with
        one, ``authorize`` decides from the policy's certificate mapping)."""
        if not self.bind_backends or self.policy is not None:
            return
        identity, _ = certificate_names(context.auth_context())
        if identity != backend:
            raise denied(
                f"{field}: this connection's certificate is for {identity or 'no backend'!r}, "
                f"not for backend {backend!r}"
            )

    async def _persist(self) -> None:
        await self.writer.flush(self.state.commit)

    def close_streams(self) -> None:
        """Shutdown: end every streaming RPC so the server can stop."""
        self._closing.set()
        self.state.decisions.close_all()
        self.state.watch.close_all()
        self.state.task_logs.close_all()

    # --- backends ----------------------------------------------------------------------------

    @unary
    async def RegisterBackend(
        self, request: pb.RegisterBackendRequest, context: Any
    ) -> pb.RegisterBackendResponse:
        self._as_backend(context, request.name, "name")
        resp = ingest.register_backend(self.state, request)
        await self._persist()
        log.info("backend.registered", backend=request.name, kind=request.kind)
        return resp

    @unary
    async def SyncSnapshot(
        self, request: pb.SyncSnapshotRequest, context: Any
    ) -> pb.SyncSnapshotResponse:
        self._as_backend(context, request.backend, "backend")
        resp = ingest.sync_snapshot(self.state, request)
        await self._persist()
        return resp

    @unary
    async def SendDeltas(
        self, request: pb.SendDeltasRequest, context: Any
    ) -> pb.SendDeltasResponse:
        self._as_backend(context, request.backend, "backend")
        resp = ingest.send_deltas(self.state, request)
        await self._persist()
        return resp

    async def StreamDecisions(
        self, request: pb.StreamDecisionsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.Decision]:
        async for batch in self._decision_feed("StreamDecisions", request, context, 1, 0):
            yield batch[0]

    async def StreamDecisionBatches(
        self, request: pb.StreamDecisionsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.DecisionBatch]:
        # One message per burst: streaming costs the server (and the backend) per message, and a
        # cycle issues thousands of binds at once.
        async for batch in self._decision_feed(
            "StreamDecisionBatches",
            request,
            context,
            request.max_batch or DECISION_BATCH,
            DECISION_BATCH_BYTES,
        ):
            yield pb.DecisionBatch(decisions=batch)

    async def _decision_feed(
        self,
        rpc: str,
        request: pb.StreamDecisionsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
        max_batch: int,
        max_bytes: int,
    ) -> AsyncIterator[list[pb.Decision]]:
        """A backend's decision feed: what is queued for it, up to ``max_batch`` decisions and about
        ``max_bytes`` serialized at a time (a decision that would pass ``max_bytes`` starts the next)."""

        def check_feed(_: Principal | None) -> None:
            self._as_backend(context, request.backend, "backend")
            ingest.check_stream(self.state, request)
            # With identities (a policy, or mutual TLS) a backend has one feed: a second would
            # split its decisions between two readers.
            if (self.bind_backends or self.policy is not None) and self._streams.get(
                request.backend
            ):
                raise precondition(
                    f"backend: {request.backend!r} already has a live decision stream"
                )

        await self._admit_stream(rpc, request, context, check_feed, audit_every=True)
        if self._closing.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
        sub = self.state.decisions.subscribe(request.backend, request.after_decision_id)
        log.info(
            "decisions.subscribed",
            backend=request.backend,
            after=request.after_decision_id,
            rpc=rpc,
        )
        self._streams[request.backend] = self._streams.get(request.backend, 0) + 1
        try:
            async for decision in sub.receive:
                batch = [decision]
                size = decision.ByteSize() if max_batch > 1 else 0
                while len(batch) < max_batch:
                    try:
                        decision = sub.receive.receive_nowait()
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                    n = decision.ByteSize()
                    if size + n > max_bytes:
                        yield batch
                        batch, size = [], 0
                    batch.append(decision)
                    size += n
                yield batch
        finally:
            self._streams[request.backend] -= 1
            self.state.decisions.unsubscribe(request.backend, sub)
            log.info("decisions.unsubscribed", backend=request.backend, dropped=sub.dropped)
        if sub.dropped:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "decision feed fell behind; reconnect to receive the backlog",
            )

    @unary
    async def AckDecisions(
        self, request: pb.AckDecisionsRequest, context: Any
    ) -> pb.AckDecisionsResponse:
        self._as_backend(context, request.backend, "backend")
        missing = ingest.check_acks(self.state, request)
        # Decisions settled long ago are only in the store. Meanwhile pending ones may settle in
        # memory; ack() finds those in the decision log's recent outcomes.
        settled = await self.writer.decision_states(missing)
        resp = ingest.ack(self.state, request, settled)
        await self._persist()
        return resp

    @unary
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        # Not audited: every backend calls it every few seconds. Its one change (a backend declared
        # silent is back: ingest.contact) is saved like any other.
        self._as_backend(context, request.backend, "backend")
        resp = ingest.heartbeat(self.state, request)
        await self._persist()
        return resp

    # --- jobs --------------------------------------------------------------------------------

    @unary
    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Any) -> pb.SubmitJobResponse:
        if not request.HasField("job"):
            raise invalid("job: required")
        owner = self.owner(context)
        if request.job.array:  # up to 10,000 elements: built away from the event loop
            prepared = await anyio.to_thread.run_sync(commands.prepare_job, request.job, owner)
            done = commands.commit_jobs(self.state, [prepared], batch=False)[0]
        else:
            done = commands.submit(self.state, request.job, owner=owner)
        await self._persist()
        return pb.SubmitJobResponse(
            job=done.job, created=done.created, element_ids=done.element_ids
        )

    @unary
    async def SubmitJobs(
        self, request: pb.SubmitJobsRequest, context: Any
    ) -> pb.SubmitJobsResponse:
        owner = self.owner(context)
        # Validating and building the jobs reads no state: a worker thread does it, so a big batch
        # does not hold the event loop (GetJob and the streams go on). Checking them against the
        # state and creating them happens here, on the loop, in one step.
        prepared = await anyio.to_thread.run_sync(commands.prepare_jobs, request.jobs, owner)
        results = commands.commit_jobs(self.state, prepared)
        await self._persist()
        return pb.SubmitJobsResponse(
            results=[
                pb.SubmitJobResponse(job=j, created=c, element_ids=ids) for j, c, ids in results
            ]
        )

    @unary
    async def GetTaskLogs(
        self, request: pb.GetTaskLogsRequest, context: Any
    ) -> pb.GetTaskLogsResponse:
        return queries.get_task_logs(self.state, request)

    async def WatchTaskLogs(
        self, request: pb.WatchTaskLogsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.TaskLogEvent]:
        """A task's output until it ends (server/service/api/follow.py); any replica serves it."""
        following = await self._admit_stream(
            "WatchTaskLogs", request, context, lambda _: prepare_follow(self.state, request)
        )
        if self._closing.is_set() or self.state.task_logs.closed:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
        try:
            async for event in following.events():
                yield event
        except DomainError as exc:  # the store could not be read: follow again (offsets)
            await context.abort(STATUS_CODES[exc.code], exc.message)
        if following.closed:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                "server is shutting down; follow again from the offsets received",
            )

    @unary
    async def ListJobHistory(
        self, request: pb.ListJobHistoryRequest, context: Any
    ) -> pb.ListJobHistoryResponse:
        return list_job_history(self.state, request, self.read_scope(CALLER.get()))

    @unary
    async def CancelJob(self, request: pb.CancelJobRequest, context: Any) -> pb.CancelJobResponse:
        job, elements = commands.cancel(self.state, request.id)
        await self._persist()
        return pb.CancelJobResponse(job=job, element_ids=elements)

    @unary
    async def HoldJob(self, request: pb.HoldJobRequest, context: Any) -> pb.JobControlResponse:
        by, admin_hold, _ = self._controller(context, request.id)
        jobs = control.hold(self.state, request.id, by, admin=admin_hold)
        await self._persist()
        return pb.JobControlResponse(jobs=jobs)

    @unary
    async def ReleaseJob(
        self, request: pb.ReleaseJobRequest, context: Any
    ) -> pb.JobControlResponse:
        by, _, may_release_admin = self._controller(context, request.id)
        jobs = control.release(self.state, request.id, by, admin=may_release_admin)
        await self._persist()
        return pb.JobControlResponse(jobs=jobs)

    @unary
    async def RequeueJob(
        self, request: pb.RequeueJobRequest, context: Any
    ) -> pb.JobControlResponse:
        by, admin_hold, _ = self._controller(context, request.id)
        jobs = control.requeue(self.state, request.id, by, admin=admin_hold, hold_it=request.hold)
        await self._persist()
        return pb.JobControlResponse(jobs=jobs)

    @unary
    async def GetJob(self, request: pb.GetJobRequest, context: Any) -> pb.Job:
        return queries.get_job(self.state, request.id)

    @unary
    async def ListJobs(self, request: pb.ListJobsRequest, context: Any) -> pb.ListJobsResponse:
        return queries.list_jobs(self.state, request, self.read_scope(CALLER.get()))

    async def WatchJobs(
        self, request: pb.WatchJobsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.JobEvent]:
        sub, initial = await self._admit_stream(
            "WatchJobs",
            request,
            context,
            lambda principal: queries.watch_jobs(self.state, request, self.read_scope(principal)),
        )
        if self._closing.is_set():
            self.state.watch.unsubscribe(sub)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
        try:
            async for event in queries.watch_stream(initial, sub):
                yield event
        finally:
            self.state.watch.unsubscribe(sub)
        if sub.dropped:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "watch fell behind; watch again with send_initial",
            )

    @unary
    async def Explain(self, request: pb.ExplainRequest, context: Any) -> pb.ExplainResponse:
        return queries.explain(self.state, request.job_id)

    # --- queues ------------------------------------------------------------------------------

    @unary
    async def CreateQueue(self, request: pb.QueueRequest, context: Any) -> pb.Queue:
        if not request.HasField("queue"):
            raise invalid("queue: required")
        q = commands.create_queue(self.state, request.queue)
        await self._persist()
        return q

    @unary
    async def UpdateQueue(self, request: pb.QueueRequest, context: Any) -> pb.Queue:
        if not request.HasField("queue"):
            raise invalid("queue: required")
        q = commands.update_queue(self.state, request.queue)
        await self._persist()
        return q

    @unary
    async def DeleteQueue(
        self, request: pb.DeleteQueueRequest, context: Any
    ) -> pb.DeleteQueueResponse:
        commands.delete_queue(self.state, request.name)
        await self._persist()
        return pb.DeleteQueueResponse()

    @unary
    async def ListQueues(
        self, request: pb.ListQueuesRequest, context: Any
    ) -> pb.ListQueuesResponse:
        return queries.list_queues(self.state)

    # --- cluster and configuration -----------------------------------------------------------

    @unary
    async def ListNodes(self, request: pb.ListNodesRequest, context: Any) -> pb.ListNodesResponse:
        return queries.list_nodes(self.state, request.backend)

    @unary
    async def ListServers(
        self, request: pb.ListServersRequest, context: Any
    ) -> pb.ListServersResponse:
        replica = self.replica
        if replica is None:  # one server: it leads, in no term
            me = pb.ServerInfo(id=self.state.server_id, address=self.address, role="leader")
            me.last_renewal.GetCurrentTime()
            return pb.ListServersResponse(servers=[me], leader=self.address)
        rows, lease = await anyio.to_thread.run_sync(replica.servers)
        reply = pb.ListServersResponse(
            leader=lease.address if lease.valid else "", term=max(lease.term, replica.term)
        )
        for row in rows:
            info = reply.servers.add(
                id=row.id,
                address=row.address,
                role=row.role,
                term=row.term,
                lag_seconds=row.lag_seconds,
            )
            info.last_renewal.FromNanoseconds(int(row.last_seen * 1e9))
        return reply

    @unary
    async def GetConfig(self, request: pb.GetConfigRequest, context: Any) -> pb.SchedulerConfig:
        return pb.SchedulerConfig(yaml=self.configs.yaml, generation=self.configs.generation)

    @unary
    async def UpdateConfig(
        self, request: pb.UpdateConfigRequest, context: Any
    ) -> pb.SchedulerConfig:
        config = await anyio.to_thread.run_sync(self.configs.parse, request.yaml)
        self.configs.apply(config, request.yaml)
        # Its priority classes count at once: `muster config set F && muster submit J` naming one.
        self.state.set_priority_classes(priority_classes_of(config))
        self.state.set_meta("config_yaml", self.configs.yaml)
        self.state.set_meta("config_generation", str(self.configs.generation))
        await self._persist()
        self.loop.wake()
        log.info("config.updated", generation=self.configs.generation)
        return pb.SchedulerConfig(yaml=self.configs.yaml, generation=self.configs.generation)

    @unary
    async def Simulate(self, request: pb.SimulateRequest, context: Any) -> pb.SimulateResponse:
        if not request.scenario.strip():
            raise invalid("scenario: must not be empty")
        if not 0 <= request.cycles <= MAX_SIMULATED_CYCLES:
            raise invalid(f"cycles: {request.cycles} is not between 0 and {MAX_SIMULATED_CYCLES}")
        try:
            result = await anyio.to_thread.run_sync(
                simulate_text, request.scenario, request.cycles or None
            )
        except ScenarioError as exc:
            raise invalid("\n".join(exc.problems)) from None
        return pb.SimulateResponse(result_json=json.dumps(result, default=str))
