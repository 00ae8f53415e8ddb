"""Replicated servers on one PostgreSQL, a recording backend and a submitter: what the failover
tests (tests/ha/test_failover.py) and ``bench/failover.py`` drive.

The backend here is deliberately not the agent: it applies whatever the servers send and
*counts* what a correct deployment never sends -- a task bound a second time, a node given more
than it has, a decision of a lower term after a higher one -- instead of refusing it, so the
figures measure the servers. It follows the leader as every Muster client does (UNAVAILABLE with
the ``muster-leader`` hint, else the next address).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from muster.transport import LEADER_METADATA
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]
BACKEND = "ha-null"
NODE_CPU_MILLI = 4000
TASK_CPU_MILLI = 1000
# Ambiguous or transient: the call may not have reached the leader (or did; the retry is
# idempotent -- resubmitting a job with the same spec is a no-op).
# A paused server answers nothing: calls give up soon and try the next replica.
CALL_TIMEOUT = 2.0
SUSPECT_SECONDS = 4.0
LIVENESS_INTERVAL = 0.5
LIVENESS_TIMEOUT = 1.0
RETRY_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


# A server that is paused or cut off leaves its streams open: pings unanswered end them.
KEEPALIVE = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def leader_hint(exc: grpc.aio.AioRpcError) -> str:
    for key, value in exc.trailing_metadata() or ():
        if key == LEADER_METADATA and isinstance(value, str):
            return value
    return ""


class ServerProc:
    """One ``muster-server`` replica in a process of its own (restartable on the same port)."""

    def __init__(
        self,
        index: int,
        dsn: str,
        work: Path,
        *,
        lease_duration: float = 2.0,
        lease_renew: float = 0.5,
        bind_timeout: float = 30.0,
        cycle_worker: str = "thread",
    ) -> None:
        self.index = index
        self.dsn = dsn
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = work / f"server-{index}.log"
        self.args = [
            sys.executable,
            "-m",
            "server.service.main",
            "--listen",
            self.address,
            "--state",
            dsn,
            "--lease-duration",
            str(lease_duration),
            "--lease-renew",
            str(lease_renew),
            "--cycle-worker",
            cycle_worker,
            "--cycle-period",
            "0.2",
            "--bind-timeout",
            str(bind_timeout),
            "--log-format",
            "json",
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = False  # SIGSTOP sent, no SIGCONT yet

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.stopped = False

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            os.kill(self.pid, sig)
            if sig == signal.SIGSTOP:
                self.stopped = True
            elif sig == signal.SIGCONT:
                self.stopped = False

    def wait(self, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.proc.wait(5)

    def kill(self) -> None:
        if self.stopped:
            self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        self.wait()


@dataclass
class Deployment:
    servers: list[ServerProc]

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.servers]

    def start(self) -> None:
        for s in self.servers:
            s.start()

    def stop(self) -> None:
        for s in self.servers:
            if s.alive:
                s.signal(signal.SIGCONT)
                s.signal(signal.SIGTERM)
        for s in self.servers:
            s.wait()

    def by_address(self, address: str) -> ServerProc | None:
        return next((s for s in self.servers if s.address == address), None)

    async def leader(
        self, timeout: float = 30.0, *, other_than: ServerProc | None = None
    ) -> ServerProc:
        """The replica that says it leads (asked of every live one until one does); with
        ``other_than``, one other than that replica (which may still lead for a moment, e.g.
        until it has handled the SIGTERM it was sent)."""
        deadline = time.monotonic() + timeout
        while True:
            for s in self.servers:
                if not s.alive or s.stopped or s is other_than:
                    continue
                try:
                    async with grpc.aio.insecure_channel(s.address) as ch:
                        reply = await pb_grpc.SchedulerStub(ch).ListServers(
                            pb.ListServersRequest(), timeout=2
                        )
                except grpc.aio.AioRpcError:
                    continue
                mine = next((r for r in reply.servers if r.address == s.address), None)
                if mine is not None and mine.role == "leader":
                    return s
            if time.monotonic() > deadline:
                raise TimeoutError("no replica leads")
            await asyncio.sleep(0.1)

    def terminate_store_sessions(self, server: ServerProc) -> int:
        """Cut ``server``'s database connections (as a network partition or a restarted
        database would), through a session of our own."""
        import psycopg

        with psycopg.connect(self.servers[0].dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name LIKE %s",
                (f"muster/%@%:{server.pid}",),
            ).fetchall()
        return len(rows)


class Follower:
    """A channel that goes where the leader is: the hint of an UNAVAILABLE, else the next
    address."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self.addresses = list(addresses)
        self.current = self.addresses[0]
        self._channels: dict[str, grpc.aio.Channel] = {}
        # Addresses that did not answer in time -> until when a hint naming them is not
        # followed: a paused leader is still named by the others until its lease runs out.
        self._suspect: dict[str, float] = {}

    def stub(self) -> pb_grpc.SchedulerStub:
        ch = self._channels.get(self.current)
        if ch is None:
            ch = self._channels[self.current] = grpc.aio.insecure_channel(
                self.current, options=KEEPALIVE
            )
        return pb_grpc.SchedulerStub(ch)

    def moved(self, exc: grpc.aio.AioRpcError | None = None) -> None:
        now = time.monotonic()
        if exc is None or exc.code() in (
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.CANCELLED,
        ):
            self._suspect[self.current] = now + SUSPECT_SECONDS
        hint = leader_hint(exc) if exc is not None else ""
        if hint and hint != self.current and self._suspect.get(hint, 0.0) < now:
            self.current = hint
            return
        i = self.addresses.index(self.current) if self.current in self.addresses else -1
        for step in range(1, len(self.addresses) + 1):
            candidate = self.addresses[(i + step) % len(self.addresses)]
            if self._suspect.get(candidate, 0.0) < now or step == len(self.addresses):
                self.current = candidate
                return

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()


@dataclass
class BackendRecord:
    """What the recording backend saw."""

    starts: Counter[str] = field(default_factory=Counter)  # task id -> binds applied
    done: set[str] = field(default_factory=set)
    applied: set[int] = field(default_factory=set)  # decision ids
    max_term: int = 0
    stale_term: int = 0  # decisions of a lower term than one already seen
    overcommits: int = 0  # binds onto a node without room
    decisions: int = 0
    # decision id -> what it said (task, node, term): one id saying two things is a corrupt log
    said: dict[int, tuple[str, str]] = field(default_factory=dict)
    conflicting: int = 0
    # (monotonic time received, term) of each decision batch, for failover times
    received: list[tuple[float, int]] = field(default_factory=list)
    sessions: int = 0

    @property
    def started_twice(self) -> int:
        return sum(1 for n in self.starts.values() if n > 1)


class RecordingBackend:
    """A null backend over ``nodes`` nodes of 4 CPUs: applies every bind it is sent, holds the
    task for ``hold`` seconds, reports it Succeeded; counts what should never happen."""

    def __init__(self, addresses: Sequence[str], *, nodes: int = 8, hold: float = 0.3) -> None:
        self.follower = Follower(addresses)
        self.nodes = [f"n{i:03d}" for i in range(nodes)]
        self.hold = hold
        self.record = BackendRecord()
        self.used: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.running: dict[str, str] = {}  # task -> node
        self.finished: list[pb.Delta] = []  # reported on the next session if a send failed
        self._switched = False  # the watchdog moved us to the leader a server named

    async def run(self) -> None:
        while True:
            stub = self.follower.stub()
            self._switched = False
            try:
                await self._session(stub)
            except grpc.aio.AioRpcError as exc:
                self.follower.moved(exc)
            else:
                if not self._switched:  # the stream ended, or the watchdog gave up on it
                    self.follower.moved()
            await asyncio.sleep(0.05)

    async def _session(self, stub: pb_grpc.SchedulerStub) -> None:
        await stub.RegisterBackend(
            pb.RegisterBackendRequest(name=BACKEND, kind="fake-agent"), timeout=CALL_TIMEOUT
        )
        nodes = [
            pb.Node(name=n, allocatable=pb.ResourceList(quantities={"cpu": "4", "memory": "16Gi"}))
            for n in self.nodes
        ]
        # The truth, as a real backend tells it: what runs, and what ended but was not reported.
        tasks = [
            pb.BackendTask(task_id=t, node=n, status=pb.TASK_STATUS_RUNNING)
            for t, n in self.running.items()
        ] + [
            pb.BackendTask(
                task_id=d.task_status.task_id, node=d.task_status.node, status=d.task_status.status
            )
            for d in self.finished
        ]
        await stub.SyncSnapshot(
            pb.SyncSnapshotRequest(backend=BACKEND, nodes=nodes, tasks=tasks),
            timeout=3 * CALL_TIMEOUT,
        )
        self.record.sessions += 1
        await self._send(stub, [])
        stream = stub.StreamDecisionBatches(
            pb.StreamDecisionsRequest(backend=BACKEND), timeout=None
        )
        watchdog = asyncio.create_task(self._watch(stub, stream))
        try:
            await self._read(stub, stream)
        except asyncio.CancelledError:
            if not watchdog.done():
                raise  # we are being cancelled, not the stream
        finally:
            watchdog.cancel()

    async def _watch(self, stub: pb_grpc.SchedulerStub, stream: object) -> None:
        """A server that is paused or cut off keeps its stream open: ask it every second whether
        it still leads (what the agent's runtime does too), and end the stream when it does not
        answer so, in time."""
        while True:
            await asyncio.sleep(LIVENESS_INTERVAL)
            try:
                reply = await stub.ListServers(pb.ListServersRequest(), timeout=LIVENESS_TIMEOUT)
                if reply.leader and reply.leader != self.follower.current:
                    self.follower.current = reply.leader
                    self._switched = True
                    stream.cancel()  # type: ignore[attr-defined]
                    return
            except grpc.aio.AioRpcError:
                stream.cancel()  # type: ignore[attr-defined]
                return

    async def _read(self, stub: pb_grpc.SchedulerStub, stream: object) -> None:
        async for batch in stream:  # type: ignore[attr-defined]
            now = time.monotonic()
            acks: list[pb.DecisionAck] = []
            for d in batch.decisions:
                self.record.decisions += 1
                self.record.received.append((now, d.term))
                what = (d.bind.task_id or d.evict.task_id, d.bind.node or d.evict.node)
                if self.record.said.setdefault(d.id, what) != what:
                    self.record.conflicting += 1
                if d.term < self.record.max_term:
                    self.record.stale_term += 1
                    continue  # never acted on: the leader that sent it was replaced
                self.record.max_term = d.term
                if d.id not in self.record.applied:
                    self.record.applied.add(d.id)
                    self._apply(d, stub)
                acks.append(pb.DecisionAck(decision_id=d.id, applied=True))
            if acks:
                await stub.AckDecisions(
                    pb.AckDecisionsRequest(backend=BACKEND, acks=acks), timeout=CALL_TIMEOUT
                )

    def _apply(self, d: pb.Decision, stub: pb_grpc.SchedulerStub) -> None:
        if d.HasField("evict"):
            node = self.running.pop(d.evict.task_id, None)
            if node is not None:
                self.used[node] -= TASK_CPU_MILLI
            return
        task, node = d.bind.task_id, d.bind.node
        self.record.starts[task] += 1
        if task in self.running:
            return  # counted; it runs once here
        if self.used.get(node, 0) + TASK_CPU_MILLI > NODE_CPU_MILLI:
            self.record.overcommits += 1
        self.used[node] = self.used.get(node, 0) + TASK_CPU_MILLI
        self.running[task] = node
        asyncio.get_running_loop().call_later(self.hold, self._finish, task)

    def _finish(self, task: str) -> None:
        node = self.running.pop(task, None)
        if node is None:
            return
        self.used[node] -= TASK_CPU_MILLI
        self.record.done.add(task)
        self.finished.append(
            pb.Delta(
                task_status=pb.TaskStatusUpdate(
                    task_id=task, status=pb.TASK_STATUS_SUCCEEDED, node=node
                )
            )
        )

    async def report_loop(self) -> None:
        """Send finished tasks every 50 ms to wherever the leader is."""
        while True:
            await asyncio.sleep(0.05)
            if self.finished:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await self._send(self.follower.stub(), [])

    async def _send(self, stub: pb_grpc.SchedulerStub, extra: list[pb.Delta]) -> None:
        # Kept until a server has them: a snapshot taken meanwhile must still tell them.
        deltas = self.finished + extra
        if not deltas:
            return
        await stub.SendDeltas(
            pb.SendDeltasRequest(backend=BACKEND, deltas=deltas), timeout=CALL_TIMEOUT
        )
        sent = {id(d) for d in deltas}
        self.finished = [d for d in self.finished if id(d) not in sent]


def job_spec(job_id: str) -> pb.JobSpec:
    return pb.JobSpec(
        id=job_id,
        task_groups=[
            pb.TaskGroup(
                role="worker",
                replicas=1,
                request=pb.ResourceList(quantities={"cpu": "1", "memory": "1Gi"}),
            )
        ],
    )


class Submitter:
    """Submits one-task jobs at ``rate`` per second; remembers each one a server acknowledged."""

    def __init__(self, addresses: Sequence[str], prefix: str = "j") -> None:
        self.follower = Follower(addresses)
        self.prefix = prefix
        self.acked: list[str] = []
        self.retries = 0

    async def submit(self, job_id: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                await self.follower.stub().SubmitJob(
                    pb.SubmitJobRequest(job=job_spec(job_id)), timeout=CALL_TIMEOUT
                )
                self.acked.append(job_id)
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRY_CODES or time.monotonic() > deadline:
                    raise
                self.retries += 1
                self.follower.moved(exc)
                await asyncio.sleep(0.05)

    async def run(self, rate: float, count: int) -> None:
        start = time.monotonic()
        for i in range(count):
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            await self.submit(f"{self.prefix}{i:06d}")


async def unfinished(addresses: Sequence[str], job_ids: Sequence[str]) -> list[str]:
    """The acknowledged jobs that are not Completed (or not found), asked of the leader."""
    follower = Follower(addresses)
    try:
        missing: list[str] = []
        for job_id in job_ids:
            while True:
                try:
                    job = await follower.stub().GetJob(pb.GetJobRequest(id=job_id), timeout=5)
                    if job.status.phase != pb.JOB_PHASE_COMPLETED:
                        missing.append(job_id)
                    break
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.NOT_FOUND:
                        missing.append(job_id)
                        break
                    follower.moved(exc)
                    await asyncio.sleep(0.05)
        return missing
    finally:
        await follower.close()


def refused_writes(server_logs: Sequence[Path]) -> int:
    """Cycle writes of a deposed leader the fence refused (each stopped its cycling and stepped
    it down), from the servers' JSON logs."""
    import json

    count = 0
    for path in server_logs:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if '"cycle.stopped"' not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if "no longer holds the leader lease" in str(event.get("reason", "")):
                count += 1
    return count
