"""The evaluator's caches must give the answers a from-scratch evaluation gives."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from core_helpers import job, node, session, snapshot, task

from server.config import DEFAULT_CONFIG_YAML
from server.model import ClusterSnapshot, Taint, TaskStatus, Toleration

KAI_CONFIG = (Path(__file__).resolve().parents[2] / "examples" / "config-kai.yaml").read_text()

CONFIG = (
    DEFAULT_CONFIG_YAML
    + """
- plugins:
  - name: binpack
"""
)


def _cluster(seed: int) -> ClusterSnapshot:
    rng = random.Random(seed)
    nodes = [
        node(
            f"n{i:02d}",
            str(rng.choice([4, 8, 16])),
            "32Gi",
            pods="5",
            labels={"zone": f"z{i % 3}"},
            taints=[Taint("t", "v", "NoSchedule")] if i % 5 == 0 else [],
        )
        for i in range(30)
    ]
    jobs = []
    for j in range(40):
        req = {"cpu": str(rng.choice([1, 2, 3])), "memory": "1Gi"}
        sel = {"zone": "z1"} if j % 7 == 0 else {}
        tol = [Toleration("t", "Exists")] if j % 3 == 0 else []
        tasks = [
            task(f"j{j}-{k}", f"j{j}", req, node_selector=sel, tolerations=tol)
            for k in range(rng.randint(1, 4))
        ]
        jobs.append(job(f"j{j}", tasks=tasks, min_member=1, index=j))
    return snapshot(nodes, jobs)


def test_cached_selection_matches_fresh_evaluation_after_every_allocation() -> None:
    for seed in range(3):
        ssn = session(_cluster(seed), CONFIG)
        ev = ssn.evaluator
        stmt = ssn.statement()
        placed = 0
        for t in sorted(ssn.tasks.values(), key=lambda x: x.uid):
            cached = ev.select(t)
            # A fresh evaluator (no caches) must agree, on masks, scores and choice.
            ev._shape.clear()
            ev._static.clear()
            fresh = ev.select(t)
            assert cached == fresh, (seed, t.uid)
            if cached is not None:
                stmt.allocate(t, ssn.nodes.names[cached[0]])
                placed += 1
        assert placed > 10
        # Never over-committed.
        assert np.all(ssn.nodes.idle >= -0.1)
        assert np.all(ssn.nodes.task_count <= ssn.nodes.max_tasks)


def test_one_row_forms_give_the_vector_answers_bit_for_bit() -> None:
    """Every shape predicate's and scorer's ``row`` form agrees with its vector form, on nodes
    part used, full, releasing and over-committed (the evaluator switches between them)."""
    rng = random.Random(7)
    ssn = session(_cluster(1), CONFIG)
    stmt = ssn.statement()
    for t in sorted(ssn.tasks.values(), key=lambda x: x.uid)[:60]:
        choice = ssn.evaluator.select(t)
        if choice is not None:
            stmt.allocate(t, ssn.nodes.names[choice[0]])
    ssn.nodes.used[3] = ssn.nodes.allocatable[3] * 1.5  # over-committed row
    rows = np.arange(len(ssn.nodes))
    predicates, scorers = ssn.evaluator.predicates["shape"], ssn.evaluator.scorers["shape"]
    assert {p.plugin for p in predicates if p.row} >= {"predicates"}
    assert {s.plugin for s in scorers if s.row} >= {"nodeorder", "binpack"}
    tasks = list(ssn.tasks.values())
    for _ in range(20):
        t = rng.choice(tasks)
        for p in predicates:
            assert p.row is not None
            assert [p.row(t, int(i)) for i in rows] == p.check(t, rows).tolist(), p.plugin
        for s in scorers:
            assert s.row is not None
            assert [s.row(t, int(i)) for i in rows] == s.score(t, rows).tolist(), s.plugin


def test_scalar_and_vector_row_updates_leave_identical_caches() -> None:
    """The same placements with one-row re-checks in plain Python and with numpy only: the shape
    caches (masks and scores) are equal after every placement."""

    def run(scalar: bool) -> list[tuple[bytes, bytes, bytes]]:
        ssn = session(_cluster(2), CONFIG)
        ev = ssn.evaluator
        ev._scalar_rows = scalar
        stmt = ssn.statement()
        seen = []
        for t in sorted(ssn.tasks.values(), key=lambda x: x.uid):
            choice = ev.select(t)
            if choice is not None:
                stmt.allocate(t, ssn.nodes.names[choice[0]])
            e = ev._shape_entry(t)
            seen.append((e.future_ok.tobytes(), e.idle_ok.tobytes(), e.score.tobytes()))
        return seen

    assert run(True) == run(False)


def test_kai_shape_scorers_one_row_forms_match_their_vector_forms() -> None:
    """KAI's nodeavailability and resourcetype score in shape scope with a one-row form: on GPU and
    CPU nodes, with whole, fractional and CPU-only tasks, some nodes full, some releasing."""
    rng = random.Random(3)
    nodes = [
        node(f"g{i:02d}", "16", "64Gi", **{"nvidia.com/gpu": str(rng.choice([2, 4]))})
        for i in range(8)
    ]
    nodes += [node(f"c{i:02d}", str(rng.choice([4, 8])), "16Gi") for i in range(8)]
    running = [
        task(
            f"r{i}",
            "run",
            {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "1"},
            f"g{i:02d}",
            status=TaskStatus.RELEASING if i % 2 else TaskStatus.RUNNING,
        )
        for i in range(4)
    ]
    pending = [
        task(
            f"p{i}",
            "pend",
            {
                "cpu": str(rng.choice([1, 3, 6])),
                "memory": "4Gi",
                **({"nvidia.com/gpu": "1"} if i % 3 == 0 else {}),
            },
        )
        for i in range(30)
    ]
    pending += [
        task(f"f{i}", "frac", {"cpu": "1", "memory": "1Gi"}, gpu_fraction=0.5) for i in range(6)
    ]
    snap = snapshot(
        nodes,
        [
            job("run", tasks=running, min_member=1, index=0),
            job("pend", tasks=pending, min_member=1, index=1),
            job("frac", tasks=pending[-6:], min_member=1, index=2),
        ],
    )
    ssn = session(snap, KAI_CONFIG)
    stmt = ssn.statement()
    for t in sorted(
        (t for t in ssn.tasks.values() if t.status == TaskStatus.PENDING), key=lambda x: x.uid
    )[:20]:
        choice = ssn.evaluator.select(t)
        if choice is not None:
            stmt.allocate(t, ssn.nodes.names[choice[0]])
    rows = np.arange(len(ssn.nodes))
    scorers = {s.plugin: s for s in ssn.evaluator.scorers["shape"]}
    assert {"nodeavailability", "resourcetype"} <= set(scorers)
    for t in ssn.tasks.values():
        for name in ("nodeavailability", "resourcetype"):
            s = scorers[name]
            assert s.row is not None
            assert [s.row(t, int(i)) for i in rows] == s.score(t, rows).tolist(), (name, t.uid)


def test_a_few_rows_changed_many_times_are_rechecked_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Evictions and their rollback log each node's row several times (a status change logs it
    twice): the cache counts each changed row once, re-checks a few in plain Python rather than
    through numpy, and gives the answers of a fresh evaluation."""
    from server.session import evaluator as evaluator_module

    ssn = session(_cluster(3), CONFIG)
    ev = ssn.evaluator
    stmt = ssn.statement()
    probe = sorted(ssn.tasks.values(), key=lambda x: x.uid)[-1]
    for t in sorted(ssn.tasks.values(), key=lambda x: x.uid)[:-1]:
        choice = ev.select(t)
        if choice is not None:
            stmt.allocate(t, ssn.nodes.names[choice[0]])
    ev._shape_entry(probe)  # current now
    held = [t for t in ssn.tasks.values() if t.node is not None]
    rows = sorted({ssn.nodes.index[t.node] for t in held})[:3]
    on_rows = [t for t in held if ssn.nodes.index[t.node] in rows]
    mark = stmt.checkpoint()
    for t in on_rows:
        stmt.evict(t, "test")
    stmt.rollback(mark)
    for t in on_rows[:2]:
        stmt.evict(t, "test")
    changed = ssn.nodes.change_log[ev._shape[probe.shape_key].log_position :]
    assert len(changed) > evaluator_module.SCALAR_ROWS >= len(set(changed))
    calls = {"numpy": 0}
    vector = ev._shape_rows

    def counting(*args: object, **kwargs: object) -> object:
        calls["numpy"] += 1
        return vector(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ev, "_shape_rows", counting)
    entry = ev._shape_entry(probe)
    assert calls["numpy"] == 0
    cached = (entry.future_ok.tobytes(), entry.idle_ok.tobytes(), entry.score.tobytes())
    ev._shape.clear()
    fresh_entry = ev._shape_entry(probe)
    fresh = (
        fresh_entry.future_ok.tobytes(),
        fresh_entry.idle_ok.tobytes(),
        fresh_entry.score.tobytes(),
    )
    assert cached == fresh
