"""KAI's job queue: jobs ordered through the queue hierarchy (departments, then queues).

Each pop walks from the top-level queues down to a leaf queue, at every level taking the queue the
``queue_jobs_order`` point puts first, comparing queues with the job each would run next; the leaf
gives its first job by ``job_order``. As a *victim* queue everything is reversed: the queue that
should lose first (compared with the jobs it would lose, those already given up included), and in
it the last job by job order. Every pop re-compares, so allocations made since the last pop count.

Jobs are kept in order by job-order keys where every job-order plugin gives one (a victim queue's
compare the other way round), else by the comparator; ``fill`` sorts each leaf's jobs at once.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Any

from server.model import TaskStatus
from server.session.info import JobInfo
from server.session.kai import ACTIVE_ALLOCATED, GivenUp, is_preemptible, ready_for_scheduling
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
        self._shown: dict[tuple[int, int], GivenUp] = {}  # pop_unchanged's lists of given-up jobs
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
        # rather than the plugins asked at every comparison of an insertion. A victim queue's
        # order is the reverse: its keys compare the other way round.
        key = ssn.job_order_key()
        self._base_key = key
        self._order_key = (lambda job: _Reversed(key(job))) if victims and key else key
        self._keys: dict[str, Any] = {}  # job -> its key, computed when pushed

    def fill(self, jobs: Iterable[JobInfo], filters: Filters) -> JobsByQueue:
        kept = [
            job
            for job in jobs
            if not (filters.unready and not ready_for_scheduling(job))
            and not (filters.non_pending and not job.index[TaskStatus.PENDING])
            and not (filters.non_preemptible and not is_preemptible(job))
            and not (
                filters.non_active
                and not any(t.status in ACTIVE_ALLOCATED for t in job.tasks.values())
            )
        ]
        key = self._base_key
        if key is None or any(self.jobs.values()) or len({job.uid for job in kept}) < len(kept):
            for job in kept:
                self.push(job)
            return self
        self._sort_in(kept, key)
        return self

    def _sort_in(self, jobs: list[JobInfo], key: Callable[[JobInfo], Any]) -> None:
        """``push`` each of ``jobs``, into an empty queue, at once: each leaf's jobs sorted by
        their keys (stably: jobs of equal keys in the order given, as one push after another
        leaves them; a victim queue's descending, ties still in that order), then cut to the
        depth (what dropping the last after each push keeps)."""
        keys, by_leaf = self._keys, self._by_leaf(jobs)
        for leaf, members in by_leaf.items():
            found = {job.uid: key(job) for job in members}
            members.sort(key=lambda j: found[j.uid], reverse=self.victims)
            if self.depth is not None:
                del members[self.depth :]
            for uid, k in found.items():
                keys[uid] = _Reversed(k) if self.victims else k
            self.jobs[leaf] = members

    def _by_leaf(self, jobs: list[JobInfo]) -> dict[str, list[JobInfo]]:
        """``jobs`` by the leaf queue ``push`` files each in (those it drops left out), leaves in
        the order their first job comes."""
        out: dict[str, list[JobInfo]] = {}
        for job in jobs:
            leaf = self._leaf_of(job)
            if leaf is not None:
                out.setdefault(leaf, []).append(job)
        return out

    def _leaf_of(self, job: JobInfo) -> str | None:
        queue = self.ssn.queues.get(job.queue)
        if queue is None or not self._is_leaf(queue.name):
            return None
        if queue.parent and queue.parent not in self.ssn.queues:
            return None
        return queue.name

    def _is_leaf(self, name: str) -> bool:
        return name not in self.children

    def push(self, job: JobInfo) -> None:
        leaf = self._leaf_of(job)
        if leaf is None:
            return
        # Kept in order (a job's order does not change while it waits: only popped jobs are placed).
        jobs = self.jobs.setdefault(leaf, [])
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
        other._answers, other._kept, other._shown = None, [], {}
        other._order_key, other._keys = self._order_key, dict(self._keys)
        other._base_key = self._base_key
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
        up only grow, so a queue's representatives are its next job and how many it gave up.) A
        victim queue shows the order plugins each queue's given-up jobs as a ``GivenUp``, one
        object per list, on which they may keep what they derive from it."""
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

        # Under pop_unchanged a victim queue shows each queue's given-up jobs as a GivenUp, one
        # object per (given-up list, next job), on which the order plugins may keep what they derive.
        unchanged = victims and known is not None and known is self._answers

        def side(name: str) -> tuple[JobInfo | None, list[JobInfo], tuple[object, ...]]:
            below = leaf(name)  # noqa: F821 - a cell emptied only after the last call (below)
            nxt = self.jobs[below][0]
            if not victims:
                return nxt, [], (name, id(nxt))
            given_up = popped.get(below, _NONE)
            shown = self._given_up(given_up, nxt) if unchanged else [*given_up, nxt]
            return None, shown, (name, below, len(given_up), id(nxt))

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
        if victims:  # (a new list: one shown to the order plugins is never changed)
            given_up = popped.get(chosen, _NONE)
            popped[chosen] = self._given_up(given_up, job) if unchanged else [*given_up, job]
        return job

    def _given_up(self, given_up: list[JobInfo], job: JobInfo) -> GivenUp:
        """``[*given_up, job]`` as a GivenUp, one object per pair (kept: both ids are the key)."""
        key = (id(given_up), id(job))
        shown = self._shown.get(key)
        if shown is None:
            shorter = given_up if isinstance(given_up, GivenUp) else None
            shown = self._shown[key] = GivenUp([*given_up, job], shorter)
            self._kept.append(given_up)
        return shown

    def pop(self) -> JobInfo:
        return self._pop(None)


class _Reversed:
    """A sort key compared the other way round (a victim queue's job order)."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __lt__(self, other: _Reversed) -> bool:
        return bool(other.key < self.key)


_NONE: list[JobInfo] = []  # a queue that gave up nothing yet (never changed)


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
