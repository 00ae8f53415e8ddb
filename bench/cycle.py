"""Benchmark one scheduling cycle on a synthetic cluster.

    python bench/cycle.py --nodes 5000 --tasks 10000 [--seed S] [--repeat R] [--config FILE]

Builds N nodes (3/4 CPU nodes of 32 cores / 128Gi, 1/4 GPU nodes of 64 cores / 512Gi / 8 GPUs,
a few labels and taints) and M pending tasks in gangs of 1-8 tasks with mixed CPU / memory / GPU
requests, all Inqueue in 4 queues, then runs one cycle of the default configuration (Volcano's
default tiers) and prints one JSON line per run: nodes, tasks, placed, cycle_seconds (wall),
cpu_seconds (this process; steadier when the machine is shared),
placements_per_second, plus per-action seconds.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from muster.quantity import parse_resources  # noqa: E402
from server.config import default_config, load_config  # noqa: E402
from server.model import (  # noqa: E402
    ClusterSnapshot,
    JobSpec,
    NodeSpec,
    PodGroupPhase,
    QueueSpec,
    Taint,
    TaskSpec,
)
from server.scheduler import SchedulerCore  # noqa: E402
from server.service.gctune import tune_gc  # noqa: E402

SHAPES = [
    {"cpu": "1", "memory": "2Gi"},
    {"cpu": "2", "memory": "4Gi"},
    {"cpu": "4", "memory": "8Gi"},
    {"cpu": "8", "memory": "32Gi"},
    {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
    {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "2"},
    {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4"},
]


def build(nodes: int, tasks: int, seed: int) -> ClusterSnapshot:
    rng = random.Random(seed)
    node_specs = []
    for i in range(nodes):
        gpu = i % 4 == 3
        alloc = (
            {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "110"}
            if gpu
            else {"cpu": "32", "memory": "128Gi", "pods": "110"}
        )
        node_specs.append(
            NodeSpec(
                name=f"node-{i:05d}",
                allocatable=parse_resources(alloc),
                labels={"zone": f"z{i % 3}", "rack": f"r{i // 40}", "gpu": str(gpu).lower()},
                taints=[Taint("nvidia.com/gpu", "present", "PreferNoSchedule")] if gpu else [],
            )
        )
    queues = [QueueSpec(f"q{i}", weight=i + 1) for i in range(4)]
    jobs = []
    made = 0
    j = 0
    while made < tasks:
        size = min(rng.randint(1, 8), tasks - made)
        shape = parse_resources(rng.choice(SHAPES))
        uid = f"bench/job-{j}"
        job_tasks = [
            TaskSpec(
                uid=f"{uid}-{k}",
                name=f"job-{j}-{k}",
                namespace="bench",
                job=uid,
                request=dict(shape),
                role="worker",
                creation_index=made + k,
            )
            for k in range(size)
        ]
        jobs.append(
            JobSpec(
                uid=uid,
                name=f"job-{j}",
                namespace="bench",
                queue=f"q{j % 4}",
                tasks=job_tasks,
                min_member=size,
                phase=PodGroupPhase.INQUEUE,
                priority=rng.choice([0, 0, 10]),
                creation_index=j,
            )
        )
        made += size
        j += 1
    return ClusterSnapshot(nodes=node_specs, queues=queues, jobs=jobs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--config", type=Path, default=None)
    ap.add_argument(
        "--profile", action="store_true", help="print the top functions (cProfile) after each cycle"
    )
    args = ap.parse_args()
    config = load_config(args.config.read_text()) if args.config else default_config()
    tune_gc()  # as the server's core worker process does
    for _ in range(args.repeat):
        snapshot = build(args.nodes, args.tasks, args.seed)
        core = SchedulerCore(config)
        profiler = cProfile.Profile() if args.profile else None
        started, cpu_started = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        result = core.run_cycle(snapshot, 1)
        if profiler is not None:
            profiler.disable()
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_started
        placed = len(result.binds) + len(result.pipelined)
        print(
            json.dumps(
                {
                    "nodes": args.nodes,
                    "tasks": args.tasks,
                    "placed": placed,
                    "cycle_seconds": round(seconds, 4),
                    "cpu_seconds": round(cpu_seconds, 4),
                    "placements_per_second": round(placed / seconds, 1) if seconds else None,
                    "actions": {k: round(v, 4) for k, v in result.action_seconds.items()},
                }
            ),
            flush=True,
        )
        if profiler is not None:  # the cycle under the profiler runs ~2x slower; shares hold
            stats = pstats.Stats(profiler, stream=sys.stdout)
            stats.sort_stats("tottime").print_stats(20)
            stats.sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
