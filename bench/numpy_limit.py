"""Muster's cycle beside a tight plain-numpy allocator with the same policy, in one run.

    python bench/numpy_limit.py --nodes 5000 --tasks 10000 [--seed S] [--repeat R]

The input is bench/cycle.py's synthetic cluster. The numpy allocator hard-codes what Muster's
default configuration decides for that input, and nothing else: queues by proportion share
(weight water-filling), jobs by priority then submission, tasks by submission, a gang placed all
or nothing, each task on the node with the highest leastrequested + balancedresource +
tainttoleration score that fits (ties: first node). It places one job's tasks against one score
array computed for the job's shape, re-scoring only the row a placement changed: the floor a
vectorised Python scheduler can reach with no plugins, no extension points and no bookkeeping.

Both run on the same snapshot, alternating, ``--repeat`` times. Prints one JSON line per run with
both times (wall and CPU), their ratio, and whether the placements are identical (they must be: a
difference means the baseline no longer models the policy, and the ratio means nothing). With
more than one run, a summary line: each side's fastest CPU time and their ratio, and the median
of the per-run ratios (on a shared machine one run's ratio moves with the host's speed).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cycle import build
from muster.devices import NVIDIA_GPU
from muster.quantity import CPU, MEMORY, MIN_RESOURCE
from server.config import default_config
from server.model import ClusterSnapshot, JobSpec
from server.scheduler import SchedulerCore
from server.service.gctune import tune_gc

DIMS = (CPU, MEMORY, NVIDIA_GPU)
MAX_SCORE = 100.0
TAINT_WEIGHT = 3.0


def water_fill(
    total: np.ndarray, weights: list[float], requests: list[np.ndarray]
) -> list[np.ndarray]:
    """proportion's deserved shares: the cluster shared by weight, each capped by its request."""
    deserved = [np.zeros_like(total) for _ in weights]
    remaining = total.copy()
    met: set[int] = set()
    while True:
        total_weight = sum(w for i, w in enumerate(weights) if i not in met)
        if total_weight == 0:
            break
        before = remaining.copy()
        increased, decreased = np.zeros_like(total), np.zeros_like(total)
        for i, w in enumerate(weights):
            if i in met:
                continue
            old = deserved[i]
            deserved[i] = np.maximum(
                np.minimum(old + remaining * (w / total_weight), requests[i]), 0.0
            )
            if np.all(requests[i] <= deserved[i] + MIN_RESOURCE) or np.array_equal(
                deserved[i], old
            ):
                met.add(i)
            diff = deserved[i] - old
            increased += np.maximum(diff, 0)
            decreased += np.maximum(-diff, 0)
        remaining = np.maximum(remaining + decreased - increased, 0.0)
        if np.all(remaining < MIN_RESOURCE) or np.array_equal(remaining, before):
            break
    return deserved


def share(allocated: np.ndarray, deserved: np.ndarray) -> float:
    mask = deserved >= MIN_RESOURCE
    return float((allocated[mask] / deserved[mask]).max()) if mask.any() else 0.0


def numpy_cycle(snapshot: ClusterSnapshot) -> dict[str, str]:
    """task uid -> node name, as the default configuration places them."""
    names = sorted(n.name for n in snapshot.nodes)
    by_name = {n.name: n for n in snapshot.nodes}
    alloc = np.array([[by_name[n].allocatable.get(d, 0.0) for d in DIMS] for n in names])
    max_pods = np.array([by_name[n].allocatable.get("pods", 110.0) for n in names])
    used = np.zeros_like(alloc)
    pods = np.zeros(len(names))
    inv = np.divide(1.0, alloc[:, :2], out=np.zeros_like(alloc[:, :2]), where=alloc[:, :2] > 0)
    has = inv > 0
    # tainttoleration: no task tolerates the GPU nodes' PreferNoSchedule taint.
    tainted = np.array(
        [any(t.effect == "PreferNoSchedule" for t in by_name[n].taints) for n in names]
    )
    taint_score = (MAX_SCORE - np.floor(tainted * MAX_SCORE / max(tainted.max(), 1))) * TAINT_WEIGHT

    queue_index = {q.name: i for i, q in enumerate(snapshot.queues)}
    requests = [np.zeros(len(DIMS)) for _ in snapshot.queues]
    jobs_of: list[list[tuple[int, int, JobSpec]]] = [[] for _ in snapshot.queues]
    for job in snapshot.jobs:
        q = queue_index[job.queue]
        for t in job.tasks:
            requests[q] += [t.request.get(d, 0.0) for d in DIMS]
        heapq.heappush(jobs_of[q], (-job.priority, job.creation_index, job))
    deserved = water_fill(alloc.sum(axis=0), [q.weight for q in snapshot.queues], requests)
    allocated = [np.zeros(len(DIMS)) for _ in snapshot.queues]
    queues = [(0.0, i) for i in range(len(snapshot.queues))]
    heapq.heapify(queues)

    def scores(req: np.ndarray, rows: slice | np.ndarray) -> np.ndarray:
        frac = (used[rows, :2] + req[:2]) * inv[rows]
        fits_cm = has[rows] & (frac <= 1.0)
        least = np.floor(np.where(fits_cm, np.floor((1.0 - frac) * MAX_SCORE), 0.0).sum(axis=1) / 2)
        capped = np.where(has[rows], np.minimum(frac, 1.0), 1.0)
        balanced = np.floor((1 - np.abs(capped[:, 0] - capped[:, 1]) / 2) * MAX_SCORE)
        fits = ((alloc[rows] - used[rows]) >= req - MIN_RESOURCE).all(axis=1) & (
            pods[rows] < max_pods[rows]
        )
        return np.where(fits, least + balanced + taint_score[rows], -np.inf)

    inv_list, alloc_list, max_pods_list = inv.tolist(), alloc.tolist(), max_pods.tolist()
    taint_list = taint_score.tolist()
    used_list, pods_list = used.tolist(), pods.tolist()  # kept in step with used and pods by move

    def row_score(req: list[float], row: int) -> float:
        """``scores`` for one row in plain floats (numpy's per-call cost dominates one row)."""
        u, a = used_list[row], alloc_list[row]
        if pods_list[row] >= max_pods_list[row] or any(
            a[d] - u[d] < req[d] - MIN_RESOURCE for d in range(len(DIMS))
        ):
            return -math.inf
        ic, im = inv_list[row]
        fc, fm = (u[0] + req[0]) * ic, (u[1] + req[1]) * im
        lc = math.floor((1.0 - fc) * MAX_SCORE) if ic > 0 and fc <= 1.0 else 0.0
        lm = math.floor((1.0 - fm) * MAX_SCORE) if im > 0 and fm <= 1.0 else 0.0
        cc = min(fc, 1.0) if ic > 0 else 1.0
        cm = min(fm, 1.0) if im > 0 else 1.0
        return (
            math.floor((lc + lm) / 2)
            + math.floor((1 - abs(cc - cm) / 2) * MAX_SCORE)
            + taint_list[row]
        )

    changed: list[int] = []  # rows in the order placements changed them
    by_shape: dict[tuple[float, ...], tuple[np.ndarray, int]] = {}

    def shape_scores(req: np.ndarray) -> np.ndarray:
        """The shape's scores over every node, kept per shape; rows changed since its last use
        re-scored (one by one when few, else vectorised)."""
        key = tuple(req.tolist())
        known = by_shape.get(key)
        if known is None:
            score = scores(req, slice(None))
        else:
            score, seen = known
            dirty = changed[seen:]
            if len(dirty) <= 16:
                for row in set(dirty):
                    score[row] = row_score(list(key), row)
            else:
                rows = np.unique(np.array(dirty))
                score[rows] = scores(req, rows)
        by_shape[key] = (score, len(changed))
        return score

    def move(row: int, req: np.ndarray, sign: float) -> None:
        used[row] += sign * req
        used_list[row] = used[row].tolist()
        pods[row] += sign
        pods_list[row] += sign
        changed.append(row)

    placements: dict[str, str] = {}
    while queues:
        _, q = heapq.heappop(queues)
        if np.all(deserved[q] <= allocated[q] + MIN_RESOURCE) or not jobs_of[q]:
            continue  # overused, or nothing left: the queue leaves the cycle
        job = heapq.heappop(jobs_of[q])[2]
        tasks = sorted(job.tasks, key=lambda t: (-t.priority, t.creation_index, t.uid))
        req = np.array([tasks[0].request.get(d, 0.0) for d in DIMS])  # a bench job has one shape
        req_list = req.tolist()
        asks = req > MIN_RESOURCE
        placed: list[int] = []
        score = shape_scores(req)
        for _ in tasks:
            if np.any((allocated[q] + req > deserved[q] + MIN_RESOURCE) & asks):
                break  # over the queue's deserved share
            row = int(np.argmax(score))
            if score[row] == -np.inf:
                break
            move(row, req, 1.0)
            allocated[q] += req
            placed.append(row)
            score[row] = row_score(req_list, row)
        by_shape[tuple(req_list)] = (score, len(changed))
        if len(placed) == len(tasks):
            placements.update((t.uid, names[r]) for t, r in zip(tasks, placed, strict=True))
        else:
            for row in placed:
                move(row, req, -1.0)
                allocated[q] -= req
        heapq.heappush(queues, (share(allocated[q], deserved[q]), q))
    return placements


def muster_cycle(snapshot: ClusterSnapshot) -> dict[str, str]:
    result = SchedulerCore(default_config()).run_cycle(snapshot, 1)
    return dict(result.binds)


def timed(
    fn: Callable[[ClusterSnapshot], dict[str, str]], snapshot: ClusterSnapshot
) -> tuple[dict[str, str], float, float]:
    started, cpu_started = time.perf_counter(), time.process_time()
    out = fn(snapshot)
    return out, time.perf_counter() - started, time.process_time() - cpu_started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tune_gc()
    numpy_cpus: list[float] = []
    muster_cpus: list[float] = []
    for _ in range(args.repeat):
        snapshot = build(args.nodes, args.tasks, args.seed)
        base, base_s, base_cpu = timed(numpy_cycle, snapshot)
        snapshot = build(args.nodes, args.tasks, args.seed)
        mine, mine_s, mine_cpu = timed(muster_cycle, snapshot)
        numpy_cpus.append(base_cpu)
        muster_cpus.append(mine_cpu)
        print(
            json.dumps(
                {
                    "nodes": args.nodes,
                    "tasks": args.tasks,
                    "placed": len(mine),
                    "identical": base == mine,
                    "numpy_seconds": round(base_s, 4),
                    "muster_seconds": round(mine_s, 4),
                    "numpy_cpu": round(base_cpu, 4),
                    "muster_cpu": round(mine_cpu, 4),
                    "ratio_cpu": round(mine_cpu / base_cpu, 2),
                }
            ),
            flush=True,
        )
        if base != mine:
            diff = sorted(set(base.items()) ^ set(mine.items()))[:5]
            print(
                json.dumps({"numpy_only_or_muster_only": diff, "numpy_placed": len(base)}),
                flush=True,
            )
    if args.repeat > 1:
        # On a shared machine one pair's ratio moves with the host's speed between the two runs;
        # each side's fastest run is its least disturbed one, so their ratio is the steadier figure.
        print(
            json.dumps(
                {
                    "summary": f"{args.repeat} pairs",
                    "numpy_cpu_min": round(min(numpy_cpus), 4),
                    "muster_cpu_min": round(min(muster_cpus), 4),
                    "ratio_of_mins": round(min(muster_cpus) / min(numpy_cpus), 2),
                    "ratio_median": round(
                        statistics.median(
                            m / n for m, n in zip(muster_cpus, numpy_cpus, strict=True)
                        ),
                        2,
                    ),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
