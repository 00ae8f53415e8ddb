"""reclaim (KAI): a pending job of a queue below its fair share takes resources back from other
queues' preemptible jobs, as far as the proportion plugin finds it fair (``can_reclaim`` before the
search, ``reclaim_scenario_valid`` for each candidate solution); victims re-placed elsewhere count
as moved when ``allowConsolidatingReclaim`` (session parameter, default true)."""

from __future__ import annotations

from typing import ClassVar

from server.actions.base import Action
from server.actions.kai.job_queue import Filters, JobsByQueue
from server.actions.kai.solver import FailedJobs, JobSolver
from server.session.info import JobInfo
from server.session.session import Session


class KaiReclaimAction(Action):
    name: ClassVar[str] = "reclaim"

    def execute(self, ssn: Session) -> None:
        queue = JobsByQueue(ssn).fill(ssn.jobs.values(), Filters(unready=True, non_pending=True))
        failed = FailedJobs(ssn)
        while not queue.empty():
            job = queue.pop()
            if not failed.worth_trying(job):
                continue
            if job.uid in ssn.invalid_jobs or not ssn.can_reclaim(job):
                continue
            ssn.solution_start()

            def victims(reclaimer: JobInfo = job) -> JobsByQueue:
                others = [j for j in ssn.jobs.values() if j.queue != reclaimer.queue]
                return JobsByQueue(ssn, victims=True).fill(others, Filters(non_preemptible=True, non_active=True))

            solver = JobSolver(ssn, ssn.reclaim_scenario_valid, victims, self.name)
            solved, stmt, _ = solver.solve(job)
            if solved and stmt is not None:
                stmt.commit()
            else:
                failed.failed(job)
