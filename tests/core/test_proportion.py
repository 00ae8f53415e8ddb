"""proportion plugin: Volcano's plugins/proportion/proportion_test.go (``TestEnqueueAndAllocable``,
``TestAllocate``, ``TestNoDoubleCountingForInqueueJobWithBindingTasks``) as scenarios, plus the
deserved water-filling and share of proportion.go checked directly."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from server.config import load_config
from server.model import ClusterSnapshot, JobSpec, NodeSpec, PodGroupPhase, QueueSpec, TaskSpec
from server.plugins.proportion import ProportionPlugin
from server.session.info import dominant_share as share
from server.session.session import Session
from server.simulate import simulate_text

# TestEnqueueAndAllocable: the tier switches of each case.
ALL_ENABLE = "{name: proportion, enabledAllocatable: true, enabledOverused: true, enableJobEnqueued: true}"
ENQUEUEABLE = "{name: proportion, enabledAllocatable: false, enabledOverused: false, enableJobEnqueued: true}"
ALLOCATABLE = "{name: proportion, enabledAllocatable: true, enabledOverused: false, enableJobEnqueued: false}"

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
    text = textwrap.dedent(f"""
        config:
          actions: [enqueue, allocate]
          extension_points_not_listed: disabled
          tiers:
          - plugins:
            - {switches}
    """) + CLUSTER + "- " + new_job + "\n"
    return simulate_text(text)


def test_job_requesting_only_cpu_is_admitted_when_memory_exceeds_deserved() -> None:
    """TestEnqueueAndAllocable case0: q1's memory is used up, but pod3 asks only for cpu, and
    proportion compares only the requested dimensions."""
    out = run_case(ALL_ENABLE, "{name: pg3, namespace: ns1, queue: q1, minMember: 1, minResources: {cpu: '1'}, "
                               "tasks: [{name: pod3, request: {cpu: '1', memory: '0'}}]}")
    assert out["binds"] == {"ns1/pod3": "n1"}


def test_job_requesting_only_memory_is_admitted_when_cpu_exceeds_deserved() -> None:
    """TestEnqueueAndAllocable case1."""
    out = run_case(ALL_ENABLE, "{name: pg4, namespace: ns1, queue: q2, minMember: 1, minResources: {memory: 1G}, "
                               "tasks: [{name: pod4, request: {cpu: '0', memory: 1G}}]}")
    assert out["binds"] == {"ns1/pod4": "n2"}


def test_job_exceeding_queue_capability_is_not_enqueued() -> None:
    """TestEnqueueAndAllocable case2: allocated 1c/2G + 1c/1G exceeds q1's 2G capability."""
    out = run_case(ENQUEUEABLE, "{name: pg5, namespace: ns1, queue: q1, minMember: 1, minResources: {cpu: '1', "
                                "memory: 1G}, tasks: [{name: pod5, request: {cpu: '1', memory: 1G}}]}")
    assert out["binds"] == {}
    assert out["jobs"]["ns1/pg5"]["phase"] == "Pending"


def test_job_exceeding_deserved_is_not_allocated() -> None:
    """TestEnqueueAndAllocable case3: admitted (no enqueue vote), but allocatable refuses a task
    that takes q1 above its deserved memory."""
    out = run_case(ALLOCATABLE, "{name: pg5, namespace: ns1, queue: q1, minMember: 1, minResources: {cpu: '1', "
                                "memory: 1G}, tasks: [{name: pod5, request: {cpu: '1', memory: 1G}}]}")
    assert out["jobs"]["ns1/pg5"]["phase"] == "Inqueue"
    assert out["binds"] == {}


def test_job_of_a_closed_queue_is_not_enqueued() -> None:
    """TestEnqueueAndAllocable case4: queue state Closed rejects enqueue."""
    out = run_case(ENQUEUEABLE, "{name: pg6, namespace: ns1, queue: q3, minMember: 1, minResources: {cpu: '1', "
                                "memory: 1G}, tasks: [{name: pod6, request: {cpu: '1', memory: 1G}}]}")
    assert out["binds"] == {}
    assert out["jobs"]["ns1/pg6"]["phase"] == "Pending"


def test_queues_are_served_in_queue_priority_order() -> None:
    """proportion TestAllocate case0 (allocate part): q3 (priority 10) before q1 (5) and q2 (1),
    so q3's pod takes the one free node."""
    out = simulate_text(textwrap.dedent("""
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
    """))
    assert out["binds"] == {"ns1/p3": "n2"}


def test_inqueue_job_with_binding_tasks_is_not_counted_twice() -> None:
    """TestNoDoubleCountingForInqueueJobWithBindingTasks: job A is still Inqueue while its three
    1-cpu tasks are Binding; its minResources are covered by those allocations, so they must not
    also count as inqueue. Job B (1 cpu) then fits q1's 4-cpu capability and is bound."""
    out = simulate_text(textwrap.dedent("""
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
    """))
    assert out["jobs"]["ns1/pgB"]["phase"] == "Running"
    assert out["binds"] == {"ns1/pB1": "n1"}


def _deserved(queues: list[QueueSpec], requests: dict[str, float], cpu: float = 12000.0) -> dict[str, np.ndarray]:
    jobs = [
        JobSpec(uid=f"ns/{q}", name=q, namespace="ns", queue=q, min_member=1, phase=PodGroupPhase.INQUEUE,
                tasks=[TaskSpec(uid=f"ns/{q}-0", name=f"{q}-0", namespace="ns", job=f"ns/{q}", request={"cpu": r})])
        for q, r in requests.items()
    ]
    snap = ClusterSnapshot(nodes=[NodeSpec("n1", {"cpu": cpu, "memory": 1e9})], queues=queues, jobs=jobs)
    ssn = Session(snap, load_config("tiers: [{plugins: [{name: proportion}]}]"), 1)
    plugin = next(p for p in ssn.plugins if isinstance(p, ProportionPlugin))
    return {name: attr.deserved for name, attr in plugin.attrs.items()}


def test_deserved_is_water_filled_by_weight_and_capped_by_request() -> None:
    """proportion.go's deserved loop: 12 cpu by weight 1:1:2; q1 asks only 2 so its surplus is
    shared again between q2 and q3 by weight."""
    d = _deserved([QueueSpec("q1", weight=1), QueueSpec("q2", weight=1), QueueSpec("q3", weight=2)],
                  {"q1": 2000.0, "q2": 10000.0, "q3": 10000.0})
    assert d["q1"][0] == pytest.approx(2000.0)
    assert d["q2"][0] == pytest.approx(10000.0 / 3)
    assert d["q3"][0] == pytest.approx(20000.0 / 3)


def test_deserved_is_raised_to_the_guarantee_and_capped_by_capability() -> None:
    """deserved = max(guarantee, min(weight share, realCapability, request))."""
    d = _deserved([QueueSpec("q1", guarantee={"cpu": 5000.0}), QueueSpec("q2", capability={"cpu": 3000.0})],
                  {"q1": 1000.0, "q2": 10000.0})
    assert d["q1"][0] == pytest.approx(5000.0)
    assert d["q2"][0] == pytest.approx(3000.0)


def test_share_counts_only_dimensions_the_queue_deserves() -> None:
    """updateQueueAttrShare walks deserved.ResourceNames(): a dimension with no deserved amount
    does not make the share 1."""
    assert share(np.array([1000.0, 0.0, 1000.0]), np.array([4000.0, 0.0, 0.0])) == pytest.approx(0.25)
    assert share(np.array([4000.0, 2e9]), np.array([4000.0, 1e9])) == pytest.approx(2.0)
