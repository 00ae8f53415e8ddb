"""backfill action: Volcano's actions/backfill/backfill_test.go (``TestPickUpPendingTasks``) and
the behaviour of backfill.go, as a direct session test and as scenarios."""

from __future__ import annotations

from core_helpers import job, node, queue, session, simulate_yaml, snapshot, task

from server.actions.volcano.backfill import BackfillAction
from server.model import ClusterSnapshot, TaskStatus

PICK_UP_TIERS = """
extension_points_not_listed: disabled
tiers:
- plugins:
  - {name: priority, enablePreemptable: true, enableTaskOrder: true, enableJobOrder: true}
  - {name: drf, enableQueueOrder: true}
"""


def _pick_up_snapshot() -> ClusterSnapshot:
    """Two jobs (priority 1 and 2) in one queue, each with best-effort and 500m tasks of task
    priorities 1..4, submitted in Volcano's pod order (pending pods, then the pipelined ones)."""
    jobs = []
    for j, job_priority in (("pg1", 1), ("pg2", 2)):
        tasks = []
        for k, prio in enumerate((1, 3, 2, 4)):
            for kind, request in (("besteffort", {}), ("unbesteffort", {"cpu": "500m"})):
                tasks.append(
                    task(
                        f"{j}-{kind}-task-{prio}",
                        j,
                        request,
                        ns="default",
                        priority=prio,
                        creation_index=k * 2 + len(tasks),
                    )
                )
        jobs.append(
            job(
                j,
                ns="default",
                queue="q1",
                tasks=tasks,
                min_member=1,
                priority=job_priority,
                index=len(jobs),
            )
        )
    return snapshot([node("node1", "8", "8Gi")], jobs, [queue("q1")])


def test_pick_up_pending_tasks_in_job_then_task_priority_order() -> None:
    """TestPickUpPendingTasks "test": best-effort tasks only, the higher-priority job first, then
    task priority; the pipelined best-effort tasks (priorities 2 and 4) are unpipelined and taken
    too."""
    ssn = session(_pick_up_snapshot(), PICK_UP_TIERS)
    for info in ssn.jobs.values():
        for t in list(info.tasks.values()):
            if t.name.endswith(("task-2", "task-4")):
                ssn.statement().pipeline(t, "node1")
    names = [t.name for t in BackfillAction().pending_tasks(ssn)]
    assert names == [
        "pg2-besteffort-task-4",
        "pg2-besteffort-task-3",
        "pg2-besteffort-task-2",
        "pg2-besteffort-task-1",
        "pg1-besteffort-task-4",
        "pg1-besteffort-task-3",
        "pg1-besteffort-task-2",
        "pg1-besteffort-task-1",
    ]
    # The unpipelined best-effort tasks are Pending again; the 500m ones stay pipelined.
    assert ssn.tasks["default/pg1-besteffort-task-4"].status == TaskStatus.PENDING
    assert ssn.tasks["default/pg1-unbesteffort-task-4"].status == TaskStatus.PIPELINED


BACKFILL_TIERS = """
config:
  actions: [allocate, backfill]
  extension_points_not_listed: disabled
  tiers:
  - plugins:
    - {name: gang, enableJobReady: true, enableJobPipelined: true}
    - {name: predicates, enablePredicate: true}
"""


def run(cluster: str) -> dict:
    return simulate_yaml(BACKFILL_TIERS, cluster)


def test_best_effort_task_goes_to_a_node_passing_the_predicates() -> None:
    """backfill.go: a task without requests is placed on a node that passes the predicates (the
    selector rules out n1), even a full one: it needs no resources."""
    out = run("""
        nodes:
        - {name: n1, allocatable: {cpu: "1", memory: 1Gi, pods: 10}}
        - {name: n2, allocatable: {cpu: "1", memory: 1Gi, pods: 10}, labels: {kind: batch}}
        queues: [{name: q1}]
        jobs:
        - name: full
          namespace: ns
          queue: q1
          minMember: 1
          phase: Running
          tasks: [{name: f0, request: {cpu: "1", memory: 1Gi}, status: Running, node: n2}]
        - name: be
          namespace: ns
          queue: q1
          minMember: 1
          phase: Inqueue
          tasks: [{name: be0, request: {}, nodeSelector: {kind: batch}}]
    """)
    assert out["binds"] == {"ns/be0": "n2"}
    assert out["jobs"]["ns/be"]["phase"] == "Running"


def test_task_that_fits_nowhere_does_not_stop_the_next_one() -> None:
    """backfill.go records the fit errors of a task that fits no node and goes on with the next
    task (it does not break out of the job)."""
    out = run("""
        nodes:
        - {name: n1, allocatable: {cpu: "1", memory: 1Gi, pods: 10}}
        queues: [{name: q1}]
        jobs:
        - name: be
          namespace: ns
          queue: q1
          minMember: 1
          phase: Inqueue
          tasks:
          - {name: be0, request: {}, nodeSelector: {kind: gpu}}
          - {name: be1, request: {}}
    """)
    assert out["binds"] == {"ns/be1": "n1"}
    assert out["tasks"]["ns/be0"]["status"] == "Pending"


def test_pending_job_is_not_backfilled() -> None:
    """pickUpPendingTasks skips jobs whose PodGroup is still Pending (not admitted)."""
    cluster = """
        nodes:
        - {name: n1, allocatable: {cpu: "1", memory: 1Gi, pods: 10}}
        queues: [{name: q1}]
        jobs:
        - name: be
          namespace: ns
          queue: q1
          minMember: 1
          phase: Pending
          tasks: [{name: be0, request: {}}]
    """
    backfill_only = BACKFILL_TIERS.replace("actions: [allocate, backfill]", "actions: [backfill]")
    out = simulate_yaml(backfill_only, cluster)
    assert out["binds"] == {}


def test_best_effort_placement_binds_only_once_the_gang_is_ready() -> None:
    """Volcano ``Session.Allocate`` dispatches a job's allocated tasks only when the job is ready:
    a best-effort task of a gang whose other member found no room stays Allocated, unbound."""
    out = run("""
        nodes:
        - {name: n1, allocatable: {cpu: "1", memory: 1Gi, pods: 10}}
        queues: [{name: q1}]
        jobs:
        - name: mixed
          namespace: ns
          queue: q1
          minMember: 2
          phase: Inqueue
          tasks:
          - {name: big, request: {cpu: "2", memory: 1Gi}}
          - {name: be, request: {}}
    """)
    assert out["binds"] == {}
    assert out["tasks"]["ns/be"] == {
        "status": "Allocated",
        "node": "n1",
        "gpu_groups": [],
        "devices": [],
    }
    assert out["tasks"]["ns/big"]["status"] == "Pending"


def test_best_effort_gang_binds_when_its_members_complete_it() -> None:
    """The same gang rule from the other side: two best-effort members of a minMember-2 job are
    both bound, since pending best-effort tasks count toward readiness."""
    out = run("""
        nodes:
        - {name: n1, allocatable: {cpu: "1", memory: 1Gi, pods: 10}}
        queues: [{name: q1}]
        jobs:
        - name: be
          namespace: ns
          queue: q1
          minMember: 2
          phase: Inqueue
          tasks:
          - {name: be0, request: {}}
          - {name: be1, request: {}}
    """)
    assert out["binds"] == {"ns/be0": "n1", "ns/be1": "n1"}
