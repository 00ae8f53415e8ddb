"""huaweiNPU: the Ascend 910 affinity rules, each checked where a wrong rule would pick otherwise."""

from __future__ import annotations

import random
from typing import Any

import pytest
import yaml

from server.plugins.ascend.huawei_npu import PRIORITY_TABLE, best_ring
from server.simulate.run import simulate_text

ASCEND = "huawei.com/Ascend910"
CONFIG = {
    "actions": "enqueue, allocate",
    "tiers": [
        {"plugins": [{"name": "priority"}, {"name": "gang"}]},
        {
            "plugins": [
                {"name": "predicates"},
                {"name": "nodeorder"},
                {"name": "binpack"},
                {"name": "huaweiNPU"},
            ]
        },
    ],
}


def npu_node(name: str, healthy: int = 8, cpu: str = "64") -> dict[str, Any]:
    devices = [
        {"id": f"Ascend910-{i}", "type": ASCEND, "group": str(i // 4), "healthy": i < healthy}
        for i in range(8)
    ]
    return {
        "name": name,
        "allocatable": {"cpu": cpu, "memory": "256Gi", ASCEND: 8},
        "devices": devices,
    }


def holder(name: str, node: str, chips: list[int], status: str = "Running") -> dict[str, Any]:
    """A job whose one task holds ``chips`` of ``node`` (its request need not pass the rules:
    holders are only placed, not scheduled)."""
    return {
        "name": name,
        "queue": "default",
        "tasks": [
            {
                "name": f"{name}-0",
                "status": status,
                "node": node,
                "request": {"cpu": "1", ASCEND: len(chips)},
                "devices": [f"Ascend910-{c}" for c in chips],
            }
        ],
    }


def npu_job(name: str, *chips: float, resource: str = ASCEND) -> dict[str, Any]:
    return {
        "name": name,
        "tasks": [
            {"name": f"{name}-{i}", "request": {"cpu": "1", resource: c}}
            for i, c in enumerate(chips)
        ],
    }


def run(
    nodes: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    config: dict[str, Any] | None = None,
    cycles: int = 1,
) -> dict[str, Any]:
    cfg = dict(config or CONFIG)
    cfg["cycles"] = cycles
    return simulate_text(yaml.safe_dump({"config": cfg, "nodes": nodes, "jobs": jobs}))


def layout_node(name: str, free0: int, free1: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A node whose ring 0 has ``free0`` free chips and ring 1 ``free1`` (the rest held)."""
    held = list(range(4 - free0)) + [4 + i for i in range(4 - free1)]
    return npu_node(name), ([holder(f"h-{name}", name, held)] if held else [])


# Per chips asked, every (ring taken, other ring) layout in the A-D table's order of preference,
# then layouts only the fallback rule (even remainder first) accepts.
ORDER = {
    1: [
        (1, 0),
        (1, 1),
        (1, 2),
        (1, 3),
        (1, 4),
        (3, 0),
        (3, 2),
        (3, 3),
        (3, 4),
        (2, 0),
        (2, 2),
        (2, 4),
        (4, 0),
        (4, 4),
    ],
    2: [
        (2, 0),
        (2, 1),
        (2, 2),
        (2, 3),
        (2, 4),
        (4, 0),
        (4, 1),
        (4, 3),
        (4, 4),
        (3, 0),
        (3, 1),
        (3, 3),
    ],
    4: [(4, 0), (4, 1), (4, 2), (4, 3), (4, 4)],
}


def test_the_table_ranks_every_layout_in_its_order() -> None:
    for chips, layouts in ORDER.items():
        ranks = [best_ring({"0": a, "1": b}, chips)[0] for a, b in layouts]
        assert ranks == sorted(ranks), (chips, ranks)
        assert len(set(ranks)) == len(ranks), (chips, ranks)
        # Mirrored rings rank the same, taking the mirrored ring.
        for a, b in layouts:
            assert best_ring({"0": b, "1": a}, chips)[0] == best_ring({"0": a, "1": b}, chips)[0]
        assert set(PRIORITY_TABLE[chips][0][1]) == {0, 1, 2, 3, 4}  # group A accepts any other ring


@pytest.mark.parametrize("chips", [1, 2, 4])
def test_the_scheduler_picks_nodes_in_table_order(chips: int) -> None:
    """All layouts at once, node names shuffled against the order: the pod lands on the best one;
    take that node away and the next best wins, down the whole table."""
    layouts = list(ORDER[chips])
    shuffled = random.Random(chips).sample(range(len(layouts)), len(layouts))
    names = {layout: f"n{k:02d}" for layout, k in zip(layouts, shuffled, strict=True)}
    for expected in layouts:
        nodes, jobs = [], []
        for (free_taken, free_other), name in names.items():
            # Put the ring the pod takes on ring 1 for every other layout (both rings count).
            f0, f1 = (free_taken, free_other) if int(name[1:]) % 2 else (free_other, free_taken)
            n, h = layout_node(name, f0, f1)
            nodes.append(n)
            jobs += h
        out = run(nodes, [*jobs, npu_job("p", chips)])
        assert out["binds"] == {"default/p-0": names[expected]}, (chips, expected)
        task = out["tasks"]["default/p-0"]
        ring = {int(d.split("-")[1]) // 4 for d in task["devices"]}
        assert len(task["devices"]) == chips
        assert len(ring) == 1
        del names[expected]


def test_capacity_eight_nodes_come_before_nodes_with_a_broken_chip() -> None:
    # n1: one broken chip (capacity 7) and a perfect fit for 1 chip (ring 0: 1 free, ring 1: 0
    # free once the broken one counts as used); n2: capacity 8, the worst layout (4~4).
    n1 = npu_node("n1", healthy=7)
    out = run([n1, npu_node("n2")], [holder("h", "n1", [0, 1, 2, 4, 5, 6]), npu_job("p", 1)])
    assert out["binds"] == {"default/p-0": "n2"}
    assert out["tasks"]["default/p-0"]["devices"] == ["Ascend910-0"]
    # Without a capacity-8 node the capacity-7 node is used, never its broken chip.
    out = run([npu_node("n1", healthy=7)], [npu_job("p", 4), npu_job("q", 4)])
    assert out["binds"] == {"default/p-0": "n1"}
    assert out["tasks"]["default/p-0"]["devices"] == [f"Ascend910-{i}" for i in range(4)]
    assert "Ascend910-7" not in out["tasks"]["default/q-0"]["devices"]


def test_a_ring_must_hold_the_whole_request() -> None:
    # 2 chips free on the node, one per ring: the count fits, the HCCS rule does not.
    n, h = layout_node("n1", 1, 1)
    out = run([n], [*h, npu_job("p", 2)])
    assert out["binds"] == {}
    assert "HCCS ring" in out["jobs"]["default/p"]["conditions"][0]["message"]
    # Without huaweiNPU the same pod is placed across the rings.
    plain = {
        **CONFIG,
        "tiers": [CONFIG["tiers"][0], {"plugins": [{"name": "predicates"}, {"name": "nodeorder"}]}],
    }
    out = run([n], [*h, npu_job("p", 2)], config=plain)
    assert out["tasks"]["default/p-0"]["devices"] == ["Ascend910-3", "Ascend910-7"]


def test_eight_chips_take_a_whole_node_and_sixteen_take_two() -> None:
    nodes = [npu_node("n1"), npu_node("n2"), npu_node("n3")]
    out = run(nodes, [holder("h", "n2", [0]), npu_job("p", 8, 8)])
    assert sorted(out["binds"].values()) == ["n1", "n3"]
    for uid in ("default/p-0", "default/p-1"):
        assert out["tasks"][uid]["devices"] == [f"Ascend910-{i}" for i in range(8)]
    # One whole node left: the 8 x 2 gang waits whole.
    out = run(nodes[:2], [holder("h", "n2", [0]), npu_job("p", 8, 8)])
    assert out["binds"] == {}


@pytest.mark.parametrize(
    ("chips", "resource", "needle"),
    [
        ((3,), ASCEND, "asks 3 chips"),
        ((5,), ASCEND, "asks 5 chips"),
        ((2, 2), ASCEND, "one pod"),
        ((8, 4), ASCEND, "8 x N"),
        ((8, 4, 4), ASCEND, "every pod asks 8"),
        ((2,), "huawei.com/Ascend910-2c", "exactly 1 virtual NPU"),
    ],
)
def test_requests_the_rules_forbid_leave_the_job_unscheduled_with_a_reason(
    chips: tuple[int, ...], resource: str, needle: str
) -> None:
    node = npu_node("n1")
    node["allocatable"]["huawei.com/Ascend910-2c"] = 4
    out = run([node, npu_node("n2")], [npu_job("p", *chips, resource=resource)])
    assert out["binds"] == {}
    cond = out["jobs"]["default/p"]["conditions"][0]
    assert cond["type"] == "Unschedulable"
    assert cond["reason"] == "InvalidNPURequest"
    assert needle in cond["message"]


def test_one_virtual_npu_is_placed() -> None:
    node = npu_node("n1")
    node["allocatable"]["huawei.com/Ascend910-2c"] = 4
    out = run([node], [npu_job("p", 1, resource="huawei.com/Ascend910-2c")])
    assert out["binds"] == {"default/p-0": "n1"}
    assert out["tasks"]["default/p-0"]["devices"] == []  # a vNPU is a count, not a chip


def test_chips_are_never_given_twice_in_a_cycle_or_across_cycles() -> None:
    jobs = [npu_job(f"p{i}", 1) for i in range(8)]
    out = run([npu_node("n1")], jobs)
    given = [d for t in out["tasks"].values() for d in t["devices"]]
    assert sorted(given) == sorted(f"Ascend910-{i}" for i in range(8))
    # Packing: the first ring fills before the second is touched.
    order = [out["tasks"][f"default/p{i}-0"]["devices"][0] for i in range(8)]
    assert order[:4] == [f"Ascend910-{i}" for i in range(4)]
    # Two cycles: the second cycle's pods see the first's chips as held.
    out = run(
        [npu_node("n1")],
        [npu_job("a", 4), npu_job("b", 2), npu_job("c", 2), npu_job("d", 1)],
        cycles=2,
    )
    held = [d for t in out["tasks"].values() for d in t["devices"]]
    assert len(held) == len(set(held)) == 8


def test_chips_being_released_are_not_handed_out() -> None:
    # Ring 0 is held by a running pod, ring 1 by a releasing one: a 4-chip pod does not get ring 1,
    # not even pipelined (seed 002, 并发处理原则: "判断资源是否处于待释放状态。若是，则本次不分配").
    out = run(
        [npu_node("n1")],
        [
            holder("r", "n1", [0, 1, 2, 3]),
            holder("x", "n1", [4, 5, 6, 7], "Releasing"),
            npu_job("p", 4),
        ],
    )
    assert out["binds"] == {}
    assert out["pipelined"] == {}
    assert out["tasks"]["default/p-0"]["devices"] == []
    (condition,) = out["jobs"]["default/p"]["conditions"]
    assert "only with chips still being released" in condition["message"]


def test_chips_being_released_leave_the_pod_to_a_node_with_free_chips() -> None:
    # n1's ring 1 is being released (the better packing, were it free); n2 has a free ring: the pod
    # is bound there now rather than pipelined onto n1.
    out = run(
        [npu_node("n1"), npu_node("n2")],
        [
            holder("r", "n1", [0, 1, 2, 3]),
            holder("x", "n1", [4, 5, 6, 7], "Releasing"),
            holder("y", "n2", [0, 1, 2, 3]),
            npu_job("p", 4),
        ],
    )
    assert out["binds"] == {"default/p-0": "n2"}
    assert out["pipelined"] == {}
    assert out["tasks"]["default/p-0"]["devices"] == [f"Ascend910-{i}" for i in range(4, 8)]


def test_preemptor_waits_for_the_chips_this_session_frees() -> None:
    # The rule is about chips already being released when the session opens. Chips of a pod the
    # session evicts itself take the preemptor pipelined (eviction and pipelining are one decision);
    # without that no NPU job could ever preempt.
    config = {
        "actions": "allocate, preempt",
        "tiers": [
            {"plugins": [{"name": "priority"}, {"name": "gang"}, {"name": "conformance"}]},
            {
                "plugins": [
                    {"name": "predicates"},
                    {"name": "proportion"},
                    {"name": "nodeorder"},
                    {"name": "huaweiNPU"},
                ]
            },
        ],
    }
    low = holder("low", "n1", list(range(8)))
    low.update(priorityClass="low", minMember=-1)
    low["tasks"][0]["preemptable"] = True
    high = npu_job("high", 8)
    high["priorityClass"] = "high"
    out = simulate_text(
        yaml.safe_dump(
            {
                "config": config,
                "priorityClasses": [{"name": "low", "value": 1}, {"name": "high", "value": 1000}],
                "nodes": [npu_node("n1")],
                "jobs": [low, high],
            }
        )
    )
    assert out["evictions"] == ["default/low-0"]
    assert out["pipelined"] == {"default/high-0": "n1"}
    assert out["tasks"]["default/high-0"]["devices"] == [f"Ascend910-{i}" for i in range(8)]
