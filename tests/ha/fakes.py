"""In-process fake replicas of a replicated Muster deployment (grpc.aio servers).

A :class:`Store` is what the replicas share (the PostgreSQL store of the real thing): jobs,
decisions, acks, who leads. A :class:`Replica` serves part of the Scheduler service from it. As
the real servers do, a follower refuses the leader-only RPCs (writes, the backend feed) with
UNAVAILABLE and trailing metadata ``muster-leader: ADDRESS`` (absent while no leader is known)
and answers reads. Switches let a test drop a call after it was processed (an UNAVAILABLE with
no hint, what a connection lost mid-call looks like) or end the open streams.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field
from typing import Any

import grpc

from muster.transport import LEADER_METADATA
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc


@dataclass
class Store:
    server_id: str = "store-1"
    leader: str = ""  # the leader's address ("" while none)
    term: int = 0
    jobs: dict[str, pb.Job] = field(default_factory=dict)
    decisions: list[pb.Decision] = field(default_factory=list)
    acked: set[int] = field(default_factory=set)
    servers: list[pb.ServerInfo] = field(default_factory=list)
    # Answer a resubmission of an identical spec ALREADY_EXISTS (the real server answers it with
    # the stored job): the case the client's retry must read and compare.
    identical_already_exists: bool = True

    async def put_job(self, job: pb.Job, *, publish: bool = True) -> None:
        kind = pb.JobEvent.TYPE_MODIFIED if job.spec.id in self.jobs else pb.JobEvent.TYPE_ADDED
        self.jobs[job.spec.id] = job
        if publish:
            for replica in list(Replica.live):
                if replica.store is self:
                    replica.publish(pb.JobEvent(type=kind, job=job))

    def push(self, decision: pb.Decision) -> None:
        self.decisions.append(decision)


def stored_spec(spec: pb.JobSpec, owner: str = "alice") -> pb.JobSpec:
    """What the real server stores: the defaults written in, the owner set from the caller."""
    stored = pb.JobSpec()
    stored.CopyFrom(spec)
    stored.namespace = stored.namespace or "default"
    stored.name = stored.name or stored.id
    stored.queue = stored.queue or "default"
    stored.owner = owner
    return stored


class Replica(pb_grpc.SchedulerServicer):
    live: list[Replica] = []

    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.name = name
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.calls: list[str] = []
        self.registers: list[pb.RegisterBackendRequest] = []
        self.snapshots: list[pb.SyncSnapshotRequest] = []
        self.acks: list[pb.DecisionAck] = []
        self.stream_requests: list[pb.StreamDecisionsRequest] = []
        self.watch_requests: list[pb.WatchJobsRequest] = []
        # Process the next N writes, then answer UNAVAILABLE without a hint (a dropped call).
        self.drop_after_processing = 0
        # Answer the next N writes so without processing them (a call lost on its way).
        self.drop_before_processing = 0
        # Ignore after_decision_id and resend every decision not acked *to this replica* (an ack
        # that never reached the store).
        self.resend_all = False
        self._watchers: list[asyncio.Queue[pb.JobEvent | None]] = []
        self._streams_done = asyncio.Event()
        # A process stopped (SIGSTOP): connections stay open, nothing is ever answered.
        self.paused = False
        # A deposed leader that has not noticed yet: it serves on as if it led (ListServers,
        # read from the shared store, names the real leader).
        self.believes_it_leads = False

    async def _hang_if_paused(self) -> None:
        while self.paused:
            await asyncio.sleep(0.05)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> Replica:
        self.server = grpc.aio.server()
        pb_grpc.add_SchedulerServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        Replica.live.append(self)
        return self

    async def stop(self) -> None:
        if self in Replica.live:
            Replica.live.remove(self)
        self.end_streams()
        if self.server is not None:
            await self.server.stop(grace=None)
            self.server = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def leads(self) -> bool:
        return self.store.leader == self.address or self.believes_it_leads

    def watching(self) -> bool:
        """A WatchJobs stream is open here (its handler has started)."""
        return bool(self._watchers)

    def end_streams(self) -> None:
        """Every open stream of this replica ends with UNAVAILABLE (a leader losing its lease)."""
        self._streams_done.set()
        for queue in self._watchers:
            queue.put_nowait(None)
        self._streams_done = asyncio.Event()

    def publish(self, event: pb.JobEvent) -> None:
        for queue in self._watchers:
            queue.put_nowait(event)

    # -- refusals -----------------------------------------------------------------------------

    async def _refuse_unless_leader(self, context: Any) -> None:
        await self._hang_if_paused()
        if self.leads:
            if self.drop_before_processing > 0:
                self.drop_before_processing -= 1
                await context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
            return
        metadata = ((LEADER_METADATA, self.store.leader),) if self.store.leader else ()
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, "not the leader", trailing_metadata=metadata
        )

    async def _maybe_drop(self, context: Any) -> None:
        if self.drop_after_processing > 0:
            self.drop_after_processing -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "Connection reset by peer")

    # -- jobs ---------------------------------------------------------------------------------

    async def SubmitJob(self, request, context):
        self.calls.append("SubmitJob")
        await self._refuse_unless_leader(context)
        spec = stored_spec(request.job)
        existing = self.store.jobs.get(spec.id)
        if existing is not None:
            if existing.spec != spec or self.store.identical_already_exists:
                await context.abort(
                    grpc.StatusCode.ALREADY_EXISTS, f"job.id: job {spec.id!r} already exists"
                )
            return pb.SubmitJobResponse(job=existing, created=False)
        job = pb.Job(spec=spec, status=pb.JobStatus(phase=pb.JOB_PHASE_PENDING))
        await self.store.put_job(job)
        await self._maybe_drop(context)
        return pb.SubmitJobResponse(job=job, created=True)

    async def SubmitJobs(self, request, context):
        self.calls.append("SubmitJobs")
        await self._refuse_unless_leader(context)
        specs = [stored_spec(s) for s in request.jobs]
        for i, spec in enumerate(specs):
            if spec.id in self.store.jobs:
                await context.abort(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"jobs[{i}].job.id: job {spec.id!r} already exists",
                )
        jobs = [pb.Job(spec=s, status=pb.JobStatus(phase=pb.JOB_PHASE_PENDING)) for s in specs]
        for job in jobs:
            await self.store.put_job(job)
        await self._maybe_drop(context)
        return pb.SubmitJobsResponse(
            results=[pb.SubmitJobResponse(job=j, created=True) for j in jobs]
        )

    async def CancelJob(self, request, context):
        self.calls.append("CancelJob")
        await self._refuse_unless_leader(context)
        job = self.store.jobs.get(request.id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"id: job {request.id!r} not found")
        if job.status.phase != pb.JOB_PHASE_CANCELLED:
            # What the real server does: a job already cancelled is answered as it is.
            if job.status.phase in (pb.JOB_PHASE_COMPLETED, pb.JOB_PHASE_FAILED):
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "already ended")
            job = pb.Job(spec=job.spec, status=pb.JobStatus(phase=pb.JOB_PHASE_CANCELLED))
            await self.store.put_job(job)
            await self._maybe_drop(context)
        return pb.CancelJobResponse(job=job)

    async def GetJob(self, request, context):
        self.calls.append("GetJob")
        job = self.store.jobs.get(request.id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"id: job {request.id!r} not found")
        return job

    async def ListQueues(self, request, context):
        self.calls.append("ListQueues")
        return pb.ListQueuesResponse(queues=[pb.QueueView(queue=pb.Queue(name=self.name))])

    async def ListServers(self, request, context):
        await self._hang_if_paused()
        self.calls.append("ListServers")
        return pb.ListServersResponse(
            servers=self.store.servers, leader=self.store.leader, term=self.store.term
        )

    async def WatchJobs(self, request, context):
        self.calls.append("WatchJobs")
        self.watch_requests.append(request)
        queue: asyncio.Queue[pb.JobEvent | None] = asyncio.Queue()
        self._watchers.append(queue)
        try:
            if request.send_initial:
                for job in list(self.store.jobs.values()):
                    yield pb.JobEvent(type=pb.JobEvent.TYPE_ADDED, job=job)
            while True:
                event = await queue.get()
                if event is None:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "lease lost")
                yield event
        finally:
            self._watchers.remove(queue)

    # -- backends -----------------------------------------------------------------------------

    async def RegisterBackend(self, request, context):
        await self._hang_if_paused()
        self.calls.append("RegisterBackend")
        await self._refuse_unless_leader(context)
        self.registers.append(request)
        return pb.RegisterBackendResponse(name=request.name, server_id=self.store.server_id)

    async def SyncSnapshot(self, request, context):
        self.calls.append("SyncSnapshot")
        await self._refuse_unless_leader(context)
        self.snapshots.append(request)
        return pb.SyncSnapshotResponse(nodes=len(request.nodes), tasks=len(request.tasks))

    async def SendDeltas(self, request, context):
        await self._refuse_unless_leader(context)
        return pb.SendDeltasResponse(applied=len(request.deltas))

    async def AckDecisions(self, request, context):
        await self._hang_if_paused()
        await self._refuse_unless_leader(context)
        self.acks.extend(request.acks)
        for ack in request.acks:
            self.store.acked.add(ack.decision_id)
        return pb.AckDecisionsResponse(accepted=len(request.acks))

    async def StreamDecisionBatches(self, request, context):
        self.calls.append("StreamDecisionBatches")
        await self._refuse_unless_leader(context)
        self.stream_requests.append(request)
        done = self._streams_done
        mine = {a.decision_id for a in self.acks}
        sent: set[int] = set()
        while True:
            batch = [
                d
                for d in self.store.decisions
                if d.id not in sent
                and (
                    d.id not in mine
                    if self.resend_all
                    else d.id > request.after_decision_id and d.id not in self.store.acked
                )
            ]
            if self.paused or (not batch and not done.is_set()):
                await asyncio.sleep(0.01)  # polling keeps the fake simple; tests are short
                continue
            if done.is_set():
                metadata = ((LEADER_METADATA, self.store.leader),) if self.store.leader else ()
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, "lease lost", trailing_metadata=metadata
                )
            if batch:
                sent.update(d.id for d in batch)
                yield pb.DecisionBatch(decisions=batch)


def closed_port_address() -> tuple[socket.socket, str]:
    """A port bound but never listening: connections to it are refused while the socket lives."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, f"127.0.0.1:{sock.getsockname()[1]}"


def bind(decision_id: int, task: str, term: int = 0, cycle: int = 1) -> pb.Decision:
    return pb.Decision(
        id=decision_id,
        cycle_id=cycle,
        term=term,
        bind=pb.BindDecision(
            task_id=task, job_id="j1", node="n1", request=pb.ResourceList(quantities={"cpu": "1"})
        ),
    )


async def eventually(predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> None:
    """Poll ``predicate`` until true; fail after ``timeout`` seconds (a bound, not a verdict)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate}")
        await asyncio.sleep(interval)
