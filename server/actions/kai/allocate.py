"""allocate (KAI): jobs in hierarchical queue order, one statement per job. A job's tasks for this
attempt (its gang minimum, or one more task of an elastic job) are placed all or none; when one of
them could only be pipelined onto resources being released, the whole job is pipelined. A job with
tasks left goes back into the queue (an elastic job grows one task per turn)."""

from __future__ import annotations

from typing import ClassVar

from server.actions.base import Action
from server.actions.kai.common import allocate_job
from server.actions.kai.job_queue import Filters, JobsByQueue, queue_depth
from server.session.kai import has_tasks_to_allocate, should_pipeline_job
from server.session.session import Session


class KaiAllocateAction(Action):
    name: ClassVar[str] = "allocate"

    def execute(self, ssn: Session) -> None:
        queue = JobsByQueue(ssn, depth=queue_depth(ssn, self.name)).fill(
            ssn.jobs.values(), Filters(unready=True, non_pending=True)
        )
        while not queue.empty():
            job = queue.pop()
            if job.uid in ssn.invalid_jobs:
                continue
            stmt = ssn.statement()
            if allocate_job(ssn, stmt, job):
                if should_pipeline_job(job):
                    stmt.convert_to_pipelined(job.uid)
                stmt.commit()
                if has_tasks_to_allocate(job, real=True):
                    queue.push(job)
            else:
                stmt.discard()
