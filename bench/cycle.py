"""Benchmark one scheduling cycle on a synthetic cluster.

    python bench/cycle.py --nodes 5000 --tasks 10000 [--seed S] [--repeat R] [--config FILE]
    python bench/cycle.py --nodes 500 --tasks 2500 --profile both [--filters both] [--cprofile]
    python bench/cycle.py --nodes 16000 --tasks 32000 --backends 16

Builds N nodes (3/4 CPU nodes of 32 cores / 128Gi, 1/4 GPU nodes of 64 cores / 512Gi / 8 GPUs,
a few labels and taints) and M pending tasks in gangs of 1-8 tasks with mixed CPU / memory / GPU
requests, all Inqueue in 4 queues, then runs one cycle and prints one JSON line per run: profile,
nodes, tasks, placed, cycle_seconds (wall), cpu_seconds (this process; steadier when the machine is
shared), placements_per_second, plus per-action seconds.

``--profile`` picks the configuration: ``volcano`` (the default: Volcano's default tiers),
``kai`` (examples/config-kai.yaml) or ``both``, run alternately on the same cluster, with a closing
line of medians side by side and KAI's ratio to Volcano. ``--filters on|off|both`` sets the KAI
profile's ``scenarioFilters`` (server/actions/kai/scenario_filters.py; ``both`` alternates them,
to measure them in one run). ``--config FILE`` runs that configuration instead. ``--cprofile``
prints the top functions after each cycle. ``--backends N`` (default 1) splits the nodes into N
backends of contiguous blocks of nodes, ``b00``, ``b01``, ... (``with_backends``): with more than
one, the gang-backend plugin keeps each gang inside one backend; the JSON line says ``backends``.
``--node-share`` also times the per-node work (``NodeWork``: node selection, fit errors, node
table updates) and prints its share of the cycle with the speed-up a parallel per-backend solve
could reach at best on 2 and 16 cores (Amdahl's law, coordination free).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import itertools
import json
import pstats
import random
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from muster.quantity import parse_resources  # noqa: E402
from server.config import SchedulerConfig, default_config, load_config  # noqa: E402
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
from server.session.evaluator import NodeEvaluator  # noqa: E402
from server.session.info import NodeTable  # noqa: E402

SHAPES = [
    {"cpu": "1", "memory": "2Gi"},
    {"cpu": "2", "memory": "4Gi"},
    {"cpu": "4", "memory": "8Gi"},
    {"cpu": "8", "memory": "32Gi"},
    {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
    {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "2"},
    {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4"},
]


def bench_job(
    j: int, size: int, shape: dict[str, float], first_task: int, priority: int
) -> JobSpec:
    """Job ``bench/job-<j>``: a gang of ``size`` tasks asking ``shape`` in queue ``q<j % 4>``,
    Inqueue; its tasks' creation indexes count up from ``first_task``."""
    uid = f"bench/job-{j}"
    return JobSpec(
        uid=uid,
        name=f"job-{j}",
        namespace="bench",
        queue=f"q{j % 4}",
        tasks=[
            TaskSpec(
                uid=f"{uid}-{k}",
                name=f"job-{j}-{k}",
                namespace="bench",
                job=uid,
                request=dict(shape),
                role="worker",
                creation_index=first_task + k,
            )
            for k in range(size)
        ],
        min_member=size,
        phase=PodGroupPhase.INQUEUE,
        priority=priority,
        creation_index=j,
    )


def bench_jobs(rng: random.Random, max_gang: int, tasks: int | None = None) -> Iterator[JobSpec]:
    """Jobs ``bench/job-0``, ``bench/job-1``, ...: each a gang of 1 to ``max_gang`` tasks of one of
    ``SHAPES``, priority 0 or 10, drawn from ``rng``; until ``tasks`` tasks (the last gang cut to
    fit), or without end when ``tasks`` is None."""
    shapes = [parse_resources(s) for s in SHAPES]
    made = 0
    for j in itertools.count():
        if tasks is not None and made >= tasks:
            return
        size = rng.randint(1, max_gang)
        if tasks is not None:
            size = min(size, tasks - made)
        shape = rng.choice(shapes)
        yield bench_job(j, size, shape, made, rng.choice([0, 0, 10]))
        made += size


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
    jobs = list(bench_jobs(rng, 8, tasks))
    return ClusterSnapshot(nodes=node_specs, queues=queues, jobs=jobs)


def with_backends(snapshot: ClusterSnapshot, backends: int) -> ClusterSnapshot:
    """``snapshot`` with its nodes split into ``backends`` contiguous blocks of (nearly) equal
    size, named ``b00``, ``b01``, ...; one backend leaves the nodes as they are."""
    if backends <= 1:
        return snapshot
    n = len(snapshot.nodes)
    nodes = [
        dataclasses.replace(node, backend=f"b{i * backends // n:02d}")
        for i, node in enumerate(snapshot.nodes)
    ]
    return dataclasses.replace(snapshot, nodes=nodes)


KAI_CONFIG = Path(__file__).resolve().parent.parent / "examples" / "config-kai.yaml"


def variants(args: argparse.Namespace) -> list[tuple[str, SchedulerConfig]]:
    """(name, configuration) of each configuration the run alternates."""
    if args.config is not None:
        return [(args.config.name, load_config(args.config.read_text()))]
    out: list[tuple[str, SchedulerConfig]] = []
    if args.profile in ("volcano", "both"):
        out.append(("volcano", default_config()))
    if args.profile in ("kai", "both"):
        raw = yaml.safe_load(KAI_CONFIG.read_text())
        for flag in {"on": [True], "off": [False], "both": [True, False]}[args.filters]:
            raw.setdefault("session", {})["scenarioFilters"] = flag
            name = "kai" if args.filters == "on" else f"kai(filters {'on' if flag else 'off'})"
            out.append((name, load_config(yaml.safe_dump(raw))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--config", type=Path, default=None)
    ap.add_argument(
        "--backends", type=int, default=1, help="split the nodes into N backends (contiguous)"
    )
    ap.add_argument("--profile", choices=("volcano", "kai", "both"), default="volcano")
    ap.add_argument("--filters", choices=("on", "off", "both"), default="on")
    ap.add_argument(
        "--cprofile",
        action="store_true",
        help="print the top functions (cProfile) after each cycle",
    )
    ap.add_argument(
        "--node-share",
        action="store_true",
        help="also time the per-node work (what a per-backend parallel solve could move)",
    )
    args = ap.parse_args()
    configs = variants(args)
    tune_gc()  # as the server's core worker process does
    seconds_of: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in configs}
    for _ in range(args.repeat):
        for name, config in configs:  # alternately: a loaded machine weighs on each alike
            seconds_of[name].append(run(args, name, config))
    if len(configs) > 1:
        medians = {
            name: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
            for name, runs in seconds_of.items()
        }
        summary: dict[str, object] = {
            name: {"cycle_seconds": round(w, 4), "cpu_seconds": round(c, 4)}
            for name, (w, c) in medians.items()
        }
        base = medians.get("volcano")
        if base is not None:
            summary["cpu_ratio_to_volcano"] = {
                name: round(c / base[1], 1) for name, (_, c) in medians.items() if name != "volcano"
            }
        print(json.dumps({"medians": summary}), flush=True)


def run(args: argparse.Namespace, name: str, config: SchedulerConfig) -> tuple[float, float]:
    snapshot = with_backends(build(args.nodes, args.tasks, args.seed), args.backends)
    core = SchedulerCore(config)
    node_work = NodeWork() if args.node_share else None
    profiler = cProfile.Profile() if args.cprofile else None
    started, cpu_started = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    with node_work if node_work is not None else contextlib.nullcontext():
        result = core.run_cycle(snapshot, 1)
    if profiler is not None:
        profiler.disable()
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    placed = len(result.binds) + len(result.pipelined)
    print(
        json.dumps(
            {
                "profile": name,
                "nodes": args.nodes,
                "tasks": args.tasks,
                "backends": args.backends,
                "placed": placed,
                "cycle_seconds": round(seconds, 4),
                "cpu_seconds": round(cpu_seconds, 4),
                "placements_per_second": round(placed / seconds, 1) if seconds else None,
                "actions": {k: round(v, 4) for k, v in result.action_seconds.items()},
                **(node_work.report(cpu_seconds) if node_work is not None else {}),
            }
        ),
        flush=True,
    )
    if profiler is not None:  # the cycle under the profiler runs ~2x slower; shares hold
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(20)
        stats.sort_stats("cumulative").print_stats(25)
    return seconds, cpu_seconds


class NodeWork:
    """CPU seconds spent in the per-node work of a cycle: choosing a task's node and explaining a
    failure (``NodeEvaluator.select`` / ``fit_errors``), and the node table's updates
    (``NodeTable.add_task`` / ``remove_task``). That is the work a solve split by backend could
    run in parallel; the rest (queue and job order, fair-share ledger, statements, plugins'
    events) stays one sequential ledger. Timed with the thread's CPU clock, outermost call only
    (~1 us per call added)."""

    TIMED = (
        (NodeEvaluator, ("select", "fit_errors")),
        (NodeTable, ("add_task", "remove_task")),
    )

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._depth = 0
        self._saved: list[tuple[type, str, object]] = []

    def __enter__(self) -> NodeWork:
        for cls, names in self.TIMED:
            for name in names:
                original = getattr(cls, name)
                self._saved.append((cls, name, original))
                setattr(cls, name, self._timed(name, original))
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, name, original in self._saved:
            setattr(cls, name, original)
        self._saved.clear()

    def _timed(self, name: str, original: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return original(*args, **kwargs)
            self._depth += 1
            started = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1
                spent = time.thread_time() - started
                self.seconds[name] = self.seconds.get(name, 0.0) + spent

        return timed

    def report(self, cpu_seconds: float) -> dict[str, object]:
        """The per-node seconds, their share of the cycle, and the speed-up Amdahl's law allows a
        parallel per-backend solve on 16 and on 2 cores if coordinating cost nothing."""
        node = sum(self.seconds.values())
        share = node / cpu_seconds if cpu_seconds else 0.0
        return {
            "node_work": {k: round(v, 3) for k, v in sorted(self.seconds.items())},
            "node_share": round(share, 3),
            "amdahl_bound": {
                cores: round(1 / ((1 - share) + share / cores), 2) for cores in (2, 16)
            },
        }


if __name__ == "__main__":
    main()
