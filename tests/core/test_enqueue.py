"""enqueue action: behaviour of Volcano's actions/enqueue/enqueue.go beyond the cases of its
enqueue_test.go, with ``TestEnqueue``'s tier, run as scenarios. The cases of ``TestEnqueue`` are
scenario files under tests/scenarios/volcano/enqueue/ (proportion_test.go's
``TestJobEnqueuedOnOtherPluginsReject`` under tests/scenarios/volcano/proportion/), run by
test_volcano_cases.py.

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


def phases(out: dict) -> dict[str, str]:
    return {uid: j["phase"] for uid, j in out["jobs"].items()}


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
