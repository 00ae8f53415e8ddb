"""network-topology-aware plugin, method by method: hypernode membership, the job's topology,
the predicate's region, the node scores (topology and normal pods), the hypernode gradients and the
hypernode order, each called directly on the plugin. Whole cycles are in test_network_topology.py
and test_network_topology_volcano.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from core_helpers import job, node, queue, res, session, snapshot, task

from server.model import HyperNodeSpec, TaskStatus
from server.plugins.volcano.network_topology import (
    NetworkTopologyPlugin,
    hypernode_members,
    mode_and_highest_tier,
)
from server.session.session import Session

CONFIG = "tiers: [{plugins: [{name: network-topology-aware}]}]"
# s0 = {n1, n2}, s1 = {n3, n4} (tier 1), s2 = {s0, s1} (tier 2); n5 in none.
HYPERNODES = [
    HyperNodeSpec("s0", 1, nodes=["n1", "n2"]),
    HyperNodeSpec("s1", 1, nodes=["n3", "n4"]),
    HyperNodeSpec("s2", 2, hypernodes=["s0", "s1"]),
]
NODES = ["n1", "n2", "n3", "n4", "n5"]


def open_session(
    topology: dict[str, Any],
    n_tasks: int = 2,
    cpu: str = "2",
    held: str | tuple[str, ...] = (),
    arguments: str = "",
) -> tuple[Session, NetworkTopologyPlugin]:
    """Five 4 cpu / 8G nodes, n2 half busy (2 cpu of another job); job ns/j of ``n_tasks`` tasks
    of ``cpu`` each with ``topology``; its first tasks Running on the ``held`` nodes."""
    nodes = [node(n, "4", "8G", pods=110) for n in NODES]
    busy = task("busy", None, res("2"), "n2", ns="other")
    tasks = [task(f"t{i}", "j", res(cpu), creation_index=i) for i in range(n_tasks)]
    for t, where in zip(tasks, (held,) if isinstance(held, str) else held, strict=False):
        t.status, t.node = TaskStatus.RUNNING, where
    gang = job("j", queue="q", tasks=tasks, min_member=None, network_topology=topology)
    snap = snapshot(nodes, [gang], [queue("q")], foreign_tasks=[busy], hypernodes=HYPERNODES)
    config = CONFIG if not arguments else CONFIG.replace("}]}]", f", arguments: {arguments}}}]}}]")
    ssn = session(snap, config)
    return ssn, next(p for p in ssn.plugins if isinstance(p, NetworkTopologyPlugin))


def names(mask: np.ndarray) -> list[str]:
    return [NODES[i] for i in np.nonzero(mask)[0]]


ALL = np.arange(len(NODES))


# -- membership and topology --------------------------------------------------------------------


def test_hypernode_members_follow_children_and_skip_unknown_nodes() -> None:
    specs = {h.name: h for h in HYPERNODES}
    specs["s0"] = HyperNodeSpec("s0", 1, nodes=["n1", "n2", "gone"])
    members = hypernode_members(specs, {n: i for i, n in enumerate(NODES)}, len(NODES))
    assert names(members["s0"]) == ["n1", "n2"]
    assert names(members["s2"]) == ["n1", "n2", "n3", "n4"]


def test_hypernode_members_end_on_a_cycle() -> None:
    """Hypernodes listing each other: the walk ends."""
    specs = {
        "a": HyperNodeSpec("a", 2, nodes=["n1"], hypernodes=["b"]),
        "b": HyperNodeSpec("b", 2, nodes=["n2"], hypernodes=["a"]),
    }
    members = hypernode_members(specs, {n: i for i, n in enumerate(NODES)}, len(NODES))
    assert names(members["a"]) == ["n1", "n2"]
    assert "n2" in names(members["b"])  # (a cycle is followed once, from where it is entered)


def test_mode_and_highest_tier() -> None:
    assert mode_and_highest_tier({}, 3) == ("hard", 3)
    assert mode_and_highest_tier({"mode": "Soft", "highestTierAllowed": 1}, 3) == ("soft", 1)
    assert mode_and_highest_tier({"highest_tier_allowed": "2"}, 3) == ("hard", 2)
    assert mode_and_highest_tier({"highestTierAllowed": "top"}, 3) == ("hard", 3)


def test_topology_of_a_task() -> None:
    ssn, p = open_session({"mode": "hard", "highestTierAllowed": 1})
    assert p.max_tier == 2
    assert p.topology(ssn.tasks["ns/t0"]) == ("hard", 1)
    ssn, p = open_session({})
    assert p.topology(ssn.tasks["ns/t0"]) is None


# -- predicate ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("highest", "held", "inside"),
    [
        (1, None, ["n1", "n2", "n3", "n4"]),  # before the first placement: any hypernode
        (1, "n3", ["n3", "n4"]),  # then only one holding the job's nodes
        (2, "n3", ["n1", "n2", "n3", "n4"]),
        (1, "n5", []),  # a held node outside every hypernode: nothing holds it
    ],
)
def test_hard_mode_region(highest: int, held: str | None, inside: list[str]) -> None:
    ssn, p = open_session({"mode": "hard", "highestTierAllowed": highest}, held=held or ())
    t1 = ssn.tasks["ns/t1"]
    assert names(p.check(t1, ALL)) == inside
    assert list(p.check(t1, np.array([4, 2]))) == ["n5" in inside, "n3" in inside]


def test_soft_mode_and_no_topology_pass_everywhere() -> None:
    for topology in ({"mode": "soft", "highestTierAllowed": 1}, {}):
        ssn, p = open_session(topology, held="n3")
        assert p.check(ssn.tasks["ns/t1"], ALL).all()


# -- node order ---------------------------------------------------------------------------------


def test_topology_score_by_lowest_common_tier() -> None:
    """weight * 100 * (maxTier - tier + 1) / maxTier for the lowest tier shared with every node
    the job holds; 0 with none in common and before the first placement."""
    ssn, p = open_session({"mode": "soft"}, held="n3", arguments="{weight: 3}")
    assert list(p.score(ssn.tasks["ns/t1"], ALL)) == [150.0, 150.0, 300.0, 300.0, 0.0]
    ssn, p = open_session({"mode": "soft"})
    assert not p.score(ssn.tasks["ns/t1"], ALL).any()
    ssn, p = open_session({"mode": "soft"}, held="n3", arguments="{weight: 0}")
    assert not p.score(ssn.tasks["ns/t1"], ALL).any()


def test_normal_pod_score_bin_packs_each_tier() -> None:
    """A 2 cpu task without topology: (used + 2) / allocatable of its tier-1 hypernode, its tier-2
    hypernode and the cluster top (weights 1, 0.8, 0.64); a tier holding no hypernode of the node
    scores 1. s0 holds 2 cpu of 8 (n2's busy task), s1 none; s2 2 of 16; the top 2 of 20."""
    ssn, p = open_session({})
    t = ssn.tasks["ns/t0"]
    top, s2 = 4 / 20, 4 / 16
    expect = {
        "n1": (4 / 8 + 0.8 * s2 + 0.64 * top) / 2.44,
        "n3": (2 / 8 + 0.8 * s2 + 0.64 * top) / 2.44,
        "n5": (1.0 + 0.8 * 1.0 + 0.64 * top) / 2.44,
    }
    scores = p.score(t, np.array([0, 2, 4]))
    assert list(scores) == pytest.approx([100 * expect[n] for n in ("n1", "n3", "n5")])
    assert list(p.normal_pod_score(t, np.array([1]))) == pytest.approx([100 * expect["n1"]])
    ssn, p = open_session({}, arguments='{"hypernode.binpack.normal-pod.enable": false}')
    assert not p.score(ssn.tasks["ns/t0"], ALL).any()


def test_normal_pod_score_is_zero_for_a_hypernode_it_overflows() -> None:
    """A 7 cpu task fits no tier-1 hypernode with n2's busy 2 cpu (s0: 9 > 8) but fits s1 (7/8)."""
    ssn, p = open_session({}, cpu="7")
    t = ssn.tasks["ns/t0"]
    top, s2 = 9 / 20, 9 / 16
    n1, n3 = p.score(t, np.array([0, 2]))
    assert n1 == pytest.approx(100 * (0.0 + 0.8 * s2 + 0.64 * top) / 2.44)
    assert n3 == pytest.approx(100 * (7 / 8 + 0.8 * s2 + 0.64 * top) / 2.44)


# -- hypernode search ---------------------------------------------------------------------------


def gradient_names(gradients: Any) -> list[list[str]]:
    return [[name for name, _ in tier] for tier in gradients]


def test_gradients_by_tier_where_the_gang_has_room() -> None:
    ssn, p = open_session({"mode": "hard", "highestTierAllowed": 2})
    grads = p.gradients(ssn.jobs["ns/j"])
    assert grads is not None
    assert gradient_names(grads) == [["s0", "s1"], ["s2"]]
    assert names(grads[0][1][1]) == ["n3", "n4"]  # each with its node mask
    ssn, p = open_session({"mode": "hard", "highestTierAllowed": 1})
    assert gradient_names(p.gradients(ssn.jobs["ns/j"])) == [["s0", "s1"]]
    # 3 x 4 cpu: s0 has 6 idle, s1 8: only s2 (14) has room.
    ssn, p = open_session({"mode": "hard", "highestTierAllowed": 2}, n_tasks=3, cpu="4")
    assert gradient_names(p.gradients(ssn.jobs["ns/j"])) == [["s2"]]


def test_gradients_of_a_job_holding_nodes_and_of_soft_mode() -> None:
    ssn, p = open_session({"mode": "hard"}, n_tasks=3, cpu="4", held="n3")
    # Holding n3, room is not asked: only hypernodes holding n3.
    assert gradient_names(p.gradients(ssn.jobs["ns/j"])) == [["s1"], ["s2"]]
    ssn, p = open_session({"mode": "hard"}, n_tasks=3, held=("n1", "n3"))
    assert gradient_names(p.gradients(ssn.jobs["ns/j"])) == [["s2"]]  # must hold both
    ssn, p = open_session({"mode": "soft"})
    assert p.gradients(ssn.jobs["ns/j"]) is None


def test_hypernode_order_bin_packs_the_job_request() -> None:
    """(used + request) / allocatable on cpu (the job asks no memory) times weight * 100; a
    hypernode the request overflows scores 0."""
    ssn, p = open_session({"mode": "hard"}, arguments="{weight: 2}")
    j = ssn.jobs["ns/j"]
    masks = {name: p.members[name] for name in ("s0", "s1", "s2")}
    scores = p.hypernode_order(j, masks)
    assert scores == pytest.approx({"s0": 200 * 6 / 8, "s1": 200 * 4 / 8, "s2": 200 * 6 / 16})
    ssn, p = open_session({"mode": "hard"}, n_tasks=4)
    scores = p.hypernode_order(ssn.jobs["ns/j"], {n: p.members[n] for n in ("s0", "s1")})
    assert scores == {"s0": 0.0, "s1": 100.0}  # s0: 2 used + 8 > 8; s1: 8 of 8


def test_binpack_weights_of_listed_extended_resources() -> None:
    """cpu, memory and the resources listed in hypernode.binpack.resources that the cluster has,
    each weighted by its own argument (negative: 1)."""
    devices: dict[str, Any] = {"nvidia.com/gpu": 4, "example.com/fpga": 2}
    nodes = [node(n, "4", "8G", **devices) for n in NODES]
    snap = snapshot(nodes, [job("j", queue="q")], [queue("q")], hypernodes=HYPERNODES)
    arguments = (
        '{"hypernode.binpack.cpu": -2, "hypernode.binpack.memory": 3,'
        ' "hypernode.binpack.resources": "nvidia.com/gpu, example.com/fpga, absent.com/x",'
        ' "hypernode.binpack.resources.nvidia.com/gpu": 5,'
        ' "hypernode.binpack.resources.example.com/fpga": -1}'
    )
    ssn = session(snap, CONFIG.replace("}]}]", f", arguments: {arguments}}}]}}]"))
    p = next(p for p in ssn.plugins if isinstance(p, NetworkTopologyPlugin))
    index = ssn.space.index
    assert p.binpack_weights == {
        0: 1,
        1: 3,
        index["nvidia.com/gpu"]: 5,
        index["example.com/fpga"]: 1,
    }


def test_no_hypernodes_registers_nothing() -> None:
    nodes = [node(n, "4", "8G") for n in NODES]
    gang = job("j", queue="q", network_topology={"mode": "hard"})
    ssn = session(snapshot(nodes, [gang], [queue("q")]), CONFIG)
    p = next(p for p in ssn.plugins if isinstance(p, NetworkTopologyPlugin))
    assert p.members == {}
    assert ssn.hypernode_gradients(ssn.jobs["ns/j"]) is None
