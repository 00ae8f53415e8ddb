"""The gRPC service ``muster.v1.Scheduler``.

Each handler validates and applies its request through the cache (synchronously, so atomically),
then persists the resulting changes before it answers. ``ApiError`` becomes the gRPC status it
names; any other exception is logged and answered with INTERNAL: a bad request never takes the
server down.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import grpc
import structlog

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.api.errors import ApiError, invalid
from server.cache import ClusterCache
from server.loop import ConfigManager, CycleLoop
from server.simulate import ScenarioError, simulate_text
from server.store import StoreWriter

log = structlog.get_logger("muster.service")

R = TypeVar("R")


def unary(handler: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """Map ApiError to its status; anything unexpected to INTERNAL (logged), never a crash."""

    @functools.wraps(handler)
    async def wrapper(self: SchedulerService, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await handler(self, request, context)
        except ApiError as exc:
            await context.abort(exc.code, exc.message)
        except (anyio.get_cancelled_exc_class(), grpc.aio.AbortError):
            raise
        except Exception as exc:
            log.exception("rpc.failed", rpc=handler.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
        raise AssertionError("unreachable")  # abort() always raises

    return wrapper


class SchedulerService(pb_grpc.SchedulerServicer):
    def __init__(self, cache: ClusterCache, writer: StoreWriter, loop: CycleLoop, configs: ConfigManager) -> None:
        self.cache = cache
        self.writer = writer
        self.loop = loop
        self.configs = configs
        self._closing = anyio.Event()

    async def _persist(self) -> None:
        await self.writer.flush(self.cache.commit)

    def close_streams(self) -> None:
        """Shutdown: end every streaming RPC so the server can stop."""
        self._closing.set()
        self.cache.decisions.close_all()
        self.cache.watch.close_all()

    # --- backends ----------------------------------------------------------------------------

    @unary
    async def RegisterBackend(self, request: pb.RegisterBackendRequest, context: Any) -> pb.RegisterBackendResponse:
        resp = self.cache.register_backend(request)
        await self._persist()
        log.info("backend.registered", backend=request.name, kind=request.kind)
        return resp

    @unary
    async def SyncSnapshot(self, request: pb.SyncSnapshotRequest, context: Any) -> pb.SyncSnapshotResponse:
        resp = self.cache.sync_snapshot(request)
        await self._persist()
        return resp

    @unary
    async def SendDeltas(self, request: pb.SendDeltasRequest, context: Any) -> pb.SendDeltasResponse:
        resp = self.cache.send_deltas(request)
        await self._persist()
        return resp

    async def StreamDecisions(
        self, request: pb.StreamDecisionsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Decision]:
        try:
            self.cache.require_backend(request.backend)
        except ApiError as exc:
            await context.abort(exc.code, exc.message)
        if self._closing.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
        sub = self.cache.decisions.subscribe(request.backend, request.after_decision_id)
        log.info("decisions.subscribed", backend=request.backend, after=request.after_decision_id)
        try:
            async for decision in sub.receive:
                yield decision
        finally:
            self.cache.decisions.unsubscribe(request.backend, sub)
            log.info("decisions.unsubscribed", backend=request.backend, dropped=sub.dropped)
        if sub.dropped:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "decision feed fell behind; reconnect to receive the backlog"
            )

    @unary
    async def AckDecisions(self, request: pb.AckDecisionsRequest, context: Any) -> pb.AckDecisionsResponse:
        missing = self.cache.check_acks(request)
        # Decisions settled long ago are only in the store. Meanwhile pending ones may settle in
        # memory; ack() finds those in the decision log's recent outcomes.
        settled = await self.writer.decision_states(missing)
        resp = self.cache.ack(request, settled)
        await self._persist()
        return resp

    # --- jobs --------------------------------------------------------------------------------

    @unary
    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Any) -> pb.SubmitJobResponse:
        if not request.HasField("job"):
            raise invalid("job: required")
        job, created = self.cache.submit_job(request.job)
        await self._persist()
        return pb.SubmitJobResponse(job=job, created=created)

    @unary
    async def CancelJob(self, request: pb.CancelJobRequest, context: Any) -> pb.CancelJobResponse:
        job = self.cache.cancel_job(request.id)
        await self._persist()
        return pb.CancelJobResponse(job=job)

    @unary
    async def GetJob(self, request: pb.GetJobRequest, context: Any) -> pb.Job:
        return self.cache.get_job(request.id)

    @unary
    async def ListJobs(self, request: pb.ListJobsRequest, context: Any) -> pb.ListJobsResponse:
        return self.cache.list_jobs(request)

    async def WatchJobs(
        self, request: pb.WatchJobsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.JobEvent]:
        try:
            sub, initial = self.cache.watch_jobs(request)
        except ApiError as exc:
            await context.abort(exc.code, exc.message)
        if self._closing.is_set():
            self.cache.watch.unsubscribe(sub)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
        try:
            for event in initial:
                yield event
            async for event in sub.receive:
                yield event
        finally:
            self.cache.watch.unsubscribe(sub)
        if sub.dropped:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "watch fell behind; watch again with send_initial"
            )

    @unary
    async def Explain(self, request: pb.ExplainRequest, context: Any) -> pb.ExplainResponse:
        return self.cache.explain(request.job_id)

    # --- queues ------------------------------------------------------------------------------

    @unary
    async def CreateQueue(self, request: pb.QueueRequest, context: Any) -> pb.Queue:
        if not request.HasField("queue"):
            raise invalid("queue: required")
        q = self.cache.create_queue(request.queue)
        await self._persist()
        return q

    @unary
    async def UpdateQueue(self, request: pb.QueueRequest, context: Any) -> pb.Queue:
        if not request.HasField("queue"):
            raise invalid("queue: required")
        q = self.cache.update_queue(request.queue)
        await self._persist()
        return q

    @unary
    async def DeleteQueue(self, request: pb.DeleteQueueRequest, context: Any) -> pb.DeleteQueueResponse:
        self.cache.delete_queue(request.name)
        await self._persist()
        return pb.DeleteQueueResponse()

    @unary
    async def ListQueues(self, request: pb.ListQueuesRequest, context: Any) -> pb.ListQueuesResponse:
        return self.cache.list_queues()

    # --- cluster and configuration -----------------------------------------------------------

    @unary
    async def ListNodes(self, request: pb.ListNodesRequest, context: Any) -> pb.ListNodesResponse:
        return self.cache.list_nodes(request.backend)

    @unary
    async def GetConfig(self, request: pb.GetConfigRequest, context: Any) -> pb.SchedulerConfig:
        return pb.SchedulerConfig(yaml=self.configs.yaml, generation=self.configs.generation)

    @unary
    async def UpdateConfig(self, request: pb.UpdateConfigRequest, context: Any) -> pb.SchedulerConfig:
        self.configs.update(request.yaml)
        self.cache.set_meta("config_yaml", self.configs.yaml)
        self.cache.set_meta("config_generation", str(self.configs.generation))
        await self._persist()
        self.loop.wake()
        log.info("config.updated", generation=self.configs.generation)
        return pb.SchedulerConfig(yaml=self.configs.yaml, generation=self.configs.generation)

    @unary
    async def Simulate(self, request: pb.SimulateRequest, context: Any) -> pb.SimulateResponse:
        if not request.scenario.strip():
            raise invalid("scenario: must not be empty")
        if request.cycles < 0:
            raise invalid(f"cycles: {request.cycles} is negative")
        try:
            result = await anyio.to_thread.run_sync(simulate_text, request.scenario, request.cycles or None)
        except ScenarioError as exc:
            raise invalid("\n".join(exc.problems)) from None
        return pb.SimulateResponse(result_json=json.dumps(result, default=str))
