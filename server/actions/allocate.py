"""allocate: place pending tasks of admitted jobs, gang by gang (Volcano ``actions/allocate``).

Queues in queue order (an overused queue is skipped), one job per visit in job order, its pending
tasks in task order. Each task goes to the best-scoring node that passes every predicate and fits
idle resources, else to one whose resources are being released (pipelined). A job's placements
form one Statement: committed when the job is ready (gang satisfied), kept in the session without
binding when it is only pipelined, discarded otherwise. A ready job with tasks left goes back into
its queue, so queues and jobs interleave fairly.

A job with a hard network topology is placed inside one hypernode: the hypernode gradients (from
the network-topology-aware plugin) are tried tier by tier, the whole gang is tried in every
hypernode of a tier, and the best-scoring hypernode that satisfies the gang wins (Volcano's
allocateForJob).
"""

from __future__ import annotations

import numpy as np

from server.actions.base import Action
from server.model import PodGroupPhase, TaskStatus
from server.session.info import FitErrors, JobInfo, TaskInfo
from server.session.priority_queue import PriorityQueue
from server.session.session import Session
from server.session.statement import Op, Statement


class AllocateAction(Action):
    name = "allocate"
    ARGUMENTS = {"predicateErrorCacheEnable": True}

    def execute(self, ssn: Session) -> None:
        enqueue_enabled = "enqueue" in ssn.config.actions
        # A waiting queue's order does not change either: only the popped queue's job is placed,
        # and the queue is pushed again (its key computed again) after.
        queues = PriorityQueue(ssn.queue_order_fn, key=ssn.queue_order_key())
        jobs_by_queue: dict[str, PriorityQueue] = {}
        pending: dict[str, PriorityQueue] = {}
        # A waiting job's or task's order does not change in allocate (only the popped job is
        # placed): keys computed at push where every order plugin gives one.
        job_key, task_key = ssn.job_order_key(), ssn.task_order_key()
        for job in ssn.jobs.values():
            if job.phase == PodGroupPhase.PENDING:
                if enqueue_enabled:
                    continue
                job.phase = PodGroupPhase.INQUEUE
            vr = ssn.job_valid(job)
            if vr is not None and not vr.passed:
                continue
            if job.queue not in ssn.queues:
                continue
            tasks = PriorityQueue(
                ssn.task_order_fn,
                (t for t in job.index[TaskStatus.PENDING].values() if not t.best_effort),
                task_key,
            )
            if tasks.empty():
                continue
            if job.queue not in jobs_by_queue:
                jobs_by_queue[job.queue] = PriorityQueue(ssn.job_order_fn, key=job_key)
                queues.push(ssn.queues[job.queue])
            jobs_by_queue[job.queue].push(job)
            pending[job.uid] = tasks

        while not queues.empty():
            queue = queues.pop()
            if ssn.overused(queue):
                continue
            jobs = jobs_by_queue.get(queue.uid)
            if jobs is None or jobs.empty():
                continue
            job = jobs.pop()
            tasks = pending[job.uid]
            gradients = ssn.hypernode_gradients(job) if job.spec.network_topology else None
            if gradients is not None:
                stmt = self.allocate_in_hypernodes(ssn, job, tasks, gradients)
            else:
                stmt = self.allocate_tasks(ssn, job, tasks)
            if stmt is not None and ssn.job_ready(job):
                stmt.commit()
                if not tasks.empty():
                    jobs.push(job)
            queues.push(queue)

    def allocate_in_hypernodes(
        self,
        ssn: Session,
        job: JobInfo,
        tasks: PriorityQueue,
        gradients: list[list[tuple[str, np.ndarray]]],
    ) -> Statement | None:
        waiting = []
        while not tasks.empty():
            waiting.append(tasks.pop())
        task_key = ssn.task_order_key()
        for gradient in gradients:
            solutions: dict[str, tuple[list[tuple[Op, TaskInfo, str]], list[TaskInfo]]] = {}
            masks = dict(gradient)
            for name, mask in gradient:
                job.fit_errors.clear()
                trial = PriorityQueue(ssn.task_order_fn, waiting, task_key)
                stmt = self.allocate_tasks(ssn, job, trial, restrict=mask)
                if stmt is None or not len(stmt):
                    continue
                if ssn.job_ready(job) or ssn.job_pipelined(job):
                    left = []
                    while not trial.empty():
                        left.append(trial.pop())
                    solutions[name] = ([(o.op, o.task, o.node) for o in stmt.operations], left)
                stmt.discard()
            if not solutions:
                continue
            scores = ssn.hypernode_order(job, {n: masks[n] for n in solutions})
            best = max(solutions, key=lambda n: (scores.get(n, 0.0), [-ord(c) for c in n]))
            operations, left = solutions[best]
            stmt = ssn.statement()
            for op, task, node in operations:
                (stmt.allocate if op is Op.ALLOCATE else stmt.pipeline)(task, node)
            for task in left:
                tasks.push(task)
            return stmt
        for task in waiting:
            tasks.push(task)
        return None

    def allocate_tasks(
        self, ssn: Session, job: JobInfo, tasks: PriorityQueue, restrict: np.ndarray | None = None
    ) -> Statement | None:
        queue = ssn.queues[job.queue]
        stmt = ssn.statement()
        names = ssn.nodes.names
        use_role_cache = self.arg_bool("predicateErrorCacheEnable")
        while not tasks.empty():
            task = tasks.pop()
            verdict = ssn.allocatable(queue, task)
            if not verdict:
                missing = [
                    ssn.space.dims[d]
                    for d in np.nonzero((task.resreq > 0) & (ssn.total_resource <= 0))[0]
                ]
                if missing:
                    ssn.outcomes.fit_errors_found(
                        job,
                        task,
                        FitErrors(
                            total_nodes=len(ssn.nodes),
                            message=f"no node in the cluster offers {', '.join(missing)}",
                        ),
                    )
                elif ssn.evaluator.select(task, restrict) is None:
                    # The queue's share is not the only obstacle: no node has room either. Say so
                    # in the explanation (Volcano records nothing here, so the gang condition and the
                    # role fit-error cache stay as they are).
                    ssn.outcomes.fit_errors_found(
                        job, task, ssn.evaluator.fit_errors(task, restrict), keep_first=True
                    )
                else:  # only the queue's bound holds the task back: its verdict explains the job
                    ssn.outcomes.queue_refused(job, verdict)
                continue
            if use_role_cache and job.task_has_fit_errors(task):
                job.fit_errors[task.uid] = FitErrors(
                    message=f"Task {task.name} with role spec {task.role} has already predicated failed, skip"
                )
                continue
            choice = ssn.evaluator.select(task, restrict)
            if choice is None:
                job.fit_errors[task.uid] = ssn.evaluator.fit_errors(task, restrict)
                if job.need_continue_allocating():
                    continue
                break
            row, on_idle = choice
            if on_idle:
                stmt.allocate(task, names[row])
            else:
                stmt.pipeline(task, names[row])
            if ssn.job_ready(job):
                break
        if ssn.job_ready(job) or ssn.job_pipelined(job):
            return stmt
        stmt.discard()
        return None
