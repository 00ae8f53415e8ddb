"""Big gangs and backfill on Philly's job sequences (Gavel's per-VC traces), through Muster's core.

    python bench/backfill.py --trace ../shared/traces/philly-derived [--vc ee9e8c] [--jobs 300]
                             [--load 0.9 | --nodes N] [--limit-factor 1.5] [--large 8]
                             [--runs volcano,volcano-off,volcano-res,kai,kai-res] [--depth 1]

``--trace`` is a directory holding Gavel's ``<vc>.trace`` files (directly, or under
``gavel-msr-seed0/``; the project does not need them: point it at a copy, e.g.
``../shared/traces/philly-derived``, whose README describes the columns). Each line is one job:
``job_type, command, num_steps_arg, needs_data_dir, total_steps, arrival_time, scale_factor``
(tab-separated), plus an optional 8th column, the job's time limit in seconds. The first
``--jobs`` jobs of the VC arrive at their ``arrival_time`` (seconds), each a gang of
``scale_factor`` GPUs: one task when it fits a node (``--gpus-per-node``, 8), else tasks of a whole
node's GPUs (32 GPUs: 4 tasks of 8), all or nothing.

**Lengths.** Gavel writes a job's length as training steps of the model it assigned (at random) to
the job; steps per second differ per model and the trace does not carry them. A job's length here
is its steps over the median steps of its job type, times ``--median-hours`` (4 h, the median of
the Philly durations Gavel published): it keeps each job's place in its type's distribution (the
Philly duration behind it) and gives every type the same median. Approximate, as the trace's
README says. A job runs exactly its length; its time limit is the 8th column when the trace has
one, else its length times ``--limit-factor`` (users ask for more than they use).

**Cluster.** ``--nodes`` nodes of 8 GPUs, 64 CPUs, 512 GiB; by default as many as make the jobs'
GPU-hours over the arrival window ``--load`` (0.9) of the cluster, at least the biggest gang.

**Simulation.** Simulated time: a cycle of the core at every arrival and every job end (again at
the same instant while it still places or evicts), on a snapshot of the jobs that wait and run
(``ClusterSnapshot.now`` is the simulated time). Binds start tasks at once; an evicted job starts
over. Runs (``--runs``): ``volcano`` (Muster's default: Volcano's configuration), ``volcano-off``
(the same with the ``reservation`` plugin, ``enablePredicate: false``, and the ``reserve``
action: estimates only, the same schedule), ``volcano-res`` (reservations on), ``kai`` (KAI's
configuration, examples/config-kai.yaml) and ``kai-res`` (KAI's with reservations).

**Measures.** Wait = first start - arrival, mean and p95, of large gangs (``--large`` GPUs or
more) and of the other jobs; GPU utilisation over the arrival window (busy GPU-seconds / GPU-
seconds); reservations made and broken: a job's reservation (``reserved`` in the cycle's estimates;
for ``volcano-off``, the first job in line whose estimate is in the future, what would have been
reserved) is broken when a later cycle moves it later, or the job starts later, than promised
(more than two minutes: ends are rounded to a minute).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from muster.devices import NVIDIA_GPU, UNIT  # noqa: E402
from server.config import DEFAULT_CONFIG_YAML, load_config  # noqa: E402
from server.model import (  # noqa: E402
    ClusterSnapshot,
    CycleResult,
    JobSpec,
    NodeSpec,
    PodGroupPhase,
    QueueSpec,
    TaskSpec,
    TaskStatus,
)
from server.scheduler import SchedulerCore  # noqa: E402
from server.session.options import SchedulerConfig  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
KAI_CONFIG = REPO / "examples" / "config-kai.yaml"
RUNS = ("volcano", "volcano-off", "volcano-res", "kai", "kai-res")
GIB = 2**30
TOLERANCE = 120.0  # seconds a reservation may slip before it counts as broken (rounding)
MAX_CYCLES_AT_ONCE = 4


@dataclass(frozen=True)
class TraceJob:
    index: int
    job_type: str
    steps: int
    arrival: float
    gpus: int
    limit: float | None  # the trace's own time limit (8th column), seconds


@dataclass(frozen=True)
class Job:
    uid: str
    index: int
    arrival: float
    gpus: int
    length: float
    limit: float


def trace_file(directory: Path, vc: str) -> Path:
    for candidate in (directory / f"{vc}.trace", directory / "gavel-msr-seed0" / f"{vc}.trace"):
        if candidate.is_file():
            return candidate
    raise SystemExit(f"no {vc}.trace in {directory} (nor in {directory / 'gavel-msr-seed0'})")


def load_trace(path: Path) -> list[TraceJob]:
    jobs = []
    with path.open() as f:
        for k, line in enumerate(f):
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 7:
                continue
            limit = float(fields[7]) if len(fields) > 7 and fields[7].strip() else None
            jobs.append(
                TraceJob(
                    k, fields[0], int(float(fields[4])), float(fields[5]), int(fields[6]), limit
                )
            )
    return jobs


def job_lengths(jobs: Sequence[TraceJob], median_hours: float) -> list[float]:
    """Each job's steps over its job type's median steps, times the common median (seconds)."""
    by_type: dict[str, list[int]] = {}
    for j in jobs:
        by_type.setdefault(j.job_type, []).append(j.steps)
    median = {t: statistics.median(v) or 1.0 for t, v in by_type.items()}
    return [max(60.0, j.steps / median[j.job_type] * median_hours * 3600) for j in jobs]


def prepare(trace: Sequence[TraceJob], count: int, median_hours: float, factor: float) -> list[Job]:
    lengths = job_lengths(trace, median_hours)  # over the whole VC: the type medians
    first = trace[0].arrival if trace else 0.0
    out = []
    for j, length in list(zip(trace, lengths, strict=True))[:count]:
        limit = j.limit if j.limit else length * factor
        out.append(Job(f"vc/j{j.index:05d}", j.index, j.arrival - first, j.gpus, length, limit))
    return out


def nodes_for(jobs: Sequence[Job], load: float, per_node: int) -> int:
    """Nodes that make the jobs' GPU-seconds over the arrival window ``load`` of the cluster."""
    span = max(j.arrival for j in jobs) - min(j.arrival for j in jobs) or 1.0
    work = sum(j.gpus * j.length for j in jobs)
    need = math.ceil(work / (span * load * per_node))
    return max(need, math.ceil(max(j.gpus for j in jobs) / per_node))


def tasks_of(gpus: int, per_node: int) -> list[int]:
    """A gang's tasks: GPUs each (one task if it fits a node, else whole nodes then the rest)."""
    if gpus <= per_node:
        return [gpus]
    whole, rest = divmod(gpus, per_node)
    return [per_node] * whole + ([rest] if rest else [])


# -- configurations ---------------------------------------------------------------------------------
def _with_reservation(text: str, enforce: bool, depth: int, after: str) -> str:
    """The configuration ``text`` with the ``reserve`` action after ``after`` and a last tier
    holding the ``reservation`` plugin (its predicate off unless ``enforce``)."""
    raw = yaml.safe_load(text)
    actions = [a.strip() for a in raw["actions"].split(",")]
    actions.insert(actions.index(after) + 1, "reserve")
    raw["actions"] = ", ".join(actions)
    plugin: dict[str, object] = {"name": "reservation", "arguments": {"depth": depth}}
    if not enforce:
        plugin["enablePredicate"] = False
    raw["tiers"].append({"plugins": [plugin]})
    return str(yaml.safe_dump(raw, sort_keys=False))


def run_config(name: str, depth: int = 1) -> SchedulerConfig:
    volcano, kai = DEFAULT_CONFIG_YAML, KAI_CONFIG.read_text()
    texts = {
        "volcano": volcano,
        "volcano-off": _with_reservation(volcano, False, depth, "backfill"),
        "volcano-res": _with_reservation(volcano, True, depth, "backfill"),
        "kai": kai,
        "kai-res": _with_reservation(kai, True, depth, "stalegangeviction"),
    }
    if name not in texts:
        raise ValueError(f"unknown run {name!r} (known: {', '.join(RUNS)})")
    return load_config(texts[name])


# -- the simulation -------------------------------------------------------------------------------------
@dataclass
class State:
    job: Job
    tasks: list[int]  # GPUs per task
    phase: PodGroupPhase = PodGroupPhase.PENDING
    nodes: list[str | None] = field(default_factory=list)
    start: float | None = None  # this run's start (None: waiting)
    first_start: float | None = None
    end: float | None = None


@dataclass
class Result:
    name: str
    nodes: int
    large_waits: list[float]
    small_waits: list[float]
    utilisation: float
    reserved: int
    broken: int
    cycles: int
    unstarted: int
    seconds: float


def _p95(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


class Simulation:
    def __init__(
        self,
        jobs: Sequence[Job],
        nodes: int,
        config: SchedulerConfig,
        *,
        per_node: int = 8,
        large: int = 8,
        depth: int = 1,
        estimates_only: bool = False,
    ) -> None:
        self.jobs = sorted(jobs, key=lambda j: (j.arrival, j.index))
        self.per_node = per_node
        self.large = large
        self.depth = depth
        self.estimates_only = estimates_only
        self.core = SchedulerCore(config)
        self.node_specs = [
            NodeSpec(
                f"n{i:03d}",
                {
                    "cpu": 64_000.0,
                    "memory": 512.0 * GIB,
                    NVIDIA_GPU: per_node * UNIT,
                    "pods": 110.0,
                },
            )
            for i in range(nodes)
        ]
        self.states: dict[str, State] = {}
        self.active: dict[str, State] = {}
        self.promised: dict[str, float] = {}  # job -> the start its reservation promised
        self.reserved: set[str] = set()
        self.broken: set[str] = set()
        self.cycles = 0
        self.busy = 0  # GPUs busy now

    # one cycle's input
    def snapshot(self, now: float) -> ClusterSnapshot:
        specs = []
        for st in self.active.values():
            j = st.job
            running = st.start is not None
            tasks = [
                TaskSpec(
                    uid=f"{j.uid}-{k}",
                    name=f"{j.uid.split('/')[1]}-{k}",
                    namespace="vc",
                    job=j.uid,
                    request={
                        "cpu": 4000.0 * g,
                        "memory": 32.0 * GIB * g,
                        NVIDIA_GPU: g * UNIT,
                    },
                    status=TaskStatus.RUNNING if running else TaskStatus.PENDING,
                    node=st.nodes[k] if running else None,
                    creation_index=k,
                )
                for k, g in enumerate(st.tasks)
            ]
            specs.append(
                JobSpec(
                    uid=j.uid,
                    name=j.uid.split("/")[1],
                    namespace="vc",
                    queue="vc",
                    tasks=tasks,
                    min_member=len(tasks),
                    phase=st.phase,
                    creation_index=j.index,
                    created_at=j.arrival,
                    time_limit_seconds=j.limit,
                    started_at=st.start,
                )
            )
        return ClusterSnapshot(nodes=self.node_specs, queues=[QueueSpec("vc")], jobs=specs, now=now)

    def apply(self, result: CycleResult, now: float) -> bool:
        """The cycle's binds and evictions; whether it changed anything."""
        changed = False
        for uid, outcome in result.jobs.items():
            st = self.active.get(uid)
            if st is not None and st.start is None:
                st.phase = outcome.phase
        for task_uid in result.evictions:
            st = self.active.get(task_uid.rsplit("-", 1)[0])
            if st is not None and st.start is not None:
                self.busy -= st.job.gpus
                st.start, st.end = None, None
                st.nodes = [None] * len(st.tasks)
                st.phase = PodGroupPhase.INQUEUE
                changed = True
        for task_uid, node in result.binds.items():
            job_uid, _, k = task_uid.rpartition("-")
            st = self.active.get(job_uid)
            if st is None or st.start is not None:
                continue
            if not st.nodes:
                st.nodes = [None] * len(st.tasks)
            st.nodes[int(k)] = node
            changed = True
            if all(n is not None for n in st.nodes):
                st.start = now
                st.end = now + st.job.length
                st.phase = PodGroupPhase.RUNNING
                self.busy += st.job.gpus
                if st.first_start is None:
                    st.first_start = now
                    promise = self.promised.pop(st.job.uid, None)
                    if promise is not None and now > promise + TOLERANCE:
                        self.broken.add(st.job.uid)
        return changed

    def track(self, result: CycleResult, now: float) -> None:
        """This cycle's reservations against what earlier ones promised."""
        if self.estimates_only:  # what would have been reserved: the first in line to wait
            waiting = sorted(
                (
                    (self.active[u].job.index, u, e.start)
                    for u, e in result.estimates.items()
                    if u in self.active and e.start is not None and e.start > now
                ),
            )
            current = {u: s for _, u, s in waiting[: self.depth]}
        else:
            current = {
                u: e.start
                for u, e in result.estimates.items()
                if e.reserved and e.start is not None
            }
        for uid, start in current.items():
            self.reserved.add(uid)
            before = self.promised.get(uid)
            if before is not None and start > before + TOLERANCE:
                self.broken.add(uid)
            self.promised[uid] = start
        for uid, before in list(self.promised.items()):
            if uid not in current and now > before + TOLERANCE:
                self.broken.add(uid)  # its reservation went and it has not started

    def run(self, name: str = "") -> Result:
        started = time.perf_counter()
        arrivals = list(self.jobs)
        t0 = arrivals[0].arrival if arrivals else 0.0
        window_end = arrivals[-1].arrival if arrivals else 0.0
        busy_seconds = 0.0
        now = t0
        last = t0
        while True:
            # utilisation over the arrival window
            lo, hi = max(last, t0), min(now, window_end)
            if hi > lo:
                busy_seconds += self.busy * (hi - lo)
            last = now
            for st in list(self.active.values()):
                if st.end is not None and st.end <= now:
                    self.busy -= st.job.gpus
                    del self.active[st.job.uid]
            while arrivals and arrivals[0].arrival <= now:
                j = arrivals.pop(0)
                st = State(j, tasks_of(j.gpus, self.per_node))
                self.states[j.uid] = self.active[j.uid] = st
            result: CycleResult | None = None
            for _ in range(MAX_CYCLES_AT_ONCE):
                self.cycles += 1
                result = self.core.run_cycle(self.snapshot(now), self.cycles)
                if not self.apply(result, now):
                    break
            if result is not None:
                self.track(result, now)
            ends = [st.end for st in self.active.values() if st.end is not None]
            upcoming = [t for t in (arrivals[0].arrival if arrivals else None, *ends) if t]
            if not upcoming:
                break
            now = min(upcoming)
        large: list[float] = []
        small: list[float] = []
        for st in self.states.values():
            if st.first_start is None:
                continue
            wait = st.first_start - st.job.arrival
            (large if st.job.gpus >= self.large else small).append(wait)
        capacity = len(self.node_specs) * self.per_node * max(window_end - t0, 1.0)
        return Result(
            name,
            len(self.node_specs),
            large,
            small,
            busy_seconds / capacity,
            len(self.reserved),
            len(self.broken),
            self.cycles,
            sum(1 for st in self.states.values() if st.first_start is None),
            time.perf_counter() - started,
        )


def simulate(
    name: str, jobs: Sequence[Job], nodes: int, *, large: int, depth: int, per_node: int = 8
) -> Result:
    sim = Simulation(
        jobs,
        nodes,
        run_config(name, depth),
        per_node=per_node,
        large=large,
        depth=depth,
        estimates_only=name == "volcano-off",
    )
    return sim.run(name)


def table(results: Sequence[Result]) -> str:
    def hours(v: float) -> str:
        return f"{v / 3600:.2f}"

    head = (
        "| run | large gangs | large mean wait (h) | large p95 wait (h) | small jobs | "
        "small mean wait (h) | small p95 wait (h) | GPU util % | reservations | broken | "
        "cycles | wall s |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        lines.append(
            f"| {r.name} | {len(r.large_waits)} | "
            f"{hours(statistics.fmean(r.large_waits)) if r.large_waits else '-'} | "
            f"{hours(_p95(r.large_waits))} | {len(r.small_waits)} | "
            f"{hours(statistics.fmean(r.small_waits)) if r.small_waits else '-'} | "
            f"{hours(_p95(r.small_waits))} | {100 * r.utilisation:.1f} | "
            f"{r.reserved if r.name not in ('volcano', 'kai') else '-'} | "
            f"{r.broken if r.name not in ('volcano', 'kai') else '-'} | {r.cycles} | "
            f"{r.seconds:.1f} |"
        )
    return "\n".join(lines)


def vc_nodes(directory: Path, vc: str) -> int | None:
    """The VC's node count from ``philly_vc.csv`` beside the traces, if there."""
    path = directory / "philly_vc.csv"
    if not path.is_file():
        return None
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row.get("vc") == vc:
                return int(row.get("node num") or 0) or None
    return None


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--trace", type=Path, required=True, help="directory of Gavel <vc>.trace files")
    ap.add_argument("--vc", default="ee9e8c", help="the virtual cluster (trace file) to replay")
    ap.add_argument("--jobs", type=int, default=300, help="its first N jobs (default 300)")
    ap.add_argument("--nodes", type=int, default=None, help="cluster nodes (default: from --load)")
    ap.add_argument(
        "--load", type=float, default=0.9, help="offered GPU load that sizes the cluster (0.9)"
    )
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--median-hours", type=float, default=4.0, help="median job length (4)")
    ap.add_argument(
        "--limit-factor", type=float, default=1.5, help="time limit = length x this (1.5)"
    )
    ap.add_argument("--large", type=int, default=8, help="a large gang asks this many GPUs (8)")
    ap.add_argument("--depth", type=int, default=1, help="reservations per cycle (1)")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"of {', '.join(RUNS)}")
    args = ap.parse_args(argv)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    for r in runs:
        if r not in RUNS:
            ap.error(f"unknown run {r!r} (known: {', '.join(RUNS)})")
    trace = load_trace(trace_file(args.trace, args.vc))
    jobs = prepare(trace, args.jobs, args.median_hours, args.limit_factor)
    if not jobs:
        ap.error("the trace holds no job")
    nodes = args.nodes or nodes_for(jobs, args.load, args.gpus_per_node)
    biggest = max(j.gpus for j in jobs)
    span_h = (max(j.arrival for j in jobs) - min(j.arrival for j in jobs)) / 3600
    print(
        f"VC {args.vc}: first {len(jobs)} jobs over {span_h:.0f} h, gangs up to {biggest} GPUs, "
        f"{sum(1 for j in jobs if j.gpus >= args.large)} of >= {args.large} GPUs; cluster "
        f"{nodes} nodes x {args.gpus_per_node} GPUs"
        + (f" (Helios' VC size: {n} nodes)" if (n := vc_nodes(args.trace, args.vc)) else "")
        + f"; time limit = length x {args.limit_factor}",
        flush=True,
    )
    results = []
    for name in runs:
        r = simulate(
            name, jobs, nodes, large=args.large, depth=args.depth, per_node=args.gpus_per_node
        )
        results.append(r)
        print(
            f"# {name}: {r.cycles} cycles, {r.seconds:.1f}s"
            + (f", {r.unstarted} jobs never started" if r.unstarted else ""),
            file=sys.stderr,
            flush=True,
        )
    print(table(results))


if __name__ == "__main__":
    main()
