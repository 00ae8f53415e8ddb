"""priority plugin: the functions priority.go registers (task_order, job_order, preemptable,
job_starving), checked in a session. The two ``TestPreempt`` cases of Volcano's
plugins/priority/priority_test.go are scenario files under tests/scenarios/volcano/priority/, run by
test_volcano_cases.py; its "disable preempt" case is also checked here at the function level."""

from __future__ import annotations

from core_helpers import (
    config,
    job,
    node,
    plugin,
    queue,
    res,
    session,
    simulate_yaml,
    snapshot,
    task,
)

from server.model import JobSpec, PodGroupPhase, TaskStatus
from server.session.session import Session


def _job(
    name: str, priority: int, tasks: list[tuple[str, int, TaskStatus]], index: int = 0
) -> JobSpec:
    """A Running job of the (name, task priority, status) 1-cpu tasks, on n1 unless Pending."""
    specs = [
        task(t, name, res("1"), None if s == TaskStatus.PENDING else "n1", status=s, priority=p)
        for t, p, s in tasks
    ]
    return job(
        name,
        queue="q1",
        tasks=specs,
        priority=priority,
        min_member=1,
        phase=PodGroupPhase.RUNNING,
        index=index,
    )


def _session(*jobs: JobSpec, preemptable: bool = True) -> Session:
    tier = [
        plugin(
            "priority",
            "enableTaskOrder",
            "enableJobOrder",
            "enableJobStarving",
            enablePreemptable=preemptable,
            enableReclaimable=preemptable,
        )
    ]
    return session(snapshot([node("n1", "8", "8G")], jobs, [queue("q1")]), config(None, [tier]))


def test_higher_priority_job_and_task_order_first() -> None:
    """priority job_order / task_order: higher priority first, whatever the submission order."""
    ssn = _session(
        _job(
            "low",
            100,
            [("low-a", 1, TaskStatus.PENDING), ("low-b", 5, TaskStatus.PENDING)],
            index=0,
        ),
        _job("high", 1000, [("high-a", 1, TaskStatus.PENDING)], index=1),
    )
    assert ssn.job_order_fn(ssn.jobs["ns/high"], ssn.jobs["ns/low"])
    assert not ssn.job_order_fn(ssn.jobs["ns/low"], ssn.jobs["ns/high"])
    assert ssn.task_order_fn(ssn.tasks["ns/low-b"], ssn.tasks["ns/low-a"])


def test_preemptable_victims_are_lower_priority_jobs_or_lower_priority_tasks_of_the_same_job() -> (
    None
):
    """priority preemptableFn: another job's task is a victim only if that job's priority is lower
    (equal is not enough); within the preemptor's own job, a task of lower task priority."""
    ssn = _session(
        _job("low", 100, [("low-0", 1, TaskStatus.RUNNING)]),
        _job("peer", 1000, [("peer-0", 1, TaskStatus.RUNNING)]),
        _job(
            "high",
            1000,
            [
                ("high-run", 1, TaskStatus.RUNNING),
                ("high-run-top", 9, TaskStatus.RUNNING),
                ("high-new", 5, TaskStatus.PENDING),
            ],
        ),
    )
    candidates = [ssn.tasks[u] for u in ("ns/low-0", "ns/peer-0", "ns/high-run", "ns/high-run-top")]
    victims = ssn.preemptable(ssn.tasks["ns/high-new"], candidates)
    assert [v.uid for v in victims] == ["ns/low-0", "ns/high-run"]


def test_disabled_preemptable_switch_contributes_no_victims() -> None:
    """priority_test.go TestPreempt "disable preempt low priority: enablePreemptable:false": with
    the switch off the plugin's preemptable function is not consulted (no plugin: no victims)."""
    ssn = _session(
        _job("low", 100, [("low-0", 1, TaskStatus.RUNNING)]),
        _job("high", 1000, [("high-new", 1, TaskStatus.PENDING)]),
        preemptable=False,
    )
    assert ssn.preemptable(ssn.tasks["ns/high-new"], [ssn.tasks["ns/low-0"]]) == []


def test_job_is_starving_while_some_task_is_neither_ready_nor_pipelined() -> None:
    """priority jobStarvingFn: ReadyTaskNum + WaitingTaskNum < len(tasks)."""
    ssn = _session(
        _job("partial", 1, [("p-0", 1, TaskStatus.RUNNING), ("p-1", 1, TaskStatus.PENDING)]),
        _job("full", 1, [("f-0", 1, TaskStatus.RUNNING), ("f-1", 1, TaskStatus.PIPELINED)]),
    )
    assert ssn.job_starving(ssn.jobs["ns/partial"])
    assert not ssn.job_starving(ssn.jobs["ns/full"])


def test_high_priority_job_is_allocated_first_on_a_small_cluster() -> None:
    """priority job_order drives allocate: the priorityClass of the later-submitted job wins the
    only free slot."""
    out = simulate_yaml("""
        config:
          actions: [enqueue, allocate]
          tiers:
          - plugins: [{name: priority}, {name: gang}]
          - plugins: [{name: predicates}]
        priorityClasses:
        - {name: low-priority, value: 100}
        - {name: high-priority, value: 1000}
        nodes: [{name: node1, allocatable: {cpu: "3", memory: 3G, pods: 10}}]
        queues: [{name: q1}]
        jobs:
        - {name: pg1, namespace: ns1, queue: q1, minMember: 1, priorityClass: low-priority, phase: Inqueue,
           tasks: [{name: t1, request: {cpu: "3", memory: 3G}}]}
        - {name: pg2, namespace: ns2, queue: q1, minMember: 1, priorityClass: high-priority, phase: Inqueue,
           tasks: [{name: t2, request: {cpu: "3", memory: 3G}}]}
    """)
    assert out["binds"] == {"ns2/t2": "node1"}
