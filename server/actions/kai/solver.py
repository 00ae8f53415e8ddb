"""The victim search shared by consolidation, reclaim and preempt (KAI's job solver).

For a pending job the tasks of this attempt are solved one more at a time: each step searches for
victims that make room for the tasks so far, starting from the victims the previous step needed.
Candidate victims come from the action's victim queue, a victim job at a time (an elastic job gives
up one task above its minimum at a time, a gang all of its tasks); each new candidate job is tried
node by node: on one of its nodes, every candidate task of the jobs with candidates there is evicted,
then the victims' jobs and the pending job are placed again in job-queue order, pipelined (victims
may land elsewhere: consolidation). The first arrangement in which the pending job fits and the
action's validator accepts is the step's solution. A solved job's statement holds the evictions and
the pipelined placements; the action commits it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from server.actions.kai.common import allocate_job
from server.actions.kai.job_queue import Filters, JobsByQueue
from server.model import TaskStatus
from server.session.info import JobInfo, TaskInfo
from server.session.kai import (
    ACTIVE_ALLOCATED,
    ACTIVE_USED,
    gang_satisfied,
    tasks_to_allocate,
    tasks_to_evict,
)
from server.session.session import Session
from server.session.statement import Statement

# (pending job, its tasks placed in this step, every candidate victim of the arrangement) -> accept?
Validator = Callable[[JobInfo, list[TaskInfo], list[TaskInfo]], bool]
VictimQueueFactory = Callable[[], JobsByQueue]


@dataclass
class Solution:
    statement: Statement
    # Evicted for good, then the ones moved elsewhere. (KAI's allowConsolidatingReclaim changes only
    # when its solver adds the moved ones, not the list: the setting matters to proportion alone.)
    victims: list[TaskInfo]


@dataclass
class JobSolver:
    ssn: Session
    validator: Validator
    victim_queue: VictimQueueFactory
    action: str
    _recorded: list[TaskInfo] = field(default_factory=list)
    _waiting: JobsByQueue | None = None

    def solve(self, job: JobInfo) -> tuple[bool, Statement | None, list[TaskInfo]]:
        ssn = self.ssn
        before = sum(1 for t in job.tasks.values() if t.status in ACTIVE_USED)
        tasks = tasks_to_allocate(job, ssn.task_order_fn, real=False)
        statement: Statement | None = None
        self._recorded = []
        self._waiting = None
        for k in range(1, len(tasks) + 1):
            solution = self._solve_partial(job, tasks[:k])
            if solution is None:
                if statement is not None:
                    statement.discard()
                    statement = None
                break
            if k < len(tasks):
                solution.statement.discard()
            else:
                statement = solution.statement
            self._recorded = solution.victims
        after = sum(1 for t in job.tasks.values() if t.status in ACTIVE_USED)
        solved = statement is not None and gang_satisfied(job) and after > before
        if not solved and statement is not None:
            statement.discard()
            statement = None
        return solved, statement, list(self._recorded)

    # -- one step --------------------------------------------------------------------------------
    def _solve_partial(self, job: JobInfo, pending: list[TaskInfo]) -> Solution | None:
        recorded_uids = {t.uid for t in self._recorded}
        queue = self.victim_queue()
        potential: list[TaskInfo] = []
        latest: JobInfo | None = None
        # The scenario with no new candidates: the recorded victims alone.
        if self._recorded:
            found = self._attempt(job, pending, [], latest=None)
            if found is not None:
                return found
        while not queue.empty():
            victim_job = queue.pop()
            chosen, more = tasks_to_evict(victim_job, self.ssn.task_order_fn)
            if any(t.uid in recorded_uids for t in chosen):
                rest = [t for t in victim_job.tasks.values() if t.uid not in recorded_uids]
                if rest:
                    queue.push(victim_job.with_tasks(rest))
                continue
            if more:
                kept = {t.uid for t in chosen}
                queue.push(
                    victim_job.with_tasks(t for t in victim_job.tasks.values() if t.uid not in kept)
                )
            if not chosen:
                continue
            potential += chosen
            latest = self.ssn.jobs[victim_job.uid]
            found = self._attempt(job, pending, potential, latest)
            if found is not None:
                return found
        return None

    def _attempt(
        self,
        job: JobInfo,
        pending: list[TaskInfo],
        potential: list[TaskInfo],
        latest: JobInfo | None,
    ) -> Solution | None:
        ssn = self.ssn
        stmt = ssn.statement()
        for t in self._recorded:
            if t.status != TaskStatus.RELEASING:
                stmt.evict(t, self._reason(t, job))
        if latest is None:
            found = self._simulate(job, pending, stmt, list(self._recorded), list(self._recorded))
            if found is not None:
                return found
            stmt.discard()
            return None
        nodes = sorted({t.node for t in latest.tasks.values() if t.node is not None})
        by_node: dict[str, set[str]] = {}
        for t in potential:
            if t.node is not None:
                by_node.setdefault(t.node, set()).add(t.job)
        for node in nodes:
            mark = stmt.checkpoint()
            jobs_here = by_node.get(node, set())
            evicted = [t for t in potential if t.job in jobs_here]
            for t in evicted:
                if t.status in ACTIVE_ALLOCATED:
                    stmt.evict(t, self._reason(t, job))
            candidates = [*self._recorded, *potential]
            found = self._simulate(job, pending, stmt, [*self._recorded, *evicted], candidates)
            if found is not None:
                return found
            stmt.rollback(mark)
        stmt.discard()
        return None

    def _simulate(
        self,
        job: JobInfo,
        pending: list[TaskInfo],
        stmt: Statement,
        victims: list[TaskInfo],
        candidates: list[TaskInfo],
    ) -> Solution | None:
        """Place the victims' jobs and the pending job again (pipelined), in job-queue order."""
        ssn = self.ssn
        mark = stmt.checkpoint()
        victim_jobs = {t.job for t in victims}
        # KAI orders them with every pending job (a queue's next job decides its turn) and places only
        # them. The other jobs wait unchanged: their order is taken once per search, these join it.
        if self._waiting is None:
            self._waiting = JobsByQueue(ssn).fill(
                [j for j in ssn.jobs.values() if j.index[TaskStatus.PENDING]], Filters()
            )
        order = self._waiting.copy()
        relevant = [ssn.jobs[uid] for uid in victim_jobs | {job.uid} if uid in ssn.jobs]
        for j in relevant:
            order.remove(j)
            order.push(j)
        placed = False
        left = len(relevant)
        while left and not order.empty():
            other = order.pop()
            if other.uid in victim_jobs or other.uid == job.uid:
                left -= 1
            if other.uid == job.uid:
                if not allocate_job(ssn, stmt, job, pending, pipeline_only=True):
                    stmt.rollback(mark)
                    return None
                placed = True
            elif other.uid in victim_jobs:
                inner = stmt.checkpoint()
                if not allocate_job(ssn, stmt, other, pipeline_only=True):
                    stmt.rollback(inner)
        if not placed:
            stmt.rollback(mark)
            return None
        evicted = [t for t in victims if t.status == TaskStatus.RELEASING]
        moved = [t for t in victims if t.status == TaskStatus.PIPELINED]
        if not self.validator(job, pending, candidates):
            stmt.rollback(mark)
            return None
        return Solution(stmt, evicted + moved)

    def _reason(self, victim: TaskInfo, job: JobInfo) -> str:
        return f"{self.action}: evicted to make room for {job.uid}"


class FailedJobs:
    """KAI's minimal job representatives (session parameter ``useSchedulingSignatures``): once a
    job found no solution, a later job with the same scheduling constraints is skipped unless it is
    easier -- fewer pending tasks, or task by task (largest first) no larger and somewhere smaller."""

    def __init__(self, ssn: Session) -> None:
        self.enabled = _session_flag(ssn, "useSchedulingSignatures")
        self.smallest: dict[tuple[object, ...], list[TaskInfo]] = {}

    @staticmethod
    def _key(job: JobInfo) -> tuple[object, ...]:
        return (
            job.queue,
            tuple(sorted({repr(t.static_key) for t in job.index[TaskStatus.PENDING].values()})),
        )

    @staticmethod
    def _requests(tasks: list[TaskInfo]) -> list[tuple[float, ...]]:
        return sorted((tuple(t.resreq.tolist()) + (t.gpu_fraction,) for t in tasks), reverse=True)

    def worth_trying(self, job: JobInfo) -> bool:
        if not self.enabled:
            return True
        known = self.smallest.get(self._key(job))
        mine = list(job.index[TaskStatus.PENDING].values())
        if known is None:
            return True
        if not mine or not known:
            return False
        if len(known) > len(mine):
            return True
        for a, b in zip(self._requests(mine), self._requests(known), strict=False):
            if all(x <= y for x, y in zip(a, b, strict=True)):
                if a != b:
                    return True
                continue
            return False
        return False

    def failed(self, job: JobInfo) -> None:
        if not self.enabled:
            return
        mine = list(job.index[TaskStatus.PENDING].values())
        known = self.smallest.get(self._key(job))
        if known is not None and (
            len(mine) > len(known)
            or not all(
                all(x <= y for x, y in zip(a, b, strict=True))
                for a, b in zip(self._requests(mine), self._requests(known), strict=False)
            )
        ):
            return
        self.smallest[self._key(job)] = mine


def solve_pending_jobs(
    ssn: Session,
    action: str,
    *,
    pending: Filters,
    may_try: Callable[[JobInfo], bool],
    victim_jobs: Callable[[JobInfo], list[JobInfo]],
    victim_filters: Filters,
    validator: Validator,
) -> None:
    """The loop consolidation, reclaim and preempt share: pending jobs in job-queue order, each one
    the action may try gets a victim search (a fresh solution start) over the victim queue of
    ``victim_jobs``; a solution is committed, a failure remembered (scheduling signatures)."""
    queue = JobsByQueue(ssn).fill(ssn.jobs.values(), pending)
    failed = FailedJobs(ssn)
    while not queue.empty():
        job = queue.pop()
        if not failed.worth_trying(job) or job.uid in ssn.invalid_jobs or not may_try(job):
            continue
        ssn.solution_start()

        def victims(preemptor: JobInfo = job) -> JobsByQueue:
            return JobsByQueue(ssn, victims=True).fill(victim_jobs(preemptor), victim_filters)

        solved, stmt, _ = JobSolver(ssn, validator, victims, action).solve(job)
        if solved and stmt is not None:
            stmt.commit()
        else:
            failed.failed(job)


def _session_flag(ssn: Session, key: str) -> bool:
    value = ssn.config.session.get(key, False)
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)
