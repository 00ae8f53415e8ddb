"""consolidation (KAI): make room for a pending job by moving running preemptible jobs to other
nodes -- only if every one of them is placed again (pipelined where it goes), so nothing is lost.
Session parameter ``maxNumberConsolidationPreemptees`` bounds the candidate victim jobs (-1: no
bound, 0: the action is off)."""

from __future__ import annotations

from typing import ClassVar

from server.actions.base import Action
from server.actions.kai.job_queue import Filters, JobsByQueue
from server.actions.kai.solver import FailedJobs, JobSolver
from server.model import TaskStatus
from server.session.info import JobInfo, TaskInfo
from server.session.kai import is_preemptible
from server.session.session import Session


def max_preemptees(ssn: Session) -> int:
    try:
        return int(ssn.config.session.get("maxNumberConsolidationPreemptees", -1))
    except (TypeError, ValueError):
        return -1


class ConsolidationAction(Action):
    name: ClassVar[str] = "consolidation"

    def execute(self, ssn: Session) -> None:
        limit = max_preemptees(ssn)
        if limit == 0:
            return
        queue = JobsByQueue(ssn).fill(ssn.jobs.values(), Filters(unready=True, non_pending=True, non_preemptible=True))
        failed = FailedJobs(ssn)
        while not queue.empty():
            job = queue.pop()
            if not failed.worth_trying(job):
                continue
            if job.uid in ssn.invalid_jobs:
                continue
            ssn.solution_start()

            def victims(preemptor: JobInfo = job) -> JobsByQueue:
                candidates = [j for j in ssn.jobs.values() if is_preemptible(j) and j.uid != preemptor.uid]
                if limit > 0:
                    candidates = candidates[: limit + 1]
                return JobsByQueue(ssn, victims=True).fill(candidates, Filters(non_active=True))

            solver = JobSolver(ssn, _all_placed_again, victims, self.name)
            solved, stmt, _ = solver.solve(job)
            if solved and stmt is not None:
                stmt.commit()
            else:
                failed.failed(job)


def _all_placed_again(job: JobInfo, tasks: list[TaskInfo], victims: list[TaskInfo]) -> bool:
    return all(t.status != TaskStatus.RELEASING for t in victims)
