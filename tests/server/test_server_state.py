"""Cluster state: snapshot consistency, apply with races, decisions, gang release (no network)."""

from __future__ import annotations

import pytest
from server_test_helpers import gang, node, rl, send_statuses

from muster.v1 import muster_pb2 as pb
from server.model import Condition, CycleResult, JobOutcome, PodGroupPhase, TaskStatus
from server.service import commands, ingest, snapshot
from server.service.api import queries
from server.service.apply import apply
from server.service.decisions import DecisionLog
from server.service.errors import DomainError
from server.service.state import ClusterState


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def state(clock: Clock) -> ClusterState:
    c = ClusterState(DecisionLog(bind_timeout=30), clock=clock)
    ingest.register_backend(c, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(
        c, pb.SyncSnapshotRequest(backend="a", nodes=[node(f"n{i}") for i in range(4)])
    )
    return c


def bind_all(state: ClusterState, job_id: str) -> tuple[object, CycleResult]:
    """Capture, then a result binding every task of the job to n0..n3 round robin."""
    capture = snapshot.capture(state)
    rec = state.jobs[job_id]
    result = CycleResult(capture.cycle_id)
    for i, t in enumerate(rec.tasks):
        result.binds[t.uid] = f"n{i % 4}"
    result.jobs[job_id] = JobOutcome(PodGroupPhase.RUNNING)
    return capture, result


def statuses(state: ClusterState, job_id: str) -> list[TaskStatus]:
    return [t.status for t in state.jobs[job_id].tasks]


def test_snapshot_is_a_deep_copy(state: ClusterState) -> None:
    commands.submit_job(state, gang("g", replicas=2))
    snap = snapshot.capture(state).materialize()
    job = snap.jobs[0]
    assert [t.uid for t in job.tasks] == ["g/worker-0", "g/worker-1"]
    assert job.tasks[0].request == {"cpu": 4000.0}
    job.tasks[0].request["cpu"] = 1.0
    job.tasks[0].status = TaskStatus.RUNNING
    snap.nodes[0].allocatable["cpu"] = 0
    again = snapshot.capture(state).materialize()
    assert again.jobs[0].tasks[0].request == {"cpu": 4000.0}
    assert again.jobs[0].tasks[0].status == TaskStatus.PENDING
    assert again.nodes[0].allocatable["cpu"] == 4000.0
    assert {q.name for q in again.queues} == {"root", "default"}


def test_bind_issues_decisions_to_owning_backend(state: ClusterState) -> None:
    commands.submit_job(state, gang("g", replicas=4))
    capture, result = bind_all(state, "g")
    stats = apply(state, capture, result)
    assert stats.binds == 4
    assert stats.dropped_binds == 0
    assert statuses(state, "g") == [TaskStatus.BINDING] * 4
    pending = sorted(state.decisions.pending.values(), key=lambda p: p.row.id)
    assert [p.decision.bind.task_id for p in pending] == [f"g/worker-{i}" for i in range(4)]
    assert {p.decision.backend for p in pending} == {"a"}
    assert pending[0].decision.cycle_id == capture.cycle_id
    assert pending[0].decision.bind.request.quantities["cpu"] == "4"
    assert state.jobs["g"].status.phase == pb.JOB_PHASE_RUNNING
    assert any(
        c.type == "Scheduled" and c.status == "True" for c in state.jobs["g"].status.conditions
    )


def test_apply_drops_binds_of_job_cancelled_meanwhile(state: ClusterState) -> None:
    commands.submit_job(state, gang("g", replicas=2))
    capture, result = bind_all(state, "g")
    commands.cancel_job(state, "g")
    stats = apply(state, capture, result)
    assert stats.binds == 0
    assert stats.dropped_binds == 2
    assert not state.decisions.pending
    assert state.jobs["g"].status.phase == pb.JOB_PHASE_CANCELLED


def test_apply_drops_whole_gang_when_a_node_vanished(state: ClusterState) -> None:
    commands.submit_job(state, gang("g", replicas=4))
    capture, result = bind_all(state, "g")
    ingest.send_deltas(
        state, pb.SendDeltasRequest(backend="a", deltas=[pb.Delta(node_removed="n3")])
    )
    stats = apply(state, capture, result)
    assert stats.binds == 0
    assert stats.dropped_binds == 4
    assert statuses(state, "g") == [TaskStatus.PENDING] * 4


def test_apply_drops_bind_of_task_already_bound(state: ClusterState) -> None:
    commands.submit_job(state, gang("g", replicas=1))
    first_capture, first = bind_all(state, "g")
    second_capture, second = bind_all(state, "g")  # a stale result computed on the same state
    apply(state, first_capture, first)
    stats = apply(state, second_capture, second)
    assert stats.dropped_binds == 1
    assert len(state.decisions.pending) == 1


def test_pipelined_tasks_stay_pending(state: ClusterState) -> None:
    commands.submit_job(state, gang("g", replicas=1))
    capture = snapshot.capture(state)
    result = CycleResult(capture.cycle_id, pipelined={"g/worker-0": "n0"})
    apply(state, capture, result)
    assert statuses(state, "g") == [TaskStatus.PENDING]
    assert not state.decisions.pending


def test_outcome_sets_conditions_and_explanation(state: ClusterState) -> None:
    from server.model import Condition, Explanation

    commands.submit_job(state, gang("g", replicas=8))
    capture = snapshot.capture(state)
    result = CycleResult(capture.cycle_id)
    result.jobs["g"] = JobOutcome(
        PodGroupPhase.INQUEUE,
        [Condition("Unschedulable", "True", "NotEnoughResources", "4/8 tasks fit")],
        Explanation("gang", "0/4 nodes available: 4 insufficient cpu", {"insufficient cpu": 4}),
    )
    apply(state, capture, result)
    rec = state.jobs["g"]
    assert rec.status.phase == pb.JOB_PHASE_INQUEUE
    cond = rec.status.conditions[0]
    assert (cond.type, cond.reason, cond.cycle_id) == (
        "Unschedulable",
        "NotEnoughResources",
        capture.cycle_id,
    )
    exp = queries.explain(state, "g")
    assert exp.gate == "gang"
    assert exp.node_reasons["insufficient cpu"] == 4
    assert exp.cycle_id == capture.cycle_id


def ack(state: ClusterState, *acks: pb.DecisionAck) -> pb.AckDecisionsResponse:
    req = pb.AckDecisionsRequest(backend="a", acks=acks)
    return ingest.ack(state, req, {})


def decision_for(state: ClusterState, task_id: str, kind: str = "bind") -> int:
    return next(
        p.row.id
        for p in state.decisions.pending.values()
        if p.row.task_id == task_id and p.row.kind == kind
    )


def test_ack_applied_then_running_then_completed(state: ClusterState) -> None:
    commands.submit_job(state, gang("g", replicas=2))
    apply(state, *bind_all(state, "g"))
    ids = [decision_for(state, f"g/worker-{i}") for i in range(2)]
    assert ack(state, *(pb.DecisionAck(decision_id=i, applied=True) for i in ids)).accepted == 2
    assert statuses(state, "g") == [TaskStatus.BOUND] * 2
    assert (
        ack(state, pb.DecisionAck(decision_id=ids[0], applied=True)).accepted == 1
    )  # duplicate: fine
    send_statuses(
        state,
        "a",
        [
            pb.TaskStatusUpdate(task_id=f"g/worker-{i}", status=pb.TASK_STATUS_SUCCEEDED)
            for i in range(2)
        ],
    )
    assert state.jobs["g"].status.phase == pb.JOB_PHASE_COMPLETED
    assert state.jobs["g"].status.finish_time > 0


def test_rejected_bind_releases_the_whole_gang(state: ClusterState) -> None:
    commands.submit_job(state, gang("g", replicas=4))
    apply(state, *bind_all(state, "g"))
    ids = [decision_for(state, f"g/worker-{i}") for i in range(4)]
    ack(state, pb.DecisionAck(decision_id=ids[0], applied=True))
    ack(state, pb.DecisionAck(decision_id=ids[1], applied=False, reason="node full"))
    st = statuses(state, "g")
    assert st[1] == TaskStatus.PENDING
    assert "node full" in state.jobs["g"].tasks[1].message
    # 3 < min_member 4: the other placed tasks are evicted (gang-broken).
    assert st[0] == st[2] == st[3] == TaskStatus.RELEASING
    evicts = [p.decision for p in state.decisions.pending.values() if p.row.kind == "evict"]
    assert sorted(d.evict.task_id for d in evicts) == ["g/worker-0", "g/worker-2", "g/worker-3"]
    assert {d.evict.reason for d in evicts} == {"gang-broken"}
    assert state.jobs["g"].status.phase != pb.JOB_PHASE_RUNNING
    # Evict acks return the tasks to Pending: the gang is re-placed as a whole later.
    ack(state, *(pb.DecisionAck(decision_id=d.id, applied=True) for d in evicts))
    ack(state, *(pb.DecisionAck(decision_id=i, applied=False) for i in ids[2:]))  # late, moot binds
    assert statuses(state, "g") == [TaskStatus.PENDING] * 4
    assert (
        sum(
            t.status in (TaskStatus.PENDING,)
            for t in snapshot.capture(state).materialize().jobs[0].tasks
        )
        == 4
    )


def test_rejection_keeps_gang_when_min_member_still_met(state: ClusterState) -> None:
    commands.submit_job(state, gang("g", replicas=4, min_member=2))
    apply(state, *bind_all(state, "g"))
    ack(
        state,
        pb.DecisionAck(decision_id=decision_for(state, "g/worker-3"), applied=False, reason="no"),
    )
    assert statuses(state, "g") == [TaskStatus.BINDING] * 3 + [TaskStatus.PENDING]
    assert not [p for p in state.decisions.pending.values() if p.row.kind == "evict"]


def test_expired_bind_returns_task_and_breaks_gang(state: ClusterState, clock: Clock) -> None:
    commands.submit_job(state, gang("g", replicas=2))
    apply(state, *bind_all(state, "g"))
    ack(state, pb.DecisionAck(decision_id=decision_for(state, "g/worker-0"), applied=True))
    late = decision_for(state, "g/worker-1")
    assert ingest.expire(state) == 0  # not yet
    clock.now += 31
    assert ingest.expire(state) == 1
    assert statuses(state, "g") == [TaskStatus.RELEASING, TaskStatus.PENDING]
    assert state.decisions.recent[late][1] == "expired"
    # The expired decision can still be acknowledged (idempotent), and is not pending any more.
    assert ack(state, pb.DecisionAck(decision_id=late, applied=False)).accepted == 1


def test_cancel_evicts_placed_tasks(state: ClusterState) -> None:
    commands.submit_job(state, gang("g", replicas=2))
    apply(state, *bind_all(state, "g"))
    ack(
        state,
        *(
            pb.DecisionAck(decision_id=decision_for(state, f"g/worker-{i}"), applied=True)
            for i in range(2)
        ),
    )
    commands.cancel_job(state, "g")
    evicts = [p.decision for p in state.decisions.pending.values() if p.row.kind == "evict"]
    assert {d.evict.reason for d in evicts} == {"cancel"}
    assert len(evicts) == 2
    ended = next(c for c in state.jobs["g"].status.conditions if c.type == "Ended")
    assert ended.message == "cancelled: 2 tasks stopped"
    ack(state, *(pb.DecisionAck(decision_id=d.id, applied=True) for d in evicts))
    assert statuses(state, "g") == [TaskStatus.CANCELLED] * 2  # not re-placed
    assert state.jobs["g"].status.phase == pb.JOB_PHASE_CANCELLED
    assert not snapshot.capture(state).jobs  # cancelled jobs are not scheduled


def test_ended_jobs_say_how_they_ended_not_why_they_waited(state: ClusterState) -> None:
    """Truthful statuses: a cancelled job has no pending tasks and says it was cancelled; a failed
    one names the task and its exit code; the old Unschedulable text is switched off."""
    commands.submit_job(state, gang("never", replicas=3))
    capture = snapshot.capture(state)
    result = CycleResult(capture.cycle_id)
    result.jobs["never"] = JobOutcome(
        PodGroupPhase.INQUEUE,
        [
            Condition(
                "Unschedulable", "True", "NotEnoughResources", "3/3 tasks in gang unschedulable"
            )
        ],
    )
    apply(state, capture, result)
    view = commands.cancel_job(state, "never")
    assert view.status.pending == 0
    assert view.status.cancelled == 3
    assert {t.status for t in view.tasks} == {pb.TASK_STATUS_CANCELLED}
    conds = {c.type: c for c in view.status.conditions}
    assert conds["Unschedulable"].status == "False"
    assert conds["Unschedulable"].reason == "Cancelled"
    assert conds["Ended"].reason == "Cancelled"
    assert conds["Ended"].message == "cancelled: 3 never placed"

    commands.submit_job(state, gang("crash", replicas=2))
    apply(state, *bind_all(state, "crash"))
    send_statuses(
        state,
        "a",
        [
            pb.TaskStatusUpdate(
                task_id="crash/worker-1",
                status=pb.TASK_STATUS_FAILED,
                exit_code=2,
                message="exit code 2",
            )
        ],
    )
    view = queries.get_job(state, "crash")
    assert view.status.phase == pb.JOB_PHASE_FAILED
    ended = next(c for c in view.status.conditions if c.type == "Ended")
    assert (
        ended.message == "task crash/worker-1 failed (exit code 2); 0/2 succeeded; the gang needs 2"
    )


def test_a_job_goes_to_a_leaf_queue_and_names_a_known_priority_class(state: ClusterState) -> None:
    commands.create_queue(state, pb.Queue(name="eng"))
    commands.create_queue(state, pb.Queue(name="eng-dev", parent="eng"))
    with pytest.raises(DomainError, match="queue 'eng' is not a leaf"):
        commands.submit_job(state, gang("x", replicas=1, queue="eng"))
    commands.submit_job(state, gang("y", replicas=1, queue="eng-dev"))
    with pytest.raises(DomainError, match="'urgent' is not a configured priority class"):
        commands.submit_job(state, gang("z", replicas=1, priority_class="urgent"))


def test_ack_for_other_backends_decision_is_not_found(state: ClusterState) -> None:
    ingest.register_backend(state, pb.RegisterBackendRequest(name="b", kind="fake-agent"))
    commands.submit_job(state, gang("g", replicas=1))
    apply(state, *bind_all(state, "g"))
    req = pb.AckDecisionsRequest(
        backend="b", acks=[pb.DecisionAck(decision_id=decision_for(state, "g/worker-0"))]
    )
    with pytest.raises(DomainError) as info:
        ingest.check_acks(state, req)
    assert info.value.code.name == "NOT_FOUND"
    assert statuses(state, "g") == [TaskStatus.BINDING]


def test_sync_reconciles_running_lost_and_foreign(state: ClusterState) -> None:
    commands.submit_job(state, gang("g", replicas=2))
    apply(state, *bind_all(state, "g"))
    ack(
        state,
        *(
            pb.DecisionAck(decision_id=decision_for(state, f"g/worker-{i}"), applied=True)
            for i in range(2)
        ),
    )
    # The backend re-syncs: worker-0 runs, worker-1 is gone, an unknown pod holds capacity.
    ingest.sync_snapshot(
        state,
        pb.SyncSnapshotRequest(
            backend="a",
            nodes=[node(f"n{i}") for i in range(4)],
            tasks=[
                pb.BackendTask(
                    task_id="g/worker-0",
                    node="n0",
                    request=rl(cpu="4"),
                    status=pb.TASK_STATUS_RUNNING,
                ),
                pb.BackendTask(task_id="other-pod", node="n2", request=rl(cpu="3")),
                # Ended work of someone else holds nothing.
                pb.BackendTask(
                    task_id="done-pod",
                    node="n3",
                    request=rl(cpu="4"),
                    status=pb.TASK_STATUS_SUCCEEDED,
                ),
            ],
        ),
    )
    st = statuses(state, "g")
    assert st[1] == TaskStatus.PENDING
    assert "lost" in state.jobs["g"].tasks[1].message
    assert st[0] == TaskStatus.RELEASING  # gang of 2 broken: the survivor is released too
    snap = snapshot.capture(state).materialize()
    assert [(t.node, t.request) for t in snap.foreign_tasks] == [("n2", {"cpu": 3000.0})]
    views = {v.node.name: v for v in queries.list_nodes(state, "").nodes}
    assert views["n2"].used.quantities["cpu"] == "3"
    assert views["n2"].idle.quantities["cpu"] == "1"


def test_sync_drops_nodes_not_reported(state: ClusterState) -> None:
    ingest.sync_snapshot(state, pb.SyncSnapshotRequest(backend="a", nodes=[node("n0")]))
    assert list(state.nodes) == ["n0"]


def test_list_jobs_paging_and_filters(state: ClusterState) -> None:
    commands.create_queue(state, pb.Queue(name="q2"))
    for i in range(5):
        commands.submit_job(state, gang(f"j{i}", replicas=1, queue="q2" if i % 2 else "default"))
    page = queries.list_jobs(state, pb.ListJobsRequest(page_size=2))
    assert [j.spec.id for j in page.jobs] == ["j0", "j1"]
    assert page.next_page_token
    page2 = queries.list_jobs(
        state, pb.ListJobsRequest(page_size=2, page_token=page.next_page_token)
    )
    assert [j.spec.id for j in page2.jobs] == ["j2", "j3"]
    page3 = queries.list_jobs(
        state, pb.ListJobsRequest(page_size=2, page_token=page2.next_page_token)
    )
    assert [j.spec.id for j in page3.jobs] == ["j4"]
    assert not page3.next_page_token
    assert [j.spec.id for j in queries.list_jobs(state, pb.ListJobsRequest(queue="q2")).jobs] == [
        "j1",
        "j3",
    ]
    with pytest.raises(DomainError):  # a token from another filter set
        queries.list_jobs(state, pb.ListJobsRequest(queue="q2", page_token=page.next_page_token))
    commands.cancel_job(state, "j0")
    got = queries.list_jobs(state, pb.ListJobsRequest(phases=[pb.JOB_PHASE_CANCELLED]))
    assert [j.spec.id for j in got.jobs] == ["j0"]


def test_list_queues_allocated(state: ClusterState) -> None:
    commands.submit_job(state, gang("g", replicas=2, cpu="3"))
    apply(state, *bind_all(state, "g"))
    views = {v.queue.name: v for v in queries.list_queues(state).queues}
    assert views["default"].allocated.quantities["cpu"] == "6"
    assert views["default"].running_jobs == 1
    # root's numbers are its subtree's (issue 28): the cluster's whole allocation
    assert views["root"].allocated.quantities == {"cpu": "6"}
    assert views["root"].running_jobs == 1


def test_commit_batches_only_what_changed(state: ClusterState) -> None:
    state.commit()
    commands.submit_job(state, gang("g", replicas=3))
    batch = state.commit()
    assert set(batch.jobs) == {"g"}
    assert len(batch.tasks) == 3
    assert state.commit().empty()


def test_submit_jobs_is_all_or_nothing(state: ClusterState) -> None:
    commands.submit_job(state, gang("old", replicas=1))
    batch = [gang("new-1", replicas=1), gang("old", replicas=2), gang("new-2", replicas=1)]
    with pytest.raises(
        DomainError, match=r"^jobs\[1\]\.job\.id: job 'old' already exists with a different spec"
    ):
        commands.submit_jobs(state, batch)
    assert sorted(state.jobs) == ["old"]  # nothing of the batch went in
    with pytest.raises(DomainError, match=r"jobs\[1\]\.job\.id: job 'x' is also jobs\[0\]"):
        commands.submit_jobs(state, [gang("x", replicas=1), gang("x", replicas=1)])
    results = commands.submit_jobs(state, [gang("new-1", replicas=1), gang("old", replicas=1)])
    assert [(job.spec.id, created) for job, created in results] == [("new-1", True), ("old", False)]


def test_submit_jobs_reports_the_first_refusal_in_batch_order(state: ClusterState) -> None:
    """Validation (done apart from the state, in a worker thread) and the state's checks refuse in
    the batch's order: an unknown queue at jobs[0] wins over an invalid field at jobs[1]."""
    bad_queue = gang("a", replicas=1)
    bad_queue.queue = "nowhere"
    bad_field = gang("b", replicas=1)
    bad_field.task_groups[0].replicas = -1
    with pytest.raises(
        DomainError, match=r"^jobs\[0\]\.job\.queue: queue 'nowhere' does not exist"
    ):
        commands.submit_jobs(state, [bad_queue, bad_field])
    with pytest.raises(DomainError, match=r"^jobs\[1\]\."):
        commands.submit_jobs(state, [gang("c", replicas=1), bad_field, bad_queue])
    assert "c" not in state.jobs


def test_prepared_jobs_take_their_creation_order_when_created(state: ClusterState) -> None:
    """A batch prepared before another batch but created after it comes after it in creation
    order (tasks and the core's view included)."""
    first = commands.prepare_jobs([gang("late", replicas=2)])
    commands.submit_jobs(state, [gang("early", replicas=1)])
    commands.commit_jobs(state, first)
    early, late = state.jobs["early"], state.jobs["late"]
    assert early.creation_index < late.creation_index
    assert late.template.creation_index == late.creation_index
    assert {t.creation_index for t in late.template.tasks} == {late.creation_index}
    assert late.status.submit_time is not None
    assert late.status.submit_time >= early.status.submit_time


def test_task_output_from_its_backend_is_kept_bounded_and_served(state: ClusterState) -> None:
    from server.service.logs import TaskLogs

    commands.submit_job(state, gang("g", replicas=2))
    apply(state, *bind_all(state, "g"))

    def send(task: str, data: bytes, eof: bool = False, backend: str = "a") -> None:
        ingest.send_deltas(
            state,
            pb.SendDeltasRequest(
                backend=backend,
                deltas=[pb.Delta(task_log=pb.TaskLogChunk(task_id=task, data=data, eof=eof))],
            ),
        )

    send("g/worker-0", b"hello\n")
    send("g/worker-0", b"world\n", eof=True)
    logs = queries.get_task_logs(state, pb.GetTaskLogsRequest(job_id="g"))
    assert [(entry.task_id, entry.data, entry.eof) for entry in logs.logs] == [
        ("g/worker-0", b"hello\nworld\n", True),
        ("g/worker-1", b"", False),
    ]
    one = queries.get_task_logs(state, pb.GetTaskLogsRequest(job_id="g", task_id="g/worker-0")).logs
    assert len(one) == 1
    ingest.register_backend(state, pb.RegisterBackendRequest(name="b", kind="fake-agent"))
    with pytest.raises(DomainError, match="does not run on backend 'b'"):
        send("g/worker-1", b"spoofed", backend="b")  # a backend writes only its own tasks' output
    with pytest.raises(DomainError, match="no task 'g/nope'"):
        queries.get_task_logs(state, pb.GetTaskLogsRequest(job_id="g", task_id="g/nope"))
    # Bounded: the tail per task, and only the most recent tasks.
    small = TaskLogs(per_task=8, tasks=2)
    small.append("t1", b"0123456789")
    out = small.get("t1")
    assert out is not None
    assert bytes(out.data) == b"23456789"
    assert out.truncated
    small.append("t2", b"x")
    small.append("t3", b"y")
    assert small.get("t1") is None
    assert small.get("t3") is not None
