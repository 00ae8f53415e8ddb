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

Two bounds on what a deep queue costs (issue 29). Shape classes (``server/session/shape_classes.py``,
session parameter ``shapeClasses``, on by default): a job of a shape that already found no room in
the cycle is not tried again until resources come back; it gets the first failing job's finding,
naming that job. The same placements, at a dictionary look-up per job. And ``maxQueueLookback``
(session parameter, default 0: no bound; Armada's ``maxQueueLookback``): a cycle considers at most
that many waiting jobs of a queue (jobs that hold something do not count). Where the job order
allows, the session opens only those (``server/session/window.py``); otherwise allocate stops at
them here, and the rest wait for the next cycle, their explanation saying so. A job's tasks are
put in order only when the job comes up.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from server.actions.base import Action
from server.model import PodGroupPhase, TaskStatus
from server.session.extension_points import ALLOWED, Verdict, refuse
from server.session.info import FitErrors, JobInfo, QueueInfo, TaskInfo
from server.session.priority_queue import PriorityQueue
from server.session.session import Session
from server.session.shape_classes import Attempt
from server.session.statement import Op, Statement
from server.session.window import lookback_of, waits_whole

_PENDING = TaskStatus.PENDING  # bound once: an enum class attribute costs ~0.2 us per lookup


class AllocateAction(Action):
    name = "allocate"
    ARGUMENTS = {"predicateErrorCacheEnable": True}

    def execute(self, ssn: Session) -> None:
        enqueue_enabled = "enqueue" in ssn.config.actions
        # A waiting queue's order does not change either: only the popped queue's job is placed,
        # and the queue is pushed again (its key computed again) after.
        queues = PriorityQueue(ssn.queue_order_fn, key=ssn.queue_order_key())
        waiting: dict[str, list[JobInfo]] = {}
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
            if not job.pending_asks():
                continue
            if job.queue not in waiting:
                waiting[job.queue] = []
                queues.push(ssn.queues[job.queue])
            waiting[job.queue].append(job)
        # A waiting job's or task's order does not change in allocate (only the popped job is
        # placed): keys computed once where every order plugin gives one, each queue's jobs put in
        # order at once (the order of pushing them one by one).
        job_key = ssn.job_order_key()
        jobs_by_queue = {
            name: PriorityQueue(ssn.job_order_fn, jobs, job_key) for name, jobs in waiting.items()
        }
        turns = _Turns(ssn, ssn.task_order_key())

        while not queues.empty():
            queue = queues.pop()
            if ssn.overused(queue):
                continue
            jobs = jobs_by_queue[queue.uid]
            turn = turns.next(queue, jobs)
            if turn is None:  # no job left to try (skipped by shape, or past the lookback)
                if not jobs.empty():
                    queues.push(queue)
                continue
            job, tasks, attempt = turn
            gradients = ssn.hypernode_gradients(job) if job.spec.network_topology else None
            if gradients is not None:
                stmt = self.allocate_in_hypernodes(ssn, job, tasks, gradients)
            else:
                stmt = self.allocate_tasks(ssn, job, tasks)
            if stmt is None and attempt is not None:
                ssn.shape_classes.failed(ssn, job, attempt)
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
        # Looked up once per job, asked once per task.
        allocatable, select, job_ready = ssn.allocatable, ssn.evaluator.select, ssn.job_ready
        while not tasks.empty():
            task = tasks.pop()
            verdict = allocatable(queue, task)
            if verdict is not ALLOWED and not verdict:  # (the identity first: no __bool__ call)
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
            if use_role_cache and job.fit_errors and job.task_has_fit_errors(task):
                job.fit_errors[task.uid] = FitErrors(
                    message=f"Task {task.name} with role spec {task.role} has already predicated failed, skip"
                )
                continue
            choice = select(task, restrict)
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
            if job_ready(job):
                break
        if job_ready(job) or ssn.job_pipelined(job):
            return stmt
        stmt.discard()
        return None


class _Turns:
    """Which job of a queue is tried next, with its tasks in order and (when a shape class stands
    for it) its state before the attempt. A job that comes up for the first time counts against
    the queue's lookback, and one whose shape class failed is skipped: a skip changes nothing, so
    the queue would come up again at once, and the next job is taken here instead."""

    def __init__(self, ssn: Session, task_key: Any) -> None:
        self.ssn = ssn
        self.task_key = task_key
        self.classes = ssn.shape_classes
        self.lookback = lookback_of(ssn.config)
        # Per queue, the jobs that came up and count against a lookback (kept only under one).
        self.considered: dict[str, int] = {}
        # A job's pending tasks in task order, made when the job first comes up (most jobs of a
        # deep queue never do, or are skipped by their shape class).
        self.pending: dict[str, PriorityQueue] = {}

    def next(
        self, queue: QueueInfo, jobs: PriorityQueue
    ) -> tuple[JobInfo, PriorityQueue, Attempt | None] | None:
        ssn, classes = self.ssn, self.classes
        while not jobs.empty():
            job: JobInfo = jobs.pop()
            tasks = self.pending.get(job.uid)
            if tasks is not None:  # it came up before (ready, with tasks left)
                return job, tasks, None
            # A job holding something does not count (nor wait); with no lookback none is counted.
            if self.lookback > 0 and waits_whole(job.spec):
                seen = self.considered.get(queue.uid, 0)
                if self.lookback <= seen:
                    self.ssn.outcomes.queue_refused(job, self.beyond_lookback(queue))
                    continue
                self.considered[queue.uid] = seen + 1
            key = classes.key(ssn, job)
            failure = classes.failure(key)
            if failure is not None:  # its shape found no room, and none came back since
                classes.skip(ssn, job, failure)
                continue
            tasks = self.pending[job.uid] = PriorityQueue(
                ssn.task_order_fn,
                (t for t in job.index[_PENDING].values() if not t.best_effort),
                self.task_key,
            )
            return job, tasks, None if key is None else classes.before(ssn, key, job)
        return None

    def beyond_lookback(self, queue: QueueInfo) -> Verdict:
        """Why a waiting job of ``queue`` past its lookback waits for the next cycle."""
        return refuse(
            "allocate",
            f"queue {queue.name}: not considered this cycle, which considered the first "
            f"{self.lookback} jobs of the queue (maxQueueLookback)",
        )
