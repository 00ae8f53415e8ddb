"""gang plugin: Volcano's plugins/gang/gang_test.go (``TestShouldSkipUnschedulableForReleasing``)
and the functions gang.go registers (job_valid, job_order, job_ready, job_pipelined, preemptable,
the session-close conditions)."""

from __future__ import annotations

import pytest
from core_helpers import job, node, queue, res, session, simulate_yaml, snapshot, task

from server.model import JobSpec, PodGroupPhase, TaskStatus
from server.plugins.volcano.gang import _releasing_covers_gang
from server.session.info import JobInfo, ResourceSpace
from server.session.session import Session

GANG_ONLY = """
extension_points_not_listed: disabled
tiers:
- plugins:
  - {name: gang, enableJobOrder: true, enableJobReady: true, enableJobPipelined: true, enablePreemptable: true,
     enableReclaimable: true, enableJobStarving: true}
"""


def _job(min_member: int, tasks: list[tuple[str, TaskStatus, str | None]]) -> JobInfo:
    """Job ns/job-1 of the (name, status, node) tasks, as the session sees it."""
    spec = job(
        "job-1",
        queue="q",
        tasks=[
            task(name, "job-1", res("1"), where, uid=name, status=status)
            for name, status, where in tasks
        ],
        min_member=min_member,
        phase=PodGroupPhase.PENDING,
    )
    return JobInfo(spec, ResourceSpace(["cpu", "memory"]))


@pytest.mark.parametrize(
    ("min_member", "tasks", "expected"),
    [
        # "partial termination": a running and a releasing (still on its node) task cover min 2.
        (
            2,
            [
                ("running", TaskStatus.RUNNING, "node-1"),
                ("releasing", TaskStatus.RELEASING, "node-2"),
            ],
            True,
        ),
        # "pending replacement still needs condition"
        (
            2,
            [
                ("running", TaskStatus.RUNNING, "node-1"),
                ("releasing", TaskStatus.RELEASING, "node-2"),
                ("replacement", TaskStatus.PENDING, None),
            ],
            False,
        ),
        # "pipelined replacement still needs condition"
        (
            2,
            [
                ("running", TaskStatus.RUNNING, "node-1"),
                ("releasing", TaskStatus.RELEASING, "node-2"),
                ("replacement", TaskStatus.PIPELINED, "node-3"),
            ],
            False,
        ),
        # "never scheduled releasing task is not counted"
        (1, [("releasing", TaskStatus.RELEASING, None)], False),
        # "scheduled tasks below minAvailable"
        (
            3,
            [
                ("running", TaskStatus.RUNNING, "node-1"),
                ("releasing", TaskStatus.RELEASING, "node-2"),
            ],
            False,
        ),
    ],
    ids=[
        "partial-termination",
        "pending-replacement",
        "pipelined-replacement",
        "never-scheduled-releasing",
        "below-min-available",
    ],
)
def test_should_skip_unschedulable_for_releasing(
    min_member: int, tasks: list, expected: bool
) -> None:
    """TestShouldSkipUnschedulableForReleasing: each of Volcano's five cases."""
    assert _releasing_covers_gang(_job(min_member, tasks)) is expected


def _session(jobs: list[JobSpec]) -> Session:
    return session(snapshot([node("n1", "8", "8G")], jobs, [queue("q")]), GANG_ONLY)


def _spec(
    name: str,
    min_member: int,
    statuses: list[TaskStatus],
    roles: list[str] | None = None,
    min_task_member: dict[str, int] | None = None,
) -> JobSpec:
    """One 1-cpu task per status, on n1 unless Pending."""
    return job(
        name,
        cpu="1",
        memory=None,
        queue="q",
        status=statuses,
        nodes="n1",
        roles=roles,
        min_member=min_member,
        min_task_member=min_task_member or {},
        task_index=0,
    )


def test_job_with_fewer_valid_tasks_than_min_available_is_invalid_with_reason() -> None:
    """gang job_valid: ValidTaskNum < MinAvailable -> NotEnoughTasks; the job stays in the session
    (Volcano's actions skip it through JobValid) and closes with the condition as Unschedulable."""
    ssn = _session([_spec("j", 3, [TaskStatus.PENDING, TaskStatus.FAILED, TaskStatus.PENDING])])
    assert ssn.invalid_jobs["ns/j"].reason == "NotEnoughTasks"
    outcome = ssn.close().jobs["ns/j"]
    assert outcome.conditions[0].reason == "NotEnoughTasks"
    assert (
        outcome.conditions[0].message
        == "Not enough valid tasks for gang-scheduling, valid: 2, min: 3"
    )


def test_role_with_fewer_valid_tasks_than_its_minimum_is_invalid() -> None:
    """gang job_valid, CheckTaskValid: minTaskMember worker 2 with one valid worker ->
    NotEnoughPodsOfTask."""
    spec = _spec(
        "j",
        2,
        [TaskStatus.PENDING, TaskStatus.PENDING, TaskStatus.FAILED],
        roles=["ps", "worker", "worker"],
        min_task_member={"ps": 1, "worker": 2},
    )
    spec.min_member = 3
    spec.tasks.append(task("j-3", "j", role="ps"))
    ssn = _session([spec])
    assert ssn.close().jobs["ns/j"].conditions[0].reason == "NotEnoughPodsOfTask"


def test_unready_jobs_order_before_ready_ones() -> None:
    """gang job_order: a job that is not ready yet goes before a ready one."""
    ready = _spec("ready", 1, [TaskStatus.RUNNING, TaskStatus.PENDING])
    waiting = _spec("waiting", 1, [TaskStatus.PENDING])
    ssn = _session([ready, waiting])
    assert ssn.job_order_fn(ssn.jobs["ns/waiting"], ssn.jobs["ns/ready"])
    assert not ssn.job_order_fn(ssn.jobs["ns/ready"], ssn.jobs["ns/waiting"])


def test_job_ready_and_pipelined_count_like_volcano() -> None:
    """gang job_ready: ready tasks (+ pending best-effort) >= minAvailable; job_pipelined also
    counts pipelined tasks."""
    ssn = _session([_spec("j", 2, [TaskStatus.RUNNING, TaskStatus.PIPELINED])])
    job = ssn.jobs["ns/j"]
    assert not ssn.job_ready(job)
    assert ssn.job_pipelined(job)


def test_victims_never_take_a_job_below_min_available() -> None:
    """gang preemptable/reclaimable: of a job's running tasks only those above minAvailable may
    be victims, counted per job across the candidate list."""
    ssn = _session([_spec("j", 2, [TaskStatus.RUNNING] * 4), _spec("k", 1, [TaskStatus.RUNNING])])
    candidates = [t for job in ssn.jobs.values() for t in job.tasks.values()]
    preemptor = ssn.jobs["ns/k"].tasks["ns/k-0"]
    victims = ssn.preemptable(preemptor, candidates)
    assert [v.uid for v in victims] == ["ns/j-0", "ns/j-1"]
    assert [v.uid for v in ssn.reclaimable(preemptor, candidates)] == ["ns/j-0", "ns/j-1"]


def test_conditions_written_on_close() -> None:
    """gang OnSessionClose: Scheduled for a ready gang, Unschedulable (NotEnoughResources) with
    the "x/y tasks in gang unschedulable" message otherwise."""
    out = simulate_yaml("""
        config:
          actions: [allocate]
          tiers:
          - plugins: [{name: gang}, {name: predicates}]
        nodes: [{name: n1, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}]
        queues: [{name: q}]
        jobs:
        - {name: fits, namespace: ns, queue: q, minMember: 1, phase: Inqueue, tasks: [{name: f0, request: {cpu: "1"}}]}
        - name: big
          namespace: ns
          queue: q
          minMember: 2
          phase: Inqueue
          tasks: [{name: b0, request: {cpu: "4"}}, {name: b1, request: {cpu: "4"}}]
    """)
    fits = out["jobs"]["ns/fits"]["conditions"]
    assert fits == [
        {"type": "Scheduled", "reason": "tasks in gang are ready to be scheduled", "message": ""}
    ]
    big = out["jobs"]["ns/big"]["conditions"][0]
    assert big["type"] == "Unschedulable"
    assert big["reason"] == "NotEnoughResources"
    assert big["message"].startswith(
        "2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 2 minAvailable"
    )
    assert "Origin reason is b0: 0/1 nodes are unavailable: 1 Insufficient cpu." in big["message"]


def test_pipelined_gang_keeps_its_placements_without_binding() -> None:
    """Volcano allocate: a gang that is pipelined (two members on idle nodes, the third on a node
    whose task is releasing) keeps its statement in the session uncommitted: nothing is bound, the
    idle placements stay Allocated and the third is Pipelined (Volcano ExpectPipeLined)."""
    out = simulate_yaml("""
        config:
          actions: [allocate]
          tiers:
          - plugins: [{name: gang}, {name: predicates}]
        nodes:
        - {name: n1, allocatable: {cpu: "1", pods: 10}}
        - {name: n2, allocatable: {cpu: "1", pods: 10}}
        - {name: n3, allocatable: {cpu: "1", pods: 10}}
        queues: [{name: q}]
        jobs:
        - name: blocker
          namespace: ns
          queue: q
          minMember: 1
          phase: Running
          tasks: [{name: x0, request: {cpu: "1"}, status: Releasing, node: n3}]
        - name: gang
          namespace: ns
          queue: q
          minMember: 3
          phase: Inqueue
          tasks: [{name: g0, request: {cpu: "1"}}, {name: g1, request: {cpu: "1"}}, {name: g2, request: {cpu: "1"}}]
    """)
    assert out["binds"] == {}
    assert out["pipelined"] == {"ns/g2": "n3"}
    assert {out["tasks"][f"ns/g{i}"]["status"] for i in (0, 1)} == {"Allocated"}
    assert out["jobs"]["ns/gang"]["phase"] == "Inqueue"


def test_each_subgroup_needs_its_own_minimum() -> None:
    """Volcano gang job ready = CheckTaskReady && CheckSubJobReady && IsReady: a gang whose overall
    minMember is met but one of whose sub-groups is short is not ready (and is not bound)."""
    text = """
nodes:
- {name: n1, allocatable: {cpu: "2", memory: 8Gi}}
jobs:
- name: sg
  phase: Inqueue
  minMember: 2
  subGroups: [{name: a, minMember: 1}, {name: b, minMember: 2}]
  tasks:
  - {name: a0, subGroup: a, request: {cpu: "1"}}
  - {name: b0, subGroup: b, request: {cpu: "1"}}
  - {name: b1, subGroup: b, request: {cpu: "1"}}
"""
    out = simulate_yaml(text)
    # Two tasks fit (minMember 2), but sub-group b needs both of its tasks: nothing is bound.
    assert out["binds"] == {}
    assert out["jobs"]["default/sg"]["conditions"][0]["type"] == "Unschedulable"
    roomy = simulate_yaml(text.replace('cpu: "2", memory', 'cpu: "3", memory'))
    assert len(roomy["binds"]) == 3
