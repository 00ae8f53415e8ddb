"""proportion plugin: what tests/core/test_proportion.py and test_enqueue.py leave of Volcano's
plugins/proportion/proportion_test.go, as scenarios.

``TestEnqueueAndAllocable``, ``TestAllocate``, ``TestNoDoubleCountingForInqueueJobWithBindingTasks``
and ``TestJobEnqueuedOnOtherPluginsReject`` are ported there. ``TestProportion`` checks the
``queue_allocated`` metric through a metrics server after deleting PodGroups (not ported); its
bind expectation for "pod-deallocate" is ported here, with the workers pending (Volcano builds
them Running without a node, which the cache never places).
"""

from __future__ import annotations

import yaml

from server.simulate import simulate_text

# TestProportion's tier: proportion (predicate switch only), gang ready/pipelined, priority job order.
TIER = {
    "actions": ["allocate"], "extension_points_not_listed": "disabled",
    "tiers": [{"plugins": [{"name": "proportion", "enablePredicate": True},
                           {"name": "gang", "enableJobReady": True, "enableJobPipelined": True},
                           {"name": "priority", "enableJobOrder": True}]}],
}
NODES = [
    {"name": "node1", "allocatable": {"cpu": "4", "memory": "4k", "pods": 15},
     "labels": {"selector": "worker", "kubernetes.io/hostname": "node1"}},
    {"name": "node2", "allocatable": {"cpu": "3", "memory": "3k", "pods": 15},
     "labels": {"kubernetes.io/hostname": "node2"}},
]
WORKER = {"labels": {"role": "worker"}}


def test_pod_deallocate_gang_that_cannot_fit_leaves_room_for_the_next_job() -> None:
    """TestProportion "pod-deallocate": pg1 (priority p2, minMember 2) needs worker-2's 5 cpu,
    which no node has, so its placement of worker-1 is undone; pg2's worker-3 (4 cpu) then
    takes node1, the only node with 4 cpu."""
    scenario = {
        "config": TIER,
        "priorityClasses": [{"name": "p1", "value": 1}, {"name": "p2", "value": 2}],
        "nodes": NODES,
        "queues": [{"name": "q1", "weight": 0}],
        "jobs": [
            {"name": "pg1", "namespace": "ns1", "queue": "q1", "minMember": 2, "priorityClass": "p2",
             "phase": "Inqueue",
             "tasks": [{"name": "worker-1", "request": {"cpu": "3", "memory": "3k"},
                        "nodeSelector": {"selector": "worker"}, **WORKER},
                       {"name": "worker-2", "request": {"cpu": "5", "memory": "5k"}, **WORKER}]},
            {"name": "pg2", "namespace": "ns1", "queue": "q1", "minMember": 1, "priorityClass": "p1",
             "phase": "Inqueue",
             "tasks": [{"name": "worker-3", "request": {"cpu": "4", "memory": "4k"}, **WORKER}]},
        ],
    }
    out = simulate_text(yaml.safe_dump(scenario, sort_keys=False))
    assert out["binds"] == {"ns1/worker-3": "node1"}
    assert out["jobs"]["ns1/pg1"]["phase"] == "Inqueue"
    assert out["jobs"]["ns1/pg2"]["phase"] == "Running"
