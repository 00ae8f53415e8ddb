"""priority: order jobs and tasks by priority; lower-priority work is preemptable
(Volcano ``plugins/priority``).

Registers: task_order (higher task priority first), job_order (higher job priority first),
preemptable (victims from other jobs must have a lower job priority; within the preemptor's own
job, a lower task priority), job_starving (fewer ready + pipelined tasks than tasks).
"""

from __future__ import annotations

from server.plugins.base import Plugin
from server.session.extension_points import (
    JOB_ORDER,
    JOB_ORDER_KEY,
    JOB_STARVING,
    PERMIT,
    PREEMPTABLE,
    TASK_ORDER,
    TASK_ORDER_KEY,
)
from server.session.info import JobInfo, TaskInfo
from server.session.session import Session


def _desc(left: int, right: int) -> int:
    return 0 if left == right else (-1 if left > right else 1)


class PriorityPlugin(Plugin):
    name = "priority"

    def on_session_open(self, ssn: Session) -> None:
        def preemptable(
            preemptor: TaskInfo, preemptees: list[TaskInfo]
        ) -> tuple[list[TaskInfo], int]:
            pjob = ssn.jobs.get(preemptor.job)
            if pjob is None:
                return [], PERMIT
            victims = []
            for t in preemptees:
                tjob = ssn.jobs.get(t.job)
                if tjob is None:
                    continue
                if tjob.uid != pjob.uid:
                    if tjob.priority < pjob.priority:
                        victims.append(t)
                elif t.priority < preemptor.priority:
                    victims.append(t)
            return victims, PERMIT

        def starving(job: JobInfo) -> bool:
            return job.ready_task_num() + job.waiting_task_num() < len(job.tasks)

        ssn.register(TASK_ORDER, self.name, lambda a, b: _desc(a.priority, b.priority))
        ssn.register(TASK_ORDER_KEY, self.name, lambda t: -t.priority)
        ssn.register(JOB_ORDER, self.name, lambda a, b: _desc(a.priority, b.priority))
        ssn.register(JOB_ORDER_KEY, self.name, lambda j: -j.priority)
        ssn.register(PREEMPTABLE, self.name, preemptable)
        ssn.register(JOB_STARVING, self.name, starving)
