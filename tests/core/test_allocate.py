"""allocate action: the cases of Volcano's actions/allocate/allocate_test.go, re-expressed as
scenarios run through ``muster simulate`` (``server.simulate.simulate_text``).

Each test names the behaviour and cites the Volcano case (``TestAllocate`` / ``TestFareShareAllocate``
and the case name). Volcano's test tiers switch on only the extension points they list, which a
scenario writes as ``extension_points_not_listed: disabled``. Volcano's ``minMember: 0`` (no gang
at all) is spelled ``minMember: -1`` in Muster (0 means "every task"); these cases use
``minMember: 1``, which gives the same decisions there.
"""

from __future__ import annotations

from core_helpers import simulate_yaml

# TestAllocate's tier: gang, drf, proportion, predicates, nodeorder with the switches it sets.
ALLOCATE_TIERS = """
config:
  actions: [allocate]
  extension_points_not_listed: disabled
  tiers:
  - plugins:
    - {name: gang, enableJobOrder: true, enableJobReady: true, enableJobPipelined: true, enableJobStarving: true}
    - {name: drf, enablePreemptable: true, enableJobOrder: true}
    - {name: proportion, enableQueueOrder: true, enableReclaimable: true, enabledAllocatable: true}
    - {name: predicates, enablePredicate: true}
    - {name: nodeorder, enableNodeOrder: true}
"""

# TestFareShareAllocate's tier: no gang, proportion's allocatable switched off.
FAIR_SHARE_TIERS = """
config:
  actions: [allocate]
  extension_points_not_listed: disabled
  tiers:
  - plugins:
    - {name: drf, enablePreemptable: true, enableJobOrder: true}
    - {name: proportion, enableQueueOrder: true, enableReclaimable: true, enabledAllocatable: false}
    - {name: predicates, enablePredicate: true}
    - {name: nodeorder, enableNodeOrder: true}
"""


def test_task_whose_selector_matches_no_node_does_not_stop_the_others() -> None:
    """TestAllocate "prepredicate failed: node selector does not match": the master's selector
    matches no node; minMember 1 lets the worker go alone."""
    out = simulate_yaml(
        ALLOCATE_TIERS,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "2", memory: 4Gi, pods: 10}, labels: {nodeRole: worker}}
        queues: [{name: c1, weight: 1}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 1
          phase: Inqueue
          tasks:
          - {name: p1, role: master, request: {cpu: "1", memory: 1G}, nodeSelector: {nodeRole: master}}
          - {name: p2, role: worker, request: {cpu: "1", memory: 1G}, nodeSelector: {nodeRole: worker}}
    """,
    )
    assert out["binds"] == {"c1/p2": "n1"}
    assert out["jobs"]["c1/pg1"]["phase"] == "Running"


def test_failed_role_with_its_minimum_met_lets_allocation_continue() -> None:
    """TestAllocate "prepredicate failed and tasks are not used up, continue on until min member
    meet": minTaskMember master 1 / worker 1; the second master fits nowhere but the first already
    satisfies its role, so a worker is placed and the gang commits."""
    out = simulate_yaml(
        ALLOCATE_TIERS,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "1", memory: 2Gi, pods: 10}, labels: {nodeRole: master}}
        - {name: n2, allocatable: {cpu: "1", memory: 2Gi, pods: 10}, labels: {nodeRole: worker}}
        queues: [{name: c1, weight: 1}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 2
          minTaskMember: {master: 1, worker: 1}
          phase: Inqueue
          tasks:
          - {name: p0, role: master, request: {cpu: "1", memory: 1G}, nodeSelector: {nodeRole: master}}
          - {name: p1, role: master, request: {cpu: "1", memory: 1G}, nodeSelector: {nodeRole: master}}
          - {name: p2, role: worker, request: {cpu: "1", memory: 1G}, nodeSelector: {nodeRole: worker}}
          - {name: p3, role: worker, request: {cpu: "1", memory: 1G}, nodeSelector: {nodeRole: worker}}
    """,
    )
    assert out["binds"] == {"c1/p0": "n1", "c1/p2": "n2"}
    assert out["pipelined"] == {}


def test_role_below_its_minimum_breaks_allocation_and_discards_the_gang() -> None:
    """TestAllocate "master's min member can not be allocated, break from allocating": two masters
    are required, only one master node exists: nothing is bound, the gang is reported
    Unschedulable."""
    out = simulate_yaml(
        ALLOCATE_TIERS,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "1", memory: 2Gi, pods: 10}, labels: {nodeRole: master}}
        - {name: n2, allocatable: {cpu: "2", memory: 2Gi, pods: 10}, labels: {nodeRole: worker}}
        queues: [{name: c1, weight: 1}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 2
          minTaskMember: {master: 2, worker: 0}
          phase: Inqueue
          tasks:
          - {name: p0, role: master, request: {cpu: "1", memory: 1G}, nodeSelector: {nodeRole: master}}
          - {name: p1, role: master, request: {cpu: "1", memory: 1G}, nodeSelector: {nodeRole: master}}
          - {name: p2, role: worker, request: {cpu: "1", memory: 1G}, nodeSelector: {nodeRole: worker}}
          - {name: p3, role: worker, request: {cpu: "1", memory: 1G}, nodeSelector: {nodeRole: worker}}
    """,
    )
    assert out["binds"] == {}
    assert out["pipelined"] == {}
    assert {uid: t["status"] for uid, t in out["tasks"].items()} == {
        f"c1/p{i}": "Pending" for i in range(4)
    }
    job = out["jobs"]["c1/pg1"]
    assert job["phase"] == "Inqueue"
    assert [c["type"] for c in job["conditions"]] == ["Unschedulable"]


def test_one_job_with_two_pods_fills_one_node() -> None:
    """TestAllocate "one Job with two Pods on one node"."""
    out = simulate_yaml(
        ALLOCATE_TIERS,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}
        queues: [{name: c1, weight: 1}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 1
          phase: Inqueue
          tasks:
          - {name: p1, request: {cpu: "1", memory: 1G}}
          - {name: p2, request: {cpu: "1", memory: 1G}}
    """,
    )
    assert out["binds"] == {"c1/p1": "n1", "c1/p2": "n1"}
    assert out["jobs"]["c1/pg1"]["phase"] == "Running"


def test_two_queues_share_one_node_by_proportion() -> None:
    """TestAllocate "two Jobs on one node": each queue deserves half the node, so each job gets
    its first task and the second is refused by proportion's allocatable."""
    out = simulate_yaml(
        ALLOCATE_TIERS,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "2", memory: 4G, pods: 10}}
        queues: [{name: c1, weight: 1}, {name: c2, weight: 1}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 1
          phase: Inqueue
          tasks:
          - {name: pg1-p-1, request: {cpu: "1", memory: 1G}}
          - {name: pg1-p-2, request: {cpu: "1", memory: 1G}}
        - name: pg2
          namespace: c2
          queue: c2
          minMember: 1
          phase: Inqueue
          tasks:
          - {name: pg2-p-1, request: {cpu: "1", memory: 1G}}
          - {name: pg2-p-2, request: {cpu: "1", memory: 1G}}
    """,
    )
    assert out["binds"] == {"c1/pg1-p-1": "n1", "c2/pg2-p-1": "n1"}


def test_job_that_fits_nowhere_does_not_block_another_queue() -> None:
    """TestAllocate "high priority queue should not block others": a 3-cpu task on a 2-cpu node
    fails; the other queue's 1-cpu task is still placed."""
    out = simulate_yaml(
        ALLOCATE_TIERS,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "2", memory: 4G, pods: 10}}
        queues: [{name: c1, weight: 1}, {name: c2, weight: 1}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 1
          phase: Inqueue
          tasks: [{name: p1, request: {cpu: "3", memory: 1G}}]
        - name: pg2
          namespace: c1
          queue: c2
          minMember: 1
          phase: Inqueue
          tasks: [{name: p2, request: {cpu: "1", memory: 1G}}]
    """,
    )
    assert out["binds"] == {"c1/p2": "n1"}
    assert out["tasks"]["c1/p1"]["status"] == "Pending"


def test_pending_job_is_admitted_by_allocate_when_enqueue_is_not_configured() -> None:
    """Volcano ``buildAllocateContext``: without the enqueue action a Pending PodGroup is moved to
    Inqueue by allocate itself rather than being skipped."""
    out = simulate_yaml(
        ALLOCATE_TIERS,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}
        queues: [{name: c1, weight: 1}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 1
          phase: Pending
          tasks: [{name: p1, request: {cpu: "1", memory: 1G}}]
    """,
    )
    assert out["binds"] == {"c1/p1": "n1"}


def test_pending_job_waits_for_enqueue_when_enqueue_is_configured() -> None:
    """Volcano ``buildAllocateContext``: with enqueue configured, allocate leaves Pending jobs to
    it (here enqueue runs after allocate, so the job is admitted but placed only next cycle)."""
    tiers = ALLOCATE_TIERS.replace("actions: [allocate]", "actions: [allocate, enqueue]")
    out = simulate_yaml(
        tiers,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}
        queues: [{name: c1, weight: 1}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 1
          phase: Pending
          tasks: [{name: p1, request: {cpu: "1", memory: 1G}}]
    """,
    )
    assert out["binds"] == {}
    assert out["jobs"]["c1/pg1"]["phase"] == "Inqueue"


def test_gang_that_does_not_fit_entirely_is_discarded() -> None:
    """All-or-nothing (gang job_ready / job_pipelined): three 2-cpu tasks, minMember 3, two 2-cpu
    nodes: nothing is bound and every tentative placement is undone, so the small job behind it
    still gets a node."""
    out = simulate_yaml(
        ALLOCATE_TIERS,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}
        - {name: n2, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}
        queues: [{name: c1, weight: 1}]
        jobs:
        - name: gang
          namespace: c1
          queue: c1
          minMember: 3
          phase: Inqueue
          tasks:
          - {name: g0, request: {cpu: "2", memory: 1G}}
          - {name: g1, request: {cpu: "2", memory: 1G}}
          - {name: g2, request: {cpu: "2", memory: 1G}}
        - name: small
          namespace: c1
          queue: c1
          minMember: 1
          phase: Inqueue
          tasks: [{name: s0, request: {cpu: "2", memory: 1G}}]
    """,
    )
    assert out["binds"] == {"c1/s0": "n1"}
    assert {out["tasks"][f"c1/g{i}"]["status"] for i in range(3)} == {"Pending"}
    # Volcano counts the two tentatively placed, then discarded, tasks as schedulable
    # (LastTransaction), so one of three is reported unschedulable.
    msg = out["jobs"]["c1/gang"]["conditions"][0]["message"]
    assert msg.startswith(
        "1/3 tasks in gang unschedulable: pod group is not ready, 3 Pending, 3 minAvailable"
    )


def test_gang_on_releasing_resources_is_pipelined_not_bound() -> None:
    """Volcano ``prioritizeNodes`` / ``allocateResourcesForTask``: a task that fits only the
    node's future idle (idle + releasing) is pipelined; a pipelined-only gang is kept in the
    session but not committed (no bind)."""
    out = simulate_yaml(
        ALLOCATE_TIERS,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}
        queues: [{name: c1, weight: 1}]
        jobs:
        - name: old
          namespace: c1
          queue: c1
          minMember: 1
          phase: Running
          tasks: [{name: o0, request: {cpu: "2", memory: 1G}, status: Releasing, node: n1}]
        - name: new
          namespace: c1
          queue: c1
          minMember: 1
          phase: Inqueue
          tasks: [{name: n0, request: {cpu: "2", memory: 1G}}]
    """,
    )
    assert out["binds"] == {}
    assert out["pipelined"] == {"c1/n0": "n1"}
    assert out["tasks"]["c1/n0"]["status"] == "Pipelined"


def test_idle_node_is_preferred_over_releasing_one() -> None:
    """Volcano ``prioritizeNodes``: nodes whose idle fits come first; a node that fits only with
    releasing resources is used only when no idle node fits, whatever the scores."""
    out = simulate_yaml(
        ALLOCATE_TIERS,
        """
        nodes:
        - {name: a-releasing, allocatable: {cpu: "8", memory: 16Gi, pods: 10}}
        - {name: b-idle, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}
        queues: [{name: c1, weight: 1}]
        jobs:
        - name: old
          namespace: c1
          queue: c1
          minMember: 1
          phase: Running
          tasks: [{name: o0, request: {cpu: "8", memory: 1G}, status: Releasing, node: a-releasing}]
        - name: new
          namespace: c1
          queue: c1
          minMember: 1
          phase: Inqueue
          tasks: [{name: n0, request: {cpu: "2", memory: 1G}}]
    """,
    )
    assert out["binds"] == {"c1/n0": "b-idle"}
    assert out["pipelined"] == {}


def test_invalid_gang_is_not_allocated() -> None:
    """gang job_valid: fewer valid tasks than minMember makes the job invalid; allocate skips it
    and its condition says why (Volcano NotEnoughTasks)."""
    out = simulate_yaml(
        ALLOCATE_TIERS,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "4", memory: 4Gi, pods: 10}}
        queues: [{name: c1, weight: 1}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 3
          phase: Inqueue
          tasks:
          - {name: p0, request: {cpu: "1", memory: 1G}}
          - {name: p1, request: {cpu: "1", memory: 1G}}
    """,
    )
    assert out["binds"] == {}
    cond = out["jobs"]["c1/pg1"]["conditions"][0]
    assert cond["type"] == "Unschedulable"
    assert cond["reason"] == "NotEnoughTasks"
    assert "valid: 2, min: 3" in cond["message"]


def test_best_effort_tasks_are_left_to_backfill() -> None:
    """Volcano ``organizeJobWorksheet``: allocate skips tasks with an empty request."""
    out = simulate_yaml(
        ALLOCATE_TIERS,
        """
        nodes:
        - {name: n1, allocatable: {cpu: "4", memory: 4Gi, pods: 10}}
        queues: [{name: c1, weight: 1}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 1
          phase: Inqueue
          tasks:
          - {name: be, request: {}}
          - {name: p1, request: {cpu: "1", memory: 1G}}
    """,
    )
    assert out["binds"] == {"c1/p1": "n1"}
    assert out["tasks"]["c1/be"]["status"] == "Pending"


FAIR_SHARE_NODE = """
        nodes:
        - {name: node-1, allocatable: {cpu: "5", memory: 5G, pods: 10}}
        queues: [{name: q-1, weight: 1}, {name: q-2, weight: 1}]
"""


def test_queue_with_lower_share_allocates_first() -> None:
    """TestFareShareAllocate "queue with low DRF share value has high priority, should allocate
    first": q-1 already runs a task, so q-2's large job goes first and takes the room q-1's
    large job would have needed."""
    out = simulate_yaml(
        FAIR_SHARE_TIERS,
        FAIR_SHARE_NODE
        + """
        jobs:
        - name: pg-small-1
          namespace: ns-1
          queue: q-1
          minMember: 1
          phase: Running
          tasks: [{name: pod-small-1, request: {cpu: "1", memory: 1G}, status: Running, node: node-1}]
        - name: pg-large-1
          namespace: ns-1
          queue: q-1
          minMember: 1
          phase: Inqueue
          tasks: [{name: pod-large-1, request: {cpu: "2", memory: 2G}}]
        - name: pg-large-2
          namespace: ns-1
          queue: q-2
          minMember: 1
          phase: Inqueue
          tasks: [{name: pod-large-2, request: {cpu: "3", memory: 2G}}]
    """,
    )
    assert out["binds"] == {"ns-1/pod-large-2": "node-1"}


def test_queue_share_is_updated_before_the_queue_is_pushed_back() -> None:
    """TestFareShareAllocate "queue's DRF share value will be updated and its priority will change
    before it is put back into the priority queue": order q-2/large-2, q-1/large-1, then
    q-2/small-2 no longer fits. Volcano breaks the tie between q-2's two jobs (equal DRF share,
    equal creation time) by uid, pg-large-2 < pg-small-2; Muster breaks it by submission order, so
    pg-large-2 is listed first."""
    out = simulate_yaml(
        FAIR_SHARE_TIERS,
        FAIR_SHARE_NODE
        + """
        jobs:
        - name: pg-small-1
          namespace: ns-1
          queue: q-1
          minMember: 1
          phase: Running
          tasks: [{name: pod-small-1, request: {cpu: "1", memory: 1G}, status: Running, node: node-1}]
        - name: pg-large-1
          namespace: ns-1
          queue: q-1
          minMember: 1
          phase: Inqueue
          tasks: [{name: pod-large-1, request: {cpu: "2", memory: 2G}}]
        - name: pg-large-2
          namespace: ns-1
          queue: q-2
          minMember: 1
          phase: Inqueue
          tasks: [{name: pod-large-2, request: {cpu: "2", memory: 2G}}]
        - name: pg-small-2
          namespace: ns-1
          queue: q-2
          minMember: 1
          phase: Inqueue
          tasks: [{name: pod-small-2, request: {cpu: "1", memory: 1G}}]
    """,
    )
    assert out["binds"] == {"ns-1/pod-large-1": "node-1", "ns-1/pod-large-2": "node-1"}


def test_queue_is_put_back_for_its_next_job() -> None:
    """TestFareShareAllocate "queue's one jobs has no pending tasks, should be put back to queues
    for next job": a Running job with nothing pending does not end the queue's turn."""
    out = simulate_yaml(
        FAIR_SHARE_TIERS,
        """
        nodes:
        - {name: node-1, allocatable: {cpu: "5", memory: 5G, pods: 10}}
        queues: [{name: q-1, weight: 1}]
        jobs:
        - name: pg-1
          namespace: ns-1
          queue: q-1
          minMember: 1
          phase: Running
          tasks: [{name: pod-1, request: {cpu: "1", memory: 1G}, status: Running, node: node-1}]
        - name: pg-2
          namespace: ns-1
          queue: q-1
          minMember: 1
          phase: Inqueue
          tasks: [{name: pod-2, request: {cpu: "2", memory: 2G}}]
    """,
    )
    assert out["binds"] == {"ns-1/pod-2": "node-1"}


def test_predicate_error_cache_skips_tasks_of_a_failed_role() -> None:
    """Volcano ``TaskHasFitErrors`` (predicateErrorCacheEnable, default on): once a task of a role
    fits nowhere, the role's other tasks are skipped with "has already predicated failed"; with
    the cache off every task is tried (same decisions, different reasons)."""
    cluster = """
        nodes:
        - {name: n1, allocatable: {cpu: "1", memory: 4Gi, pods: 10}}
        queues: [{name: c1, weight: 1}]
        jobs:
        - name: pg1
          namespace: c1
          queue: c1
          minMember: 1
          phase: Inqueue
          tasks:
          - {name: big-0, role: big, request: {cpu: "2", memory: 1G}}
          - {name: big-1, role: big, request: {cpu: "2", memory: 1G}}
          - {name: small-0, role: small, request: {cpu: "1", memory: 1G}}
    """
    out = simulate_yaml(ALLOCATE_TIERS, cluster)
    assert out["binds"] == {"c1/small-0": "n1"}
    off = ALLOCATE_TIERS.replace(
        "extension_points_not_listed: disabled",
        "extension_points_not_listed: disabled\n  action_arguments: {allocate: {predicateErrorCacheEnable: false}}",
    )
    assert simulate_yaml(off, cluster)["binds"] == {"c1/small-0": "n1"}
