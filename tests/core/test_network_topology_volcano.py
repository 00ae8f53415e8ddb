"""network-topology-aware plugin: Volcano's cases, ported as a table of scenarios.

The first part runs the allocate_test.go cases ``TestAllocateWithNetWorkTopologies``,
``TestNodeLevelScoreWithNetWorkTopologies`` and ``TestHyperNodeBinpackWithNetWorkTopologies`` as
scenarios run through ``muster simulate``.

The checks are Volcano's: most cases only count binds (``MinimalBindCheck``: Volcano breaks ties
between equal nodes at random), a few name the node of each bind, and the hypernode-binpack case
counts binds per tier-1 hypernode. A hard-mode job must in addition stay inside one hypernode of
a tier its ``highestTierAllowed`` permits, which Volcano guarantees whatever the tie-break.
Volcano's ``highestTierName`` is written as the tier number its tier-name map gives.

Not ported (need the PodGroup-level allocated-hypernode annotation Muster does not model): the
"tasks in job rescheduled" cases 3-5, 11-16 and 20-24 of ``TestAllocateWithNetWorkTopologies``.

The second part checks node scores of plugins/network-topology-aware/network_topology_aware_test.go.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import yaml
from core_helpers import config, plugin, session, simulate

from server.model import TaskStatus
from server.simulate import parse_scenario_text

GANG = plugin("gang", "enableJobOrder", "enableJobReady", "enableJobPipelined", "enableJobStarving")
PREDICATES = plugin("predicates", "enablePredicate")
NETWORK_TOPOLOGY = plugin(
    "network-topology-aware", "enableNodeOrder", "enabledHyperNodeOrder", "enabledHyperNodeGradient"
)

ALLOCATE = config(["allocate"], [[GANG, PREDICATES, NETWORK_TOPOLOGY]])
NODE_LEVEL_SCORE = config(
    ["allocate"], [[GANG, PREDICATES, plugin("binpack", "enableNodeOrder"), NETWORK_TOPOLOGY]]
)
HYPERNODE_BINPACK = ALLOCATE


def hypernode_nodes(hypernodes: list[dict]) -> dict[str, set[str]]:
    """Every hypernode's set of real nodes."""
    by_name = {h["name"]: h for h in hypernodes}

    def nodes_of(name: str) -> set[str]:
        members = by_name[name]["members"]
        out = set(members.get("nodes", []))
        for child in members.get("hypernodes", []):
            out |= nodes_of(child)
        return out

    return {name: nodes_of(name) for name in by_name}


def assert_hard_jobs_confined(scenario: dict, binds: dict[str, str]) -> None:
    members = hypernode_nodes(scenario["hypernodes"])
    tiers = {h["name"]: h["tier"] for h in scenario["hypernodes"]}
    for job in scenario["jobs"]:
        topology = job.get("networkTopology") or {}
        if topology.get("mode") != "hard":
            continue
        placed = {
            node
            for task, node in binds.items()
            if task.startswith(f"{job['namespace']}/")
            and task.split("/", 1)[1] in {t["name"] for t in job["tasks"]}
        }
        if placed:
            assert any(
                tiers[h] <= topology["highestTierAllowed"] and placed <= nodes
                for h, nodes in members.items()
            ), (job["name"], placed)


CASES = [
    pytest.param(
        ALLOCATE,
        """
    # Volcano numbers these hypernode tiers from 0; Muster from 1 (shifted by one).
hypernodes:
- name: s0
  tier: 1
  members:
    nodes: [s0-n1, s0-n2]
- name: s1
  tier: 1
  members:
    nodes: [s1-n3, s1-n4]
- name: s2
  tier: 2
  members:
    hypernodes: [s0, s1]
nodes:
- name: s0-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s0-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n3
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n4
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 3
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G}
    role: master
  - name: p2
    request: {cpu: '2', memory: 4G}
    role: worker
  - name: p3
    request: {cpu: '2', memory: 4G}
    role: worker
  networkTopology: {mode: soft, highestTierAllowed: 0}
""",
        {"binds_num": 3},
        id="allocate-0-soft_network_topology_constrain_can_allocate_job_when_resources_are_en",  # TestAllocateWithNetWorkTopologies case 0: soft network topology constrain, can allocate job when resources are enough
    ),
    pytest.param(
        ALLOCATE,
        """
hypernodes:
- name: s0
  tier: 1
  members:
    nodes: [s0-n1, s0-n2]
- name: s1
  tier: 1
  members:
    nodes: [s1-n3, s1-n4]
- name: s2
  tier: 2
  members:
    hypernodes: [s0, s1]
nodes:
- name: s0-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s0-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n3
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n4
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 1
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G}
    role: master
  - name: p2
    request: {cpu: '2', memory: 4G}
    role: worker
  networkTopology: {mode: soft, highestTierAllowed: 0}
""",
        {"binds_num": 2},
        id="allocate-1-soft_network_topology_constrain_can_allocate_job_when_minavailable_rep",  # TestAllocateWithNetWorkTopologies case 1: soft network topology constrain, can allocate job when minavailable < replicas
    ),
    pytest.param(
        ALLOCATE,
        """
    # Volcano numbers these hypernode tiers from 0; Muster from 1 (shifted by one).
hypernodes:
- name: s0
  tier: 1
  members:
    nodes: [s0-n1]
- name: s1
  tier: 1
  members:
    nodes: [s1-n2]
nodes:
- name: s0-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {nodeRole: master}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 1
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G}
    role: master
    nodeSelector: {nodeRole: master}
  networkTopology: {mode: soft, highestTierAllowed: 0}
""",
        {"binds_num": 1, "bind_map": {"c1/p1": "s1-n2"}},
        id="allocate-2-soft_network_topology_constrain_two_available_hypernodes_can_allocate_",  # TestAllocateWithNetWorkTopologies case 2: soft network topology constrain, two available hyperNodes, can allocate job to nodes with affinity
    ),
    pytest.param(
        ALLOCATE,
        """
hypernodes:
- name: s0
  tier: 1
  members:
    nodes: [s0-n1, s0-n2]
- name: s1
  tier: 1
  members:
    nodes: [s1-n3, s1-n4]
- name: s2
  tier: 2
  members:
    hypernodes: [s0, s1]
nodes:
- name: s0-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s0-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n3
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n4
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 3
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G}
    role: master
  - name: p2
    request: {cpu: '2', memory: 4G}
    role: worker
  - name: p3
    request: {cpu: '2', memory: 4G}
    role: worker
  networkTopology: {mode: hard, highestTierAllowed: 1}
""",
        {"binds_num": 0},
        id="allocate-6-hard_network_topology_constrain_can_not_allocate_job_when_cross_highes",  # TestAllocateWithNetWorkTopologies case 6: hard network topology constrain, can not allocate job when cross highestTierAllowed tier
    ),
    pytest.param(
        ALLOCATE,
        """
hypernodes:
- name: s0
  tier: 1
  members:
    nodes: [s0-n1, s0-n2]
- name: s1
  tier: 1
  members:
    nodes: [s1-n3, s1-n4]
- name: s2
  tier: 2
  members:
    hypernodes: [s0, s1]
nodes:
- name: s0-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s0-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n3
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n4
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 3
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G}
    role: master
  - name: p2
    request: {cpu: '2', memory: 4G}
    role: worker
  - name: p3
    request: {cpu: '2', memory: 4G}
    role: worker
  networkTopology: {mode: hard, highestTierAllowed: 2}
""",
        {"binds_num": 3},
        id="allocate-7-hard_network_topology_constrain_can_allocate_job_when_highesttierallow",  # TestAllocateWithNetWorkTopologies case 7: hard network topology constrain, can allocate job when highestTierAllowed not reached
    ),
    pytest.param(
        ALLOCATE,
        """
hypernodes:
- name: s0
  tier: 1
  members:
    nodes: [s0-n1, s0-n2]
- name: s1
  tier: 1
  members:
    nodes: [s1-n3, s1-n4]
- name: s2
  tier: 2
  members:
    hypernodes: [s0, s1]
nodes:
- name: s0-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s0-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n3
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n4
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 2
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G}
    role: master
  - name: p2
    request: {cpu: '2', memory: 4G}
    role: worker
  networkTopology: {mode: hard, highestTierAllowed: 1}
""",
        {"binds_num": 2},
        id="allocate-8-hard_network_topology_constrain_can_allocate_job_when_multi_hypernodes",  # TestAllocateWithNetWorkTopologies case 8: hard network topology constrain, can allocate job when multi hyperNodes are available
    ),
    pytest.param(
        ALLOCATE,
        """
hypernodes:
- name: s0
  tier: 1
  members:
    nodes: [s0-n1, s0-n2]
- name: s1
  tier: 1
  members:
    nodes: [s1-n3, s1-n4]
- name: s2
  tier: 2
  members:
    hypernodes: [s0, s1]
nodes:
- name: s0-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s0-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n3
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n4
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 1
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G}
    role: master
  - name: p2
    request: {cpu: '2', memory: 4G}
    role: worker
  networkTopology: {mode: hard, highestTierAllowed: 1}
""",
        {"binds_num": 2},
        id="allocate-9-hard_network_topology_constrain_can_allocate_job_when_minavailable_rep",  # TestAllocateWithNetWorkTopologies case 9: hard network topology constrain, can allocate job when minavailable < replicas
    ),
    pytest.param(
        ALLOCATE,
        """
    # Volcano numbers these hypernode tiers from 0; Muster from 1 (shifted by one).
hypernodes:
- name: s0
  tier: 1
  members:
    nodes: [s0-n1]
- name: s1
  tier: 1
  members:
    nodes: [s1-n2]
nodes:
- name: s0-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {nodeRole: master}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 1
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G}
    role: master
    nodeSelector: {nodeRole: master}
  networkTopology: {mode: hard, highestTierAllowed: 2}
""",
        {"binds_num": 1, "bind_map": {"c1/p1": "s1-n2"}},
        id="allocate-10-hard_network_topology_constrain_two_available_hypernodes_can_allocate_",  # TestAllocateWithNetWorkTopologies case 10: hard network topology constrain, two available hyperNodes, can allocate job to nodes with affinity
    ),
    pytest.param(
        ALLOCATE,
        """
hypernodes:
- name: s0
  tier: 1
  members:
    nodes: [s0-n1, s0-n2]
- name: s1
  tier: 1
  members:
    nodes: [s1-n3, s1-n4]
- name: s2
  tier: 2
  members:
    hypernodes: [s0, s1]
nodes:
- name: s0-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s0-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n3
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n4
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 3
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G}
    role: master
  - name: p2
    request: {cpu: '2', memory: 4G}
    role: worker
  - name: p3
    request: {cpu: '2', memory: 4G}
    role: worker
  networkTopology: {mode: hard, highestTierAllowed: 1}
  x-highestTierName: volcano.sh/task-spec
""",
        {"binds_num": 0},
        id="allocate-17-hard_network_topology_constrain_can_not_allocate_job_when_cross_highes",  # TestAllocateWithNetWorkTopologies case 17: hard network topology constrain, can not allocate job when cross highestTierName tier
    ),
    pytest.param(
        ALLOCATE,
        """
hypernodes:
- name: s0
  tier: 1
  members:
    nodes: [s0-n1, s0-n2]
- name: s1
  tier: 1
  members:
    nodes: [s1-n3, s1-n4]
- name: s2
  tier: 2
  members:
    hypernodes: [s0, s1]
nodes:
- name: s0-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s0-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n3
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n4
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 3
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G}
    role: master
  - name: p2
    request: {cpu: '2', memory: 4G}
    role: worker
  - name: p3
    request: {cpu: '2', memory: 4G}
    role: worker
  networkTopology: {mode: hard, highestTierAllowed: 2}
  x-highestTierName: volcano.sh/job-spec
""",
        {"binds_num": 3},
        id="allocate-18-hard_network_topology_constrain_can_allocate_job_when_the_tier_corresp",  # TestAllocateWithNetWorkTopologies case 18: hard network topology constrain, can allocate job when the tier corresponding to highestTierName not reached
    ),
    pytest.param(
        ALLOCATE,
        """
hypernodes:
- name: s0
  tier: 1
  members:
    nodes: [s0-n1, s0-n2]
- name: s1
  tier: 1
  members:
    nodes: [s1-n3, s1-n4]
- name: s2
  tier: 2
  members:
    hypernodes: [s0, s1]
nodes:
- name: s0-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s0-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n3
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s1-n4
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 2
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G}
    role: master
  - name: p2
    request: {cpu: '2', memory: 4G}
    role: worker
  networkTopology: {mode: hard, highestTierAllowed: 1}
  x-highestTierName: volcano.sh/task-spec
""",
        {"binds_num": 2},
        id="allocate-19-hard_network_topology_constrain_can_allocate_job_when_multi_hypernodes",  # TestAllocateWithNetWorkTopologies case 19: hard network topology constrain, can allocate job when multi hyperNodes are available
    ),
    pytest.param(
        NODE_LEVEL_SCORE,
        """
hypernodes:
- name: s0
  tier: 1
  members:
    nodes: [s0-n1, s0-n2]
- name: s1
  tier: 1
  members:
    nodes: [s1-n3, s1-n4]
- name: s2
  tier: 2
  members:
    hypernodes: [s0, s1]
nodes:
- name: s0-n1
  allocatable: {cpu: '4', memory: 8Gi, pods: '10'}
  labels: {}
- name: s0-n2
  allocatable: {cpu: '8', memory: 16Gi, pods: '10'}
  labels: {}
- name: s1-n3
  allocatable: {cpu: '4', memory: 8Gi, pods: '10'}
  labels: {}
- name: s1-n4
  allocatable: {cpu: '8', memory: 16Gi, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 2
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4Gi}
    role: master
  - name: p2
    request: {cpu: '4', memory: 8Gi}
    role: worker
  networkTopology: {mode: hard, highestTierAllowed: 1}
- name: pg2
  namespace: c1
  queue: q1
  minMember: 2
  phase: Running
  tasks:
  - name: p3
    request: {cpu: '2', memory: 4Gi}
    role: master
    status: Running
    node: s0-n1
  - name: p4
    request: {cpu: '4', memory: 8Gi}
    role: worker
    status: Running
    node: s0-n2
""",
        {"binds_num": 2, "bind_map": {"c1/p1": "s0-n1", "c1/p2": "s0-n2"}},
        id="node_level_score-0-hard_network_topology_constrain_allocate_job_to_highest_score_hypenode",  # TestNodeLevelScoreWithNetWorkTopologies case 0: hard network topology constrain, allocate job to highest score hypeNode with node level binpack
    ),
    pytest.param(
        HYPERNODE_BINPACK,
        """
hypernodes:
- name: s0
  tier: 1
  members:
    nodes: [s0-n1, s0-n2]
- name: s1
  tier: 1
  members:
    nodes: [s1-n3, s1-n4]
- name: s2
  tier: 1
  members:
    nodes: [s2-n5, s2-n6]
- name: s3
  tier: 2
  members:
    hypernodes: [s0, s1, s2]
nodes:
- name: s0-n1
  allocatable: {cpu: '4', memory: 8Gi, pods: '10'}
  labels: {}
- name: s0-n2
  allocatable: {cpu: '4', memory: 8Gi, pods: '10'}
  labels: {}
- name: s1-n3
  allocatable: {cpu: '4', memory: 8Gi, pods: '10'}
  labels: {}
- name: s1-n4
  allocatable: {cpu: '4', memory: 8Gi, pods: '10'}
  labels: {}
- name: s2-n5
  allocatable: {cpu: '4', memory: 8Gi, pods: '10'}
  labels: {}
- name: s2-n6
  allocatable: {cpu: '4', memory: 8Gi, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 4
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '4', memory: 8Gi}
    role: master
  - name: p2
    request: {cpu: '4', memory: 8Gi}
    role: worker
  - name: p3
    request: {cpu: '4', memory: 8Gi}
    role: worker
  - name: p4
    request: {cpu: '4', memory: 8Gi}
    role: worker
  networkTopology: {mode: hard, highestTierAllowed: 2}
""",
        {"binds_num": 4, "per_tier1_hypernode": [2, 2]},
        id="hypernode_binpack-0-hard_network_topology_constrain_allocate_task_to_node_under_lcahyperno",  # TestHyperNodeBinpackWithNetWorkTopologies case 0: hard network topology constrain, allocate task to node under LCAHyperNode
    ),
]


@pytest.mark.parametrize(("tiers", "cluster", "expected"), CASES)
def test_volcano_network_topology_allocate(tiers: dict, cluster: str, expected: dict) -> None:
    scenario = yaml.safe_load(cluster)
    binds = simulate(tiers, **scenario)["binds"]
    assert len(binds) == expected["binds_num"]
    if "bind_map" in expected:
        assert binds == expected["bind_map"]
    if "per_tier1_hypernode" in expected:
        tier1 = {
            n: h
            for h, nodes in hypernode_nodes(scenario["hypernodes"]).items()
            for n in nodes
            if next(x for x in scenario["hypernodes"] if x["name"] == h)["tier"] == 1
        }
        assert (
            sorted(Counter(tier1[n] for n in binds.values()).values())
            == expected["per_tier1_hypernode"]
        )
    assert_hard_jobs_confined(scenario, binds)


# --- network_topology_aware_test.go: node scores ------------------------------------------------------
# TestNetworkTopologyAwareNodeScore_Hard / _Soft (the "first scheduler" case; the others need the
# PodGroup allocated-hypernode annotation) and TestBatchNodeOrderFn cases 0-3 (case 4 needs
# sub-group network-topology policies): the plugin's node_order score of the job's first pending
# task on each node, Volcano's tolerance 0.1. A node Volcano does not list scores 0.

SCORE_CASES = [
    pytest.param(
        {
            "name": "network-topology-aware",
            "enabledHyperNodeOrder": True,
            "enableNodeOrder": True,
            "enabledHyperNodeGradient": True,
            "arguments": {"weight": 1},
        },
        """
hypernodes:
- name: s0
  tier: 3
  members:
    hypernodes: [s1, s2]
- name: s1
  tier: 2
  members:
    hypernodes: [s3, s4]
- name: s2
  tier: 2
  members:
    hypernodes: [s5, s6]
- name: s3
  tier: 1
  members:
    nodes: [s3-n1, s3-n2]
- name: s4
  tier: 1
  members:
    nodes: [s4-n1, s4-n2]
- name: s5
  tier: 1
  members:
    nodes: [s5-n1, s5-n2]
- name: s6
  tier: 1
  members:
    nodes: [s6-n1, s6-n2]
nodes:
- name: s3-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s3-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s4-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s4-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s5-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s5-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s6-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s6-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 1
  phase: Inqueue
  tasks:
  - name: p4
    request: {cpu: '2', memory: 4G}
    role: worker
  networkTopology: {mode: hard, highestTierAllowed: 0}
""",
        ["s3-n1", "s4-n1", "s5-n1"],
        {"s3-n1": 0.0, "s4-n1": 0.0, "s5-n1": 0.0},
        id="networktopologyawarenodescore_hard_0_tasks_in_job_first_scheduler_score_all_nodes_zero",  # TestNetworkTopologyAwareNodeScore_Hard case 0: Tasks in job first scheduler, score all nodes zero
    ),
    pytest.param(
        {
            "name": "network-topology-aware",
            "enabledHyperNodeOrder": True,
            "enableNodeOrder": True,
            "enabledHyperNodeGradient": True,
            "arguments": {"weight": 1},
        },
        """
hypernodes:
- name: s0
  tier: 3
  members:
    hypernodes: [s1, s2]
- name: s1
  tier: 2
  members:
    hypernodes: [s3, s4]
- name: s2
  tier: 2
  members:
    hypernodes: [s5, s6]
- name: s3
  tier: 1
  members:
    nodes: [s3-n1, s3-n2]
- name: s4
  tier: 1
  members:
    nodes: [s4-n1, s4-n2]
- name: s5
  tier: 1
  members:
    nodes: [s5-n1, s5-n2]
- name: s6
  tier: 1
  members:
    nodes: [s6-n1, s6-n2]
nodes:
- name: s3-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s3-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s4-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s4-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s5-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s5-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s6-n1
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
- name: s6-n2
  allocatable: {cpu: '2', memory: 4Gi, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: c1
  queue: q1
  minMember: 1
  phase: Inqueue
  tasks:
  - name: p4
    request: {cpu: '2', memory: 4G}
    role: worker
  networkTopology: {mode: soft, highestTierAllowed: 0}
""",
        ["s3-n1", "s4-n1", "s5-n1"],
        {"s3-n1": 0.0, "s4-n1": 0.0, "s5-n1": 0.0},
        id="networktopologyawarenodescore_soft_0_tasks_in_job_first_scheduler_score_all_nodes_zero",  # TestNetworkTopologyAwareNodeScore_Soft case 0: Tasks in job first scheduler, score all nodes zero
    ),
    pytest.param(
        {
            "name": "network-topology-aware",
            "enableNodeOrder": True,
            "arguments": {"hypernode.binpack.normal-pod.enable": False},
        },
        """
hypernodes:
- name: s0
  tier: 3
  members:
    hypernodes: [s1, s2]
- name: s1
  tier: 2
  members:
    hypernodes: [s3, s4]
- name: s2
  tier: 2
  members:
    hypernodes: [s5, s6]
- name: s3
  tier: 1
  members:
    nodes: [s3-n1, s3-n2]
- name: s4
  tier: 1
  members:
    nodes: [s4-n1, s4-n2]
- name: s5
  tier: 1
  members:
    nodes: [s5-n1, s5-n2]
- name: s6
  tier: 1
  members:
    nodes: [s6-n1, s6-n2]
nodes:
- name: s3-n1
  allocatable: {cpu: '2', memory: 4G, pods: '10'}
  labels: {}
- name: s3-n2
  allocatable: {cpu: '2', memory: 4G, pods: '10'}
  labels: {}
- name: s4-n1
  allocatable: {cpu: '4', memory: 4G, pods: '10'}
  labels: {}
- name: s4-n2
  allocatable: {cpu: '4', memory: 4G, pods: '10'}
  labels: {}
- name: s5-n1
  allocatable: {cpu: '2', memory: 8G, pods: '10'}
  labels: {}
- name: s5-n2
  allocatable: {cpu: '2', memory: 8G, pods: '10'}
  labels: {}
- name: s6-n1
  allocatable: {cpu: '4', memory: 8G, pods: '10'}
  labels: {}
- name: s6-n2
  allocatable: {cpu: '4', memory: 8G, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: ns1
  queue: q1
  minMember: 1
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G}
""",
        None,
        {},
        id="batchnodeorderfn_0_score_empty_nodes_for_single_task_with_no_network_topology_and_no_hyper",  # TestBatchNodeOrderFn case 0: score empty nodes for single task with no network topology and no hypernode-level binpacking
    ),
    pytest.param(
        {"name": "network-topology-aware", "enableNodeOrder": True},
        """
hypernodes:
- name: s0
  tier: 3
  members:
    hypernodes: [s1, s2]
- name: s1
  tier: 2
  members:
    hypernodes: [s3, s4]
- name: s2
  tier: 2
  members:
    hypernodes: [s5, s6]
- name: s3
  tier: 1
  members:
    nodes: [s3-n1, s3-n2]
- name: s4
  tier: 1
  members:
    nodes: [s4-n1, s4-n2]
- name: s5
  tier: 1
  members:
    nodes: [s5-n1, s5-n2]
- name: s6
  tier: 1
  members:
    nodes: [s6-n1, s6-n2]
nodes:
- name: s3-n1
  allocatable: {cpu: '2', memory: 4G, pods: '10'}
  labels: {}
- name: s3-n2
  allocatable: {cpu: '2', memory: 4G, pods: '10'}
  labels: {}
- name: s4-n1
  allocatable: {cpu: '4', memory: 4G, pods: '10'}
  labels: {}
- name: s4-n2
  allocatable: {cpu: '4', memory: 4G, pods: '10'}
  labels: {}
- name: s5-n1
  allocatable: {cpu: '2', memory: 8G, pods: '10'}
  labels: {}
- name: s5-n2
  allocatable: {cpu: '2', memory: 8G, pods: '10'}
  labels: {}
- name: s6-n1
  allocatable: {cpu: '4', memory: 8G, pods: '10'}
  labels: {}
- name: s6-n2
  allocatable: {cpu: '4', memory: 8G, pods: '10'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: ns1
  queue: q1
  minMember: 1
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G}
""",
        None,
        {
            "s3-n1": 25.8,
            "s3-n2": 25.8,
            "s4-n1": 21.6,
            "s4-n2": 21.6,
            "s5-n1": 19.9,
            "s5-n2": 19.9,
            "s6-n1": 15.7,
            "s6-n2": 15.7,
        },
        id="batchnodeorderfn_1_score_empty_nodes_for_single_task_with_no_network_topology_and_default_",  # TestBatchNodeOrderFn case 1: score empty nodes for single task with no network topology and default plugin arguments
    ),
    pytest.param(
        {
            "name": "network-topology-aware",
            "enableNodeOrder": True,
            "arguments": {
                "weight": 10,
                "hypernode.binpack.cpu": 1,
                "hypernode.binpack.memory": 4,
                "hypernode.binpack.resources": "nvidia.com/gpu, example.com/foo",
                "hypernode.binpack.resources.nvidia.com/gpu": 2,
                "hypernode.binpack.resources.example.com/foo": 3,
                "hypernode.binpack.normal-pod.enable": True,
                "hypernode.binpack.normal-pod.fading": 0,
            },
        },
        """
hypernodes:
- name: s0
  tier: 3
  members:
    hypernodes: [s1, s2]
- name: s1
  tier: 2
  members:
    hypernodes: [s3, s4]
- name: s2
  tier: 2
  members:
    hypernodes: [s5, s6]
- name: s3
  tier: 1
  members:
    nodes: [s3-n1, s3-n2]
- name: s4
  tier: 1
  members:
    nodes: [s4-n1, s4-n2]
- name: s5
  tier: 1
  members:
    nodes: [s5-n1, s5-n2]
- name: s6
  tier: 1
  members:
    nodes: [s6-n1, s6-n2]
nodes:
- name: s3-n1
  allocatable: {cpu: '2', memory: 4G, pods: '10', example.com/foo: '8'}
  labels: {}
- name: s3-n2
  allocatable: {cpu: '2', memory: 4G, pods: '10', example.com/foo: '8'}
  labels: {}
- name: s4-n1
  allocatable: {cpu: '4', memory: 4G, pods: '10', example.com/foo: '8'}
  labels: {}
- name: s4-n2
  allocatable: {cpu: '4', memory: 4G, pods: '10', example.com/foo: '8'}
  labels: {}
- name: s5-n1
  allocatable: {cpu: '2', memory: 8G, pods: '10', example.com/foo: '16'}
  labels: {}
- name: s5-n2
  allocatable: {cpu: '2', memory: 8G, pods: '10', example.com/foo: '16'}
  labels: {}
- name: s6-n1
  allocatable: {cpu: '4', memory: 8G, pods: '10', example.com/foo: '16'}
  labels: {}
- name: s6-n2
  allocatable: {cpu: '4', memory: 8G, pods: '10', example.com/foo: '16'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: ns1
  queue: q1
  minMember: 1
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G, example.com/foo: '8'}
""",
        None,
        {
            "s3-n1": 500.0,
            "s3-n2": 500.0,
            "s4-n1": 468.75,
            "s4-n2": 468.75,
            "s5-n1": 281.3,
            "s5-n2": 281.3,
            "s6-n1": 250.0,
            "s6-n2": 250.0,
        },
        id="batchnodeorderfn_2_score_empty_nodes_for_single_task_with_no_network_topology_and_customiz",  # TestBatchNodeOrderFn case 2: score empty nodes for single task with no network topology and customized plugin arguments
    ),
    pytest.param(
        {
            "name": "network-topology-aware",
            "enableNodeOrder": True,
            "arguments": {
                "weight": 10,
                "hypernode.binpack.cpu": 1,
                "hypernode.binpack.memory": 4,
                "hypernode.binpack.resources": "nvidia.com/gpu, example.com/foo",
                "hypernode.binpack.resources.nvidia.com/gpu": 2,
                "hypernode.binpack.resources.example.com/foo": 3,
                "hypernode.binpack.normal-pod.enable": True,
                "hypernode.binpack.normal-pod.fading": 0,
            },
        },
        """
hypernodes:
- name: s0
  tier: 3
  members:
    hypernodes: [s1, s2]
- name: s1
  tier: 2
  members:
    hypernodes: [s3, s4]
- name: s2
  tier: 2
  members:
    hypernodes: [s5, s6]
- name: s3
  tier: 1
  members:
    nodes: [s3-n1, s3-n2]
- name: s4
  tier: 1
  members:
    nodes: [s4-n1, s4-n2]
- name: s5
  tier: 1
  members:
    nodes: [s5-n1, s5-n2]
- name: s6
  tier: 1
  members:
    nodes: [s6-n1, s6-n2]
nodes:
- name: s3-n1
  allocatable: {cpu: '2', memory: 4G, pods: '10', example.com/foo: '8'}
  labels: {}
- name: s3-n2
  allocatable: {cpu: '2', memory: 4G, pods: '10', example.com/foo: '8'}
  labels: {}
- name: s4-n1
  allocatable: {cpu: '4', memory: 4G, pods: '10', example.com/foo: '8'}
  labels: {}
- name: s4-n2
  allocatable: {cpu: '4', memory: 4G, pods: '10', example.com/foo: '8'}
  labels: {}
- name: s5-n1
  allocatable: {cpu: '2', memory: 8G, pods: '10', example.com/foo: '16'}
  labels: {}
- name: s5-n2
  allocatable: {cpu: '2', memory: 8G, pods: '10', example.com/foo: '16'}
  labels: {}
- name: s6-n1
  allocatable: {cpu: '4', memory: 8G, pods: '10', example.com/foo: '16'}
  labels: {}
- name: s6-n2
  allocatable: {cpu: '4', memory: 8G, pods: '10', example.com/foo: '16'}
  labels: {}
queues:
- {name: q1, weight: 1}
jobs:
- name: pg1
  namespace: ns1
  queue: q1
  minMember: 1
  phase: Inqueue
  tasks:
  - name: p1
    request: {cpu: '2', memory: 4G, example.com/foo: '8'}
  - name: p2
    request: {cpu: '2', memory: 4G, example.com/foo: '8'}
    status: Running
    node: s3-n1
  - name: p3
    request: {cpu: '2', memory: 4G, example.com/foo: '8'}
    status: Running
    node: s3-n2
""",
        None,
        {
            "s3-n1": 0.0,
            "s3-n2": 0.0,
            "s4-n1": 468.8,
            "s4-n2": 468.8,
            "s5-n1": 281.3,
            "s5-n2": 281.3,
            "s6-n1": 250.0,
            "s6-n2": 250.0,
        },
        id="batchnodeorderfn_3_score_non_empty_nodes_for_single_task_with_no_network_topology_and_cust",  # TestBatchNodeOrderFn case 3: score non-empty nodes for single task with no network topology and customized plugin arguments
    ),
]


@pytest.mark.parametrize(("entry", "cluster", "score_nodes", "expected"), SCORE_CASES)
def test_volcano_network_topology_node_scores(
    entry: dict, cluster: str, score_nodes: list[str] | None, expected: dict[str, float]
) -> None:
    switches = {k: v for k, v in entry.items() if k.startswith("enable")}
    tier = [{"name": "network-topology-aware", **switches, "arguments": entry.get("arguments", {})}]
    ssn = session(parse_scenario_text(cluster).snapshot, config(None, [tier]))
    task = next(
        t for job in ssn.jobs.values() for t in job.tasks.values() if t.status == TaskStatus.PENDING
    )
    names = score_nodes or list(ssn.nodes.names)
    rows = np.array([ssn.nodes.index[name] for name in names])
    scores = dict(zip(names, ssn.evaluator.scores(task, rows), strict=True))
    for name in names:
        assert scores[name] == pytest.approx(expected.get(name, 0.0), abs=0.1), name
