"""enqueue: admit Pending jobs to Inqueue (Volcano ``actions/enqueue``).

Queues are visited in queue order, one job at a time, jobs in job order. A job without
minResources is always admitted; otherwise every job_enqueueable vote must allow it, and
job_enqueued tells plugins (proportion, overcommit ...) to count it as inqueue.
"""

from __future__ import annotations

from server.actions.base import Action
from server.model import PodGroupPhase
from server.session.priority_queue import PriorityQueue
from server.session.session import Session


class EnqueueAction(Action):
    name = "enqueue"

    def execute(self, ssn: Session) -> None:
        queues = PriorityQueue(ssn.queue_order_fn)
        seen: set[str] = set()
        jobs_by_queue: dict[str, PriorityQueue] = {}
        for job in ssn.jobs.values():
            queue = ssn.queues.get(job.queue)
            if queue is None:
                continue
            if queue.uid not in seen:
                seen.add(queue.uid)
                queues.push(queue)
            if job.phase == PodGroupPhase.PENDING:
                jobs_by_queue.setdefault(queue.uid, PriorityQueue(ssn.job_order_fn)).push(job)
        while not queues.empty():
            queue = queues.pop()
            jobs = jobs_by_queue.get(queue.uid)
            if jobs is None or jobs.empty():
                continue
            job = jobs.pop()
            if job.min_resources is None or ssn.job_enqueueable(job):
                ssn.job_enqueued(job)
                job.phase = PodGroupPhase.INQUEUE
            queues.push(queue)
