"""preempt (KAI): a pending job evicts preemptible jobs of strictly lower priority in its own leaf
queue, the fewest that make room (victims placed again elsewhere are moved, not lost). A
non-preemptible job does not preempt beyond its queue's deserved quota."""

from __future__ import annotations

from typing import ClassVar

from server.actions.base import Action
from server.actions.kai.job_queue import Filters
from server.actions.kai.solver import solve_pending_jobs
from server.session.info import JobInfo, TaskInfo
from server.session.kai import tasks_to_allocate
from server.session.session import Session


class KaiPreemptAction(Action):
    name: ClassVar[str] = "preempt"

    def execute(self, ssn: Session) -> None:
        solve_pending_jobs(
            ssn,
            self.name,
            pending=Filters(unready=True, non_pending=True),
            # A non-preemptible job does not preempt beyond its queue's deserved quota.
            may_try=lambda job: (
                ssn.non_preemptible_over_quota(
                    job, tasks_to_allocate(job, ssn.task_order_fn, real=False)
                ).ok
            ),
            victim_jobs=lambda preemptor: [
                j
                for j in ssn.jobs.values()
                if j.priority < preemptor.priority
                and j.queue == preemptor.queue
                and j.uid != preemptor.uid
            ],
            victim_filters=Filters(non_preemptible=True, non_active=True),
            validator=_accept,
        )


def _accept(job: JobInfo, tasks: list[TaskInfo], victims: list[TaskInfo]) -> bool:
    return True
