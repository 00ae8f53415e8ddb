"""shuffle action: Volcano's ``actions/shuffle/shuffle_test.go`` ("select pods with low priority
and evict them") with a test plugin registering a victim function, plus the victim combination rule
the action relies on (union within a tier, first tier with victims decides)."""

from __future__ import annotations

import pytest
from core_helpers import (
    PRIORITY_CLASSES,
    config,
    evicted,
    pg,
    plugin,
    pod,
    res,
    scenario_node,
    scenario_queue,
    simulate,
    uid,
)

from muster.gang import NO_GANG_MINIMUM
from server.plugins import PLUGINS
from server.plugins.base import Plugin

LOW, HIGH = 10, 100


def _victim_plugin(name: str, pick):
    class VictimPlugin(Plugin):
        def on_session_open(self, ssn) -> None:
            ssn.register("victim", self.name, [lambda tasks: [t for t in tasks if pick(t)]])

    VictimPlugin.name = name
    return VictimPlugin


@pytest.fixture
def victim_plugins(monkeypatch):
    plugins = {
        "fake": _victim_plugin("fake", lambda t: t.priority == LOW),
        "fake-node2": _victim_plugin("fake-node2", lambda t: t.node == "node2"),
        "fake-none": _victim_plugin("fake-none", lambda t: False),
    }
    for name, cls in plugins.items():
        monkeypatch.setitem(PLUGINS, name, cls)
    return plugins


def shuffle(tiers, nodes, queues, jobs, *, actions=("shuffle",), listed_only=True):
    """One cycle of ``actions`` under ``tiers``, with Volcano's test priority classes."""
    return simulate(
        config(list(actions), tiers, listed_only=listed_only),
        nodes,
        queues,
        jobs,
        priority_classes=PRIORITY_CLASSES,
    )


def _cluster() -> tuple[list, list, list]:
    nodes = [scenario_node("node1", res("4", "8Gi")), scenario_node("node2", res("4", "8Gi"))]
    jobs = [
        pg(
            "pg1",
            "default",
            NO_GANG_MINIMUM,
            [
                pod("pod1-1", res("1", "2G"), "node1", priority=LOW),
                pod("pod1-2", res("1", "2G"), "node1", priority=HIGH),
                pod("pod1-3", res("1", "2G"), "node1", priority=HIGH),
            ],
            phase="Running",
        ),
        pg(
            "pg2",
            "default",
            NO_GANG_MINIMUM,
            [
                pod("pod2-1", res("1", "2G"), "node1", priority=LOW),
                pod("pod2-2", res("1", "2G"), "node2", priority=HIGH),
            ],
            phase="Running",
        ),
        pg(
            "pg3",
            "default",
            NO_GANG_MINIMUM,
            [
                pod("pod3-1", res("1", "2G"), "node2", priority=LOW),
                pod("pod3-2", res("1", "2G"), "node2", priority=HIGH),
            ],
            phase="Running",
        ),
    ]
    return nodes, [scenario_queue("default")], jobs


def test_evicts_the_victims_plugins_select(victim_plugins) -> None:
    """'select pods with low priority and evict them': the three low-priority pods go, each with
    reason shuffle, and nothing else changes."""
    out = shuffle([[plugin("fake", "enabledVictim")]], *_cluster())
    assert evicted(out) == {uid("pod1-1"), uid("pod2-1"), uid("pod3-1")}
    assert out["tasks"][uid("pod1-1")]["status"] == "Releasing"
    assert out["tasks"][uid("pod1-2")]["status"] == "Running"
    assert out["binds"] == {}
    assert out["pipelined"] == {}


def test_victim_switch_off_evicts_nothing(victim_plugins) -> None:
    """enabledVictim is the plugin's switch for the point: off, its functions are not asked."""
    out = shuffle([[plugin("fake")]], *_cluster())
    assert evicted(out) == set()


def test_union_within_a_tier(victim_plugins) -> None:
    out = shuffle(
        [[plugin("fake", "enabledVictim"), plugin("fake-node2", "enabledVictim")]], *_cluster()
    )
    assert evicted(out) == {
        uid("pod1-1"),
        uid("pod2-1"),
        uid("pod2-2"),
        uid("pod3-1"),
        uid("pod3-2"),
    }


def test_first_tier_with_victims_decides(victim_plugins) -> None:
    out = shuffle(
        [
            [plugin("fake-none", "enabledVictim")],
            [plugin("fake-node2", "enabledVictim")],
            [plugin("fake", "enabledVictim")],
        ],
        *_cluster(),
    )
    assert evicted(out) == {uid("pod2-2"), uid("pod3-1"), uid("pod3-2")}


def test_only_running_tasks_are_offered(victim_plugins) -> None:
    nodes, queues, jobs = _cluster()
    jobs[0]["tasks"][0]["status"] = "Bound"
    out = shuffle([[plugin("fake", "enabledVictim")]], nodes, queues, jobs)
    assert evicted(out) == {uid("pod2-1"), uid("pod3-1")}


def test_evicted_resources_are_released_for_later_actions(victim_plugins) -> None:
    """Shuffle's evictions are committed at once, so a later allocate in the same cycle sees the
    released resources as future idle and pipelines onto them."""
    nodes = [scenario_node("node1", res("1", "2Gi"))]
    jobs = [
        pg(
            "old",
            "default",
            1,
            [pod("old-1", res("1", "1Gi"), "node1", priority=LOW)],
            phase="Running",
        ),
        pg("new", "default", 1, [pod("new-1", res("1", "1Gi"), priority=HIGH)]),
    ]
    out = shuffle(
        [
            [
                plugin("fake", "enabledVictim"),
                plugin("gang"),
                plugin("proportion"),
                plugin("predicates"),
            ]
        ],
        nodes,
        [scenario_queue("default")],
        jobs,
        actions=["shuffle", "allocate"],
        listed_only=False,
    )
    assert evicted(out) == {uid("old-1")}
    assert out["pipelined"] == {uid("new-1"): "node1"}
