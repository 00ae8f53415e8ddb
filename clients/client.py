"""Async Python client of the Muster API (``muster.v1.Scheduler``) over the generated stubs.

    async with MusterClient("127.0.0.1:50051") as muster:     # or "a:50051,b:50051,c:50051"
        reply = await muster.submit_job(spec)
        async for job in muster.list_jobs(queue="default"):
            ...
        async for event in muster.watch_jobs(send_initial=True):
            ...

Errors are ``grpc.aio.AioRpcError`` (``.code()``, ``.details()``), exactly as the server sent them.

Replicated servers (docs/ha.md): give every server's address. The client keeps a channel per
address (opened on first use) and follows the leader (:class:`muster.transport.FailoverChannel`):
a call answered UNAVAILABLE goes to the leader the refusal names (trailing metadata
``muster-leader``, even an address not in the list), else to the next address, with a short
backoff, until ``failover_timeout`` seconds have passed; then the last error is raised. Reads are
served by any replica (the client stays on the one that answers); writes go to the leader.

Writes and retries. A follower's refusal means nothing was done, so sending the write again is
safe. A connection dropped mid-call is ambiguous: the write may have been done. The client
retries anyway, and makes the retry's answer mean the same as the first try's:

* ``submit_job`` / ``submit_jobs``: job ids are chosen by the client and the server answers a
  resubmission of an identical spec with the stored job (``created`` False). When a retry after an
  ambiguous failure is answered ALREADY_EXISTS, the client reads the stored job(s) and counts the
  call a success (``created`` False) if every stored spec is what was sent (:func:`same_job_spec`);
  a different stored spec raises the ALREADY_EXISTS error.
* ``cancel_job``: the server answers a cancel of an already cancelled job with the job, so the
  retry returns it; nothing to add.
* ``hold_job`` holds a held job again without change; ``release_job`` / ``requeue_job``
  answered FAILED_PRECONDITION ("not held", "has not started") on a retry after an ambiguous
  failure read the job and count the call a success if it is released / requeued.
* ``delete_queue``: NOT_FOUND on a retry after an ambiguous failure means the first try deleted
  it: success. ``update_queue`` and ``update_config`` replace the whole object (idempotent);
  ``create_queue`` answered ALREADY_EXISTS after a drop raises it (the queue exists either way).

``watch_jobs`` survives a failover: the stream is opened again on the next server (or the named
leader) with the current state of the matching jobs, and the events of jobs whose state the caller
already saw are skipped (see :meth:`MusterClient.watch_jobs`).
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import random
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import anyio
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from muster import transport
from muster.transport import DEFAULT_FAILOVER_TIMEOUT, DEFAULT_SERVER, ClientTls
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

__all__ = ["DEFAULT_SERVER", "MusterClient", "same_job_spec"]

# A watch stream that lived this long before failing was connected: its failure starts a new
# failover period instead of counting against the last one.
_WATCH_STABLE_SECONDS = 1.0


def login_name() -> str:
    """Who runs this process ("" when the system cannot say): the default ``user``, and the CLI's
    ``--owner me``."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return ""


class _StreamOutage:
    """When a watch stream lost with UNAVAILABLE is opened again, and when to give up: as for
    unary calls (``transport.FailoverChannel``), a backoff from ``FAILOVER_BACKOFF_INITIAL``
    doubling up to ``FAILOVER_BACKOFF_MAX``, every address once, then until ``failover_timeout``
    seconds have passed since the outage began. A stream that delivers an event ends it."""

    def __init__(self, channel: transport.FailoverChannel, failover_timeout: float) -> None:
        self._channel = channel
        self._failover_timeout = failover_timeout
        self._since: float | None = None  # when the outage began (None: there is none)
        self._tried: set[str] = set()  # addresses that failed during this outage
        self._delay = transport.FAILOVER_BACKOFF_INITIAL
        self._opened = 0.0

    def opened(self) -> None:
        self._opened = time.monotonic()

    def received(self) -> None:
        self._since, self._delay = None, transport.FAILOVER_BACKOFF_INITIAL

    def lost(self, address: str) -> float | None:
        """The stream to ``address`` was lost: seconds to wait before opening it again, or None
        when the outage has lasted ``failover_timeout`` (the caller raises the error)."""
        now = time.monotonic()
        if self._since is None or now - self._opened >= _WATCH_STABLE_SECONDS:
            self._since, self._tried = now, set()
        self._tried.add(address)
        pause = random.uniform(self._delay / 2, self._delay)
        if self._channel.current in self._tried:
            remaining = self._failover_timeout - (now - self._since)
            if remaining <= 0:
                return None
            pause = min(pause, remaining)
        self._delay = min(self._delay * 2, transport.FAILOVER_BACKOFF_MAX)
        return pause


def same_job_spec(sent: pb.JobSpec, stored: pb.JobSpec) -> bool:
    """Whether ``stored`` is what the server keeps for a submission of ``sent``: equal once the
    defaults the server writes in (namespace and queue ``default``, name = id, the queue's time
    limit) are filled in, the owner (the server sets it from the caller) aside. Any other
    difference counts, so a spec the server normalized further (a TYJob's defaults) is reported as
    different: the cautious side, since the job id is then taken by a job this call cannot vouch
    for."""
    mine = pb.JobSpec()
    mine.CopyFrom(sent)
    mine.namespace = mine.namespace or "default"
    mine.name = mine.name or mine.id
    mine.queue = mine.queue or "default"
    mine.owner = stored.owner
    # The server writes the queue's default time limit into a job that has none.
    mine.time_limit_seconds = mine.time_limit_seconds or stored.time_limit_seconds
    equal: bool = mine == stored
    return equal


class MusterClient:
    """A client of one Muster deployment: one server, or the replicas of a replicated one. Use
    as an async context manager, or call ``close()``."""

    def __init__(
        self,
        address: str | Sequence[str] = DEFAULT_SERVER,
        *,
        timeout: float | None = 30.0,
        tls: ClientTls | None = None,
        token: str | None = None,
        user: str | None = None,
        failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT,
    ) -> None:
        """``address``: ``HOST:PORT``, several comma-separated (``"a:1,b:1"``) or a list.
        ``timeout``: seconds per attempt of a unary call (streams are unbounded).
        ``failover_timeout``: how long a call keeps looking for a server that answers (every
        address is tried once whatever this says; 0: no more).
        ``tls``: how to reach a TLS server (default: from the MUSTER_TLS_* variables, see
        ``muster.transport``; none set: plaintext). ``token``: bearer token (default: MUSTER_TOKEN).
        ``user``: who a server without authentication records as the owner of submitted jobs
        (default: the login name; a server with tokens takes the token's user instead)."""
        self.addresses = transport.parse_addresses(address, "address")
        self.timeout = timeout
        self.failover_timeout = failover_timeout
        tls = tls if tls is not None else ClientTls.from_env()
        token = token if token is not None else os.environ.get("MUSTER_TOKEN")
        user = user if user is not None else login_name()
        self._channel = transport.FailoverChannel(
            self.addresses,
            lambda one: transport.channel(one, tls, token=token, user=user),
            failover_timeout=failover_timeout,
        )
        self.stub = pb_grpc.SchedulerStub(self._channel)

    @property
    def address(self) -> str:
        """The server address in use now (the first one until a call moves elsewhere)."""
        return self._channel.current

    async def __aenter__(self) -> MusterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(grace=None)

    # -- health -------------------------------------------------------------------------------

    async def is_serving(self) -> bool:
        """One grpc.health.v1 check of each address (the one in use first) until one serves;
        False when none does (not up yet, not serving). A serving replica becomes the one in
        use."""
        first = self._channel.current
        for address in [first, *(a for a in self._channel.book.addresses if a != first)]:
            stub = health_pb2_grpc.HealthStub(self._channel.channel_to(address))
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0)
            except grpc.aio.AioRpcError:
                continue
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                self._channel.book.answered(address)
                return True
        return False

    async def wait_until_serving(self, timeout: float = 30.0, interval: float = 0.1) -> None:
        """Poll the health service until SERVING; TimeoutError after ``timeout`` seconds."""
        with anyio.fail_after(timeout):
            while not await self.is_serving():
                await anyio.sleep(interval)

    # -- jobs ---------------------------------------------------------------------------------

    async def submit_job(self, spec: pb.JobSpec) -> pb.SubmitJobResponse:
        """Submit one job. Safe to retry (ids are the client's); see the module docstring for
        how a retry after a dropped connection is answered."""
        call: transport.FailoverUnaryCall = self.stub.SubmitJob(
            pb.SubmitJobRequest(job=spec), timeout=self.timeout
        )
        try:
            reply: pb.SubmitJobResponse = await call
        except grpc.aio.AioRpcError as exc:
            stored = await self._already_submitted(exc, call, [spec])
            if stored is None:
                raise
            return stored[0]
        return reply

    async def submit_jobs(self, specs: Iterable[pb.JobSpec]) -> list[pb.SubmitJobResponse]:
        """All or nothing: every job is submitted, or none (the error names the refused one)."""
        specs = list(specs)
        call: transport.FailoverUnaryCall = self.stub.SubmitJobs(
            pb.SubmitJobsRequest(jobs=specs), timeout=self.timeout
        )
        try:
            reply = await call
        except grpc.aio.AioRpcError as exc:
            stored = await self._already_submitted(exc, call, specs)
            if stored is None:
                raise
            return stored
        return list(reply.results)

    async def _already_submitted(
        self,
        error: grpc.aio.AioRpcError,
        call: transport.FailoverUnaryCall,
        specs: list[pb.JobSpec],
    ) -> list[pb.SubmitJobResponse] | None:
        """After ALREADY_EXISTS answered a retry whose earlier try may have been processed: the
        stored jobs when every one of ``specs`` is stored as sent (the first try submitted them),
        else None (the error stands)."""
        if error.code() != grpc.StatusCode.ALREADY_EXISTS or not call.ambiguous:
            return None
        stored: list[pb.SubmitJobResponse] = []
        for spec in specs:
            try:
                # The server that answered (the leader) is now the one in use: no stale replica.
                job = await self.get_job(spec.id)
            except grpc.aio.AioRpcError:
                return None
            if not same_job_spec(spec, job.spec):
                return None
            stored.append(pb.SubmitJobResponse(job=job, created=False))
        return stored

    async def task_logs(self, job_id: str, task_id: str = "") -> list[pb.TaskLog]:
        reply = await self.stub.GetTaskLogs(
            pb.GetTaskLogsRequest(job_id=job_id, task_id=task_id), timeout=self.timeout
        )
        return list(reply.logs)

    async def follow_task_logs(
        self, job_id: str, task_id: str = "", *, offsets: Mapping[str, int] | None = None
    ) -> AsyncIterator[pb.TaskLogEvent]:
        """A task's output (``task_id`` empty: every task's of the job) until it ends
        (WatchTaskLogs): what the server keeps, then new output as it arrives; each task's last
        event has ``eof``. ``offsets``: per task, the bytes already had (a resumed follow).

        Any replica serves it. A stream lost with UNAVAILABLE (a server gone or stopping) is
        opened again on the next server or the named leader from the offsets received, so no
        byte comes twice and none is skipped but what the server dropped (``dropped_bytes``). It
        gives up (raising the last error) after ``failover_timeout`` seconds without a server."""
        have = {task: int(offset) for task, offset in (offsets or {}).items()}
        done: set[str] = set()
        outage = _StreamOutage(self._channel, self.failover_timeout)
        while True:
            call: transport.FailoverStreamCall = self.stub.WatchTaskLogs(
                pb.WatchTaskLogsRequest(job_id=job_id, task_id=task_id, offsets=have)
            )
            outage.opened()
            try:
                async for event in call:
                    outage.received()
                    if event.task_id in done:
                        continue  # its end, sent again by a resumed stream
                    if event.eof:
                        done.add(event.task_id)
                    else:
                        have[event.task_id] = event.offset + len(event.data)
                    yield event
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                pause = outage.lost(call.address)
                if pause is None:
                    raise
            finally:
                call.cancel()
            await anyio.sleep(pause)

    async def list_job_history(
        self,
        *,
        queue: str = "",
        namespace: str = "",
        owner: str = "",
        phases: Iterable[pb.JobPhase] = (),
        since: float | None = None,
        until: float | None = None,
        page_size: int = 0,
        limit: int | None = None,
    ) -> AsyncIterator[pb.JobAccounting]:
        """Finished jobs with their accounting (ListJobHistory), by finish time, following page
        tokens (at most ``limit``). ``since`` / ``until``: unix seconds, finish time >= since and
        < until; ``phases``: some of Completed, Failed, Cancelled (empty: all)."""
        request = pb.ListJobHistoryRequest(
            queue=queue, namespace=namespace, owner=owner, phases=list(phases), page_size=page_size
        )
        if since is not None:
            request.finished_after.FromNanoseconds(int(since * 1e9))
        if until is not None:
            request.finished_before.FromNanoseconds(int(until * 1e9))
        count = 0
        while True:
            reply: pb.ListJobHistoryResponse = await self.stub.ListJobHistory(
                request, timeout=self.timeout
            )
            for entry in reply.jobs:
                yield entry
                count += 1
                if limit is not None and count >= limit:
                    return
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token

    async def cancel_job(self, job_id: str) -> pb.Job:
        # A retry after a dropped connection needs nothing more: the server answers a cancel of a
        # job already cancelled with the job (FAILED_PRECONDITION only when it ended otherwise).
        reply: pb.CancelJobResponse = await self.stub.CancelJob(
            pb.CancelJobRequest(id=job_id), timeout=self.timeout
        )
        return reply.job

    async def cancel(self, job_id: str) -> pb.CancelJobResponse:
        """``cancel_job``, the whole answer: cancelling an array's id cancels every element
        (``element_ids``; ``job`` is the first of them)."""
        reply: pb.CancelJobResponse = await self.stub.CancelJob(
            pb.CancelJobRequest(id=job_id), timeout=self.timeout
        )
        return reply

    async def hold_job(self, job_id: str) -> list[pb.Job]:
        """Hold a pending job, or every pending element of an array (``scontrol hold``): it is not
        scheduled until released. Holding a held job again changes nothing, so a retry is safe."""
        reply: pb.JobControlResponse = await self.stub.HoldJob(
            pb.HoldJobRequest(id=job_id), timeout=self.timeout
        )
        return list(reply.jobs)

    async def release_job(self, job_id: str) -> list[pb.Job]:
        """Release a held job, or every held element of an array (``scontrol release``). A retry
        after a dropped connection answered "not held" finds the job released: a success."""
        call: transport.FailoverUnaryCall = self.stub.ReleaseJob(
            pb.ReleaseJobRequest(id=job_id), timeout=self.timeout
        )
        try:
            reply: pb.JobControlResponse = await call
        except grpc.aio.AioRpcError as exc:
            job = await self._after_retry(exc, call, job_id)
            if job is None or job.status.hold:
                raise
            return [job]
        return list(reply.jobs)

    async def requeue_job(self, job_id: str, *, hold: bool = False) -> list[pb.Job]:
        """Send a started job (every started element of an array) back to pending: its running
        tasks are evicted, ``status.requeue_count`` goes up (``scontrol requeue``; ``hold``: held
        as well, ``scontrol requeuehold``). A retry after a dropped connection answered "has not
        started" finds the job requeued (pending, counted): a success."""
        call: transport.FailoverUnaryCall = self.stub.RequeueJob(
            pb.RequeueJobRequest(id=job_id, hold=hold), timeout=self.timeout
        )
        try:
            reply: pb.JobControlResponse = await call
        except grpc.aio.AioRpcError as exc:
            job = await self._after_retry(exc, call, job_id)
            if job is None or not job.status.requeue_count:
                raise
            return [job]
        return list(reply.jobs)

    async def _after_retry(
        self, error: grpc.aio.AioRpcError, call: transport.FailoverUnaryCall, job_id: str
    ) -> pb.Job | None:
        """The job, when FAILED_PRECONDITION answered a retry whose first try may have been done
        (the caller checks that it was); None: the error stands."""
        if error.code() != grpc.StatusCode.FAILED_PRECONDITION or not call.ambiguous:
            return None
        try:
            return await self.get_job(job_id)
        except grpc.aio.AioRpcError:
            return None

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
        """Job events, until the server ends the stream. A stream lost with UNAVAILABLE (a
        server gone, a failover) is opened again on the next server or the named leader, asking
        for the current state of the matching jobs so nothing that changed meanwhile is missed:
        a job whose state the caller already saw is skipped, one it saw in another state comes as
        MODIFIED, one it never saw as the server sends it (even without ``send_initial``: it may
        have changed during the gap). A job deleted during the gap is not reported. The stream
        gives up (raising the last error) after ``failover_timeout`` seconds without a server."""
        request = pb.WatchJobsRequest(
            queue=queue, namespace=namespace, job_id=job_id, send_initial=send_initial
        )
        seen: dict[str, bytes] = {}  # job id -> digest of the state last yielded
        resumed = False
        outage = _StreamOutage(self._channel, self.failover_timeout)
        while True:
            call: transport.FailoverStreamCall = self.stub.WatchJobs(request)
            outage.opened()
            try:
                async for event in call:
                    outage.received()
                    key = event.job.spec.id
                    if event.type == pb.JobEvent.TYPE_DELETED:
                        seen.pop(key, None)
                        yield event
                        continue
                    digest = hashlib.blake2b(
                        event.job.SerializeToString(deterministic=True), digest_size=16
                    ).digest()
                    if resumed:
                        if seen.get(key) == digest:
                            continue  # replayed state the caller already has
                        if key in seen and event.type == pb.JobEvent.TYPE_ADDED:
                            event = pb.JobEvent(type=pb.JobEvent.TYPE_MODIFIED, job=event.job)
                    seen[key] = digest
                    yield event
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                pause = outage.lost(call.address)
                if pause is None:
                    raise
            finally:
                call.cancel()
            resumed = True
            request = pb.WatchJobsRequest(
                queue=queue, namespace=namespace, job_id=job_id, send_initial=True
            )
            await anyio.sleep(pause)

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
        call: transport.FailoverUnaryCall = self.stub.DeleteQueue(
            pb.DeleteQueueRequest(name=name), timeout=self.timeout
        )
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            # Gone after a try that may have been processed: that try deleted it.
            if exc.code() != grpc.StatusCode.NOT_FOUND or not call.ambiguous:
                raise

    # -- cluster, config, simulate ------------------------------------------------------------

    async def list_nodes(self, backend: str = "") -> list[pb.NodeView]:
        reply = await self.stub.ListNodes(
            pb.ListNodesRequest(backend=backend), timeout=self.timeout
        )
        return list(reply.nodes)

    async def list_servers(self) -> pb.ListServersResponse:
        """The servers of a replicated deployment and which one leads (UNIMPLEMENTED from a
        server from before replication)."""
        reply: pb.ListServersResponse = await self.stub.ListServers(
            pb.ListServersRequest(), timeout=self.timeout
        )
        return reply

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
