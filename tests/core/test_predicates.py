"""predicates plugin: the kube-scheduler filters predicates.go wraps (node unschedulable, selector
/ required node affinity, taints, pod count, pod (anti-)affinity) with their failure reasons, as
scenarios. The cases of Volcano's plugins/predicates/predicates_test.go (``TestEventHandler``,
``TestNodeNum``, ``TestPodAntiAffinity``) are scenario files under
tests/scenarios/volcano/predicates/, run by test_volcano_cases.py."""

from __future__ import annotations

from core_helpers import simulate_yaml

ANTI_WORKER = """
            affinity:
              podAntiAffinity:
                requiredDuringSchedulingIgnoredDuringExecution:
                - labelSelector: {matchExpressions: [{key: role, operator: In, values: [worker]}]}
                  topologyKey: kubernetes.io/hostname"""


PREDICATES_ONLY = """
config:
  actions: [allocate]
  tiers:
  - plugins: [{name: gang}, {name: predicates}]
"""


def single_task(task_yaml: str, nodes_yaml: str) -> dict:
    return simulate_yaml(
        PREDICATES_ONLY,
        nodes_yaml
        + """
        queues: [{name: q}]
        jobs:
        - name: j
          namespace: ns
          queue: q
          minMember: 1
          phase: Inqueue
          tasks:
    """
        + task_yaml,
    )


def test_unschedulable_node_is_filtered() -> None:
    """nodeunschedulable: a cordoned node takes nothing; the reason is counted."""
    out = single_task(
        """
          - {name: t, request: {cpu: "1"}}
    """,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "4", pods: 10}, unschedulable: true}
    """,
    )
    assert out["binds"] == {}
    assert "1 node(s) were unschedulable" in out["jobs"]["ns/j"]["conditions"][0]["message"]


def test_taints_filter_unless_tolerated() -> None:
    """tainttoleration: NoSchedule / NoExecute taints filter, PreferNoSchedule does not; a
    matching toleration (Exists, or Equal with the value) lets the task in."""
    nodes = """
        nodes:
        - {name: a, allocatable: {cpu: "4", pods: 10}, taints: [{key: gpu, value: reserved, effect: NoSchedule}]}
        - {name: b, allocatable: {cpu: "4", pods: 10}, taints: [{key: maint, value: "", effect: NoExecute}]}
    """
    blocked = single_task(
        """
          - {name: t, request: {cpu: "1"}}
    """,
        nodes,
    )
    assert blocked["binds"] == {}
    msg = blocked["jobs"]["ns/j"]["conditions"][0]["message"]
    assert "node(s) had untolerated taint {gpu: reserved}" in msg
    tolerated = single_task(
        """
          - {name: t, request: {cpu: "1"}, tolerations: [{key: gpu, operator: Equal, value: reserved, effect: NoSchedule}]}
    """,
        nodes,
    )
    assert tolerated["binds"] == {"ns/t": "a"}
    exists = single_task(
        """
          - {name: t, request: {cpu: "1"}, tolerations: [{key: maint, operator: Exists}]}
    """,
        nodes,
    )
    assert exists["binds"] == {"ns/t": "b"}
    soft = single_task(
        """
          - {name: t, request: {cpu: "1"}}
    """,
        """
        nodes:
        - {name: a, allocatable: {cpu: "4", pods: 10}, taints: [{key: k, value: v, effect: PreferNoSchedule}]}
    """,
    )
    assert soft["binds"] == {"ns/t": "a"}


def test_required_node_affinity_filters() -> None:
    """nodeaffinity: requiredDuringScheduling terms (ORed; expressions ANDed) must match."""
    out = single_task(
        """
          - name: t
            request: {cpu: "1"}
            affinity:
              nodeAffinity:
                requiredDuringSchedulingIgnoredDuringExecution:
                  nodeSelectorTerms:
                  - matchExpressions: [{key: zone, operator: In, values: [z2, z3]}, {key: gpu, operator: DoesNotExist}]
    """,
        """
        nodes:
        - {name: a, allocatable: {cpu: "4", pods: 10}, labels: {zone: z1}}
        - {name: b, allocatable: {cpu: "4", pods: 10}, labels: {zone: z2, gpu: "yes"}}
        - {name: c, allocatable: {cpu: "4", pods: 10}, labels: {zone: z3}}
    """,
    )
    assert out["binds"] == {"ns/t": "c"}


def test_required_pod_affinity_follows_the_matching_pod() -> None:
    """interpodaffinity: a required affinity term places the task in the topology domain of a pod
    that matches it."""
    out = simulate_yaml(
        PREDICATES_ONLY,
        """
        nodes:
        - {name: a, allocatable: {cpu: "4", pods: 10}, labels: {rack: r1}}
        - {name: b, allocatable: {cpu: "4", pods: 10}, labels: {rack: r2}}
        - {name: c, allocatable: {cpu: "4", pods: 10}, labels: {rack: r2}}
        queues: [{name: q}]
        jobs:
        - {name: db, namespace: ns, queue: q, minMember: 1, phase: Running,
           tasks: [{name: db0, request: {cpu: "1"}, status: Running, node: c, labels: {app: db}}]}
        - name: web
          namespace: ns
          queue: q
          minMember: 1
          phase: Inqueue
          tasks:
          - name: web0
            request: {cpu: "4"}
            affinity:
              podAffinity:
                requiredDuringSchedulingIgnoredDuringExecution:
                - {labelSelector: {matchLabels: {app: db}}, topologyKey: rack}
    """,
    )
    assert out["binds"] == {"ns/web0": "b"}


def test_existing_pods_anti_affinity_is_symmetric() -> None:
    """interpodaffinity: a running pod anti-affine to app=web keeps a web task off its node even
    though the web task itself declares nothing."""
    out = simulate_yaml(
        PREDICATES_ONLY,
        """
        nodes:
        - {name: a, allocatable: {cpu: "4", pods: 10}}
        - {name: b, allocatable: {cpu: "4", pods: 10}}
        queues: [{name: q}]
        jobs:
        - name: lonely
          namespace: ns
          queue: q
          minMember: 1
          phase: Running
          tasks:
          - name: l0
            request: {cpu: "1"}
            status: Running
            node: a
            affinity:
              podAntiAffinity:
                requiredDuringSchedulingIgnoredDuringExecution:
                - {labelSelector: {matchLabels: {app: web}}, topologyKey: kubernetes.io/hostname}
        - {name: web, namespace: ns, queue: q, minMember: 1, phase: Inqueue,
           tasks: [{name: w0, request: {cpu: "1"}, labels: {app: web}}]}
    """,
    )
    assert out["binds"] == {"ns/w0": "b"}


def test_anti_affine_gang_spreads_one_per_node_and_fails_when_nodes_run_out() -> None:
    """Anti-affinity between a gang's own members (placed in the same statement): three workers
    on three nodes bind one per node; a fourth member would need a fourth node, so a minMember-4
    gang binds nothing."""

    def gang(n: int) -> str:
        tasks = "".join(
            f"""
          - name: w{i}
            request: {{cpu: "1"}}
            labels: {{role: worker}}{ANTI_WORKER}"""
            for i in range(n)
        )
        return f"""
        nodes:
        - {{name: a, allocatable: {{cpu: "4", pods: 10}}}}
        - {{name: b, allocatable: {{cpu: "4", pods: 10}}}}
        - {{name: c, allocatable: {{cpu: "4", pods: 10}}}}
        queues: [{{name: q}}]
        jobs:
        - name: g
          namespace: ns
          queue: q
          minMember: {n}
          phase: Inqueue
          tasks:{tasks}
"""

    three = simulate_yaml(PREDICATES_ONLY, gang(3))
    assert sorted(three["binds"].values()) == ["a", "b", "c"]
    four = simulate_yaml(PREDICATES_ONLY, gang(4))
    assert four["binds"] == {}
