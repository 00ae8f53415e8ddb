"""KAI's job queue: jobs ordered through the queue hierarchy (departments, then queues).

Each pop walks from the top-level queues down to a leaf queue, at every level taking the queue the
``queue_jobs_order`` point puts first, comparing queues with the job each would run next; the leaf
gives its first job by ``job_order``. As a *victim* queue everything is reversed: the queue that
should lose first (compared with the jobs it would lose, those already given up included), and in
it the last job by job order. Every pop re-compares, so allocations made since the last pop count.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Any

from server.model import TaskStatus
from server.session.info import JobInfo
from server.session.kai import ACTIVE_ALLOCATED, is_preemptible, ready_for_scheduling
from server.session.session import Session


@dataclass(frozen=True)
class Filters:
    unready: bool = False  # leave out jobs with fewer alive tasks than a pod set's minimum
    non_pending: bool = False  # leave out jobs with no pending task
    non_preemptible: bool = False
    non_active: bool = False  # leave out jobs with no active allocated task


class JobsByQueue:
    def __init__(self, ssn: Session, *, victims: bool = False, depth: int | None = None) -> None:
        self.ssn = ssn
        self.victims = victims
        # KAI's queueDepthPerAction: each leaf keeps at most this many jobs, the first in job order
        # (None: no bound). Those pushed beyond it are dropped.
        self.depth = depth
        # pop_unchanged's answers, and the jobs they name (kept: their ids are in the keys).
        self._answers: dict[tuple[object, ...], bool] | None = None
        self._kept: list[object] = []
        self.jobs: dict[str, list[JobInfo]] = {}
        self.popped: dict[str, list[JobInfo]] = {}
        self.children: dict[str, list[str]] = {}
        for q in ssn.queues.values():
            if q.parent and q.parent in ssn.queues:
                self.children.setdefault(q.parent, []).append(q.name)
        self.roots = [
            q.name for q in ssn.queues.values() if not q.parent or q.parent not in ssn.queues
        ]
        # The job order as a sort key when every job-order plugin gives one: one key per job
        # rather than the plugins asked at every comparison of an insertion. (A victim queue
        # keeps the comparator, reversed.)
        self._order_key = None if victims else ssn.job_order_key()
        self._keys: dict[str, Any] = {}  # job -> its key, computed when pushed

    def fill(self, jobs: Iterable[JobInfo], filters: Filters) -> JobsByQueue:
        for job in jobs:
            if filters.unready and not ready_for_scheduling(job):
                continue
            if filters.non_pending and not job.index[TaskStatus.PENDING]:
                continue
            if filters.non_preemptible and not is_preemptible(job):
                continue
            if filters.non_active and not any(
                t.status in ACTIVE_ALLOCATED for t in job.tasks.values()
            ):
                continue
            self.push(job)
        return self

    def _is_leaf(self, name: str) -> bool:
        return name not in self.children

    def push(self, job: JobInfo) -> None:
        queue = self.ssn.queues.get(job.queue)
        if queue is None or not self._is_leaf(queue.name):
            return
        if queue.parent and queue.parent not in self.ssn.queues:
            return
        # Kept in order (a job's order does not change while it waits: only popped jobs are placed).
        jobs = self.jobs.setdefault(queue.name, [])
        if self._order_key is not None:
            keys = self._keys
            keys[job.uid] = self._order_key(job)
            bisect.insort(jobs, job, key=lambda j: keys[j.uid])
        else:
            bisect.insort(jobs, job, key=self._key)
        if self.depth is not None and len(jobs) > self.depth:
            jobs.pop()

    def copy(self) -> JobsByQueue:
        """The same queue, to pop from without touching this one (the order of waiting jobs does
        not change while they wait)."""
        other = JobsByQueue.__new__(JobsByQueue)
        other.ssn, other.victims, other.children, other.roots = (
            self.ssn,
            self.victims,
            self.children,
            self.roots,
        )
        other.depth = self.depth
        other._answers, other._kept = None, []
        other._order_key, other._keys = self._order_key, dict(self._keys)
        other.jobs = {leaf: list(jobs) for leaf, jobs in self.jobs.items()}
        other.popped = {leaf: list(jobs) for leaf, jobs in self.popped.items()}
        return other

    def remove(self, job: JobInfo) -> None:
        jobs = self.jobs.get(job.queue)
        if jobs is not None:
            for i, known in enumerate(jobs):
                if known is job:
                    del jobs[i]
                    return

    def empty(self) -> bool:
        return not any(self.jobs.values())

    def __len__(self) -> int:
        return sum(len(v) for v in self.jobs.values())

    # -- ordering --------------------------------------------------------------------------------
    def _job_first(self, a: JobInfo, b: JobInfo) -> bool:
        return self.ssn.job_order_fn(b, a) if self.victims else self.ssn.job_order_fn(a, b)

    def _key(self, job: JobInfo) -> Any:
        def compare(a: JobInfo, b: JobInfo) -> int:
            return -1 if self._job_first(a, b) else (1 if self._job_first(b, a) else 0)

        return functools.cmp_to_key(compare)(job)

    def _has_jobs(self, name: str) -> bool:
        if self.jobs.get(name):
            return True
        return any(self._has_jobs(c) for c in self.children.get(name, ()))

    def pop_until(self, wanted: Container[str]) -> JobInfo | None:
        """Pop jobs until one whose uid is in ``wanted`` and return it (None: none is left); the
        jobs popped before it are dropped. The same jobs in the same order as ``pop`` gives, for a
        caller that changes nothing while this runs (a simulation between two placements): then a
        comparison of two queues, each with the job it would run next, always gives the same answer,
        so each is asked once per call however many jobs are popped past."""
        known: dict[tuple[object, ...], bool] = {}
        while not self.empty():
            job = self._pop(known)
            if job.uid in wanted:
                return job
        return None

    def pop_unchanged(self) -> JobInfo:
        """``pop``, for a caller that leaves the session as it was from one pop to the next (a
        victim search undoes each attempt before it takes the next candidate): each comparison of
        two queues with their jobs is asked once in the queue's life. (A victim queue's jobs given
        up only grow, so a queue's representatives are its next job and how many it gave up.)"""
        if self._answers is None:
            self._answers = {}
        return self._pop(self._answers)

    def _pop(self, known: dict[tuple[object, ...], bool] | None) -> JobInfo:
        """The next job (``pop``). With ``known``, the answers of the queue comparisons are kept
        there, keyed by the queues and their representatives, for as long as the session does not
        change; without it, every comparison is asked afresh."""
        queues, order, victims, popped = (
            self.ssn.queues,
            self.ssn.queue_jobs_order,
            self.victims,
            self.popped,
        )

        def side(name: str) -> tuple[JobInfo | None, list[JobInfo], tuple[object, ...]]:
            below = leaf(name)  # noqa: F821 - a cell emptied only after the last call (below)
            nxt = self.jobs[below][0]
            if not victims:
                return nxt, [], (name, id(nxt))
            given_up = popped.get(below, [])
            return None, [*given_up, nxt], (name, below, len(given_up), id(nxt))

        def best(names: list[str]) -> str:
            first = names[0]
            first_job, first_given, first_key = side(first)  # noqa: F821 - as above
            for n in names[1:]:
                job, given, key = side(n)  # noqa: F821 - as above
                if known is None:
                    goes_first = order(queues[n], queues[first], job, first_job, given, first_given)
                else:
                    answer_key = (*key, *first_key)
                    remembered = known.get(answer_key)
                    if remembered is None:
                        remembered = known[answer_key] = order(
                            queues[n], queues[first], job, first_job, given, first_given
                        )
                        self._kept.append((job, given[-1:], first_job, first_given[-1:]))
                    goes_first = remembered
                if goes_first != victims:  # (as a victim queue the order is reversed)
                    first, first_job, first_given, first_key = n, job, given, key
            return first

        def leaf(name: str) -> str:
            while not self._is_leaf(name):
                name = best([c for c in self.children[name] if self._has_jobs(c)])  # noqa: F821
            return name

        try:
            chosen = leaf(best([name for name in self.roots if self._has_jobs(name)]))
        finally:
            # The three closures call each other through their cells: emptying the cells breaks
            # that reference cycle, so nothing waits for the collector (tests/core/test_cycle_memory).
            del side, best, leaf
        job = self.jobs[chosen].pop(0)
        if victims:
            popped.setdefault(chosen, []).append(job)
        return job

    def pop(self) -> JobInfo:
        return self._pop(None)


def per_action(ssn: Session, parameter: str, action: str) -> int | None:
    """An action's entry of a per-action session parameter (``queueDepthPerAction``,
    ``simulationBudgetPerAction``): None when the action has none or a negative one (no bound)."""
    values = ssn.config.session.get(parameter)
    value = values.get(action) if isinstance(values, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def queue_depth(ssn: Session, action: str) -> int | None:
    """KAI's ``queueDepthPerAction``: the most jobs of each queue the action tries."""
    return per_action(ssn, "queueDepthPerAction", action)
