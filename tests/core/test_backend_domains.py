"""Evaluation domains per backend (server/session/evaluator.py ``DomainPredicate``, used by
server/plugins/muster/gang_backend.py).

With several backends, ``select`` answers the gang-backend predicate per backend, over the cached
per-shape scores; ``NodeEvaluator.use_domains = False`` asks it per node, as any ``task``
predicate. The two must decide the same: on bench clusters (bench/cycle.py ``build``) with the
nodes split into backends in blocks, interleaved or at random, some backends full from the start,
gangs already holding a backend, tasks releasing resources (pipelining) and gangs bigger than a
backend, the cycle results are equal: binds, pipelined tasks, evictions, every task's status, every
job's outcome (phase, conditions, explanation). Also: fit errors, whose reasons before the ``task``
predicates are cached per shape, follow node changes.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from core_helpers import PREEMPT_TIERS, load_bench

from muster.quantity import parse_resources
from server.config import DEFAULT_CONFIG_YAML, default_config, load_config
from server.model import ClusterSnapshot, CycleResult, JobSpec, PodGroupPhase, TaskSpec, TaskStatus
from server.plugins.muster.gang_backend import NO_ROOM, REASON
from server.scheduler import SchedulerCore, with_backend_rule
from server.session.evaluator import NodeEvaluator
from server.session.info import FitErrors, NodeTable
from server.session.session import Session

bench = load_bench("cycle")

PREEMPT_CONFIG = (
    'actions: "enqueue, allocate, preempt, reclaim, allocate, backfill"\n' + PREEMPT_TIERS
)
CONFIGS = {"default": DEFAULT_CONFIG_YAML, "preempt": PREEMPT_CONFIG}


def contiguous(i: int, n: int, backends: int, rng: random.Random) -> int:
    return i * backends // n


def interleaved(i: int, n: int, backends: int, rng: random.Random) -> int:
    return i % backends


def scattered(i: int, n: int, backends: int, rng: random.Random) -> int:
    return rng.randrange(backends)


LAYOUTS: dict[str, Callable[[int, int, int, random.Random], int]] = {
    "contiguous": contiguous,
    "interleaved": interleaved,
    "scattered": scattered,
}


def running_job(
    uid: str, queue: str, placed: list[tuple[str, dict[str, float], TaskStatus]], pending: int = 0
) -> JobSpec:
    """Job ``bench/<uid>`` of ``queue`` holding ``placed`` (node, request, status) and ``pending``
    more tasks like its first, its minimum every task."""
    tasks = [
        TaskSpec(
            uid=f"bench/{uid}-{k}",
            name=f"{uid}-{k}",
            namespace="bench",
            job=f"bench/{uid}",
            request=dict(request),
            status=status,
            node=where,
            creation_index=10**6 + k,
        )
        for k, (where, request, status) in enumerate(placed)
    ]
    tasks += [
        dataclasses.replace(
            tasks[0],
            uid=f"bench/{uid}-{len(placed) + k}",
            name=f"{uid}-{len(placed) + k}",
            status=TaskStatus.PENDING,
            node=None,
            creation_index=10**6 + len(placed) + k,
        )
        for k in range(pending)
    ]
    return JobSpec(
        uid=f"bench/{uid}",
        name=uid,
        namespace="bench",
        queue=queue,
        tasks=tasks,
        min_member=len(tasks),
        phase=PodGroupPhase.RUNNING if not pending else PodGroupPhase.INQUEUE,
        creation_index=10**6,
    )


def whole(allocatable: dict[str, float]) -> dict[str, float]:
    """A request taking all of a node (its pod slots aside)."""
    return {k: v for k, v in allocatable.items() if k != "pods"}


def cluster(nodes: int, tasks: int, seed: int, backends: int, layout: str) -> ClusterSnapshot:
    """``bench.build(nodes, tasks, seed)`` with its nodes in ``backends`` backends laid out by
    ``layout``; backend b00's nodes full (running tasks), half of b01's releasing theirs (room for
    pipelining), a gang holding two nodes of b02 with more members pending, and gangs asking about
    as much as a backend holds and more."""
    rng = random.Random(seed)
    snap = bench.build(nodes, tasks, seed)
    where = LAYOUTS[layout]
    specs = [
        dataclasses.replace(node, backend=f"b{where(i, nodes, backends, rng):02d}")
        for i, node in enumerate(snap.nodes)
    ]
    of = {b: [n for n in specs if n.backend == b] for b in sorted({n.backend for n in specs})}
    full = [(n.name, whole(n.allocatable), TaskStatus.RUNNING) for n in of.get("b00", [])]
    releasing = [
        (n.name, whole(n.allocatable), TaskStatus.RELEASING) for n in of.get("b01", [])[::2]
    ]
    extra = [running_job("full", "q3", full)] if full else []
    extra += [running_job("releasing", "q2", releasing)] if releasing else []
    held = of.get("b02", [])[:2]
    if held:
        small = parse_resources({"cpu": "2", "memory": "4Gi"})
        extra.append(
            running_job("held", "q1", [(n.name, small, TaskStatus.RUNNING) for n in held], 3)
        )
    per_backend = nodes // backends
    sixteen = parse_resources({"cpu": "16", "memory": "16Gi"})
    big = [  # one that a backend holds only just, one that none holds
        bench.bench_job(10**5 + k, size, sixteen, 0, 10)
        for k, size in enumerate([per_backend * 2 + 2, per_backend * 5])
    ]
    return dataclasses.replace(snap, nodes=specs, jobs=[*extra, *big, *snap.jobs])


def run(snap: ClusterSnapshot, config: str, *, domains: bool) -> CycleResult:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(NodeEvaluator, "use_domains", domains)
        return SchedulerCore(load_config(config)).run_cycle(snap, 1)


def decided(result: CycleResult) -> CycleResult:
    """The result less its timings."""
    return dataclasses.replace(result, action_seconds={}, plugin_seconds={})


def cases() -> list[Any]:
    return list(_cases())


def _cases() -> Iterator[Any]:
    for seed, (nodes, tasks, backends) in enumerate(
        [(40, 300, 4), (48, 200, 12), (64, 600, 5), (30, 120, 3), (96, 500, 16)]
    ):
        for layout in LAYOUTS:
            for config in CONFIGS:
                yield pytest.param(
                    nodes, tasks, backends, layout, config, seed, id=f"{nodes}-{layout}-{config}"
                )
    # Bench-sized: many rows change between two placements of a shape (the vectorised refresh).
    yield pytest.param(800, 1600, 16, "contiguous", "default", 7, id="800-contiguous-default")
    yield pytest.param(600, 1200, 8, "scattered", "default", 8, id="600-scattered-default")


@pytest.mark.parametrize(("nodes", "tasks", "backends", "layout", "config", "seed"), cases())
def test_domains_decide_as_per_node(
    nodes: int, tasks: int, backends: int, layout: str, config: str, seed: int
) -> None:
    snap = cluster(nodes, tasks, seed, backends, layout)
    reference = decided(run(snap, CONFIGS[config], domains=False))
    calls = []
    original = NodeEvaluator._select_in_domains

    def counted(self: NodeEvaluator, *args: Any) -> Any:
        calls.append(1)
        return original(self, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(NodeEvaluator, "_select_in_domains", counted)
        result = decided(run(snap, CONFIGS[config], domains=True))
    assert calls, "the domain path was not taken"
    assert result.binds == reference.binds
    assert result.pipelined == reference.pipelined
    assert result.evictions == reference.evictions
    assert result.task_status == reference.task_status
    assert result.jobs == reference.jobs
    assert result == reference


def test_cases_are_not_vacuous() -> None:
    """Over the cases: tasks placed and pipelined, gangs in many backends but each inside one,
    the gang holding b02 placed there, gangs waiting for each of the gang-backend's reasons."""
    pipelined, backends_used, waiting = 0, set(), ""
    for case in cases():
        nodes, tasks, backends, layout, config, seed = case.values
        if nodes > 100:
            continue  # the small ones show it
        snap = cluster(nodes, tasks, seed, backends, layout)
        result = run(snap, CONFIGS[config], domains=True)
        backend = {n.name: n.backend for n in snap.nodes}
        placed = {**result.binds, **result.pipelined}
        used: dict[str, set[str]] = {}
        for uid, node in placed.items():
            used.setdefault(uid.rsplit("-", 1)[0], set()).add(backend[node])
        assert all(len(b) == 1 for b in used.values())  # each gang inside one backend
        assert backend[placed["bench/held-2"]] == "b02"
        pipelined += len(result.pipelined)
        backends_used |= set.union(*used.values())
        waiting += " ".join(str(o.explanation) for o in result.jobs.values() if o.explanation)
    assert pipelined > 50
    assert len(backends_used) >= 12
    assert NO_ROOM in waiting
    assert REASON in waiting


def test_ties_go_to_the_first_row() -> None:
    """Identical empty nodes tie everywhere: with interleaved backends each task takes the first
    node of its allowed backends, as the per-node path does."""
    snap = bench.build(24, 0, 0)
    specs = [dataclasses.replace(n, backend=f"b{i % 3:02d}") for i, n in enumerate(snap.nodes)]
    jobs = [
        bench.bench_job(j, size, parse_resources({"cpu": "1", "memory": "1Gi"}), 10 * j, 0)
        for j, size in enumerate([3, 1, 2, 5, 4])
    ]
    snap = dataclasses.replace(snap, nodes=specs, jobs=jobs)
    on = decided(run(snap, DEFAULT_CONFIG_YAML, domains=True))
    off = decided(run(snap, DEFAULT_CONFIG_YAML, domains=False))
    assert on == off


def test_fit_errors_follow_node_changes() -> None:
    """With a ``task`` predicate active, the reasons counted before it (static, resources, shape
    predicates) are cached per shape until a node changes: after placements and their undoing,
    a task's fit errors are those a fresh evaluator finds, and the gang-backend's reasons count."""
    snap = cluster(24, 60, 3, 4, "interleaved")
    ssn = Session(snap, with_backend_rule(load_config(DEFAULT_CONFIG_YAML)), 1)
    evaluator = ssn.evaluator
    pending = [t for j in ssn.jobs.values() for t in j.tasks.values() if t.node is None]
    big = next(t for t in pending if t.job == "bench/job-100001")

    def fresh() -> FitErrors:
        evaluator._shape_fit.clear()
        return evaluator._compute_fit_errors(big, None)

    first = evaluator.fit_errors(big)
    assert first == fresh()
    assert first.reasons.get(NO_ROOM)
    stmt = ssn.statement()
    target = next(n.name for n in snap.nodes if n.backend == "b03")
    cpu = ssn.space.dims.index("cpu")
    row = ssn.nodes.index[target]
    for task in pending:  # fill one node until the big gang's task no longer fits it
        if task.job == big.job or ssn.nodes.future_idle(row)[cpu] < big.resreq[cpu]:
            continue
        if (task.resreq <= ssn.nodes.future_idle(row)).all():
            stmt.allocate(task, target)
            assert evaluator.fit_errors(big) == fresh()
    assert evaluator.fit_errors(big) != first
    stmt.discard()
    assert evaluator.fit_errors(big) == fresh() == first


def test_node_work_times_the_per_node_calls_and_puts_them_back() -> None:
    """bench/cycle.py --node-share: the per-node work of a 4-backend cycle is timed (a share of
    the cycle, never more), and the timed methods are the originals again afterwards."""
    originals = (NodeEvaluator.select, NodeTable.add_task)
    snap = bench.with_backends(bench.build(400, 800, 3), 4)
    core = SchedulerCore(default_config())
    started = time.process_time()
    with bench.NodeWork() as work:
        result = core.run_cycle(snap, 1)
    cpu = time.process_time() - started
    assert result.binds
    assert (NodeEvaluator.select, NodeTable.add_task) == originals
    report = work.report(cpu)
    assert set(report["node_work"]) == {"select", "fit_errors", "add_task", "remove_task"}
    assert report["node_work"]["select"] > 0
    assert 0 < report["node_share"] <= 1
    assert 1 <= report["amdahl_bound"][2] <= report["amdahl_bound"][16]
