"""backfill: place best-effort tasks (no resource request) on any node that passes the
predicates (Volcano ``actions/backfill``).

Tasks are taken in queue order, then job order, then task order (Volcano ``pickUpPendingTasks``),
from admitted (not Pending), valid jobs of existing queues; pipelined best-effort tasks are
unpipelined and taken too. A task that fits no node records its
fit errors and the next task is tried. Like Volcano's ``Session.Allocate``, a placement becomes a
bind only once its job is ready; until then it stays Allocated in the session.
"""

from __future__ import annotations

from server.actions.base import Action
from server.model import TaskStatus
from server.session.info import TaskInfo
from server.session.priority_queue import PriorityQueue
from server.session.session import Session
from server.session.statement import Statement

# Bound once: an enum class attribute costs ~0.2 us per lookup, and these are read per job.
_PENDING, _PIPELINED = TaskStatus.PENDING, TaskStatus.PIPELINED


class BackfillAction(Action):
    name = "backfill"
    ARGUMENTS = {"predicateErrorCacheEnable": True}

    def pending_tasks(self, ssn: Session) -> list[TaskInfo]:
        """Best-effort pending tasks in queue, job, task order."""
        unpipelined = ssn.statement()
        queues = PriorityQueue(ssn.queue_order_fn)
        jobs_by_queue: dict[str, PriorityQueue] = {}
        tasks_by_job: dict[str, PriorityQueue] = {}
        for job, queue in ssn.admitted_jobs():
            # A task asking a share of a GPU and nothing else is no best-effort task: the share is
            # placed by KAI's allocate (on a shared GPU), never here. (The job counts its pending
            # best-effort tasks: most jobs have none, and their pending tasks are not read.)
            best_effort = (
                [t for t in job.index[_PENDING].values() if t.best_effort and not t.gpu_fraction]
                if job.pending_best_effort
                else []
            )
            # Volcano unpipelines best-effort tasks and backfills them like pending ones.
            pipelined = job.index.get(_PIPELINED)
            for t in (
                [t for t in pipelined.values() if t.best_effort and not t.gpu_fraction]
                if pipelined
                else []
            ):
                unpipelined.unpipeline(t)
                best_effort.append(t)
            if not best_effort:
                continue
            tasks_by_job[job.uid] = PriorityQueue(ssn.task_order_fn, best_effort)
            if queue.uid not in jobs_by_queue:
                jobs_by_queue[queue.uid] = PriorityQueue(ssn.job_order_fn)
                queues.push(queue)
            jobs_by_queue[queue.uid].push(job)
        unpipelined.commit()
        ordered: list[TaskInfo] = []
        while not queues.empty():
            jobs = jobs_by_queue[queues.pop().uid]
            while not jobs.empty():
                tasks = tasks_by_job[jobs.pop().uid]
                while not tasks.empty():
                    ordered.append(tasks.pop())
        return ordered

    def execute(self, ssn: Session) -> None:
        names = ssn.nodes.names
        # Placements of jobs that are not ready yet: bound together once the job is.
        waiting: dict[str, list[Statement]] = {}
        for task in self.pending_tasks(ssn):
            job = ssn.jobs[task.job]
            choice = ssn.evaluator.select(task)
            if choice is None:
                job.fit_errors[task.uid] = ssn.evaluator.fit_errors(task)
                continue
            stmt = ssn.statement()
            stmt.allocate(task, names[choice[0]])
            held = waiting.setdefault(job.uid, [])
            held.append(stmt)
            if ssn.job_ready(job):
                for s in held:
                    s.commit()
                held.clear()
