"""A minimal in-test Muster server for the backend-facing RPCs (runtime and agent unit tests).

It records every register / snapshot / delta / ack, and serves decisions pushed by the test
through ``push`` (on StreamDecisions one a message, on StreamDecisionBatches in batches).
``resend_unacked`` mimics the real server's StreamDecisions contract: on a new
stream, every unacknowledged decision with id > after_decision_id is sent again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc


@dataclass
class Recorder:
    registers: list[pb.RegisterBackendRequest] = field(default_factory=list)
    snapshots: list[pb.SyncSnapshotRequest] = field(default_factory=list)
    deltas: list[pb.Delta] = field(default_factory=list)
    acks: list[pb.DecisionAck] = field(default_factory=list)
    stream_requests: list[pb.StreamDecisionsRequest] = field(default_factory=list)
    stream_rpcs: list[str] = field(default_factory=list)  # which feed each stream used
    order: list[str] = field(default_factory=list)  # "ack:<id>" / "delta:<task>:<status>"


class FakeScheduler(pb_grpc.SchedulerServicer):
    def __init__(self, server_id: str = "fake-1") -> None:
        self.server_id = server_id
        self.rec = Recorder()
        self.decisions: list[pb.Decision] = []
        self.acked: set[int] = set()
        self._new = asyncio.Condition()

    async def push(self, decision: pb.Decision) -> None:
        async with self._new:
            self.decisions.append(decision)
            self._new.notify_all()

    async def RegisterBackend(self, request, context):
        self.rec.registers.append(request)
        last = max((d.id for d in self.decisions), default=0)
        return pb.RegisterBackendResponse(
            name=request.name, server_id=self.server_id, last_decision_id=last
        )

    async def SyncSnapshot(self, request, context):
        self.rec.snapshots.append(request)
        return pb.SyncSnapshotResponse(nodes=len(request.nodes), tasks=len(request.tasks))

    async def SendDeltas(self, request, context):
        for delta in request.deltas:
            if delta.WhichOneof("change") == "node_removed" and delta.node_removed == "refuse-me":
                await context.abort(
                    grpc.StatusCode.NOT_FOUND, "deltas[0].node_removed: unknown node"
                )
        self.rec.deltas.extend(request.deltas)
        for delta in request.deltas:
            if delta.WhichOneof("change") == "task_status":
                ts = delta.task_status
                self.rec.order.append(f"delta:{ts.task_id}:{ts.status}")
        return pb.SendDeltasResponse(applied=len(request.deltas))

    async def AckDecisions(self, request, context):
        self.rec.acks.extend(request.acks)
        for ack in request.acks:
            self.acked.add(ack.decision_id)
            self.rec.order.append(f"ack:{ack.decision_id}")
        return pb.AckDecisionsResponse(accepted=len(request.acks))

    async def StreamDecisions(self, request, context):
        async for batch in self._feed("StreamDecisions", request):
            for decision in batch:
                yield decision

    async def StreamDecisionBatches(self, request, context):
        size = request.max_batch or 1000
        async for batch in self._feed("StreamDecisionBatches", request):
            for k in range(0, len(batch), size):
                yield pb.DecisionBatch(decisions=batch[k : k + size])

    async def _feed(self, rpc: str, request: pb.StreamDecisionsRequest):
        self.rec.stream_requests.append(request)
        self.rec.stream_rpcs.append(rpc)
        sent = 0
        # Resend unacknowledged decisions after the cursor, then follow new ones.
        while True:
            async with self._new:
                while sent >= len(self.decisions):
                    await self._new.wait()
                batch = self.decisions[sent:]
                sent = len(self.decisions)
            batch = [
                d for d in batch if d.id > request.after_decision_id and d.id not in self.acked
            ]
            if batch:
                yield batch


class SinglesOnlyScheduler(FakeScheduler):
    """A server from before StreamDecisionBatches: that RPC is UNIMPLEMENTED."""

    StreamDecisionBatches = pb_grpc.SchedulerServicer.StreamDecisionBatches


class FakeServerHandle:
    def __init__(self, servicer: FakeScheduler) -> None:
        self.servicer = servicer
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self, port: int = 0) -> None:
        self.server = grpc.aio.server()
        pb_grpc.add_SchedulerServicer_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=None)
            self.server = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def bind(
    decision_id: int, task: str, node: str = "n1", cycle: int = 1, job: str = "j1", **request: str
) -> pb.Decision:
    return pb.Decision(
        id=decision_id,
        cycle_id=cycle,
        bind=pb.BindDecision(
            task_id=task,
            job_id=job,
            node=node,
            request=pb.ResourceList(quantities=request or {"cpu": "1"}),
        ),
    )


def evict(
    decision_id: int, task: str, node: str = "n1", cycle: int = 1, job: str = "j1"
) -> pb.Decision:
    return pb.Decision(
        id=decision_id,
        cycle_id=cycle,
        evict=pb.EvictDecision(task_id=task, job_id=job, node=node, reason="cancel"),
    )


async def eventually(predicate, timeout: float = 10.0, interval: float = 0.02) -> None:
    """Poll ``predicate`` until true; fail after ``timeout`` seconds (a bound, not a verdict)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate}")
        await asyncio.sleep(interval)
