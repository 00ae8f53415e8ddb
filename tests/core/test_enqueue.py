"""enqueue action: the cases of Volcano's actions/enqueue/enqueue_test.go (``TestEnqueue``) and
proportion_test.go's ``TestJobEnqueuedOnOtherPluginsReject``, run as scenarios.

Volcano's ``ExpectStatus`` is the PodGroup phase after the session; here it is ``jobs[uid].phase``
of the simulate output.
"""

from __future__ import annotations

from core_helpers import simulate_yaml

# TestEnqueue's tier: drf, proportion, sla (waiting time 3m), gang, with the switches it sets.
ENQUEUE_TIERS = """
config:
  actions: [enqueue]
  extension_points_not_listed: disabled
  tiers:
  - plugins:
    - {name: drf, enableJobOrder: true, enableJobEnqueued: true}
    - {name: proportion, enableQueueOrder: true, enableJobEnqueued: true}
    - {name: sla, enableJobOrder: true, enableJobEnqueued: true, arguments: {sla-waiting-time: 3m}}
    - {name: gang, enableJobOrder: true}
"""

QUEUES_C1_C2 = """
        queues:
        - {name: c1, weight: 1, capability: {cpu: "4", memory: 4G}}
        - {name: c2, weight: 1, capability: {cpu: "4", memory: 4G}}
"""


def phases(out: dict) -> dict[str, str]:
    return {uid: j["phase"] for uid, j in out["jobs"].items()}


def test_inqueue_job_stays_inqueue() -> None:
    """TestEnqueue "when podgroup status is inqueue"."""
    out = simulate_yaml(
        ENQUEUE_TIERS,
        QUEUES_C1_C2
        + """
        nodes: []
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 2
          phase: Inqueue
          tasks:
          - {name: p1, request: {cpu: "1", memory: 1G}}
          - {name: p2, request: {cpu: "1", memory: 1G}}
    """,
    )
    assert phases(out) == {"c1/pg1": "Inqueue"}


def test_pending_jobs_without_min_resources_are_admitted_in_every_queue() -> None:
    """TestEnqueue "when podgroup status is pending": no minResources, so both jobs (one per
    queue) go Inqueue."""
    out = simulate_yaml(
        ENQUEUE_TIERS,
        QUEUES_C1_C2
        + """
        nodes: []
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 1
          tasks: [{name: p1, request: {cpu: "3", memory: 1G}}]
        - name: pg2
          namespace: c1
          queue: c2
          minMember: 1
          tasks: [{name: p2, request: {cpu: "1", memory: 1G}}]
    """,
    )
    assert phases(out) == {"c1/pg1": "Inqueue", "c1/pg2": "Inqueue"}


def test_running_job_stays_running() -> None:
    """TestEnqueue "when podgroup status is running"."""
    out = simulate_yaml(
        ENQUEUE_TIERS,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "4", memory: 4G, pods: 10}}
        queues: [{name: c1, weight: 1, capability: {cpu: "4", memory: 4G}}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 2
          phase: Running
          tasks:
          - {name: p1, request: {cpu: "1", memory: 1G}, status: Running, node: n1}
          - {name: p2, request: {cpu: "1", memory: 1G}, status: Running, node: n1}
    """,
    )
    assert phases(out) == {"c1/pg1": "Running"}


def test_job_of_a_missing_queue_is_not_admitted() -> None:
    """TestEnqueue "pggroup cannot enqueue because the specified queue is c1, but there is only
    c2". Volcano's cache drops such a job from the session altogether (no status at all); Muster
    keeps it in the output, still Pending, and explains the missing queue."""
    out = simulate_yaml(
        ENQUEUE_TIERS,
        """
        nodes: []
        queues: [{name: c2, weight: 1, capability: {cpu: "4", memory: 4G}}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 1
          tasks: [{name: p1, request: {cpu: "1", memory: 1G}}]
    """,
    )
    assert phases(out) == {"c1/pg1": "Pending"}


def test_min_resources_above_queue_capability_keep_the_job_pending() -> None:
    """TestEnqueue "pggroup cannot enqueue because queue resources are less than podgroup
    MinResources": proportion rejects 8 cpu against a 1-cpu capability."""
    out = simulate_yaml(
        ENQUEUE_TIERS,
        """
        nodes: []
        queues: [{name: c1, weight: 1, capability: {cpu: "1", memory: 1G}}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 1
          minResources: {cpu: "8", memory: 8G}
          tasks: [{name: p1, request: {cpu: "1", memory: 1G}}]
    """,
    )
    assert phases(out) == {"c1/pg1": "Pending"}


def test_admitted_jobs_consume_queue_capability_in_job_order() -> None:
    """Volcano enqueue + proportion job_enqueued: each admitted job's minResources count as
    inqueue, so of three 2-cpu jobs in a 4-cpu queue the first two (job order) are admitted."""
    out = simulate_yaml(
        ENQUEUE_TIERS,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "8", memory: 8G, pods: 10}}
        queues: [{name: c1, weight: 1, capability: {cpu: "4", memory: 4G}}]
        jobs:
        - {name: a, namespace: c1, queue: c1, minMember: 1, minResources: {cpu: "2"}, tasks: [{name: a0, request: {cpu: "2"}}]}
        - {name: b, namespace: c1, queue: c1, minMember: 1, minResources: {cpu: "2"}, tasks: [{name: b0, request: {cpu: "2"}}]}
        - {name: c, namespace: c1, queue: c1, minMember: 1, minResources: {cpu: "2"}, tasks: [{name: c0, request: {cpu: "2"}}]}
    """,
    )
    assert phases(out) == {"c1/a": "Inqueue", "c1/b": "Inqueue", "c1/c": "Pending"}


def test_job_rejected_by_a_co_tier_plugin_reserves_no_queue_capacity() -> None:
    """proportion_test.go TestJobEnqueuedOnOtherPluginsReject: job_enqueued runs only after every
    plugin of the tier admitted the job. Here overcommit rejects job A (the cluster, 4 cpu at 1.2
    with 3 used, has 1.8 left, A needs 2) while proportion alone would admit it; B (1 cpu) must
    still fit queue q1's 2.5-cpu capability, which it would not if A's 2 cpu had been counted."""
    tiers = """
        config:
          actions: [enqueue]
          extension_points_not_listed: disabled
          tiers:
          - plugins:
            - {name: proportion, enableJobEnqueued: true}
            - {name: overcommit, enableJobEnqueued: true}
    """
    out = simulate_yaml(
        tiers,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "4", memory: 8G, pods: 10}}
        queues:
        - {name: q1, weight: 1, capability: {cpu: 2500m}}
        - {name: q2, weight: 1}
        jobs:
        - name: busy
          namespace: ns
          queue: q2
          minMember: 1
          phase: Running
          tasks: [{name: busy-0, request: {cpu: "3"}, status: Running, node: n1}]
        - {name: a, namespace: ns, queue: q1, minMember: 1, minResources: {cpu: "2"}, tasks: [{name: a0, request: {cpu: "2"}}]}
        - {name: b, namespace: ns, queue: q1, minMember: 1, minResources: {cpu: "1"}, tasks: [{name: b0, request: {cpu: "1"}}]}
    """,
    )
    assert phases(out)["ns/a"] == "Pending"
    assert phases(out)["ns/b"] == "Inqueue"


def test_enqueue_then_allocate_places_admitted_job_in_the_same_cycle() -> None:
    """The default action order (enqueue, allocate): a Pending job admitted by enqueue is
    allocated in the same session."""
    tiers = ENQUEUE_TIERS.replace("actions: [enqueue]", "actions: [enqueue, allocate]")
    out = simulate_yaml(
        tiers,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "4", memory: 4G, pods: 10}}
        queues: [{name: c1, weight: 1, capability: {cpu: "4", memory: 4G}}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 1
          minResources: {cpu: "1", memory: 1G}
          tasks: [{name: p1, request: {cpu: "1", memory: 1G}}]
    """,
    )
    assert out["binds"] == {"c1/p1": "n1"}
    assert phases(out) == {"c1/pg1": "Running"}
