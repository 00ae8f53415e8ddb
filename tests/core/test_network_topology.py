"""network-topology-aware plugin: hard mode keeps a job inside one hypernode of tier <=
highestTierAllowed; soft mode prefers the lowest common tier (Volcano
plugins/network-topology-aware and the allocate action's hypernode handling)."""

from __future__ import annotations

import numpy as np
from core_helpers import cycle, job, node, queue, res, session, snapshot, task

from server.model import ClusterSnapshot, HyperNodeSpec, TaskStatus

CONFIG = """
actions: "allocate"
tiers:
- plugins:
  - name: gang
  - name: predicates
  - name: nodeorder
  - name: network-topology-aware
"""
HYPERNODES = [
    HyperNodeSpec("s0", 1, nodes=["n1", "n2"]),
    HyperNodeSpec("s1", 1, nodes=["n3", "n4"]),
    HyperNodeSpec("s2", 2, hypernodes=["s0", "s1"]),
]


def cluster(
    topology: dict, n_tasks: int = 2, hypernodes: list[HyperNodeSpec] | None = None
) -> ClusterSnapshot:
    """Five 4-cpu nodes (n1..n4 in HYPERNODES), job ns/j of ``n_tasks`` 2-cpu tasks with ``topology``."""
    nodes = [node(f"n{i}", "4", "8G", pods=110) for i in range(1, 6)]
    # n2 is half busy: least-requested node order alone would move the second task to n3.
    busy = task("busy", None, res("2"), "n2", ns="other")
    tasks = [task(f"t{i}", "j", res("2"), creation_index=i) for i in range(n_tasks)]
    gang = job("j", queue="q", tasks=tasks, min_member=None, network_topology=topology)
    return snapshot(
        nodes,
        [gang],
        [queue("q")],
        foreign_tasks=[busy],
        hypernodes=HYPERNODES if hypernodes is None else hypernodes,
    )


def binds(snap: ClusterSnapshot) -> dict[str, str]:
    return cycle(snap, CONFIG).binds


def tier1_of(node: str) -> str:
    return "s0" if node in ("n1", "n2") else ("s1" if node in ("n3", "n4") else "-")


def test_hard_mode_keeps_the_gang_in_one_tier1_hypernode() -> None:
    """Hard mode, highestTierAllowed 1: both tasks share a tier-1 hypernode."""
    placed = binds(cluster({"mode": "hard", "highestTierAllowed": 1}))
    assert len(placed) == 2
    assert len({tier1_of(n) for n in placed.values()}) == 1
    assert "n5" not in placed.values()  # outside every hypernode


def test_without_topology_the_gang_spreads() -> None:
    """Control: no network topology -> least-requested spreads across s0 and s1."""
    placed = binds(cluster({}))
    assert len({tier1_of(n) for n in placed.values()}) == 2


def test_hard_mode_tier2_allows_crossing_tier1() -> None:
    """highestTierAllowed 2: the tier-2 hypernode s2 holds n1..n4, so the second task may go to
    another tier-1 hypernode (node order decides), but never to n5."""
    placed = binds(cluster({"mode": "hard", "highestTierAllowed": 2}))
    assert len(placed) == 2
    assert "n5" not in placed.values()


def test_hard_mode_gang_that_cannot_fit_is_not_placed() -> None:
    """A gang bigger than any tier-1 hypernode (3 x 4 cpu; s0 has 6 cpu free, s1 8) fails as a
    whole instead of spilling into another hypernode."""
    snap = cluster({"mode": "hard", "highestTierAllowed": 1}, n_tasks=3)
    for t in snap.jobs[0].tasks:
        t.request = {"cpu": 4000}
    assert binds(snap) == {}


def test_soft_mode_prefers_the_lowest_common_tier() -> None:
    """Soft mode: no restriction, but a node sharing a tier-1 hypernode with the job's first task
    outscores one that only shares the tier-2 hypernode."""
    placed = binds(cluster({"mode": "soft"}))
    assert len({tier1_of(n) for n in placed.values()}) == 1


def test_predicate_and_scores_directly() -> None:
    snap = cluster({"mode": "hard", "highestTierAllowed": 1})
    snap.jobs[0].tasks[0].status, snap.jobs[0].tasks[0].node = TaskStatus.RUNNING, "n3"
    ssn = session(
        snap,
        "extension_points_not_listed: disabled\ntiers:\n- plugins:\n"
        "  - name: network-topology-aware\n    enablePredicate: true\n    enableNodeOrder: true\n"
        "    arguments: {weight: 2}\n",
    )
    t1 = ssn.tasks["ns/t1"]
    future_ok, _ = ssn.evaluator.feasible(t1)
    assert [ssn.nodes.names[i] for i in np.nonzero(future_ok)[0]] == ["n3", "n4"]
    scores = ssn.evaluator.scores(t1, np.arange(5))
    # n3, n4 share s1 (tier 1): 2 * 100 * 2/2; n1, n2 share only s2 (tier 2): 2 * 100 * 1/2; n5 none.
    assert list(scores) == [100.0, 100.0, 200.0, 200.0, 0.0]
    fe = ssn.evaluator.fit_errors(t1)
    assert fe.reasons == {"node(s) outside the job's hypernode within its highest allowed tier": 3}


def test_no_hypernodes_no_effect() -> None:
    placed = binds(cluster({"mode": "hard", "highestTierAllowed": 1}, hypernodes=[]))
    assert len(placed) == 2
