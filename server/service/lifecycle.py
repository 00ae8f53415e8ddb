"""How a job's life goes, per kind of job: the rules ``server.service.state.ClusterState`` asks
when a task fails, when the job's phase follows its tasks and when the job ends.

A plain job is a gang (``GangLifecycle``): its phase is ``muster.gang.gang_phase`` of its gang
minimum; when it ends its placed tasks are stopped. A TY-Arranger TYJob
(``TYArrangerLifecycle``) is a Leader and workers: a failed Leader starts again while its
``restartLimit`` allows, the Leader's success or its last failure ends the job, and
``cleanPodPolicy`` decides whether the job's pods are stopped when it ends. Of either kind, no
task of an ended job stays Pending (those that never ran are Cancelled, ``not run: the job
failed``) and a task stopped by the job's end is Cancelled once its eviction is acknowledged
(``stopped: the job failed``): only a task that failed itself is Failed. ``lifecycle_of`` picks
the rules by the job's kind.

The rules read and decide; the state applies what they decide (and notes the change for the
store). Only ``restart`` changes anything itself: it counts the restart on the job's status.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

import structlog

from muster.gang import GangPhase, gang_phase
from muster.timelimit import TIME_LIMIT_REASON, format_time_limit, is_time_limit
from muster.v1 import muster_pb2 as pb
from server.model import ALLOCATED, ALLOCATED_OR_UNKNOWN, PodGroupPhase, TaskStatus
from server.service.records import JobRecord, TaskRecord

log = structlog.get_logger("muster.state")

_GANG_TO_JOB_PHASE = {
    GangPhase.COMPLETED: pb.JOB_PHASE_COMPLETED,
    GangPhase.FAILED: pb.JOB_PHASE_FAILED,
    GangPhase.RUNNING: pb.JOB_PHASE_RUNNING,
}


class JobLifecycle(Protocol):
    """The per-kind rules of a job's life."""

    def phase(self, job: JobRecord) -> int:
        """The job's phase (a ``pb.JobPhase``) from its tasks, for a job not yet ended."""
        ...

    def restart(self, job: JobRecord, task: TaskRecord, message: str, exit_code: int) -> str | None:
        """A backend reports ``task`` Failed: the message it goes back to Pending with when it
        starts again (the restart counted on the job's status), or None: it stays Failed."""
        ...

    def keeps_pods(self, job: JobRecord) -> bool:
        """Whether an ended (not cancelled) job leaves its placed tasks running."""
        ...

    def stopped(self, job: JobRecord, task: TaskRecord) -> tuple[TaskStatus, str]:
        """What ``task``, stopped because its job ended (not cancelled), becomes once its
        eviction is acknowledged: status and message."""
        ...

    def unrun(self, job: JobRecord, task: TaskRecord, why: str) -> tuple[TaskStatus, str] | None:
        """What ``task`` of an ended (not cancelled) job becomes when it holds no node and has no
        result: when the job ends before it ran (``why`` empty), or when it leaves its node after
        (``why`` says how). None: it stays Pending."""
        ...

    def summary(self, job: JobRecord, phase: int) -> str:
        """The ``Ended`` condition's message for the job that just reached ``phase``: which tasks
        ended how."""
        ...


class GangLifecycle:
    """A plain job: a gang of ``min_member`` tasks (the JobLifecycle docstrings)."""

    def phase(self, job: JobRecord) -> int:
        counts = Counter(t.status for t in job.tasks)
        gang = gang_phase(
            job.min_member,
            tasks=len(job.tasks),
            # An Unknown task (its backend silent) still holds its place until it is lost.
            placed=sum(counts[s] for s in ALLOCATED_OR_UNKNOWN),
            succeeded=counts[TaskStatus.SUCCEEDED],
            failed=counts[TaskStatus.FAILED],
        )
        if gang in _GANG_TO_JOB_PHASE:
            return _GANG_TO_JOB_PHASE[gang]
        if job.status.sched_phase in (PodGroupPhase.INQUEUE, PodGroupPhase.RUNNING):
            return pb.JOB_PHASE_INQUEUE
        return pb.JOB_PHASE_PENDING

    def restart(self, job: JobRecord, task: TaskRecord, message: str, exit_code: int) -> str | None:
        return None

    def keeps_pods(self, job: JobRecord) -> bool:
        return False

    def stopped(self, job: JobRecord, task: TaskRecord) -> tuple[TaskStatus, str]:
        # Stopped by the job's end, not by a failure of its own: not Failed.
        return TaskStatus.CANCELLED, f"stopped: the job {_ended(job)}"

    def unrun(self, job: JobRecord, task: TaskRecord, why: str) -> tuple[TaskStatus, str] | None:
        # No task stays Pending in an ended job: it never runs now.
        if why:
            return TaskStatus.CANCELLED, f"{why} (after the job {_ended(job)})"
        return TaskStatus.CANCELLED, f"not run: the job {_ended(job)}"

    def summary(self, job: JobRecord, phase: int) -> str:
        return ended_summary(job, phase)


class TYArrangerLifecycle(GangLifecycle):
    """A TYJob: a Leader and workers (the module's docstring; docs/jobs.md)."""

    def phase(self, job: JobRecord) -> int:
        leader = leader_of(job)
        if leader is not None and leader.status == TaskStatus.SUCCEEDED:
            return pb.JOB_PHASE_COMPLETED  # the Leader's success ends the job
        if leader is not None and leader.status == TaskStatus.FAILED:
            return pb.JOB_PHASE_FAILED  # its restarts are spent (``restart``)
        return super().phase(job)

    def restart(self, job: JobRecord, task: TaskRecord, message: str, exit_code: int) -> str | None:
        ty = job.spec.tyjob
        if task.role != ty.leader_role or not job.active or is_time_limit(message):
            return None  # (a Leader that reached the job's time limit is not started again)
        if job.status.leader_restarts >= ty.restart_limit:
            return None
        job.status.leader_restarts += 1
        log.info(
            "tyjob.leader_restart",
            job=job.id,
            restart=job.status.leader_restarts,
            limit=ty.restart_limit,
        )
        why = message or f"exit code {exit_code}"
        return f"Leader failed ({why}); restart {job.status.leader_restarts} of {ty.restart_limit}"

    def keeps_pods(self, job: JobRecord) -> bool:
        return job.spec.tyjob.clean_pod_policy == "None"

    def summary(self, job: JobRecord, phase: int) -> str:
        """Names what ended the job: "Leader j/leader-0 succeeded; 2 workers stopped", "Leader
        j/leader-0 failed (exit code 3) after 2 restarts (restartLimit 2); 2 workers stopped",
        "worker j/actor-0 failed (exit code 2); Leader j/leader-0 stopped; 1 worker stopped; the
        gang needs 3"."""
        if job.status.cancelled:
            return ended_summary(job, phase)
        leader = leader_of(job)
        parts: list[str] = []
        if leader is not None:
            if leader.status == TaskStatus.FAILED:
                n, limit = job.status.leader_restarts, job.spec.tyjob.restart_limit
                parts.append(
                    f"Leader {leader.uid} failed ({_failure(leader)}) after {n} "
                    f"restart{'s' * (n != 1)} (restartLimit {limit})"
                )
            else:
                parts.append(f"Leader {leader.uid} {self._how(job, leader)}")
        workers = [t for t in job.tasks if t is not leader]
        failed = [t for t in workers if t.status == TaskStatus.FAILED]
        parts += [f"worker {t.uid} failed ({_failure(t)})" for t in failed[:3]]
        if len(failed) > 3:
            parts.append(f"{len(failed) - 3} more workers failed")
        others = Counter(self._how(job, t) for t in workers if t.status != TaskStatus.FAILED)
        for how, n in others.items():
            parts.append(f"{n} worker{'s' * (n != 1)} {how}")
        if phase == pb.JOB_PHASE_FAILED and (leader is None or leader.status != TaskStatus.FAILED):
            parts.append(f"the gang needs {job.min_member}")
        return "; ".join(parts)

    def _how(self, job: JobRecord, t: TaskRecord) -> str:
        """A task of an ended TYJob in a word or two (a failed one: ``_failure``)."""
        if t.status == TaskStatus.SUCCEEDED:
            return "succeeded"
        if t.status == TaskStatus.RELEASING or (
            t.status == TaskStatus.CANCELLED and t.message.startswith("stopped:")
        ):
            return "stopped"
        if t.status in ALLOCATED:
            return "left running (cleanPodPolicy None)" if self.keeps_pods(job) else "running"
        if t.status == TaskStatus.CANCELLED and t.message.startswith("not run:"):
            return "never ran"
        return t.status.title.lower()


GANG = GangLifecycle()
TYARRANGER = TYArrangerLifecycle()


def lifecycle_of(job: JobRecord) -> JobLifecycle:
    """The rules for ``job``'s kind."""
    return TYARRANGER if job.spec.HasField("tyjob") else GANG


def leader_of(job: JobRecord) -> TaskRecord | None:
    """A TYJob's Leader task (None for a job without one)."""
    if not job.spec.HasField("tyjob"):
        return None
    role = job.spec.tyjob.leader_role
    return next((t for t in job.tasks if t.role == role), None)


def _ended(job: JobRecord) -> str:
    return "completed" if job.status.phase == pb.JOB_PHASE_COMPLETED else "failed"


def _failure(t: TaskRecord) -> str:
    """How a failed task failed: its exit code and its backend's message, as far as known."""
    if is_time_limit(t.message):  # "time limit 2m reached": the exit code is the kill's
        return t.message.removeprefix(f"{TIME_LIMIT_REASON}:").strip()
    code = f"exit code {t.exit_code}" if t.exit_code else ""
    if code and t.message and code not in t.message:
        return f"{code}: {t.message}"
    return t.message or code or "failed"


def ended_summary(job: JobRecord, phase: int) -> str:
    """Which tasks of an ended job ended how, in a line: "4/4 tasks succeeded", "task j/w-1 failed
    (exit code 2); 3 succeeded; the gang needs 4", "cancelled: 2 tasks stopped, 3 never placed"."""
    counts = Counter(t.status for t in job.tasks)
    n = len(job.tasks)
    if job.status.cancelled:
        stopped = sum(
            1
            for t in job.tasks
            if t.status == TaskStatus.RELEASING
            or (t.status == TaskStatus.CANCELLED and t.message.startswith("cancelled:"))
        )
        never = sum(
            1
            for t in job.tasks
            if t.status == TaskStatus.CANCELLED and not t.message.startswith("cancelled:")
        )
        parts = [f"{stopped} task{'s' * (stopped != 1)} stopped"] if stopped else []
        parts += [f"{never} never placed"] if never else []
        done = counts[TaskStatus.SUCCEEDED]
        parts += [f"{done} had succeeded"] if done else []
        return "cancelled" + (": " + ", ".join(parts) if parts else "")
    failed = [t for t in job.tasks if t.status == TaskStatus.FAILED]
    if phase == pb.JOB_PHASE_COMPLETED and not failed:
        return f"{counts[TaskStatus.SUCCEEDED]}/{n} tasks succeeded"
    parts = []
    for t in failed[:3]:
        if is_time_limit(t.message):
            limit = format_time_limit(job.spec.time_limit_seconds)
            parts.append(f"task {t.uid} reached its time limit ({limit})")
            continue
        why = t.message or (f"exit code {t.exit_code}" if t.exit_code else "failed")
        parts.append(f"task {t.uid} failed ({why})")
    if len(failed) > 3:
        parts.append(f"{len(failed) - 3} more failed")
    parts.append(f"{counts[TaskStatus.SUCCEEDED]}/{n} succeeded")
    if phase == pb.JOB_PHASE_FAILED:
        parts.append(f"the gang needs {job.min_member}")
    return "; ".join(parts)


def ended_reason(job: JobRecord, reason: str) -> str:
    """The reason of an ended job's ``Ended`` condition: ``TimeLimit`` when it failed and a task of
    it reached its time limit (Slurm's TIMEOUT, Kubernetes' DeadlineExceeded), else ``reason`` (its
    phase)."""
    if job.status.phase == pb.JOB_PHASE_FAILED and any(
        t.status == TaskStatus.FAILED and is_time_limit(t.message) for t in job.tasks
    ):
        return TIME_LIMIT_REASON
    return reason
