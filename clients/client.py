"""Async Python client of the Muster API (``muster.v1.Scheduler``) over the generated stubs.

    async with MusterClient("127.0.0.1:50051") as muster:
        reply = await muster.submit_job(spec)
        async for job in muster.list_jobs(queue="default"):
            ...
        async for event in muster.watch_jobs(send_initial=True):
            ...

Errors are ``grpc.aio.AioRpcError`` (``.code()``, ``.details()``), exactly as the server sent them.
"""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import AsyncIterator, Iterable
from typing import Any

import anyio
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from muster import transport
from muster.transport import ClientTls
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

DEFAULT_SERVER = "127.0.0.1:50051"


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return ""


class MusterClient:
    """One channel to a Muster server. Use as an async context manager, or call ``close()``."""

    def __init__(
        self,
        address: str = DEFAULT_SERVER,
        *,
        timeout: float | None = 30.0,
        tls: ClientTls | None = None,
        token: str | None = None,
        user: str | None = None,
    ) -> None:
        """``tls``: how to reach a TLS server (default: from the MUSTER_TLS_* variables, see
        ``muster.transport``; none set: plaintext). ``token``: bearer token (default: MUSTER_TOKEN).
        ``user``: who a server without authentication records as the owner of submitted jobs
        (default: the login name; a server with tokens takes the token's user instead)."""
        self.address = address
        self.timeout = timeout  # per unary call; streams are unbounded
        self._channel = transport.channel(
            address,
            tls if tls is not None else ClientTls.from_env(),
            token=token if token is not None else os.environ.get("MUSTER_TOKEN"),
            user=user if user is not None else _login_name(),
        )
        self.stub = pb_grpc.SchedulerStub(self._channel)

    async def __aenter__(self) -> MusterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(grace=None)

    # -- health -------------------------------------------------------------------------------

    async def is_serving(self) -> bool:
        """One grpc.health.v1 check; False on any failure (not up yet, not serving)."""
        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0)
        except grpc.aio.AioRpcError:
            return False
        serving: bool = reply.status == health_pb2.HealthCheckResponse.SERVING
        return serving

    async def wait_until_serving(self, timeout: float = 30.0, interval: float = 0.1) -> None:
        """Poll the health service until SERVING; TimeoutError after ``timeout`` seconds."""
        with anyio.fail_after(timeout):
            while not await self.is_serving():
                await anyio.sleep(interval)

    # -- jobs ---------------------------------------------------------------------------------

    async def submit_job(self, spec: pb.JobSpec) -> pb.SubmitJobResponse:
        reply: pb.SubmitJobResponse = await self.stub.SubmitJob(
            pb.SubmitJobRequest(job=spec), timeout=self.timeout
        )
        return reply

    async def submit_jobs(self, specs: Iterable[pb.JobSpec]) -> list[pb.SubmitJobResponse]:
        """All or nothing: every job is submitted, or none (the error names the refused one)."""
        reply = await self.stub.SubmitJobs(
            pb.SubmitJobsRequest(jobs=list(specs)), timeout=self.timeout
        )
        return list(reply.results)

    async def task_logs(self, job_id: str, task_id: str = "") -> list[pb.TaskLog]:
        reply = await self.stub.GetTaskLogs(
            pb.GetTaskLogsRequest(job_id=job_id, task_id=task_id), timeout=self.timeout
        )
        return list(reply.logs)

    async def cancel_job(self, job_id: str) -> pb.Job:
        reply: pb.CancelJobResponse = await self.stub.CancelJob(
            pb.CancelJobRequest(id=job_id), timeout=self.timeout
        )
        return reply.job

    async def get_job(self, job_id: str) -> pb.Job:
        reply: pb.Job = await self.stub.GetJob(pb.GetJobRequest(id=job_id), timeout=self.timeout)
        return reply

    async def list_jobs(
        self,
        *,
        queue: str = "",
        namespace: str = "",
        phases: Iterable[pb.JobPhase] = (),
        page_size: int = 0,
        limit: int | None = None,
        owner: str = "",
    ) -> AsyncIterator[pb.Job]:
        """Every matching job (``owner``: only this user's), following page tokens (at most
        ``limit`` jobs)."""
        token = ""
        count = 0
        while True:
            reply = await self.stub.ListJobs(
                pb.ListJobsRequest(
                    queue=queue,
                    namespace=namespace,
                    phases=list(phases),
                    page_size=page_size,
                    page_token=token,
                    owner=owner,
                ),
                timeout=self.timeout,
            )
            for job in reply.jobs:
                yield job
                count += 1
                if limit is not None and count >= limit:
                    return
            token = reply.next_page_token
            if not token:
                return

    async def watch_jobs(
        self, *, queue: str = "", namespace: str = "", job_id: str = "", send_initial: bool = True
    ) -> AsyncIterator[pb.JobEvent]:
        call = self.stub.WatchJobs(
            pb.WatchJobsRequest(
                queue=queue, namespace=namespace, job_id=job_id, send_initial=send_initial
            )
        )
        try:
            async for event in call:
                yield event
        finally:
            call.cancel()

    async def explain(self, job_id: str) -> pb.ExplainResponse:
        reply: pb.ExplainResponse = await self.stub.Explain(
            pb.ExplainRequest(job_id=job_id), timeout=self.timeout
        )
        return reply

    # -- queues -------------------------------------------------------------------------------

    async def list_queues(self) -> list[pb.QueueView]:
        reply = await self.stub.ListQueues(pb.ListQueuesRequest(), timeout=self.timeout)
        return list(reply.queues)

    async def create_queue(self, queue: pb.Queue) -> pb.Queue:
        reply: pb.Queue = await self.stub.CreateQueue(
            pb.QueueRequest(queue=queue), timeout=self.timeout
        )
        return reply

    async def update_queue(self, queue: pb.Queue) -> pb.Queue:
        reply: pb.Queue = await self.stub.UpdateQueue(
            pb.QueueRequest(queue=queue), timeout=self.timeout
        )
        return reply

    async def delete_queue(self, name: str) -> None:
        await self.stub.DeleteQueue(pb.DeleteQueueRequest(name=name), timeout=self.timeout)

    # -- cluster, config, simulate ------------------------------------------------------------

    async def list_nodes(self, backend: str = "") -> list[pb.NodeView]:
        reply = await self.stub.ListNodes(
            pb.ListNodesRequest(backend=backend), timeout=self.timeout
        )
        return list(reply.nodes)

    async def get_config(self) -> pb.SchedulerConfig:
        reply: pb.SchedulerConfig = await self.stub.GetConfig(
            pb.GetConfigRequest(), timeout=self.timeout
        )
        return reply

    async def update_config(self, yaml_text: str) -> pb.SchedulerConfig:
        reply: pb.SchedulerConfig = await self.stub.UpdateConfig(
            pb.UpdateConfigRequest(yaml=yaml_text), timeout=self.timeout
        )
        return reply

    async def simulate(self, scenario: str, cycles: int = 0) -> dict[str, Any]:
        """Run a scenario on the server (docs/simulate.md); returns the decoded result object."""
        reply = await self.stub.Simulate(
            pb.SimulateRequest(scenario=scenario, cycles=cycles), timeout=self.timeout
        )
        result: dict[str, Any] = json.loads(reply.result_json)
        return result
