"""End-to-end throughput through the service: a real ``muster-server`` process and a *null backend*
in this process that acknowledges every bind at once and reports the task Succeeded right after
(no processes run), so what is measured is the server's path: submit, cycle, decision, ack.

    .venv/bin/python bench/e2e.py --jobs 2000 --tasks 5 --nodes 2000
    .venv/bin/python bench/e2e.py --batch 1          # one SubmitJob per job instead of SubmitJobs
    .venv/bin/python bench/e2e.py --agents 2         # real muster-agent processes running `true`

Prints one JSON object: submit jobs/s (SubmitJobs batches of ``--batch``), end-to-end placements/s
(first submit to the last bind acknowledged), ack latency p50/p99 (decision issued -> acked, as the
backend sees it: stream receive -> ack sent), GetJob p50/p99 sampled every 20 ms during the run by a
process of its own (and, for comparison, from the backend's own event loop), the server's peak
RSS, and the CPU seconds the server process and its cycle worker used during the run (with the
server's per placement: on a shared machine a steadier figure than the rates). With ``--agents M`` the backend is M real ``muster-agent`` processes (the nodes split
between them) and every task runs ``true``: a placement counts once its task has started (it is
seen running or ended through WatchJobs), and ack latency is not measured. Bounded: ``--timeout``
seconds at most. Run by hand, not in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
from soak import (  # the soak bench's helpers
    AGENT,
    SERVER,
    child_pids,
    cpu_seconds,
    free_port,
    pct,
    rss_kib,
    start,
    stop,
    wait_nodes,
)

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[1]
BACKEND = "null"

# GetJob every 20 ms from a process of its own (a user's view of the server, apart from the
# backend's and the submitter's event loop) until stdin closes; prints the latencies in seconds.
SAMPLER = """
import json, sys, threading, time
import grpc
from muster.v1 import muster_pb2 as pb, muster_pb2_grpc as pb_grpc
stub = pb_grpc.SchedulerStub(grpc.insecure_channel(sys.argv[1]))
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
seconds = []
while not stop.is_set():
    t0 = time.perf_counter()
    try:
        stub.GetJob(pb.GetJobRequest(id=sys.argv[2]), timeout=30)
        seconds.append(time.perf_counter() - t0)
    except grpc.RpcError:
        pass
    stop.wait(0.02)
print(json.dumps(seconds))
"""


class NullBackend:
    """Acks every bind and then reports its task Succeeded; counts what it saw."""

    def __init__(self, stub: pb_grpc.SchedulerStub) -> None:
        self.stub = stub
        self.binds = 0
        self.ack_seconds: list[float] = []
        self.last_ack = 0.0

    async def register(self, nodes: int) -> None:
        await self.stub.RegisterBackend(pb.RegisterBackendRequest(name=BACKEND, kind="fake-agent"))
        node_list = [
            pb.Node(
                name=f"n{i:05d}",
                allocatable=pb.ResourceList(quantities={"cpu": "64", "memory": "256Gi"}),
            )
            for i in range(nodes)
        ]
        await self.stub.SyncSnapshot(
            pb.SyncSnapshotRequest(backend=BACKEND, nodes=node_list), timeout=120
        )

    async def serve(self) -> None:
        """Read decisions as they stream in; ack whatever arrived since the last ack, in one call."""
        queue: asyncio.Queue[tuple[pb.Decision, float]] = asyncio.Queue()

        async def read() -> None:
            async for batch in self.stub.StreamDecisionBatches(
                pb.StreamDecisionsRequest(backend=BACKEND)
            ):
                received = time.perf_counter()
                for decision in batch.decisions:
                    queue.put_nowait((decision, received))

        reader = asyncio.create_task(read())
        try:
            while True:
                batch = [await queue.get()]
                while not queue.empty() and len(batch) < 1000:
                    batch.append(queue.get_nowait())
                await self._ack(batch)
        finally:
            reader.cancel()

    async def _ack(self, batch: list[tuple[pb.Decision, float]]) -> None:
        acks = [pb.DecisionAck(decision_id=d.id, applied=True) for d, _ in batch]
        await self.stub.AckDecisions(pb.AckDecisionsRequest(backend=BACKEND, acks=acks), timeout=60)
        now = time.perf_counter()
        done = [
            pb.Delta(
                task_status=pb.TaskStatusUpdate(
                    task_id=d.bind.task_id, status=pb.TASK_STATUS_SUCCEEDED, node=d.bind.node
                )
            )
            for d, _ in batch
            if d.HasField("bind")
        ]
        for d, received in batch:
            self.ack_seconds.append(now - received)
            if d.HasField("bind"):
                self.binds += 1
        self.last_ack = now
        if done:
            await self.stub.SendDeltas(
                pb.SendDeltasRequest(backend=BACKEND, deltas=done), timeout=60
            )


class AgentsWatch:
    """Real agents: counts tasks that started (running or ended) from the server's job events."""

    def __init__(self, stub: pb_grpc.SchedulerStub) -> None:
        self.stub = stub
        self.started: dict[str, int] = {}
        self.rewatches = 0
        self.binds = 0
        self.last_ack = 0.0

    async def serve(self) -> None:
        while (
            True
        ):  # a watch that falls behind is ended by the server: watch again from the current state
            try:
                async for event in self.stub.WatchJobs(pb.WatchJobsRequest(send_initial=True)):
                    st = event.job.status
                    n = st.running + st.succeeded + st.failed
                    job_id = event.job.spec.id
                    seen = self.started.get(job_id, 0)
                    if n > seen:
                        self.binds += n - seen
                        self.started[job_id] = n
                        self.last_ack = time.perf_counter()
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                self.rewatches += 1


async def run(args: argparse.Namespace) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="muster-e2e-"))
    port = free_port()
    # The server gets its own copy of the log's descriptor, so this one can close at once.
    with open(work / "server.log", "wb") as server_log:
        server = subprocess.Popen(
            [
                sys.executable,
                "-c",
                SERVER,
                "--listen",
                f"127.0.0.1:{port}",
                "--state",
                str(work / "m.db"),
                "--log-level",
                "warning",
                *args.server_arg,
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=server_log,
        )
    peak_rss = 0
    agents: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(args.agents):
            inventory = work / f"inventory-{i}.yaml"
            count = args.nodes // args.agents + (1 if i < args.nodes % args.agents else 0)
            inventory.write_text(
                f"nodes:\n  - name: a{i}-n\n    count: {count}\n    cpu: 64\n    memory: 256Gi\n"
            )
            agents.append(
                start(
                    [
                        "-c",
                        AGENT,
                        "--server",
                        f"127.0.0.1:{port}",
                        "--name",
                        f"agent-{i}",
                        "--inventory",
                        str(inventory),
                        "--log-level",
                        "warning",
                    ],
                    work / f"agent-{i}.log",
                    ROOT,
                )
            )
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.SchedulerStub(channel)
            await asyncio.wait_for(channel.channel_ready(), 30)
            backend: NullBackend | AgentsWatch
            if args.agents:
                await wait_nodes(stub, args.nodes, 120)
                backend = AgentsWatch(stub)
            else:
                backend = NullBackend(stub)
                await backend.register(args.nodes)
            serving = asyncio.create_task(backend.serve())
            get_job: list[float] = []
            total_tasks = args.jobs * args.tasks

            async def sample_get_job() -> None:
                while backend.binds < total_tasks:
                    t0 = time.perf_counter()
                    try:
                        await stub.GetJob(pb.GetJobRequest(id="e2e-000000"), timeout=30)
                        get_job.append(time.perf_counter() - t0)
                    except grpc.aio.AioRpcError:
                        pass
                    await asyncio.sleep(0.05)

            async def watch_rss() -> None:
                nonlocal peak_rss
                while True:
                    peak_rss = max(peak_rss, rss_kib(server.pid))
                    await asyncio.sleep(0.2)

            specs = [
                pb.JobSpec(
                    id=f"e2e-{i:06d}",
                    task_groups=[
                        pb.TaskGroup(
                            role="w",
                            replicas=args.tasks,
                            request=pb.ResourceList(quantities={"cpu": "1", "memory": "1Gi"}),
                            command=["true"] if args.agents else [],
                        )
                    ],
                )
                for i in range(args.jobs)
            ]
            rss_task = asyncio.create_task(watch_rss())
            # CPU the server process and its cycle worker use over the run: steadier than the rates
            # on a shared machine (the worker is started with the server's loop, before this).
            workers = child_pids(server.pid)
            cpu_before = cpu_seconds(server.pid), sum(cpu_seconds(w) for w in workers)
            started = time.perf_counter()
            for i in range(0, len(specs), args.batch):
                chunk = specs[i : i + args.batch]
                if args.batch == 1:
                    await stub.SubmitJob(pb.SubmitJobRequest(job=chunk[0]), timeout=60)
                else:
                    await stub.SubmitJobs(pb.SubmitJobsRequest(jobs=chunk), timeout=120)
                if i == 0:
                    sampler = asyncio.create_task(sample_get_job())
                    observer = subprocess.Popen(
                        [sys.executable, "-c", SAMPLER, f"127.0.0.1:{port}", "e2e-000000"],
                        cwd=ROOT,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                    )
            submitted = time.perf_counter()
            deadline = started + args.timeout
            while backend.binds < total_tasks and time.perf_counter() < deadline:
                await asyncio.sleep(0.05)
            finished = backend.last_ack or time.perf_counter()
            server_cpu = cpu_seconds(server.pid) - cpu_before[0]
            worker_cpu = sum(cpu_seconds(w) for w in workers) - cpu_before[1]
            serving.cancel()
            rss_task.cancel()
            sampler.cancel()
            observed: list[float] = json.loads(observer.communicate(b"", timeout=60)[0] or b"[]")
            return {
                "backend": f"{args.agents} agents" if args.agents else "null",
                "jobs": args.jobs,
                "tasks_per_job": args.tasks,
                "nodes": args.nodes,
                "batch": args.batch,
                "submit_jobs_per_s": round(args.jobs / max(submitted - started, 1e-9), 1),
                "placements": backend.binds,
                "placements_per_s": round(backend.binds / max(finished - started, 1e-9), 1),
                "all_placed": backend.binds >= total_tasks,
                "ack_ms": (
                    {"p50": pct(backend.ack_seconds, 0.5), "p99": pct(backend.ack_seconds, 0.99)}
                    if isinstance(backend, NullBackend)
                    else None
                ),
                "get_job_ms": {
                    "p50": pct(observed, 0.5),
                    "p99": pct(observed, 0.99),
                    "samples": len(observed),
                },
                # The same, asked from the backend's own event loop (it waits behind the backend's
                # and the submitter's work in that process too).
                "get_job_in_backend_process_ms": {
                    "p50": pct(get_job, 0.5),
                    "p99": pct(get_job, 0.99),
                },
                **({"rewatches": backend.rewatches} if isinstance(backend, AgentsWatch) else {}),
                "server_peak_rss_mib": round(peak_rss / 1024, 1),
                "server_cpu_s": round(server_cpu, 2),
                "worker_cpu_s": round(worker_cpu, 2),
                "server_cpu_ms_per_placement": round(1000 * server_cpu / max(backend.binds, 1), 3),
            }
    finally:
        for agent in agents:
            stop(agent)
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--tasks", type=int, default=5, help="tasks per job (a gang)")
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument(
        "--batch", type=int, default=100, help="jobs per SubmitJobs call (1: SubmitJob per job)"
    )
    ap.add_argument(
        "--agents",
        type=int,
        default=0,
        help="real muster-agent processes instead of the null backend",
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    ap.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra muster-server argument (repeatable)",
    )
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
