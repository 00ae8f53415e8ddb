"""nodeorder plugin: Volcano's default weights as an allocate scenario. The cases of
plugins/nodeorder/nodeorder_test.go (``TestNodeOrderPlugin``, each weighing one kube-scheduler
score) are scenario files under tests/scenarios/volcano/nodeorder/, run by
test_volcano_cases.py."""

from __future__ import annotations

from core_helpers import simulate_yaml


def test_default_weights_spread_by_least_requested() -> None:
    """Volcano's default nodeorder weights (leastrequested 1, balancedresource 1, ...): of an
    emptier and a busier node of the same size the emptier wins."""
    out = simulate_yaml("""
        config:
          actions: [allocate]
          tiers:
          - plugins: [{name: gang}, {name: predicates}, {name: nodeorder}]
        nodes:
        - {name: a, allocatable: {cpu: "4", memory: 8Gi, pods: 10}}
        - {name: b, allocatable: {cpu: "4", memory: 8Gi, pods: 10}}
        queues: [{name: q}]
        jobs:
        - {name: busy, namespace: ns, queue: q, minMember: 1, phase: Running,
           tasks: [{name: x, request: {cpu: "2", memory: 4Gi}, status: Running, node: a}]}
        - {name: new, namespace: ns, queue: q, minMember: 1, phase: Inqueue,
           tasks: [{name: y, request: {cpu: "1", memory: 1Gi}}]}
    """)
    assert out["binds"] == {"ns/y": "b"}
