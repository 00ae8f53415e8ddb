"""Placement quality on the Alibaba GPU trace (cluster-trace-gpu-v2023, "openb"), through Muster's core.

    python bench/replay.py --trace DIR [--pods openb_pod_list_default.csv] [--seeds 42-51]
                           [--policies fgd,binpack,random,default] [--tune 1.3] [--jobs 2] [--quick]

Reproduces the experiment of the FGD paper (Weng et al., ATC'23) and its simulator
(hkust-adsl/kubernetes-scheduler-simulator): the GPU nodes of ``openb_node_list_gpu_node.csv``
(1,213 nodes, 6,212 GPUs); per seed, the simulator's workload tuning: every pod of the list once,
shuffled, then pods drawn from the list with replacement appended until the next would take the GPUs
asked past ``--tune`` (1.3) x the cluster's GPUs (the default list alone asks 98 %); placed one by
one in that arrival order, never leaving. A pod that fits nowhere stays pending.

Every placement is Muster's: one job of one task per pod (jobs created in arrival order), all in one
queue, one scheduling cycle of ``profile: kai`` (the profile with GPU sharing: a pod asking part of
a GPU has ``gpu_fraction``) with the ``allocate`` action, which takes the jobs in creation order, so
each pod is placed seeing every earlier placement and no later pod. A pod's GPU model constraint
(``gpu_spec``) is a required node affinity on the node label ``gpu-model``; cpu and memory are
requested as in the trace. Policies (the tiers of that cycle):

* ``fgd``: predicates + the ``fgd`` plugin (server/plugins/volcano/fgd.py);
* ``binpack``: BestFit-like -- predicates + binpack (cpu, memory and GPUs) + gpusharingorder (a share
  goes to a node with a shared GPU it fits) + gpupack (onto the most used shared GPU);
* ``random``: predicates + a seeded random node score and GPU choice (defined here);
* ``default``: Muster's KAI configuration (examples/config-kai.yaml's tiers), action allocate.

After each arrival the bench records the share of the cluster's GPU capacity allocated (milli-GPUs
of the placed pods / total); the table gives, per arrival % of capacity, its mean over the arrivals
at which the arrived GPU requests round to that % (as the published analysis does), beside the
published means (``fgd-expected-results/analysis_allo_discrete.csv``, same workload, tune and
seeds: FGD = 06-FGD, BestFit = 05-BestFit, Random = 01-Random). The published runs drew with Go's random numbers, these with Python's: the
same seeds give different but equally distributed pod sequences.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import itertools
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from muster.devices import NVIDIA_GPU, UNIT
from server.config import load_config
from server.model import ClusterSnapshot, JobSpec, NodeSpec, PodGroupPhase, QueueSpec, TaskSpec
from server.plugins.base import Plugin
from server.scheduler import SchedulerCore
from server.session.extension_points import Scorer
from server.session.info import TaskInfo
from server.session.options import PluginOption, SchedulerConfig
from server.session.session import Session

NODE_FILE = "openb_node_list_gpu_node.csv"
POD_FILE = "openb_pod_list_default.csv"
EXPECTED_FILE = "fgd-expected-results/analysis_allo_discrete.csv"
MODEL_LABEL = "gpu-model"
MILLI = 1000  # the trace's milli-GPUs per GPU
MIB = 2**20
POLICIES = ("fgd", "binpack", "random", "default")
# Our policy -> the simulator's policy whose published numbers are printed beside it.
PUBLISHED = {"fgd": "06-FGD", "binpack": "05-BestFit", "random": "01-Random"}
REPO = Path(__file__).resolve().parent.parent
KAI_CONFIG = REPO / "examples" / "config-kai.yaml"
# Sampling stops at this many pods whatever the GPUs asked (a pod list of tiny requests).
MAX_PODS = 1_000_000


@dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU; 1000 = a whole GPU
    gpu_spec: tuple[str, ...] = ()  # allowed GPU models; empty: any

    @property
    def gpu_request_milli(self) -> int:
        """Milli-GPUs asked in all."""
        return self.num_gpu * self.gpu_milli

    @property
    def fraction(self) -> float:
        """The share of one GPU asked by a pod sharing a GPU; 0 for whole GPUs or none."""
        return self.gpu_milli / MILLI if self.num_gpu == 1 and 0 < self.gpu_milli < MILLI else 0.0


# -- reading the trace -------------------------------------------------------------------------------
def _int(row: dict[str, str], key: str, default: int = 0) -> int:
    value = (row.get(key) or "").strip()
    return int(float(value)) if value else default


def load_nodes(path: Path) -> list[TraceNode]:
    with path.open(newline="") as f:
        return [
            TraceNode(
                row["sn"],
                _int(row, "cpu_milli"),
                _int(row, "memory_mib"),
                _int(row, "gpu"),
                (row.get("model") or "").strip(),
            )
            for row in csv.DictReader(f)
        ]


def load_pods(path: Path) -> list[TracePod]:
    """A pod list (all columns, or the five of the multigpu lists: no gpu_spec)."""
    pods = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            num_gpu = _int(row, "num_gpu")
            milli = _int(row, "gpu_milli") if num_gpu else 0
            if num_gpu and milli <= 0:  # a GPU pod without a share asks whole GPUs
                milli = MILLI
            spec = tuple(s.strip() for s in (row.get("gpu_spec") or "").split("|") if s.strip())
            pods.append(
                TracePod(
                    row["name"],
                    _int(row, "cpu_milli"),
                    _int(row, "memory_mib"),
                    num_gpu,
                    milli,
                    spec,
                )
            )
    return pods


def load_expected(
    path: Path, workload: str, tune: float, seeds: Sequence[int] | None = None
) -> dict[str, dict[int, float]]:
    """Published allocation curves: per simulator policy, per arrival % (the CSV's columns
    ``0`` .. ``130``), the mean over the seeds given (None: every seed) of the allocation %."""
    values: dict[str, dict[int, list[float]]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row.get("workload") != workload:
                continue
            try:
                if abs(float(row.get("tune") or "nan") - tune) > 1e-9:
                    continue
                seed = int(row.get("seed") or "")
            except ValueError:
                continue
            if seeds is not None and seed not in seeds:
                continue
            curve = values.setdefault(row["sc_policy"], {})
            for key, value in row.items():
                if key is not None and key.isdigit() and value not in (None, ""):
                    curve.setdefault(int(key), []).append(float(value))
    return {
        policy: {p: statistics.fmean(v) for p, v in curve.items()}
        for policy, curve in values.items()
    }


# -- the experiment ------------------------------------------------------------------------------------
def capacity_milli(nodes: Sequence[TraceNode]) -> int:
    return sum(n.gpus for n in nodes) * MILLI


def sample_pods(pods: Sequence[TracePod], capacity: int, tune: float, seed: int) -> list[TracePod]:
    """The arrival sequence of one seed, drawn the way the FGD simulator tunes a workload
    (``-tune``, ``--shuffle-pod=true``): every pod of the list once, in name order shuffled; then,
    while the GPUs asked are below ``tune`` x ``capacity`` (milli-GPUs), pods drawn from the list with
    replacement and appended, stopping before the draw that would pass it (when the list alone asks
    more, pods drawn at random are removed until it no longer does). Each pod gets a name of its own."""
    if not pods or not any(p.gpu_request_milli for p in pods):
        raise ValueError("the pod list asks for no GPU")
    rng = random.Random(seed)
    target = tune * capacity
    base = sorted(pods, key=lambda p: p.name)
    order = list(base)
    rng.shuffle(order)
    drawn = [dataclasses.replace(p, name=f"{p.name}-{k}") for k, p in enumerate(order)]
    asked = sum(p.gpu_request_milli for p in drawn)
    while asked > target:
        asked -= drawn.pop(rng.randrange(len(drawn))).gpu_request_milli
    while len(drawn) < MAX_PODS:
        pod = base[rng.randrange(len(base))]
        if asked + pod.gpu_request_milli > target:
            break
        drawn.append(dataclasses.replace(pod, name=f"{pod.name}-{len(drawn)}"))
        asked += pod.gpu_request_milli
    return drawn


def build_snapshot(nodes: Sequence[TraceNode], pods: Sequence[TracePod]) -> ClusterSnapshot:
    """The nodes, one queue, and one pending job of one task per pod, created in arrival order."""
    node_specs = []
    for n in nodes:
        alloc: dict[str, float] = {"cpu": float(n.cpu_milli), "memory": float(n.memory_mib * MIB)}
        if n.gpus:
            alloc[NVIDIA_GPU] = n.gpus * UNIT
        node_specs.append(
            NodeSpec(
                name=n.name, allocatable=alloc, labels={MODEL_LABEL: n.model} if n.model else {}
            )
        )
    jobs = []
    for k, p in enumerate(pods):
        request: dict[str, float] = {"cpu": float(p.cpu_milli), "memory": float(p.memory_mib * MIB)}
        if p.num_gpu and not p.fraction:
            request[NVIDIA_GPU] = p.num_gpu * UNIT
        affinity: dict[str, Any] = {}
        if p.gpu_spec:
            term = {
                "matchExpressions": [
                    {"key": MODEL_LABEL, "operator": "In", "values": list(p.gpu_spec)}
                ]
            }
            affinity = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            }
        uid = f"trace/{p.name}"
        task = TaskSpec(
            uid=f"{uid}-0",
            name=p.name,
            namespace="trace",
            job=uid,
            request=request,
            affinity=affinity,
            gpu_fraction=p.fraction,
            creation_index=k,
        )
        jobs.append(
            JobSpec(
                uid=uid,
                name=p.name,
                namespace="trace",
                queue="trace",
                tasks=[task],
                min_member=1,
                phase=PodGroupPhase.INQUEUE,
                creation_index=k,
            )
        )
    return ClusterSnapshot(nodes=node_specs, queues=[QueueSpec("trace")], jobs=jobs)


class RandomScorePlugin(Plugin):
    """The Random policy: a seeded random score per node, and a random shared GPU for a share."""

    name: ClassVar[str] = "replay-random"
    ARGUMENTS: ClassVar[dict[str, object]] = {"seed": 0}

    def on_session_open(self, ssn: Session) -> None:
        rng = np.random.default_rng(self.arg_int("seed", 0))

        def score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            return rng.random(len(rows)) * 100.0

        def order(task: TaskInfo, row: int, group: str) -> float:
            return float(rng.random())

        ssn.register("node_order", self.name, Scorer("task", score, plugin=self.name))
        ssn.register("gpu_order", self.name, order)


_TIERS = {
    "fgd": "- plugins:\n  - name: predicates\n  - name: fgd\n",
    "binpack": (
        "- plugins:\n  - name: predicates\n  - name: binpack\n    arguments:\n"
        f"      binpack.resources: {NVIDIA_GPU}\n      binpack.resources.{NVIDIA_GPU}: 1\n"
        "  - name: gpusharingorder\n  - name: gpupack\n"
    ),
    "random": "- plugins:\n  - name: predicates\n",
}


def policy_config(policy: str, seed: int = 0) -> SchedulerConfig:
    """The scheduler configuration of one policy (``profile: kai``, action allocate)."""
    if policy == "default":
        return dataclasses.replace(load_config(KAI_CONFIG.read_text()), actions=["allocate"])
    if policy not in _TIERS:
        raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
    config = load_config(f"profile: kai\nactions: allocate\ntiers:\n{_TIERS[policy]}")
    if policy == "random":
        switches = dict(config.tiers[0][0].switches)
        option = PluginOption(
            RandomScorePlugin.name, switches, {"seed": seed}, plugin_class=RandomScorePlugin
        )
        config = dataclasses.replace(config, tiers=[[*config.tiers[0], option]])
    return config


def replay(
    nodes: Sequence[TraceNode], pods: Sequence[TracePod], config: SchedulerConfig
) -> list[bool]:
    """Place the pods in arrival order through one scheduling cycle; per pod: was it placed?"""
    result = SchedulerCore(config).run_cycle(build_snapshot(nodes, pods), 1)
    placed = set(result.binds) | set(result.pipelined)
    return [f"trace/{p.name}-0" in placed for p in pods]


def allocation_curve(
    pods: Sequence[TracePod], placed: Sequence[bool], capacity: int, points: Sequence[int]
) -> dict[int, float | None]:
    """Per arrival % of capacity, the allocated % of capacity, as the published analysis takes it
    (``merge_alloc_discrete.py``): the mean over the arrivals after which the arrived GPU requests,
    in % of capacity rounded, equal the point (none: those within one point of it). Where no arrival
    is that close (pods big beside the cluster), the allocation once the arrived requests first reach
    the point; None: never reached."""
    arrived_pct: list[float] = []
    allocated_pct: list[float] = []
    arrived = allocated = 0
    for pod, ok in zip(pods, placed, strict=True):
        arrived += pod.gpu_request_milli
        if ok:
            allocated += pod.gpu_request_milli
        arrived_pct.append(100.0 * arrived / capacity)
        allocated_pct.append(100.0 * allocated / capacity)
    rounded = np.round(np.asarray(arrived_pct))  # half to even, as pandas rounds
    allocated_arr = np.asarray(allocated_pct)
    out: dict[int, float | None] = {}
    for p in points:
        near = allocated_arr[rounded == p]
        if not len(near):
            near = allocated_arr[np.abs(rounded - p) <= 1]
        if len(near):
            out[p] = float(near.mean())
            continue
        out[p] = next((a for r, a in zip(arrived_pct, allocated_pct, strict=True) if r >= p), None)
    return out


@dataclass
class Run:
    policy: str
    seed: int
    pods: int
    placed: int
    seconds: float
    curve: dict[int, float | None]


def run_one(
    trace: Path,
    pod_file: str,
    policy: str,
    seed: int,
    tune: float,
    node_stride: int,
    points: Sequence[int],
) -> Run:
    nodes = load_nodes(trace / NODE_FILE)[::node_stride]
    capacity = capacity_milli(nodes)
    pods = sample_pods(load_pods(trace / pod_file), capacity, tune, seed)
    started = time.perf_counter()
    placed = replay(nodes, pods, policy_config(policy, seed))
    seconds = time.perf_counter() - started
    return Run(
        policy,
        seed,
        len(pods),
        sum(placed),
        seconds,
        allocation_curve(pods, placed, capacity, points),
    )


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part[1:]:
            lo, hi = part.split("-", 1)
            if int(hi) - int(lo) > 10_000:
                raise ValueError(f"seed range {part} is too long")
            seeds.extend(range(int(lo), int(hi) + 1))
        else:
            seeds.append(int(part))
    return seeds


def mean_curve(runs: Sequence[Run], points: Sequence[int]) -> dict[int, float | None]:
    out: dict[int, float | None] = {}
    for p in points:
        values = [v for r in runs if (v := r.curve.get(p)) is not None]
        out[p] = statistics.fmean(values) if values else None
    return out


def table(
    policies: Sequence[str],
    measured: dict[str, dict[int, float | None]],
    published: dict[str, dict[int, float]],
    points: Sequence[int],
) -> str:
    """Arrival % x policy: the measured allocation % (mean over seeds) and the published one."""
    head = ["arrival %"]
    for policy in policies:
        head.append(policy)
        if policy in PUBLISHED:
            head.append(f"{PUBLISHED[policy].split('-', 1)[1]} (paper)")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    for p in points:
        cells = [str(p)]
        for policy in policies:
            cells.append(fmt(measured[policy].get(p)))
            if policy in PUBLISHED:
                cells.append(fmt(published.get(PUBLISHED[policy], {}).get(p)))
        lines.append(" | ".join(cells))
    return "\n".join(f"| {line} |" for line in lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, required=True, help="the trace directory (openb CSVs)")
    ap.add_argument(
        "--pods",
        default=POD_FILE,
        help=f"pod list file in the trace directory (default {POD_FILE})",
    )
    ap.add_argument("--seeds", default="42-51", help="seeds: 42-51 or 42,43 (default 42-51)")
    ap.add_argument(
        "--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}"
    )
    ap.add_argument(
        "--tune", type=float, default=1.3, help="GPUs asked / cluster GPUs (default 1.3)"
    )
    ap.add_argument(
        "--step", type=int, default=10, help="arrival %% between table rows (default 10)"
    )
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel processes (default 1)")
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: first seed only, every 8th node"
    )
    ap.add_argument("--json", type=Path, default=None, help="write every run's curve to this file")
    args = ap.parse_args(argv)

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p not in POLICIES:
            ap.error(f"unknown policy {p!r} (known: {', '.join(POLICIES)})")
    seeds = parse_seeds(args.seeds)
    if not seeds:
        ap.error("no seeds")
    stride = 1
    if args.quick:
        seeds, stride = seeds[:1], 8
    top = int(round(args.tune * 100))
    points = list(range(0, top + 1, max(args.step, 1)))
    if points[-1] != top:
        points.append(top)
    every_point = list(range(0, top + 1))

    started = time.perf_counter()
    tasks = [
        (args.trace, args.pods, policy, seed, args.tune, stride, every_point)
        for seed in seeds
        for policy in policies
    ]
    runs: list[Run] = []
    with (
        ProcessPoolExecutor(max_workers=args.jobs)
        if args.jobs > 1
        else contextlib.nullcontext() as pool
    ):
        for r in (
            pool.map(run_one, *zip(*tasks, strict=True))
            if pool
            else itertools.starmap(run_one, tasks)
        ):
            runs.append(r)
            print(
                f"# {r.policy} seed {r.seed}: {r.placed}/{r.pods} pods placed, "
                f"{r.curve.get(top)}% at {top}%, {r.seconds:.1f}s",
                file=sys.stderr,
                flush=True,
            )

    measured = {
        policy: mean_curve([r for r in runs if r.policy == policy], every_point)
        for policy in policies
    }
    expected_path = args.trace / EXPECTED_FILE
    published: dict[str, dict[int, float]] = {}
    if expected_path.exists() and stride == 1:
        published = load_expected(expected_path, Path(args.pods).stem, args.tune, seeds)
    nodes = load_nodes(args.trace / NODE_FILE)[::stride]
    print(
        f"trace {args.trace} pods {args.pods}: {len(nodes)} nodes, {capacity_milli(nodes) // MILLI} GPUs, "
        f"tune {args.tune}, seeds {','.join(map(str, seeds))}; GPU allocation % of capacity "
        f"(mean over seeds) at each arrival % of capacity"
        + ("" if published else "; no published numbers")
    )
    print(table(policies, measured, published, points))
    print(
        f"wall {time.perf_counter() - started:.1f}s; per run (s): "
        + ", ".join(
            f"{p} {statistics.fmean(r.seconds for r in runs if r.policy == p):.1f}"
            for p in policies
        )
    )
    if args.json is not None:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in runs], indent=1))


if __name__ == "__main__":
    main()
