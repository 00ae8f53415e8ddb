"""The KAI allocate path's shortcuts give what the plain computations give: the binpack scores kept
between calls (nodeplacement ``BinpackColumn``) equal binpack scored afresh, as placements,
pipelines, evictions and rollbacks move the nodes; ``ordered_rows`` (no masking when the best node
is one the task fits; a stable sort of the unmasked scores) gives the order the masked scores give;
the fractional-GPU checks done on whole columns (``fraction_rows``) equal ``fraction_fits`` per row;
the shape scorers' one-row answers equal their vectorised ones; and ``should_pipeline_job`` /
``has_tasks_to_allocate`` answer from the status index what the pod sets answer."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from core_helpers import job, node, session, snapshot, task

from server.actions.kai.common import ordered_rows
from server.model import JobSpec, NodeSpec, TaskStatus
from server.plugins.kai import nodeplacement
from server.session.extension_points import Scorer
from server.session.info import TaskInfo
from server.session.kai import (
    all_rows,
    fit_rows,
    fraction_fits,
    fraction_rows,
    has_tasks_to_allocate,
    pod_sets,
    should_allocate,
    should_pipeline_job,
)
from server.session.session import Session

KAI = (Path(__file__).resolve().parents[2] / "examples" / "config-kai.yaml").read_text()
FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9)
GPUS: dict[str, Any] = {"nvidia.com/gpu": 4}
SHAPES: list[dict[str, str | int]] = [
    {"cpu": "1", "memory": "1Gi"},
    {"cpu": "2", "memory": "4Gi"},
    {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": 1},
]


def cluster(seed: int) -> Session:
    """A KAI session on a random small cluster: GPU and CPU nodes (one unschedulable and nearly
    full), running, releasing and fractional tasks on shared GPUs, and pending jobs of several
    shapes, fractional ones included."""
    rng = random.Random(seed)
    nodes: list[NodeSpec] = []
    jobs: list[JobSpec] = []
    for i in range(6):
        nodes.append(node(f"g{i}", "16", "64Gi", **GPUS))
    for i in range(6):
        nodes.append(node(f"c{i}", "8", "32Gi"))
    cordoned = node("cordoned", "8", "32Gi")
    cordoned.unschedulable = True
    nodes.append(cordoned)
    jobs.append(job("busy", 1, "7", memory="1Gi", nodes="cordoned", status=TaskStatus.RUNNING))
    index = 1
    for i in range(6):  # running and releasing work on every node but one of each kind
        for where in (f"g{i}", f"c{i}")[: 2 if i else 0]:
            status = rng.choice([TaskStatus.RUNNING, TaskStatus.RELEASING])
            cpu = str(rng.randint(1, 5))
            jobs.append(job(f"run-{where}", 1, cpu, nodes=where, status=status, index=index))
            index += 1
    shares = [(f"g{i}", g) for i in range(1, 4) for g in ("0", "1")]
    for k, (where, group) in enumerate(shares):  # shared GPUs, some with releasing shares
        fraction = rng.choice(FRACTIONS)
        status = rng.choice([TaskStatus.RUNNING, TaskStatus.RUNNING, TaskStatus.RELEASING])
        spec = task(f"share-{k}", f"share-{k}", {"cpu": "1"}, where, status=status)
        spec.gpu_fraction, spec.gpu_groups = fraction, [group]
        jobs.append(job(f"share-{k}", tasks=[spec], index=index))
        index += 1
    for k in range(12):  # pending work
        shape = rng.choice(SHAPES)
        specs = [task(f"p{k}-{i}", f"p{k}", shape) for i in range(rng.randint(1, 4))]
        jobs.append(job(f"p{k}", tasks=specs, index=index))
        index += 1
    for k in range(4):
        spec = task(f"f{k}", f"f{k}", {"cpu": "1"})
        spec.gpu_fraction = rng.choice(FRACTIONS)
        jobs.append(job(f"f{k}", tasks=[spec], index=index))
        index += 1
    return session(snapshot(nodes, jobs), KAI)


def pending(ssn: Session) -> list[TaskInfo]:
    return [t for j in ssn.jobs.values() for t in j.tasks.values() if should_allocate(t, True)]


def scorer(ssn: Session, scope: str, plugin: str) -> Scorer:
    return next(s for s in ssn.evaluator.scorers[scope] if s.plugin == plugin)  # type: ignore[index]


def moves(ssn: Session, seed: int) -> Iterator[str]:
    """Random placements, pipelines, evictions and rollbacks on ``ssn``, one at a time: after
    each, what was done."""
    rng = random.Random(seed)
    stmt = ssn.statement()
    names = ssn.nodes.names
    for step in range(60):
        todo = pending(ssn)
        running = [t for t in ssn.tasks.values() if t.status == TaskStatus.RUNNING]
        kind = rng.choice(["allocate", "allocate", "pipeline", "evict", "rollback"])
        if kind == "rollback" and step % 7 == 0:
            stmt.discard()
            stmt = ssn.statement()
        elif kind == "evict" and running:
            stmt.evict(rng.choice(running), "test")
        elif todo and not any(t.gpu_fraction for t in todo[:1]):
            t = rng.choice([t for t in todo if not t.gpu_fraction] or todo)
            if t.gpu_fraction:
                continue
            row = rng.randrange(len(names))
            (stmt.allocate if kind == "allocate" else stmt.pipeline)(t, names[row])
        yield kind
    stmt.discard()
    yield "discard"


@pytest.mark.parametrize("seed", range(6))
def test_kept_binpack_scores_equal_binpack_scored_afresh(seed: int) -> None:
    ssn = cluster(seed)
    score = scorer(ssn, "task", "nodeplacement").score
    n = len(ssn.nodes)
    cpu_task = next(t for t in pending(ssn) if not t.gpu_fraction and t.resreq.sum() > 0)
    gpu_task = next(t for t in pending(ssn) if t.gpu_fraction)
    probes = [cpu_task, gpu_task]
    kept_calls = 0
    for _ in moves(ssn, seed):
        for t in probes:
            kept = score(t, all_rows(n))  # the whole-column path, kept between calls
            fresh = score(t, np.arange(n))  # any other rows array: scored afresh
            assert kept.tobytes() == fresh.tobytes()
            assert not kept.flags.writeable
            kept_calls += 1
    assert kept_calls > 100


def test_kept_binpack_scores_after_many_changes_and_when_no_node_has_room() -> None:
    """More log entries than ``REPLAY_ROWS`` at once (a few rows changed many times), extremes
    that move up and down, and every node of the resource full (``hi == 0``) or all alike
    (``lo == hi``)."""
    ssn = cluster(1)
    score = scorer(ssn, "task", "nodeplacement").score
    n = len(ssn.nodes)
    gpu_task = next(t for t in pending(ssn) if t.gpu_fraction)
    assert score(gpu_task, all_rows(n)).tobytes() == score(gpu_task, np.arange(n)).tobytes()
    fillers = [TaskInfo(task(f"fill-{k}", "", {"nvidia.com/gpu": 1}), ssn.space) for k in range(40)]
    rows: list[int] = []
    for name in (f"g{i}" for i in range(6)):  # every free GPU of every GPU node
        row = ssn.nodes.index[name]
        while ssn.nodes.idle[row, ssn.nodes.gpu_dim] > 0:
            ssn.nodes.add_task(row, fillers[len(rows)])
            rows.append(row)
    placed = len(rows)
    assert placed > nodeplacement.REPLAY_ROWS
    assert not ssn.nodes.idle[:, ssn.nodes.gpu_dim].any()
    kept = score(gpu_task, all_rows(n))
    assert kept.tobytes() == score(gpu_task, np.arange(n)).tobytes()
    for k, row in enumerate(rows):  # and back, one row at a time
        ssn.nodes.remove_task(row, fillers[k])
        kept = score(gpu_task, all_rows(n))
        assert kept.tobytes() == score(gpu_task, np.arange(n)).tobytes()


def test_kept_binpack_scores_when_more_rows_changed_than_are_replayed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each changed row counts once: a row logged many times is replayed alone, and more
    distinct changed rows than ``REPLAY_ROWS`` score the whole column again."""
    nodes = [node(f"c{i:02d}", "8", "32Gi") for i in range(nodeplacement.REPLAY_ROWS + 4)]
    ssn = session(snapshot(nodes, [job("probe", 1, "1", index=0)]), KAI)
    score = scorer(ssn, "task", "nodeplacement").score
    n = len(ssn.nodes)
    probe = next(iter(ssn.tasks.values()))
    whole = {"passes": 0}
    score_all = nodeplacement.BinpackColumn._score_all

    def counting(column: nodeplacement.BinpackColumn) -> None:
        whole["passes"] += 1
        score_all(column)

    monkeypatch.setattr(nodeplacement.BinpackColumn, "_score_all", counting)
    score(probe, all_rows(n))
    assert whole["passes"] == 1
    filler = TaskInfo(task("fill", "", {"cpu": "1"}), ssn.space)
    for _ in range(nodeplacement.REPLAY_ROWS + 1):  # one row, many entries
        ssn.nodes.add_task(3, filler)
        ssn.nodes.remove_task(3, filler)
    ssn.nodes.add_task(3, filler)
    kept = score(probe, all_rows(n))
    assert whole["passes"] == 1
    assert kept.tobytes() == score(probe, np.arange(n)).tobytes()
    fillers = [TaskInfo(task(f"fill-{i}", "", {"cpu": "2"}), ssn.space) for i in range(n)]
    for i in range(n):  # every row once: more than are replayed
        ssn.nodes.add_task(i, fillers[i])
    kept = score(probe, all_rows(n))
    assert whole["passes"] == 2
    assert kept.tobytes() == score(probe, np.arange(n)).tobytes()


def plain_ordered_rows(
    ssn: Session, t: TaskInfo, nodes: np.ndarray | None
) -> list[tuple[int, bool]]:
    """``ordered_rows`` as first written: fractional checks per row, every score masked, then the
    first best and the rest in a stable sort."""
    n = len(ssn.nodes)
    future_ok, idle_ok = ssn.evaluator.feasible(t, nodes)
    future_ok, idle_ok = future_ok.copy(), idle_ok.copy()
    if t.gpu_fraction:
        for i in np.nonzero(future_ok)[0]:
            f_future, f_now = fraction_fits(ssn.nodes, int(i), t.gpu_fraction)
            future_ok[i] = f_future
            idle_ok[i] = idle_ok[i] and f_now
    if not future_ok.any():
        return []
    scores = ssn.evaluator.scores(t, all_rows(n) if nodes is None else np.nonzero(nodes)[0])
    if nodes is not None:
        full = np.full(n, -np.inf)
        full[nodes] = scores
        scores = full
    masked = np.where(future_ok, scores, -np.inf)
    best = int(np.argmax(masked))
    out = [(best, bool(idle_ok[best]))]
    for i in np.argsort(-masked, kind="stable"):
        if i != best and future_ok[i]:
            out.append((int(i), bool(idle_ok[i])))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_ordered_rows_gives_the_masked_order(seed: int) -> None:
    ssn = cluster(seed)
    rng = random.Random(seed)
    n = len(ssn.nodes)
    unmasked_best_unfit = 0
    for _ in moves(ssn, seed):
        for t in rng.sample(pending(ssn), min(4, len(pending(ssn)))):
            for mask in (None, np.array([rng.random() < 0.6 for _ in range(n)])):
                rows = ordered_rows(ssn, t, mask)
                assert rows is not None
                assert list(rows) == plain_ordered_rows(ssn, t, mask)
                future_ok = ssn.evaluator.feasible(t, mask)[0]
                if mask is None and future_ok.any():
                    scores = ssn.evaluator.scores(t, all_rows(n))
                    unmasked_best_unfit += not future_ok[int(scores.argmax())]
    # The cordoned node scores best for small CPU tasks: the masked path is taken too.
    assert unmasked_best_unfit > 0


@pytest.mark.parametrize("seed", range(4))
def test_fraction_rows_equal_fraction_fits_per_row(seed: int) -> None:
    ssn = cluster(seed)
    nodes = ssn.nodes
    rng = random.Random(seed)
    assert any(nodes.shared)
    for _ in moves(ssn, seed):
        rows = np.array(sorted(rng.sample(range(len(nodes)), rng.randint(0, len(nodes)))), int)
        for f in FRACTIONS:
            future, now = fraction_rows(nodes, rows, f)
            assert future.tolist() == [fraction_fits(nodes, int(r), f)[0] for r in rows]
            assert now.tolist() == [fraction_fits(nodes, int(r), f)[1] for r in rows]


@pytest.mark.parametrize("seed", range(4))
def test_fit_rows_with_fractions_equal_the_per_row_checks(seed: int) -> None:
    ssn = cluster(seed)
    nodes = ssn.nodes
    every = np.arange(len(nodes))
    for _ in moves(ssn, seed):
        for t in (t for t in pending(ssn) if t.gpu_fraction):
            fits_future, fits_now = fit_rows(nodes, t, every)
            limit = t.resreq - 1e-9  # (fit_rows' own comparisons, then fraction_fits per row)
            idle_fit: list[bool] = np.asarray((nodes.idle >= limit).all(axis=1)).tolist()
            future = nodes.idle + nodes.releasing - nodes.pipelined
            future_fit: list[bool] = np.asarray((future >= limit).all(axis=1)).tolist()
            per_row = [fraction_fits(nodes, r, t.gpu_fraction) for r in range(len(nodes))]
            plain_now = [bool(i) and p[1] for i, p in zip(idle_fit, per_row, strict=True)]
            plain_future = [bool(f) and p[0] for f, p in zip(future_fit, per_row, strict=True)]
            assert fits_now.tolist() == plain_now
            assert fits_future.tolist() == [
                a or b for a, b in zip(plain_future, plain_now, strict=True)
            ]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("plugin", ["nodeavailability", "resourcetype"])
def test_shape_scorers_one_row_equals_their_vector(seed: int, plugin: str) -> None:
    ssn = cluster(seed)
    s = scorer(ssn, "shape", plugin)
    assert s.row is not None
    every = np.arange(len(ssn.nodes))
    for _ in moves(ssn, seed):
        for t in pending(ssn)[:6]:
            assert [s.row(t, r) for r in every.tolist()] == s.score(t, every).tolist()


@pytest.mark.parametrize("seed", range(4))
def test_job_checks_from_the_status_index_equal_the_pod_sets(seed: int) -> None:
    ssn = cluster(seed)
    pipelined_seen = 0
    for _ in moves(ssn, seed):
        for j in ssn.jobs.values():
            plain_pipeline = any(
                ps.pipelined and ps.active_allocated - ps.pipelined < ps.min_available
                for ps in pod_sets(j)
            )
            assert should_pipeline_job(j) == plain_pipeline
            for real in (True, False):
                plain = any(should_allocate(t, real) for t in j.tasks.values())
                assert has_tasks_to_allocate(j, real) == plain
            pipelined_seen += any(ps.pipelined for ps in pod_sets(j))
    assert pipelined_seen > 0
