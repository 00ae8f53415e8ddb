"""A TYJob's status tells the truth when it ends (issue 28): no task stays Pending in an ended
TYJob, a task stopped by the job's end is not Failed, and the Ended condition names what failed
(which task, its role, its exit code) -- a worker's failure does not blame the Leader."""

from __future__ import annotations

import pytest
from server_test_helpers import node, rl, send_statuses

from muster.v1 import muster_pb2 as pb
from server.config import DEFAULT_CONFIG_YAML, load_config
from server.model import TaskStatus
from server.scheduler import SchedulerCore
from server.service import commands, ingest, snapshot
from server.service.apply import apply
from server.service.decisions import DecisionLog
from server.service.lifecycle import GANG, TYARRANGER, lifecycle_of
from server.service.state import ClusterState


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def cluster(cpu: str = "16") -> ClusterState:
    state = ClusterState(DecisionLog(bind_timeout=30), clock=Clock())
    ingest.register_backend(state, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(state, pb.SyncSnapshotRequest(backend="a", nodes=[node("n0", cpu=cpu)]))
    return state


def tyjob(job_id: str, workers: int = 2, **ty: object) -> pb.JobSpec:
    return pb.JobSpec(
        id=job_id,
        task_groups=[
            pb.TaskGroup(role="leader", replicas=1, request=rl(cpu="1")),
            pb.TaskGroup(role="actor", replicas=workers, request=rl(cpu="1")),
        ],
        tyjob=pb.TYJob(**ty),  # type: ignore[arg-type]
    )


def place_and_run(state: ClusterState, job_id: str, refused: str = "") -> None:
    """One cycle; the backend refuses the bind of task ``refused`` and runs the others."""
    capture = snapshot.capture(state)
    result = SchedulerCore(load_config(DEFAULT_CONFIG_YAML)).run_cycle(
        capture.materialize(), capture.cycle_id
    )
    apply(state, capture, result)
    if refused:
        acks = [
            pb.DecisionAck(decision_id=p.row.id, applied=False, reason="no room")
            for p in state.decisions.pending.values()
            if p.row.kind == "bind" and p.row.task_id == refused
        ]
        ingest.ack(state, pb.AckDecisionsRequest(backend="a", acks=acks), {})
    for t in state.jobs[job_id].tasks:
        if t.status == TaskStatus.BINDING:
            report(state, t.uid, pb.TASK_STATUS_RUNNING)


def report(state: ClusterState, task_id: str, status: int, exit_code: int = 0) -> None:
    send_statuses(
        state, "a", [pb.TaskStatusUpdate(task_id=task_id, status=status, exit_code=exit_code)]
    )


def ack_evictions(state: ClusterState) -> None:
    acks = [
        pb.DecisionAck(decision_id=p.row.id, applied=True)
        for p in state.decisions.pending.values()
        if p.row.kind == "evict"
    ]
    ingest.ack(state, pb.AckDecisionsRequest(backend="a", acks=acks), {})


def statuses(state: ClusterState, job_id: str) -> dict[str, TaskStatus]:
    return {t.uid: t.status for t in state.jobs[job_id].tasks}


def ended(state: ClusterState, job_id: str) -> str:
    return next(c.message for c in state.jobs[job_id].status.conditions if c.type == "Ended")


def test_failed_workers_fail_the_job_naming_them_not_the_leader() -> None:
    state = cluster()
    commands.submit_job(state, tyjob("j", min_workers_num=2))
    place_and_run(state, "j")
    report(state, "j/actor-0", pb.TASK_STATUS_FAILED, exit_code=2)
    job = state.jobs["j"]
    assert job.status.phase == pb.JOB_PHASE_FAILED
    message = ended(state, "j")
    assert "worker j/actor-0 failed (exit code 2)" in message
    assert "Leader j/leader-0 failed" not in message
    assert "restarts" not in message
    assert "Leader j/leader-0 stopped" in message
    assert "the gang needs 3" in message
    # The Leader and the other worker were stopped by the job's failure: not failed themselves.
    ack_evictions(state)
    assert statuses(state, "j") == {
        "j/leader-0": TaskStatus.CANCELLED,
        "j/actor-0": TaskStatus.FAILED,
        "j/actor-1": TaskStatus.CANCELLED,
    }
    assert job.tasks[0].message == "stopped: the job failed"


def test_a_leader_waiting_for_its_restart_does_not_stay_pending_in_a_failed_job() -> None:
    state = cluster()
    commands.submit_job(state, tyjob("j", min_workers_num=1, restart_limit=3))
    place_and_run(state, "j")
    report(state, "j/leader-0", pb.TASK_STATUS_FAILED, exit_code=3)
    assert state.jobs["j"].tasks[0].status == TaskStatus.PENDING  # restart 1 of 3
    report(state, "j/actor-0", pb.TASK_STATUS_FAILED, exit_code=8)
    report(state, "j/actor-1", pb.TASK_STATUS_FAILED, exit_code=7)
    job = state.jobs["j"]
    assert job.status.phase == pb.JOB_PHASE_FAILED
    leader = job.tasks[0]
    assert leader.status == TaskStatus.CANCELLED
    assert leader.message == "not run: the job failed"
    message = ended(state, "j")
    assert message == (
        "Leader j/leader-0 never ran; worker j/actor-0 failed (exit code 8); "
        "worker j/actor-1 failed (exit code 7); the gang needs 2"
    )
    assert not [t for t in job.tasks if t.status == TaskStatus.PENDING]


def test_a_completed_tyjob_keeps_no_pending_task() -> None:
    # The second worker's bind is refused: it never runs (the gang, the Leader and one worker, does).
    state = cluster()
    commands.submit_job(state, tyjob("j", min_workers_num=1))
    place_and_run(state, "j", refused="j/actor-1")
    assert statuses(state, "j")["j/actor-1"] == TaskStatus.PENDING
    report(state, "j/leader-0", pb.TASK_STATUS_SUCCEEDED)
    assert state.jobs["j"].status.phase == pb.JOB_PHASE_COMPLETED
    assert statuses(state, "j") == {
        "j/leader-0": TaskStatus.SUCCEEDED,
        "j/actor-0": TaskStatus.RELEASING,  # cleanPodPolicy All: stopped
        "j/actor-1": TaskStatus.CANCELLED,
    }
    assert state.jobs["j"].tasks[2].message == "not run: the job completed"
    assert ended(state, "j") == (
        "Leader j/leader-0 succeeded; 1 worker stopped; 1 worker never ran"
    )
    ack_evictions(state)
    assert statuses(state, "j")["j/actor-0"] == TaskStatus.CANCELLED  # stopped, not failed
    assert state.jobs["j"].tasks[1].message == "stopped: the job completed"


def test_a_leader_out_of_restarts_is_named_with_its_exit_code() -> None:
    state = cluster()
    commands.submit_job(state, tyjob("j", restart_limit=1))
    place_and_run(state, "j")
    report(state, "j/leader-0", pb.TASK_STATUS_FAILED, exit_code=3)
    place_and_run(state, "j")
    report(state, "j/leader-0", pb.TASK_STATUS_FAILED, exit_code=4)
    assert state.jobs["j"].status.phase == pb.JOB_PHASE_FAILED
    assert ended(state, "j") == (
        "Leader j/leader-0 failed (exit code 4) after 1 restart (restartLimit 1); 2 workers stopped"
    )


def test_a_kept_pod_that_loses_its_node_after_the_job_ended_does_not_go_back_to_pending() -> None:
    state = cluster()
    commands.submit_job(state, tyjob("j", clean_pod_policy="None"))
    place_and_run(state, "j")
    report(state, "j/leader-0", pb.TASK_STATUS_SUCCEEDED)
    assert ended(state, "j") == (
        "Leader j/leader-0 succeeded; 2 workers left running (cleanPodPolicy None)"
    )
    ingest.sync_snapshot(state, pb.SyncSnapshotRequest(backend="a", nodes=[]))
    worker = state.jobs["j"].tasks[1]
    assert worker.status == TaskStatus.CANCELLED
    assert worker.node is None
    assert worker.message.startswith("lost: ")
    assert worker.message.endswith("(after the job completed)")


@pytest.mark.parametrize(("ty", "rules"), [(True, TYARRANGER), (False, GANG)])
def test_the_rules_follow_the_kind_of_job(ty: bool, rules: object) -> None:
    state = cluster()
    spec = (
        tyjob("j")
        if ty
        else pb.JobSpec(
            id="j", task_groups=[pb.TaskGroup(role="w", replicas=2, request=rl(cpu="1"))]
        )
    )
    commands.submit_job(state, spec)
    assert lifecycle_of(state.jobs["j"]) is rules
