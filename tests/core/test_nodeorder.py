"""nodeorder plugin: Volcano's plugins/nodeorder/nodeorder_test.go (``TestNodeOrderPlugin``) as
allocate scenarios, each weighing one kube-scheduler score (the other weights 0, as the Volcano
test passes every weight explicitly)."""

from __future__ import annotations

import pytest
from core_helpers import simulate_yaml

WEIGHTS = (
    "leastrequested",
    "mostrequested",
    "balancedresource",
    "nodeaffinity",
    "tainttoleration",
    "podaffinity",
    "podtopologyspread",
    "imagelocality",
)


def run(weights: dict[str, int], cluster: str) -> dict:
    args = ", ".join(f"{w}.weight: {weights.get(w, 0)}" for w in WEIGHTS)
    config = f"""
config:
  actions: [allocate]
  extension_points_not_listed: disabled
  tiers:
  - plugins:
    - {{name: gang, enableJobReady: true}}
    - {{name: nodeorder, enableNodeOrder: true, arguments: {{{args}}}}}
"""
    return simulate_yaml(config, cluster)


ONE_POD_TWO_SIZES = """
        nodes:
        - {name: n1, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}
        - {name: n2, allocatable: {cpu: "4", memory: 8Gi, pods: 10}}
        queues: [{name: c1}]
        jobs:
        - {name: pg1, namespace: c1, queue: c1, minMember: 1, phase: Inqueue,
           tasks: [{name: p1, request: {cpu: "1", memory: 1G}}]}
"""


@pytest.mark.parametrize(
    ("weights", "node"),
    [({"leastrequested": 1}, "n2"), ({"mostrequested": 1}, "n1")],
    ids=["leastAllocated strategy", "mostAllocated strategy"],
)
def test_least_and_most_requested(weights: dict[str, int], node: str) -> None:
    """TestNodeOrderPlugin "leastAllocated strategy" / "mostAllocated strategy"."""
    assert run(weights, ONE_POD_TWO_SIZES)["binds"] == {"c1/p1": node}


def test_balanced_allocation_prefers_balanced_node() -> None:
    """TestNodeOrderPlugin "balanced allocation prefers balanced node"."""
    out = run(
        {"balancedresource": 10},
        """
        nodes:
        - {name: n1, allocatable: {cpu: "2", memory: 2Gi, pods: 10}}
        - {name: n2, allocatable: {cpu: "4", memory: 2Gi, pods: 10}}
        queues: [{name: c1}]
        jobs:
        - {name: pg1, namespace: c1, queue: c1, minMember: 1, phase: Inqueue,
           tasks: [{name: p1, request: {cpu: "1", memory: 1Gi}}]}
    """,
    )
    assert out["binds"] == {"c1/p1": "n1"}


def test_node_affinity_prefers_labeled_node() -> None:
    """TestNodeOrderPlugin "node affinity prefers labeled node" (n2 sorts after n1, so the winner
    is not a tie-break; the reverse labelling is checked too)."""
    for zone1_node in ("n1", "n2"):
        other = "n2" if zone1_node == "n1" else "n1"
        out = run(
            {"nodeaffinity": 10},
            f"""
            nodes:
            - {{name: {zone1_node}, allocatable: {{cpu: "2", memory: 4Gi, pods: 10}}, labels: {{zone: zone1}}}}
            - {{name: {other}, allocatable: {{cpu: "2", memory: 4Gi, pods: 10}}, labels: {{zone: zone2}}}}
            queues: [{{name: c1}}]
            jobs:
            - name: pg1
              namespace: c1
              queue: c1
              minMember: 1
              phase: Inqueue
              tasks:
              - name: p1
                request: {{cpu: "1", memory: 1G}}
                affinity:
                  nodeAffinity:
                    preferredDuringSchedulingIgnoredDuringExecution:
                    - weight: 100
                      preference: {{matchExpressions: [{{key: zone, operator: In, values: [zone1]}}]}}
        """,
        )
        assert out["binds"] == {"c1/p1": zone1_node}


def test_taint_toleration_prefers_node_without_prefer_no_schedule_taint() -> None:
    """TestNodeOrderPlugin "taint toleration prefers non-tainted node" (the tainted node is named
    first so that a tie would pick it)."""
    out = run(
        {"tainttoleration": 10},
        """
        nodes:
        - {name: n0, allocatable: {cpu: "2", memory: 4Gi, pods: 10},
           taints: [{key: key1, value: value1, effect: PreferNoSchedule}]}
        - {name: n1, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}
        queues: [{name: c1}]
        jobs:
        - {name: pg1, namespace: c1, queue: c1, minMember: 1, phase: Inqueue,
           tasks: [{name: p1, request: {cpu: "1", memory: 1G}}]}
    """,
    )
    assert out["binds"] == {"c1/p1": "n1"}


def test_inter_pod_affinity_prefers_node_with_matching_pod() -> None:
    """TestNodeOrderPlugin "inter-pod affinity prefers node with matching pod": a running pod with
    service=s1 on n2 attracts p2; a noise pod (service=s2) on n3 does not (the winner is not the
    first node by name, so this is not a tie-break)."""
    out = run(
        {"podaffinity": 10},
        """
        nodes:
        - {name: n1, allocatable: {cpu: "2", memory: 4Gi, pods: 10}, labels: {kubernetes.io/hostname: n1}}
        - {name: n2, allocatable: {cpu: "2", memory: 4Gi, pods: 10}, labels: {kubernetes.io/hostname: n2}}
        - {name: n3, allocatable: {cpu: "2", memory: 4Gi, pods: 10}, labels: {kubernetes.io/hostname: n3}}
        queues: [{name: c1}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 1
          phase: Inqueue
          tasks:
          - {name: p1, request: {cpu: "1", memory: 1G}, status: Running, node: n2, labels: {service: s1}}
          - {name: p-noise, request: {cpu: "1", memory: 1G}, status: Running, node: n3, labels: {service: s2}}
          - name: p2
            request: {cpu: "1", memory: 1G}
            affinity:
              podAffinity:
                preferredDuringSchedulingIgnoredDuringExecution:
                - weight: 100
                  podAffinityTerm:
                    labelSelector: {matchLabels: {service: s1}}
                    topologyKey: kubernetes.io/hostname
    """,
    )
    assert out["binds"] == {"c1/p2": "n2"}


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
