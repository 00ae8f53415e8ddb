"""proportion plugin: Volcano's plugins/proportion/proportion_test.go (``TestEnqueueAndAllocable``,
``TestAllocate``, ``TestNoDoubleCountingForInqueueJobWithBindingTasks``, the bind expectation of
``TestProportion`` "pod-deallocate") as scenarios, plus the deserved water-filling and share of
proportion.go checked directly. ``TestJobEnqueuedOnOtherPluginsReject`` is in test_enqueue.py.
``TestProportion`` otherwise checks the ``queue_allocated`` metric through a metrics server after
deleting PodGroups (not ported)."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import (
    config,
    job,
    node,
    pg,
    plugin,
    pod,
    queue,
    res,
    scenario_node,
    scenario_queue,
    session,
    simulate,
    simulate_yaml,
    snapshot,
)

from server.plugins.volcano.proportion import ProportionPlugin
from server.session.info import dominant_share as share

# TestEnqueueAndAllocable: the tier switches of each case.
ALL_ENABLE = (
    "{name: proportion, enabledAllocatable: true, enabledOverused: true, enableJobEnqueued: true}"
)
ENQUEUEABLE = (
    "{name: proportion, enabledAllocatable: false, enabledOverused: false, enableJobEnqueued: true}"
)
ALLOCATABLE = (
    "{name: proportion, enabledAllocatable: true, enabledOverused: false, enableJobEnqueued: false}"
)

# Two 2-cpu nodes; q1 runs a 1c/2G pod on n1, q2 a 2c/1G pod on n2.
CLUSTER = """
nodes:
- {name: n1, allocatable: {cpu: "2", memory: 2G, pods: 10}}
- {name: n2, allocatable: {cpu: "2", memory: 2G, pods: 10}}
queues:
- {name: q1, weight: 1, capability: {cpu: "2", memory: 2G}}
- {name: q2, weight: 1, capability: {cpu: "3", memory: 3G}}
- {name: q3, weight: 1, capability: {cpu: "3", memory: 3G}, state: Closed}
jobs:
- {name: pg1, namespace: ns1, queue: q1, minMember: 1, phase: Running, minResources: {cpu: "1", memory: 2G},
   tasks: [{name: pod1, request: {cpu: "1", memory: 2G}, status: Running, node: n1}]}
- {name: pg2, namespace: ns1, queue: q2, minMember: 1, phase: Running, minResources: {cpu: "2", memory: 1G},
   tasks: [{name: pod2, request: {cpu: "2", memory: 1G}, status: Running, node: n2}]}
"""


def run_case(switches: str, new_job: str) -> dict:
    return simulate_yaml(
        f"""
        config:
          actions: [enqueue, allocate]
          extension_points_not_listed: disabled
          tiers:
          - plugins:
            - {switches}
    """,
        CLUSTER + "- " + new_job + "\n",
    )


def test_job_requesting_only_cpu_is_admitted_when_memory_exceeds_deserved() -> None:
    """TestEnqueueAndAllocable case0: q1's memory is used up, but pod3 asks only for cpu, and
    proportion compares only the requested dimensions."""
    out = run_case(
        ALL_ENABLE,
        "{name: pg3, namespace: ns1, queue: q1, minMember: 1, minResources: {cpu: '1'}, "
        "tasks: [{name: pod3, request: {cpu: '1', memory: '0'}}]}",
    )
    assert out["binds"] == {"ns1/pod3": "n1"}


def test_job_requesting_only_memory_is_admitted_when_cpu_exceeds_deserved() -> None:
    """TestEnqueueAndAllocable case1."""
    out = run_case(
        ALL_ENABLE,
        "{name: pg4, namespace: ns1, queue: q2, minMember: 1, minResources: {memory: 1G}, "
        "tasks: [{name: pod4, request: {cpu: '0', memory: 1G}}]}",
    )
    assert out["binds"] == {"ns1/pod4": "n2"}


def test_job_exceeding_queue_capability_is_not_enqueued() -> None:
    """TestEnqueueAndAllocable case2: allocated 1c/2G + 1c/1G exceeds q1's 2G capability."""
    out = run_case(
        ENQUEUEABLE,
        "{name: pg5, namespace: ns1, queue: q1, minMember: 1, minResources: {cpu: '1', "
        "memory: 1G}, tasks: [{name: pod5, request: {cpu: '1', memory: 1G}}]}",
    )
    assert out["binds"] == {}
    assert out["jobs"]["ns1/pg5"]["phase"] == "Pending"


def test_job_exceeding_deserved_is_not_allocated() -> None:
    """TestEnqueueAndAllocable case3: admitted (no enqueue vote), but allocatable refuses a task
    that takes q1 above its deserved memory."""
    out = run_case(
        ALLOCATABLE,
        "{name: pg5, namespace: ns1, queue: q1, minMember: 1, minResources: {cpu: '1', "
        "memory: 1G}, tasks: [{name: pod5, request: {cpu: '1', memory: 1G}}]}",
    )
    assert out["jobs"]["ns1/pg5"]["phase"] == "Inqueue"
    assert out["binds"] == {}


def test_job_of_a_closed_queue_is_not_enqueued() -> None:
    """TestEnqueueAndAllocable case4: queue state Closed rejects enqueue."""
    out = run_case(
        ENQUEUEABLE,
        "{name: pg6, namespace: ns1, queue: q3, minMember: 1, minResources: {cpu: '1', "
        "memory: 1G}, tasks: [{name: pod6, request: {cpu: '1', memory: 1G}}]}",
    )
    assert out["binds"] == {}
    assert out["jobs"]["ns1/pg6"]["phase"] == "Pending"


def test_queues_are_served_in_queue_priority_order() -> None:
    """proportion TestAllocate case0 (allocate part): q3 (priority 10) before q1 (5) and q2 (1),
    so q3's pod takes the one free node."""
    out = simulate_yaml("""
        config:
          actions: [allocate]
          extension_points_not_listed: disabled
          tiers:
          - plugins:
            - {name: proportion, enableQueueOrder: true}
        nodes:
        - {name: n1, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}
        - {name: n2, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}
        queues:
        - {name: q1, priority: 5, capability: {cpu: "2", memory: 4Gi}}
        - {name: q2, priority: 1, capability: {cpu: "2", memory: 4Gi}}
        - {name: q3, priority: 10, capability: {cpu: "2", memory: 4Gi}}
        jobs:
        - {name: pg1, namespace: ns1, queue: q1, minMember: 1, phase: Running,
           tasks: [{name: p1, request: {cpu: "2", memory: 4Gi}, status: Running, node: n1}]}
        - {name: pg2, namespace: ns1, queue: q2, minMember: 1, phase: Inqueue,
           tasks: [{name: p2, request: {cpu: "2", memory: 4Gi}}]}
        - {name: pg3, namespace: ns1, queue: q3, minMember: 1, phase: Inqueue,
           tasks: [{name: p3, request: {cpu: "2", memory: 4Gi}}]}
    """)
    assert out["binds"] == {"ns1/p3": "n2"}


def test_inqueue_job_with_binding_tasks_is_not_counted_twice() -> None:
    """TestNoDoubleCountingForInqueueJobWithBindingTasks: job A is still Inqueue while its three
    1-cpu tasks are Binding; its minResources are covered by those allocations, so they must not
    also count as inqueue. Job B (1 cpu) then fits q1's 4-cpu capability and is bound."""
    out = simulate_yaml("""
        config:
          actions: [enqueue, allocate]
          extension_points_not_listed: disabled
          tiers:
          - plugins:
            - {name: proportion, enabledAllocatable: true, enabledOverused: true, enableJobEnqueued: true}
        nodes: [{name: n1, allocatable: {cpu: "4", memory: 8Gi, pods: 10}}]
        queues: [{name: q1, weight: 1, capability: {cpu: "4", memory: 8Gi}}]
        jobs:
        - name: pgA
          namespace: ns1
          queue: q1
          minMember: 3
          phase: Inqueue
          minResources: {cpu: "3", memory: 3Gi}
          tasks:
          - {name: pA1, request: {cpu: "1", memory: 1Gi}, status: Binding, node: n1}
          - {name: pA2, request: {cpu: "1", memory: 1Gi}, status: Binding, node: n1}
          - {name: pA3, request: {cpu: "1", memory: 1Gi}, status: Binding, node: n1}
        - {name: pgB, namespace: ns1, queue: q1, minMember: 1, phase: Pending, minResources: {cpu: "1", memory: 1Gi},
           tasks: [{name: pB1, request: {cpu: "1", memory: 1Gi}}]}
    """)
    assert out["jobs"]["ns1/pgB"]["phase"] == "Running"
    assert out["binds"] == {"ns1/pB1": "n1"}


def _deserved(queues: list, requests: dict[str, str], cpu: str = "12") -> dict[str, np.ndarray]:
    """Each queue's deserved, its one job asking for ``requests[queue]`` cpu."""
    jobs = [job(q, cpu=r, memory=None, queue=q, min_member=1) for q, r in requests.items()]
    snap = snapshot([node("n1", cpu, "1G")], jobs, queues)
    ssn = session(snap, "tiers: [{plugins: [{name: proportion}]}]")
    plugin = next(p for p in ssn.plugins if isinstance(p, ProportionPlugin))
    return {name: attr.deserved for name, attr in plugin.attrs.items()}


def test_deserved_is_water_filled_by_weight_and_capped_by_request() -> None:
    """proportion.go's deserved loop: 12 cpu by weight 1:1:2; q1 asks only 2 so its surplus is
    shared again between q2 and q3 by weight."""
    d = _deserved(
        [queue("q1", weight=1), queue("q2", weight=1), queue("q3", weight=2)],
        {"q1": "2", "q2": "10", "q3": "10"},
    )
    assert d["q1"][0] == pytest.approx(2000.0)
    assert d["q2"][0] == pytest.approx(10000.0 / 3)
    assert d["q3"][0] == pytest.approx(20000.0 / 3)


def test_deserved_is_raised_to_the_guarantee_and_capped_by_capability() -> None:
    """deserved = max(guarantee, min(weight share, realCapability, request))."""
    d = _deserved(
        [queue("q1", guarantee=res("5")), queue("q2", capability=res("3"))], {"q1": "1", "q2": "10"}
    )
    assert d["q1"][0] == pytest.approx(5000.0)
    assert d["q2"][0] == pytest.approx(3000.0)


def test_share_counts_only_dimensions_the_queue_deserves() -> None:
    """updateQueueAttrShare walks deserved.ResourceNames(): a dimension with no deserved amount
    does not make the share 1."""
    assert share(np.array([1000.0, 0.0, 1000.0]), np.array([4000.0, 0.0, 0.0])) == pytest.approx(
        0.25
    )
    assert share(np.array([4000.0, 2e9]), np.array([4000.0, 1e9])) == pytest.approx(2.0)


def test_pod_deallocate_gang_that_cannot_fit_leaves_room_for_the_next_job() -> None:
    """TestProportion "pod-deallocate": pg1 (priority p2, minMember 2) needs worker-2's 5 cpu,
    which no node has, so its placement of worker-1 is undone; pg2's worker-3 (4 cpu) then
    takes node1, the only node with 4 cpu. (Volcano builds the workers Running without a node,
    which its cache never places; here they are pending.)"""
    tiers = config(
        ["allocate"],
        [
            [
                plugin("proportion", "enablePredicate"),
                plugin("gang", "enableJobReady", "enableJobPipelined"),
                plugin("priority", "enableJobOrder"),
            ]
        ],
    )
    nodes = [
        scenario_node(
            "node1",
            res("4", "4k"),
            pods=15,
            labels={"selector": "worker", "kubernetes.io/hostname": "node1"},
        ),
        scenario_node("node2", res("3", "3k"), pods=15, labels={"kubernetes.io/hostname": "node2"}),
    ]
    worker = {"priority": None, "labels": {"role": "worker"}}
    jobs = [
        pg(
            "pg1",
            "q1",
            2,
            [
                pod("worker-1", res("3", "3k"), selector={"selector": "worker"}, **worker),
                pod("worker-2", res("5", "5k"), **worker),
            ],
            ns="ns1",
            priority_class="p2",
        ),
        pg(
            "pg2",
            "q1",
            1,
            [pod("worker-3", res("4", "4k"), **worker)],
            ns="ns1",
            priority_class="p1",
        ),
    ]
    out = simulate(
        tiers,
        nodes,
        [scenario_queue("q1", weight=0)],
        jobs,
        priority_classes=[{"name": "p1", "value": 1}, {"name": "p2", "value": 2}],
    )
    assert out["binds"] == {"ns1/worker-3": "node1"}
    assert out["jobs"]["ns1/pg1"]["phase"] == "Inqueue"
    assert out["jobs"]["ns1/pg2"]["phase"] == "Running"
