"""Queue depth: one cycle on a fixed cluster with ever more waiting jobs (issue 29).

    python bench/depth.py [--nodes 2000] [--depths 10000,100000] [--million] [--compare]
                          [--repeat R] [--max-gang G] [--lookback N] [--seed S]

The cluster is bench/cycle.py's (3/4 CPU nodes, 1/4 GPU nodes, labels, taints) and stays the same
at every depth; ``depth`` jobs wait on it, all Inqueue in 4 queues, each a gang of 1 to
``--max-gang`` tasks (default 4) of one of bench/cycle.py's seven shapes, so the cluster fills
within the first few thousand jobs and the rest of the queue is what a cycle must not pay for.
Each run is one cycle of the default configuration in a fresh child process (peak RSS per depth),
printed as one JSON line: depth, tasks, placed, skipped (jobs given their shape class's finding
instead of a try), cycle and CPU seconds, per-action seconds, the child's RSS once the snapshot
is built and its peak (``ru_maxrss``) after the cycle.

``--compare`` runs each depth with the shape-class cache off (``session: {shapeClasses: false}``)
and on, alternating (``--repeat`` pairs), checks that both make the same placements, and ends
with a summary line per depth: each side's fastest CPU time and their ratio. ``--compare window``
does the same with the queue window (server/session/window.py) off and on, at ``--lookback N``
(needed): "off" opens every job and allocate stops at the lookback, "on" opens only the window. ``--million`` adds a
depth of 1,000,000 jobs (minutes, and several GiB, on a 2-core machine). ``--lookback N`` sets
``maxQueueLookback``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import itertools
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cycle import bench_jobs, build  # noqa: E402
from server import scheduler  # noqa: E402
from server.config import default_config  # noqa: E402
from server.model import (
    ClusterSnapshot,  # noqa: E402
    Window,  # noqa: E402
)
from server.scheduler import SchedulerCore  # noqa: E402
from server.service import commands, snapshot  # noqa: E402
from server.service.gctune import tune_gc  # noqa: E402
from server.service.state import ClusterState  # noqa: E402
from server.session.window import summarize  # noqa: E402

SAME_SHAPE = "same shape as job"


def cluster(nodes: int, depth: int, max_gang: int, seed: int) -> ClusterSnapshot:
    """bench/cycle.py's nodes and queues, and ``depth`` waiting jobs."""
    base = build(nodes, 0, seed)
    # Each job with its WaitingSummary, as the server's resident state makes it once per change.
    jobs = [
        dataclasses.replace(job, waiting=summarize(job.tasks))
        for job in itertools.islice(bench_jobs(random.Random(seed), max_gang), depth)
    ]
    return dataclasses.replace(base, jobs=jobs)


def mib(kib: int) -> float:
    return round(kib / 1024, 1)


def run_one(args: argparse.Namespace) -> None:
    """The child: one cycle at ``args.run_one`` jobs, one JSON line."""
    tune_gc()  # as the server's core worker process does
    snapshot = cluster(args.nodes, args.run_one, args.max_gang, args.seed)
    config = default_config()
    session = dict(config.session)
    session["shapeClasses"] = args.shape_classes == "on"
    if args.lookback:
        session["maxQueueLookback"] = args.lookback
    config = dataclasses.replace(config, session=session)
    if args.window == "off":  # every job opened; allocate stops at the lookback
        vars(scheduler)["open_window"] = lambda snap, _config: (snap, Window())
    rss_input = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    core = SchedulerCore(config)
    started, cpu_started = time.perf_counter(), time.process_time()
    result = core.run_cycle(snapshot, 1)
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    placements = sorted([*result.binds.items(), *result.pipelined.items()])
    skipped = sum(
        1
        for outcome in result.jobs.values()
        if outcome.explanation is not None and SAME_SHAPE in outcome.explanation.summary
    )
    print(
        json.dumps(
            {
                "depth": args.run_one,
                "tasks": sum(len(j.tasks) for j in snapshot.jobs),
                "shape_classes": args.shape_classes,
                "window": args.window if args.lookback else "-",
                "placed": len(placements),
                "skipped": skipped,
                "cycle_seconds": round(seconds, 3),
                "cpu_seconds": round(cpu_seconds, 3),
                "actions": {k: round(v, 3) for k, v in result.action_seconds.items()},
                "rss_input_mib": mib(rss_input),
                "peak_rss_mib": mib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss),
                "placements_sha": hashlib.sha256(repr(placements).encode()).hexdigest()[:16],
            }
        ),
        flush=True,
    )


def server_state(nodes: int, depth: int, max_gang: int, seed: int) -> ClusterState:
    """A server's state holding bench/cycle.py's nodes and queues and ``depth`` waiting jobs, as a
    restart leaves it (``ClusterState.restore`` of the stored jobs: no templates built)."""
    from muster.quantity import format_resources
    from muster.v1 import muster_pb2 as pb
    from server.service.decisions import DecisionLog
    from server.service.records import JobStatusRecord, NodeEntry
    from server.service.store import StoredJob, StoredState

    base = build(nodes, 0, seed)
    state = ClusterState(DecisionLog(bind_timeout=30))
    for spec in base.nodes:
        state.nodes[spec.name] = NodeEntry(pb.Node(name=spec.name), spec)
    for queue in base.queues:
        commands.create_queue(state, pb.Queue(name=queue.name, parent="root", weight=queue.weight))
    stored: list[StoredJob] = []
    for job in itertools.islice(bench_jobs(random.Random(seed), max_gang), depth):
        request = pb.ResourceList(quantities=format_resources(job.tasks[0].request))
        spec = pb.JobSpec(
            id=job.uid.replace("/", "-"),
            name=job.name,
            namespace="bench",
            queue=job.queue,
            priority=job.priority,
            min_member=len(job.tasks),
            task_groups=[pb.TaskGroup(role="worker", replicas=len(job.tasks), request=request)],
        )
        status = JobStatusRecord(phase=pb.JOB_PHASE_PENDING)
        data = spec.SerializeToString(deterministic=True)
        stored.append(StoredJob(spec.id, job.creation_index + 1, data, status, []))
    state.restore(StoredState({}, {}, stored, [], []))
    del stored
    state.forget_changes()
    return state


def current_rss_kib() -> int:
    """This process's resident set now (Linux), after a full collection."""
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def run_server(args: argparse.Namespace) -> None:
    """The child of ``--server``: ``args.run_one`` waiting jobs in a server's state; the first
    cycle files every job (as after a restart), then one cycle through the server's path:
    capture (the resident window), the delta to the worker, its snapshot, the core. One JSON
    line: seconds of each part of each cycle and the peak RSS of the process."""
    tune_gc()
    state = server_state(args.nodes, args.run_one, args.max_gang, args.seed)
    rss_state = current_rss_kib()  # what the state holds (the peak includes building it)
    config = default_config()
    session = dict(config.session)
    if args.lookback:
        session["maxQueueLookback"] = args.lookback
    config = dataclasses.replace(config, session=session)
    core = SchedulerCore(config)
    sender, resident = snapshot.DeltaSender(), snapshot.ResidentState()
    cycles = []
    for _ in range(2):
        parts: dict[str, float] = {}
        cpu_started = t0 = time.process_time()
        anyio.run(snapshot.prepare_capture, state, config)
        t1 = time.process_time()
        captured = snapshot.capture(state, config)
        t2 = time.process_time()
        resident.apply(sender.delta(captured))
        snap = resident.materialize()
        t3 = time.process_time()
        result = core.run_cycle(snap, captured.cycle_id)
        t4 = time.process_time()
        parts = {
            "filing": round(t1 - t0, 3),
            "capture": round(t2 - t1, 3),
            "delta_and_snapshot": round(t3 - t2, 3),
            "core": round(t4 - t3, 3),
            "cpu_seconds": round(t4 - cpu_started, 3),
            "jobs_opened": len(snap.jobs),
            "placed": len(result.binds) + len(result.pipelined),
        }
        cycles.append(parts)
    print(
        json.dumps(
            {
                "depth": args.run_one,
                "server": True,
                "lookback": args.lookback,
                "first_cycle": cycles[0],
                "cycle": cycles[1],
                "rss_state_mib": mib(rss_state),
                "peak_rss_mib": mib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss),
            }
        ),
        flush=True,
    )


def child(args: argparse.Namespace, depth: int, mode: str) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--run-one",
        str(depth),
        "--window" if args.compare == "window" else "--shape-classes",
        mode,
        "--nodes",
        str(args.nodes),
        "--max-gang",
        str(args.max_gang),
        "--seed",
        str(args.seed),
        "--lookback",
        str(args.lookback),
        *(["--server"] if args.server else []),
    ]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    line: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    print(json.dumps(line), flush=True)
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--depths", default="10000,100000", help="waiting jobs, comma-separated")
    ap.add_argument("--million", action="store_true", help="also 1,000,000 waiting jobs")
    ap.add_argument(
        "--compare",
        nargs="?",
        const="shape-classes",
        choices=("shape-classes", "window"),
        help="the shape-class cache (default) or the queue window off and on, alternating",
    )
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--max-gang", type=int, default=4)
    ap.add_argument("--lookback", type=int, default=0, help="maxQueueLookback (0: no bound)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--server",
        action="store_true",
        help="through the server's state: capture, delta, worker snapshot, core (needs --lookback)",
    )
    ap.add_argument("--run-one", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--shape-classes", choices=("on", "off"), default="on", help=argparse.SUPPRESS)
    ap.add_argument("--window", choices=("on", "off"), default="on", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.compare == "window" and not args.lookback:
        ap.error("--compare window needs --lookback N")
    if args.server and (args.compare or not args.lookback):
        ap.error("--server needs --lookback N and no --compare")
    if args.run_one is not None:
        (run_server if args.server else run_one)(args)
        return
    depths = [int(d) for d in args.depths.split(",") if d]
    if args.million:
        depths.append(1_000_000)
    modes = ("off", "on") if args.compare else ("on",)
    for depth in depths:
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for _ in range(args.repeat):
            for mode in modes:
                runs[mode].append(child(args, depth, mode))
        if args.compare:
            off = min(r["cpu_seconds"] for r in runs["off"])
            on = min(r["cpu_seconds"] for r in runs["on"])
            digests = {r["placements_sha"] for rs in runs.values() for r in rs}
            print(
                json.dumps(
                    {
                        "summary": depth,
                        "cpu_seconds_off": off,
                        "cpu_seconds_on": on,
                        "ratio": round(off / on, 2) if on else None,
                        "peak_rss_mib_off": max(r["peak_rss_mib"] for r in runs["off"]),
                        "peak_rss_mib_on": max(r["peak_rss_mib"] for r in runs["on"]),
                        "same_placements": len(digests) == 1,
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
