"""reclaim: starving jobs take back resources other queues hold beyond their share
(Volcano ``actions/reclaim``).

Every queue with a non-pending valid job is visited in queue order; an overused queue
(``ssn.overused``) is skipped. Its starving jobs go in job order; while a job is starving, its
pending tasks in task order each try to reclaim, unless the task's preemptionPolicy is Never or the
queue may not grow by it (``ssn.preemptive``). Candidate nodes (static predicates) go in node
order; on a node, the Running, preemptable tasks of jobs in *other*, reclaimable queues are the
reclaimees, filtered by ``ssn.reclaimable`` (proportion: only from queues above their deserved
share; gang: never below minAvailable; conformance: no system pods). If the node's future idle
plus all victims covers the task, victims are evicted in victim order until it does and the task
is pipelined there; the first node that works ends the search. A job's statement is committed if
it is pipelined (``ssn.job_pipelined``), else discarded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from server.actions.base import Action
from server.model import TaskStatus
from server.session.eviction import (
    candidate_rows,
    could_fit,
    preemption_allowed,
    validate_victims,
    victim_capacity,
)
from server.session.info import JobInfo, TaskInfo, less_equal
from server.session.priority_queue import PriorityQueue
from server.session.session import Session
from server.session.statement import Statement

REASON = "reclaim"


class ReclaimAction(Action):
    name = "reclaim"
    ARGUMENTS = {"predicateErrorCacheEnable": True}

    def __init__(self, arguments: dict[str, Any] | None = None) -> None:
        super().__init__(arguments)
        self._capacity: dict[str, np.ndarray] = {}

    def execute(self, ssn: Session) -> None:
        queues = PriorityQueue(ssn.queue_order_fn)
        seen: set[str] = set()
        preemptors: dict[str, PriorityQueue] = {}
        preemptor_tasks: dict[str, PriorityQueue] = {}
        for job, queue in ssn.admitted_jobs():
            if queue.uid not in seen:
                seen.add(queue.uid)
                queues.push(queue)
            if ssn.job_starving(job):
                preemptors.setdefault(queue.uid, PriorityQueue(ssn.job_order_fn)).push(job)
                preemptor_tasks[job.uid] = PriorityQueue(
                    ssn.task_order_fn, job.index[TaskStatus.PENDING].values()
                )

        self._capacity = self._reclaimable_capacity(ssn)
        while not queues.empty():
            queue = queues.pop()
            if ssn.overused(queue):
                continue
            jobs = preemptors.get(queue.uid)
            while jobs is not None and not jobs.empty():
                job = jobs.pop()
                stmt = ssn.statement()
                tasks = preemptor_tasks[job.uid]
                while ssn.job_starving(job) and not tasks.empty():
                    task = tasks.pop()
                    if not preemption_allowed(task):
                        continue
                    if not ssn.preemptive(queue, task):
                        continue
                    self.reclaim_for_task(ssn, stmt, task, job)
                if ssn.job_pipelined(job):
                    stmt.commit()
                else:
                    stmt.discard()
                # Volcano pushes the queue back while it still has starving jobs (and goes on
                # with them right away); the revisit re-checks overuse and finds them done.
                if not jobs.empty():
                    queues.push(queue)

    def reclaim_for_task(self, ssn: Session, stmt: Statement, task: TaskInfo, job: JobInfo) -> bool:
        nodes = ssn.nodes
        capacity = self._capacity.get(job.queue, self._capacity.get("", None))
        for row in could_fit(ssn, task, candidate_rows(ssn, task), capacity):
            row = int(row)
            reclaimees = [t for t in nodes.tasks[row].values() if self._reclaimee(ssn, t, job)]
            if not reclaimees:
                continue
            victims = ssn.reclaimable(task, reclaimees)
            if not validate_victims(ssn, task, row, victims):
                continue
            order = ssn.victims_queue(victims, task)
            available = nodes.future_idle(row).copy()
            node_stmt = ssn.statement()
            while not order.empty() and not less_equal(task.resreq, available):
                victim = order.pop()
                node_stmt.evict(victim, REASON)
                available += victim.resreq
            if not less_equal(task.resreq, available):
                node_stmt.discard()
                continue
            node_stmt.pipeline(task, nodes.names[row])
            stmt.merge(node_stmt)
            return True
        return False

    @staticmethod
    def _reclaimable_capacity(ssn: Session) -> dict[str, np.ndarray]:
        """Per reclaiming queue: the requests other reclaimable queues' Running preemptable tasks
        hold on each node (an upper bound of what reclaim can free there; key "" = all)."""
        per_queue = victim_capacity(ssn, frozenset({TaskStatus.RUNNING}))
        per_queue = {
            q: a for q, a in per_queue.items() if q in ssn.queues and ssn.queues[q].reclaimable
        }
        if not per_queue:
            return {"": np.zeros((len(ssn.nodes), ssn.space.size))}
        total: np.ndarray = np.sum(list(per_queue.values()), axis=0)
        return {"": total, **{q: total - a for q, a in per_queue.items()}}

    @staticmethod
    def _reclaimee(ssn: Session, task: TaskInfo, reclaimer_job: JobInfo) -> bool:
        """Running, preemptable, and in another queue that lets its resources be reclaimed."""
        if task.status != TaskStatus.RUNNING or not task.preemptable:
            return False
        job = ssn.jobs.get(task.job)
        if job is None or job.queue == reclaimer_job.queue:
            return False
        queue = ssn.queues.get(job.queue)
        return queue is not None and queue.reclaimable
