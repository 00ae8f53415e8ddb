"""network-topology-aware plugin: the node scores of Volcano's
plugins/network-topology-aware/network_topology_aware_test.go, read from a session (a scenario's
output has no scores, so these stay here).

The allocate_test.go cases ``TestAllocateWithNetWorkTopologies``,
``TestNodeLevelScoreWithNetWorkTopologies`` and ``TestHyperNodeBinpackWithNetWorkTopologies`` are
scenario files under tests/scenarios/volcano/allocate/, run by test_volcano_cases.py (see the
README there for the cases not ported).
"""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import config, session

from server.model import TaskStatus
from server.simulate import parse_scenario_text

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
