"""Hard network topology: the allocate action tries the whole gang in every eligible hypernode of a
tier and keeps the best (Volcano allocate.allocateForJob with the network-topology-aware
plugin's hypernode gradients and hypernode order)."""

from __future__ import annotations

from server.simulate import simulate_text

SCENARIO = """
config:
  actions: "enqueue, allocate"
  tiers:
  - plugins: [{name: priority}, {name: gang}]
  - plugins: [{name: predicates}, {name: nodeorder}, {name: network-topology-aware}]
hypernodes:
- {name: s0, tier: 1, members: {nodes: [n1, n2]}}
- {name: s1, tier: 1, members: {nodes: [n3, n4]}}
- {name: s2, tier: 2, members: {hypernodes: [s0, s1]}}
nodes:
- {name: n1, allocatable: {cpu: "6", memory: 16Gi}}
- {name: n2, allocatable: {cpu: "8", memory: 16Gi}}
- {name: n3, allocatable: {cpu: "4", memory: 16Gi}}
- {name: n4, allocatable: {cpu: "4", memory: 16Gi}}
queues: [{name: q1}]
jobs:
- name: busy
  namespace: ns
  queue: q1
  phase: Running
  tasks:
  - {name: busy-0, request: {cpu: "6"}, status: Running, node: n2}
- name: pg
  namespace: ns
  queue: q1
  minMember: 2
  phase: Inqueue
  networkTopology: {mode: hard, highestTierAllowed: TIER}
  tasks:
  - {name: p0, request: {cpu: "4"}}
  - {name: p1, request: {cpu: "4"}}
"""


def test_gang_goes_to_the_tier1_hypernode_that_holds_it_whole() -> None:
    # Greedy placement would start on n1 (emptiest) and then find no room in s0 (n2 is busy);
    # trying each hypernode for the whole gang finds s1.
    out = simulate_text(SCENARIO.replace("TIER", "1"))
    assert sorted(out["binds"].values()) == ["n3", "n4"]


def test_gang_that_fits_no_allowed_hypernode_is_not_placed() -> None:
    out = simulate_text(
        SCENARIO.replace("TIER", "1").replace(
            'cpu: "4", memory: 16Gi}}\n- {name: n4', 'cpu: "2", memory: 16Gi}}\n- {name: n4'
        )
    )
    assert out["binds"] == {}
    assert out["jobs"]["ns/pg"]["conditions"][0]["type"] == "Unschedulable"


def test_higher_allowed_tier_lets_the_gang_span_hypernodes() -> None:
    text = SCENARIO.replace("TIER", "2").replace(
        'cpu: "4", memory: 16Gi}}\n- {name: n4', 'cpu: "2", memory: 16Gi}}\n- {name: n4'
    )
    out = simulate_text(text)
    assert len(out["binds"]) == 2
    assert "n3" not in out["binds"].values()


def test_soft_mode_is_not_confined() -> None:
    text = SCENARIO.replace(
        "mode: hard, highestTierAllowed: TIER", "mode: soft, highestTierAllowed: 1"
    ).replace('cpu: "4", memory: 16Gi}}\n- {name: n4', 'cpu: "2", memory: 16Gi}}\n- {name: n4')
    out = simulate_text(text)
    assert len(out["binds"]) == 2
