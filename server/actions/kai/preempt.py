"""preempt (KAI): a pending job evicts preemptible jobs of strictly lower priority in its own leaf
queue, the fewest that make room (victims placed again elsewhere are moved, not lost). A
non-preemptible job does not preempt beyond its queue's deserved quota."""

from __future__ import annotations

from typing import ClassVar

from server.actions.base import Action
from server.actions.kai.job_queue import Filters, JobsByQueue
from server.actions.kai.solver import FailedJobs, JobSolver
from server.session.info import JobInfo, TaskInfo
from server.session.kai import ACTIVE_ALLOCATED, is_preemptible, tasks_to_allocate
from server.session.session import Session


class KaiPreemptAction(Action):
    name: ClassVar[str] = "preempt"

    def execute(self, ssn: Session) -> None:
        queue = JobsByQueue(ssn).fill(ssn.jobs.values(), Filters(unready=True, non_pending=True))
        failed = FailedJobs(ssn)
        while not queue.empty():
            job = queue.pop()
            if not failed.worth_trying(job):
                continue
            if job.uid in ssn.invalid_jobs:
                continue
            tasks = tasks_to_allocate(job, ssn.task_order_fn, real=False)
            if ssn.non_preemptible_over_quota(job, tasks):
                continue
            ssn.solution_start()

            def victims(preemptor: JobInfo = job) -> JobsByQueue:
                eligible = [
                    j for j in ssn.jobs.values()
                    if is_preemptible(j) and j.priority < preemptor.priority and j.queue == preemptor.queue
                    and j.uid != preemptor.uid and any(t.status in ACTIVE_ALLOCATED for t in j.tasks.values())
                ]
                return JobsByQueue(ssn, victims=True).fill(eligible, Filters())

            solver = JobSolver(ssn, _accept, victims, self.name)
            solved, stmt, _ = solver.solve(job)
            if solved and stmt is not None:
                stmt.commit()
            else:
                failed.failed(job)


def _accept(job: JobInfo, tasks: list[TaskInfo], victims: list[TaskInfo]) -> bool:
    return True
