"""gang: all-or-nothing placement (Volcano ``plugins/gang``).

Registers: job_valid (enough valid tasks overall and per role), job_order (ready jobs after
unready ones), job_ready (ReadyTaskNum + pending best-effort >= minAvailable, and per-role
minimums), job_pipelined (the same counting pipelined tasks), job_starving, and preemptable /
reclaimable that never take a job below minAvailable. On close it writes the Unschedulable or
Scheduled condition, as Volcano does.
"""

from __future__ import annotations

from server.model import ALLOCATED, TaskStatus
from server.plugins.base import Plugin
from server.session.extension_points import (
    JOB_ORDER,
    JOB_ORDER_KEY,
    JOB_PIPELINED,
    JOB_READY,
    JOB_STARVING,
    JOB_VALID,
    PERMIT,
    PREEMPTABLE,
    RECLAIMABLE,
    REJECT,
    ValidateResult,
)
from server.session.info import JobInfo, TaskInfo
from server.session.session import Session


class GangPlugin(Plugin):
    name = "gang"

    def on_session_open(self, ssn: Session) -> None:
        def job_valid(job: JobInfo) -> ValidateResult | None:
            # (Role and sub-group checks only for a job that has such minimums: asked of every
            # job by every action.)
            if job.task_min_available and not job.check_task_valid():
                return ValidateResult(
                    False,
                    "NotEnoughPodsOfTask",
                    "Not enough valid pods of each task for gang-scheduling",
                )
            if job.subgroup_min_member and not job.check_subjob_valid():
                return ValidateResult(
                    False,
                    "NotEnoughPodsOfTask",
                    "Not enough valid subGroups of each task for gang-scheduling",
                )
            valid = job.valid_count
            if valid < job.min_available:
                return ValidateResult(
                    False,
                    "NotEnoughTasks",
                    f"Not enough valid tasks for gang-scheduling, valid: {valid}, min: {job.min_available}",
                )
            return None

        def evictable(evictor: TaskInfo, candidates: list[TaskInfo]) -> tuple[list[TaskInfo], int]:
            victims: list[TaskInfo] = []
            occupied: dict[str, int] = {}
            for c in candidates:
                job = ssn.jobs.get(c.job)
                if job is None:
                    continue
                if c.job not in occupied:
                    occupied[c.job] = job.ready_task_num()
                if occupied[c.job] > job.min_available:
                    occupied[c.job] -= 1
                    victims.append(c)
            return victims, PERMIT

        def job_order(left: JobInfo, right: JobInfo) -> int:
            lr, rr = left.is_ready(), right.is_ready()
            if lr == rr:
                return 0
            return 1 if lr else -1

        ssn.register(JOB_VALID, self.name, job_valid)
        ssn.register(PREEMPTABLE, self.name, evictable)
        ssn.register(RECLAIMABLE, self.name, evictable)
        ssn.register(JOB_ORDER, self.name, job_order)
        ssn.register(JOB_ORDER_KEY, self.name, lambda j: j.is_ready())  # not ready first
        ssn.register(
            JOB_READY,
            self.name,
            lambda j: j.is_ready() and j.check_task_ready() and j.check_subjob_ready(),
        )
        ssn.register(
            JOB_PIPELINED,
            self.name,
            lambda j: (
                PERMIT
                if j.check_task_pipelined() and j.check_subjob_pipelined() and j.is_pipelined()
                else REJECT
            ),
        )
        ssn.register(JOB_STARVING, self.name, lambda j: j.is_starving())

    def on_session_close(self, ssn: Session) -> None:
        for job in ssn.jobs.values():
            if not job.tasks:
                continue
            if job.is_ready():
                ssn.outcomes.set_condition(
                    job, "Scheduled", "tasks in gang are ready to be scheduled", ""
                )
                continue
            if _releasing_covers_gang(job):
                continue
            schedulable = job.ready_task_num() + sum(
                1 for t in job.index[TaskStatus.PENDING].values() if t.last_tx_status in ALLOCATED
            )
            unready = job.min_available - schedulable
            fit_error = ssn.outcomes.fit_error(job)
            if unready > 0:  # Volcano's message
                msg = f"{unready}/{len(job.tasks)} tasks in gang unschedulable: {fit_error}"
            else:  # enough tasks fit but a role's minimum does not (Volcano would print a negative count)
                msg = f"the gang's role minimums are not met: {fit_error}"
            ssn.outcomes.set_condition(job, "Unschedulable", "NotEnoughResources", msg)


# Volcano ``api.ScheduledStatus``: tasks that reached a node for good (or finished there).
_SCHEDULED = (TaskStatus.RUNNING, TaskStatus.BOUND, TaskStatus.FAILED, TaskStatus.SUCCEEDED)


def _releasing_covers_gang(job: JobInfo) -> bool:
    """Volcano ``shouldSkipUnschedulableForReleasing``: a gang whose placed tasks are only being
    released (rescheduling) is not reported unschedulable. Only releasing tasks that hold a node
    count (a pod deleted while still pending never occupied a gang slot), added to the scheduled
    ones (Running, Bound, Failed, Succeeded)."""
    releasing = sum(1 for t in job.index[TaskStatus.RELEASING].values() if t.node)
    if not releasing or job.index[TaskStatus.PENDING] or job.index[TaskStatus.PIPELINED]:
        return False
    return job.count(*_SCHEDULED) + releasing >= job.min_available
