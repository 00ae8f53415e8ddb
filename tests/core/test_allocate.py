"""allocate action: the behaviour of Volcano's actions/allocate/allocate.go, as scenarios run
through ``muster simulate`` (``server.simulate.simulate_text``).

The cases of Volcano's allocate_test.go (``TestAllocate``, ``TestFareShareAllocate`` and the
network-topology tables) are scenario files under tests/scenarios/volcano/allocate/, run by
test_volcano_cases.py. The tests here check what allocate.go does beyond those tables, with
TestAllocate's tier: Volcano's test tiers switch on only the extension points they list, which a
scenario writes as ``extension_points_not_listed: disabled``.
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
