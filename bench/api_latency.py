"""API latency while large cycles run.

Starts a Muster server in-process (its own thread and event loop), submits ``--tasks`` pending
tasks (4-task gangs; ``--unplaceable`` of them ask
for a GPU no node has, so every cycle keeps working on them), starts a client in a separate process (no shared GIL),
registers ``--nodes`` nodes (the next cycle places thousands of tasks) and measures GetJob and ListNodes
latency for ``--seconds`` while cycles run.
Prints one JSON object.

    .venv/bin/python bench/api_latency.py --nodes 5000 --tasks 10000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc

from muster.logs import configure_logging
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service.app import ServerOptions, ServerThread
from server.service.gctune import tune_gc


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    s = sorted(samples)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
    return {
        "n": len(s),
        "p50_ms": round(pick(0.50) * 1000, 2),
        "p99_ms": round(pick(0.99) * 1000, 2),
        "max_ms": round(s[-1] * 1000, 2),
        "mean_ms": round(statistics.fmean(s) * 1000, 2),
    }


def client(address: str, seconds: float, job_ids: list[str], out: mp.Queue) -> None:
    get_job: list[float] = []
    list_nodes: list[float] = []
    with grpc.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 256 << 20)]
    ) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        deadline = time.monotonic() + seconds
        i = 0
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            stub.GetJob(pb.GetJobRequest(id=job_ids[i % len(job_ids)]), timeout=30)
            get_job.append(time.perf_counter() - t0)
            if i % 10 == 0:
                t0 = time.perf_counter()
                stub.ListNodes(pb.ListNodesRequest(), timeout=30)
                list_nodes.append(time.perf_counter() - t0)
            i += 1
    out.put({"get_job": get_job, "list_nodes": list_nodes})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument(
        "--unplaceable", type=float, default=0.5, help="fraction of tasks that never fit"
    )
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--cycle-period", type=float, default=0.5)
    args = ap.parse_args()
    configure_logging("console", "warning")
    tune_gc()  # as muster-server does

    with tempfile.TemporaryDirectory() as tmp:
        opts = ServerOptions(
            listen="127.0.0.1:0",
            state=f"{tmp}/bench.db",
            cycle_period=args.cycle_period,
            bind_timeout=3600,
        )
        with ServerThread(opts) as srv, grpc.insecure_channel(srv.address) as ch:
            stub = pb_grpc.SchedulerStub(ch)
            stub.RegisterBackend(pb.RegisterBackendRequest(name="bench", kind="fake-agent"))
            nodes = [
                pb.Node(
                    name=f"node-{i:05d}",
                    allocatable=pb.ResourceList(quantities={"cpu": "8", "memory": "64Gi"}),
                    labels={"zone": f"z{i % 8}"},
                )
                for i in range(args.nodes)
            ]
            jobs = args.tasks // 4
            unplaceable = int(jobs * args.unplaceable)
            job_ids = []
            t0 = time.perf_counter()
            for j in range(jobs):
                request = {"cpu": "2", "memory": "4Gi"}
                if j < unplaceable:
                    request["nvidia.com/gpu"] = "1"
                spec = pb.JobSpec(
                    id=f"job-{j:05d}",
                    task_groups=[
                        pb.TaskGroup(
                            role="worker", replicas=4, request=pb.ResourceList(quantities=request)
                        )
                    ],
                )
                stub.SubmitJob(pb.SubmitJobRequest(job=spec), timeout=60)
                job_ids.append(spec.id)
            submit_s = time.perf_counter() - t0
            loop = srv.server.loop
            cycles_before = loop.cycles

            out: mp.Queue = mp.get_context("spawn").Queue()
            proc = mp.get_context("spawn").Process(
                target=client, args=(srv.address, args.seconds, job_ids, out)
            )
            proc.start()
            # Nodes arrive while the client measures: the first cycle over them is the biggest.
            time.sleep(1.0)
            t0 = time.perf_counter()
            stub.SyncSnapshot(pb.SyncSnapshotRequest(backend="bench", nodes=nodes), timeout=120)
            sync_s = time.perf_counter() - t0
            cycle_times = []
            deadline = time.monotonic() + args.seconds + 5
            seen = loop.cycles
            while proc.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
                if loop.cycles != seen:
                    seen = loop.cycles
                    cycle_times.append(loop.last_cycle_seconds)
            samples = out.get(timeout=60)
            proc.join(10)
            running = stub.ListJobs(
                pb.ListJobsRequest(phases=[pb.JOB_PHASE_RUNNING], page_size=1000), timeout=60
            )
            result = {
                "nodes": args.nodes,
                "tasks": jobs * 4,
                "unplaceable_tasks": unplaceable * 4,
                "sync_snapshot_s": round(sync_s, 3),
                "submit_all_s": round(submit_s, 3),
                "cycles_during_measurement": loop.cycles - cycles_before,
                "cycle_seconds_max": round(max(cycle_times, default=0.0), 3),
                "cycle_seconds_mean": round(statistics.fmean(cycle_times), 3)
                if cycle_times
                else None,
                "running_jobs_first_page": len(running.jobs),
                "get_job": percentiles(samples["get_job"]),
                "list_nodes": percentiles(samples["list_nodes"]),
            }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
