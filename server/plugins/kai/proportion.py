"""proportion (``profile: kai``): KAI Scheduler's hierarchical fair share.

Per queue and per resource (cpu, memory, GPUs) a queue has a *deserved* quota (scenario
``guarantee``; cpu and memory without one: unlimited, GPUs: 0), a *limit* (``capability``) and an
*over-quota weight* (``weight``, for GPUs; cpu and memory weigh 1). Each session divides the cluster
top-down: every queue first gets its deserved quota (capped by what it requests), then what is left
goes to the queues still asking, by weight, highest queue priority first, in rounds, whole units
first and the remainder one unit at a time to the largest leftovers. The result is the queue's
*fair share*.

Registers: ``queue_jobs_order`` (under-used queues first, then queues whose next job stays within
deserved quota, priority, no use of a resource the queue may not have, the smaller dominant share
with the next job, without it, the smaller allocatable share, creation order), ``job_over_capacity``
(a queue limit up the hierarchy; a non-preemptible job beyond deserved quota), ``non_preemptible_over_quota``,
``job_satisfiable`` (what the job needs at once within each queue's limit up the hierarchy, and a
non-preemptible job's within deserved quota: beyond it, the job can never run),
``can_reclaim`` (the reclaimer's queue stays within its fair share, a non-preemptible one within
deserved quota), ``reclaim_scenario_valid`` (each victim queue keeps its fair share, or the reclaimer
only takes back its deserved quota, and the reclaimer's queue does not become more saturated than a
sibling it reclaims from), ``solution_start`` and the allocate / deallocate events that keep each
queue's allocated share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from muster.devices import NVIDIA_GPU, UNIT
from muster.quantity import CPU, MEMORY, from_canonical
from server.model import TaskStatus
from server.plugins.base import Plugin
from server.plugins.util import beyond_limit
from server.session.extension_points import (
    ALLOWED,
    CAN_RECLAIM,
    JOB_OVER_CAPACITY,
    JOB_SATISFIABLE,
    NON_PREEMPTIBLE_OVER_QUOTA,
    QUEUE_JOBS_ORDER,
    RECLAIM_SCENARIO_VALID,
    SOLUTION_START,
    EventHandler,
    Verdict,
    refuse,
)
from server.session.info import JobInfo, QueueInfo, TaskInfo
from server.session.kai import (
    ALLOCATED_SHARE,
    GivenUp,
    is_preemptible,
    pod_sets,
    task_quantities,
    tasks_to_allocate,
)
from server.session.options import flag
from server.session.session import Session

RESOURCES = (CPU, MEMORY, NVIDIA_GPU)
INF = math.inf
NO_FAIR_SHARE_PENALTY = 1000.0  # a resource the queue may not have counts this much per unit


@dataclass
class Share:
    deserved: float = 0.0
    fair: float = 0.0
    limit: float = INF
    weight: float = 1.0
    allocated: float = 0.0
    allocated_np: float = 0.0  # allocated to non-preemptible jobs
    request: float = 0.0

    def requestable(self) -> float:
        return min(self.limit, self.request)

    def allocatable(self) -> float:
        if self.deserved == INF:
            return self.limit
        return min(self.limit, max(self.deserved, self.fair))


@dataclass
class QueueShares:
    name: str
    parent: str | None
    priority: int
    creation: int
    children: list[str] = field(default_factory=list)
    by_resource: dict[str, Share] = field(default_factory=dict)
    # get("allocated"), kept where the allocation changes (session open, allocation events): what
    # the queue-order caches key on (fair, deserved and limits are set at session open). The
    # allocation itself rather than a change count, so a simulation that is rolled back gives the
    # same key again and its comparisons are reused by the next one.
    allocation_key: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def get(self, what: str) -> tuple[float, float, float]:
        return tuple(getattr(self.by_resource[r], what) for r in RESOURCES)

    def copy(self) -> QueueShares:
        return QueueShares(
            self.name,
            self.parent,
            self.priority,
            self.creation,
            list(self.children),
            {r: Share(**vars(s)) for r, s in self.by_resource.items()},
        )


Vec3 = tuple[float, float, float]
# Per leaf queue, it and its ancestors with their cpu, memory and GPU shares; per task, its
# queue's chain, its quantities and whether its job is non-preemptible (``_event_of``).
_Chain = list[tuple[QueueShares, Share, Share, Share]]
_Event = tuple[_Chain, Vec3, bool]


@dataclass(frozen=True)
class _Fixed:
    """What the queue order reads of a queue besides its allocation: fixed once the session's fair
    shares are set."""

    fair: Vec3
    deserved: Vec3
    allocatable: Vec3
    none: tuple[bool, bool, bool]  # a resource the queue may not have (nothing allocatable)
    # Per resource, what the dominant share divides by: the allocatable, the cluster's total
    # when unlimited.
    shares_of: Vec3

    @classmethod
    def of(cls, q: QueueShares, total: Vec3) -> _Fixed:
        allocatable: Vec3 = tuple(q.by_resource[r].allocatable() for r in RESOURCES)  # type: ignore[assignment]
        return cls(
            q.get("fair"),
            q.get("deserved"),
            allocatable,
            tuple(a == 0 for a in allocatable),  # type: ignore[arg-type]
            tuple(t if a == INF else a for a, t in zip(allocatable, total, strict=True)),  # type: ignore[arg-type]
        )

    def dominant_share(self, allocated: Vec3) -> float:
        best = 0.0
        for alloc, allocatable in zip(allocated, self.shares_of, strict=True):
            value = alloc * NO_FAIR_SHARE_PENALTY if allocatable == 0 else alloc / allocatable
            best = max(best, value)
        return best


def job_state(job: JobInfo, jobs: dict[str, JobInfo]) -> tuple[object, ...]:
    """What a job asks for and holds follows from its tasks' statuses alone: a cache key for it. A
    session's job counts its status changes; a job seen through some of its tasks (another dict of
    tasks, hence the id) is keyed by the statuses themselves."""
    if jobs.get(job.uid) is job:
        return (job.uid, job.status_changes)
    return (job.uid, id(job.tasks), tuple(t.status for t in job.tasks.values()))


T = TypeVar("T")


def _memo(
    cache: dict[tuple[object, ...], tuple[T, object]],
    key: tuple[object, ...],
    keep: object,
    compute: Callable[..., T],
    *args: Any,
) -> T:
    """``cache[key]``, computed once as ``compute(*args)``; ``keep`` stays referenced beside the
    value, so the ids in ``key`` (a job seen through some of its tasks) are not reused while it is
    cached. (The arguments, not a closure: a closure made per call costs as much as a hit.)"""
    known = cache.get(key)
    if known is None:
        if len(cache) > 100_000:
            cache.clear()
        known = cache[key] = (compute(*args), keep)
    return known[0]


def less_equal(a: Vec3, b: Vec3) -> bool:
    return a[0] <= b[0] and a[1] <= b[1] and a[2] <= b[2]


def all_less(a: Vec3, b: Vec3) -> bool:
    return a[0] < b[0] and a[1] < b[1] and a[2] < b[2]


def add(a: Vec3, b: Vec3, sign: float = 1.0) -> Vec3:
    return a[0] + sign * b[0], a[1] + sign * b[1], a[2] + sign * b[2]


def divide(total: float, queues: list[QueueShares], resource: str) -> None:
    """Set ``fair`` of sibling queues for one resource out of ``total`` (KAI resource division)."""
    left = total
    for q in queues:
        s = q.by_resource[resource]
        deserved = total if s.deserved == INF else s.deserved
        amount = min(deserved, s.requestable())
        s.fair += amount
        left -= amount
    if left <= 0:
        return
    priorities = sorted({q.priority for q in queues}, reverse=True)
    leftovers: dict[int, dict[str, tuple[QueueShares, float]]] = {}
    for prio in priorities:
        group = [q for q in queues if q.priority == prio]
        left, leftovers[prio] = _up_to_fair_share(left, group, resource)
    for prio in priorities:
        if left <= 0:
            break
        rest = sorted(leftovers[prio].values(), key=lambda e: (-e[1], e[0].creation, e[0].name))
        for q, _ in rest:
            if left <= 0:
                break
            give = min(1.0, left)  # one unit (a GPU, a millicore, a byte) at a time
            q.by_resource[resource].fair += give
            left -= give


def _remaining_request(s: Share) -> float:
    return max(0.0, s.requestable() - s.fair)


def _satisfied(s: Share) -> bool:
    return s.request <= s.fair or (s.limit != INF and s.limit <= s.fair)


def _up_to_fair_share(
    left: float, queues: list[QueueShares], resource: str
) -> tuple[float, dict[str, tuple[QueueShares, float]]]:
    leftovers: dict[str, tuple[QueueShares, float]] = {}
    while True:
        again = False
        round_total = left
        unsatisfied = [q for q in queues if _remaining_request(q.by_resource[resource]) > 0]
        total_weight = sum(q.by_resource[resource].weight for q in unsatisfied)
        if total_weight == 0:
            break
        weights = {
            q.name: q.by_resource[resource].weight / total_weight
            for q in queues
            if not _satisfied(q.by_resource[resource])
        }
        weight_sum = sum(weights.values())
        if weight_sum == 0:
            break
        for q in queues:
            if left == 0:
                break
            s = q.by_resource[resource]
            if _satisfied(s) or s.weight == 0:
                continue
            requested = _remaining_request(s)
            share = round_total * weights[q.name] / weight_sum
            if requested <= share:
                give = requested
                leftovers.pop(q.name, None)
            else:
                give = max(0.0, math.floor(share))  # whole units first
                if share - give > 0:
                    leftovers[q.name] = (q, share - give)
            if give == 0:
                continue
            s.fair += give
            left -= give
            again = again or requested < share
        if not again or left == 0:
            break
    return left, leftovers


class KaiProportionPlugin(Plugin):
    name: ClassVar[str] = "proportion"
    ARGUMENTS: ClassVar[dict[str, object]] = {"relcaimerSaturationMultiplier": 1.0, "kValue": 1.0}

    def on_session_open(self, ssn: Session) -> None:
        self.ssn = ssn
        self.dims = ssn.space.index
        # Caches asked at every queue comparison, keyed by job_state (and the queue's allocation_key):
        # what a job still requests, what it holds, a queue's order key.
        self._requests: dict[tuple[object, ...], tuple[Vec3, object]] = {}
        self._allocated: dict[tuple[object, ...], tuple[Vec3, object]] = {}
        self._keys: dict[tuple[object, ...], tuple[tuple[object, ...], object]] = {}
        self._less_victims: dict[tuple[object, ...], tuple[Vec3, object]] = {}
        self.multiplier = max(1.0, self.arg_float("relcaimerSaturationMultiplier", 1.0))
        self.queues = self._build(ssn)
        self.frozen: dict[str, QueueShares] = {n: q.copy() for n, q in self.queues.items()}
        self.total = self._total(ssn)
        self._set_fair_shares()
        # What the queue order reads of a queue besides its allocation, fixed once the fair
        # shares are set (deserved quotas, limits and fair shares do not change in a session).
        self._fixed = {name: _Fixed.of(q, self.total) for name, q in self.queues.items()}
        # Per leaf queue, the shares (in RESOURCES order) of it and its ancestors, and per task
        # its quantities: what each allocation event adds to or takes from.
        self._chain_shares: dict[str, _Chain] = {}
        self._task_quantities: dict[str, Vec3] = {}
        ssn.register(QUEUE_JOBS_ORDER, self.name, self.queue_order)
        ssn.register(JOB_OVER_CAPACITY, self.name, self.over_capacity)
        ssn.register(JOB_SATISFIABLE, self.name, self.satisfiable)
        ssn.register(NON_PREEMPTIBLE_OVER_QUOTA, self.name, self.non_preemptible_over_quota)
        ssn.register(CAN_RECLAIM, self.name, self.can_reclaim)
        ssn.register(RECLAIM_SCENARIO_VALID, self.name, self.reclaimable)
        ssn.register(SOLUTION_START, self.name, self.solution_start)
        # Per task, what its allocation events add to or take from (``_event_of``).
        self._events: dict[str, _Event] = {}
        ssn.add_event_handler(EventHandler(self._on_allocate, self._on_deallocate))

    # -- building ------------------------------------------------------------------------------
    def _quantities(self, task: TaskInfo) -> Vec3:
        return task_quantities(task, self.dims).values()

    def _total(self, ssn: Session) -> Vec3:
        total = (0.0, 0.0, 0.0)
        for i in range(len(ssn.nodes)):
            if not ssn.nodes.specs[i].ready:
                continue
            row = ssn.nodes.allocatable[i]
            cpu = float(row[self.dims[CPU]]) if CPU in self.dims else 0.0
            mem = float(row[self.dims[MEMORY]]) if MEMORY in self.dims else 0.0
            gpu = float(row[self.dims[NVIDIA_GPU]]) / UNIT if NVIDIA_GPU in self.dims else 0.0
            total = add(total, (cpu, mem, gpu))
        return total

    def _build(self, ssn: Session) -> dict[str, QueueShares]:
        queues: dict[str, QueueShares] = {}
        parents = {q.parent for q in ssn.queues.values() if q.parent}
        for q in ssn.queues.values():
            qs = QueueShares(
                q.name, q.parent if q.parent in ssn.queues else None, q.priority, q.creation_index
            )
            for r in RESOURCES:
                d = self.dims.get(r)
                has_quota = r in q.spec.guarantee
                # Without a quota: cpu and memory unlimited, GPUs 0 -- but a parent queue (a
                # department) without one does not limit its children (KAI's default department).
                # KAI's quota -1 written as an unlimited deserved (the Kubernetes adapter's way,
                # a guarantee of -1 being a scenario's) is an unlimited quota too.
                unset = 0.0 if r == NVIDIA_GPU and q.name not in parents else INF
                if q.spec.deserved.get(r) == INF:
                    unset = INF
                deserved = q.guarantee[d] if d is not None and has_quota else unset
                limit = q.capability[d] if d is not None else INF
                if r == NVIDIA_GPU:
                    deserved = deserved / UNIT if deserved != INF else INF
                    limit = limit / UNIT if limit != INF else INF
                weight = q.over_quota_weight if r == NVIDIA_GPU else 1.0
                qs.by_resource[r] = Share(deserved=deserved, limit=limit, weight=weight)
            queues[q.name] = qs
        for qs in queues.values():
            if qs.parent is not None:
                queues[qs.parent].children.append(qs.name)
        for job in ssn.jobs.values():
            np_job = not is_preemptible(job)
            for t in job.tasks.values():
                amount = self._quantities(t)
                if t.status in ALLOCATED_SHARE:
                    for qs in self._chain(queues, job.queue):
                        for r, v in zip(RESOURCES, amount, strict=True):
                            s = qs.by_resource[r]
                            s.allocated += v
                            s.request += v
                            if np_job:
                                s.allocated_np += v
                elif t.status == TaskStatus.PENDING:
                    for qs in self._chain(queues, job.queue):
                        for r, v in zip(RESOURCES, amount, strict=True):
                            qs.by_resource[r].request += v
        for qs in queues.values():
            qs.allocation_key = qs.get("allocated")
        return queues

    @staticmethod
    def _chain(queues: dict[str, QueueShares], leaf: str) -> list[QueueShares]:
        out = []
        q = queues.get(leaf)
        while q is not None:
            out.append(q)
            q = queues.get(q.parent) if q.parent is not None else None
        return out

    def _set_fair_shares(self) -> None:
        """Divide the cluster top-down: the top queues share its total, then each queue's
        children its fair share, depth first. (A loop: a recursive closure would be a reference
        cycle holding the plugin, and so the session, after the cycle.)"""
        levels: list[tuple[Vec3, list[QueueShares]]] = [
            (self.total, [q for q in self.queues.values() if q.parent is None])
        ]
        while levels:
            total, members = levels.pop()
            if not members:
                continue
            for r, amount in zip(RESOURCES, total, strict=True):
                divide(amount, members, r)
            # Children in the order the recursion took them: the first member's first.
            for q in reversed(members):
                levels.append((q.get("fair"), [self.queues[c] for c in q.children]))

    # -- events ----------------------------------------------------------------------------------
    # Run at every status change of a session (KAI's reclaim evicts and rolls back hundreds of
    # victims per cycle): what an event of a task adds is found at its first event, and the two
    # signs are two handlers, so that no product is taken per share (``a - v`` is ``a + -1.0 * v``
    # exactly, as ``a + v`` is ``a + 1.0 * v``: the sums are the same to the bit).
    def _event_of(self, task: TaskInfo) -> _Event | None:
        """The shares (in RESOURCES order) of the task's queue and its ancestors, its quantities
        and whether its job is non-preemptible: none changes in a session (a job's queue and
        priority, a task's request), so each task's is found once."""
        job = self.ssn.jobs.get(task.job)
        if job is None:
            return None
        chain = self._chain_shares.get(job.queue)
        if chain is None:
            chain = self._chain_shares[job.queue] = [
                (qs, qs.by_resource[CPU], qs.by_resource[MEMORY], qs.by_resource[NVIDIA_GPU])
                for qs in self._chain(self.queues, job.queue)
            ]
        event = self._events[task.uid] = (chain, self._task_amount(task), not is_preemptible(job))
        return event

    def _on_allocate(self, task: TaskInfo) -> None:
        event = self._events.get(task.uid) or self._event_of(task)
        if event is None:
            return
        chain, (cpu, memory, gpu), np_job = event
        for qs, c, m, g in chain:
            c.allocated += cpu
            m.allocated += memory
            g.allocated += gpu
            if np_job:
                c.allocated_np += cpu
                m.allocated_np += memory
                g.allocated_np += gpu
            qs.allocation_key = (c.allocated, m.allocated, g.allocated)

    def _on_deallocate(self, task: TaskInfo) -> None:
        event = self._events.get(task.uid) or self._event_of(task)
        if event is None:
            return
        chain, (cpu, memory, gpu), np_job = event
        for qs, c, m, g in chain:
            c.allocated -= cpu
            m.allocated -= memory
            g.allocated -= gpu
            if np_job:
                c.allocated_np -= cpu
                m.allocated_np -= memory
                g.allocated_np -= gpu
            qs.allocation_key = (c.allocated, m.allocated, g.allocated)

    def solution_start(self) -> None:
        self.frozen = {n: q.copy() for n, q in self.queues.items()}

    # -- helpers ---------------------------------------------------------------------------------
    def _job_request(self, job: JobInfo | None) -> Vec3:
        if job is None:
            return (0.0, 0.0, 0.0)
        return _memo(
            self._requests,
            job_state(job, self.ssn.jobs),
            job,
            lambda: self._tasks_request(tasks_to_allocate(job, self.ssn.task_order_fn, real=False)),
        )

    def _task_amount(self, task: TaskInfo) -> Vec3:
        """The task's quantities, found once (a task's request does not change)."""
        amount = self._task_quantities.get(task.uid)
        if amount is None:
            amount = self._task_quantities[task.uid] = self._quantities(task)
        return amount

    def _tasks_request(self, tasks: Iterable[TaskInfo]) -> Vec3:
        # Summed as Quantities.add sums (the same additions in the same order), from each task's
        # quantities found once.
        cpu = memory = gpu = 0.0
        for t in tasks:
            amount = self._task_amount(t)
            cpu += amount[0]
            memory += amount[1]
            gpu += amount[2]
        return cpu, memory, gpu

    # -- queue order -----------------------------------------------------------------------------
    def queue_order(
        self,
        lq: QueueInfo,
        rq: QueueInfo,
        lj: JobInfo | None,
        rj: JobInfo | None,
        lv: list[JobInfo],
        rv: list[JobInfo],
    ) -> int:
        left, right = self.queues.get(lq.name), self.queues.get(rq.name)
        if left is None:
            return 1
        if right is None:
            return -1
        lk, rk = self._queue_key(left, lj, lv), self._queue_key(right, rj, rv)
        if lk != rk:
            return -1 if lk < rk else 1
        la, ra = self._fixed[left.name].allocatable, self._fixed[right.name].allocatable
        if not less_equal(ra, la) and less_equal(la, ra):
            return -1
        if not less_equal(la, ra) and less_equal(ra, la):
            return 1
        return 0

    def _queue_key(
        self, q: QueueShares, job: JobInfo | None, victims: list[JobInfo]
    ) -> tuple[object, ...]:
        """The queue's place in KAI's queue order, smaller first, as a tuple compared left to right:
        over its fair share (last), within deserved quota with its next job (first), priority
        (higher first), using a resource it may not have (last), dominant share with the next job
        (its given-up victims taken away), dominant share now. A pop compares queues many times
        with nothing changed between: cached until the queue's allocation or the jobs' tasks change
        (for a GivenUp list of victims, whose jobs do not change while it lives: by the list)."""
        jobs = self.ssn.jobs
        states: tuple[object, ...] | int
        if not victims:
            states = ()
        elif isinstance(victims, GivenUp):  # what its jobs hold is fixed while it lives: its id
            states = id(victims)
        else:
            states = tuple([job_state(v, jobs) for v in victims])
        if job is None:
            state: tuple[object, ...] | None = None
        elif jobs.get(job.uid) is job:  # (job_state, written out: asked at every comparison)
            state = (job.uid, job.status_changes)
        else:
            state = job_state(job, jobs)
        cache_key = (q.name, q.allocation_key, state, states)
        known = self._keys.get(cache_key)
        if known is not None:  # (_memo's hit, without the call)
            return known[0]
        return _memo(
            self._keys,
            cache_key,
            (job, victims),
            self._compute_queue_key,
            q,
            job,
            victims,
            states,
        )

    def _compute_queue_key(
        self,
        q: QueueShares,
        job: JobInfo | None,
        victims: list[JobInfo],
        states: tuple[object, ...] | int,
    ) -> tuple[object, ...]:
        fixed = self._fixed[q.name]
        alloc = q.allocation_key  # (its get("allocated"))
        with_job = add(alloc, self._job_request(job))
        return (
            all_less(fixed.fair, alloc),
            not less_equal(with_job, fixed.deserved),
            -q.priority,
            any(none and v > 0 for none, v in zip(fixed.none, with_job, strict=True)),
            fixed.dominant_share(self._minus_victims(with_job, victims, states)),
            fixed.dominant_share(alloc),
        )

    def _minus_victims(
        self, allocated: Vec3, victims: list[JobInfo], states: tuple[object, ...] | int
    ) -> Vec3:
        """``allocated`` less each victim's allocation, one after the other (``states``: the
        victims' job_state). A victim queue gives up one job at a time, so the result for all but
        the last victim is usually known: kept per (allocated, states), and only the last one
        taken away (the same subtractions in the same order). A GivenUp keeps its results."""
        if not victims:
            return allocated
        if isinstance(victims, GivenUp):
            return self._given_up_less(allocated, victims)
        assert isinstance(states, tuple)
        # (the victims kept beside the result: their ids are in the states)
        return _memo(
            self._less_victims,
            (allocated, states),
            victims,
            self._subtract_victims,
            allocated,
            victims,
            states,
        )

    def _given_up_less(self, allocated: Vec3, victims: GivenUp) -> Vec3:
        """``_minus_victims`` of a GivenUp: its result is kept on it, and built on its shorter
        list's (taken from scratch only for a list built on none): the same subtractions in the
        same order, each job's allocation taken once per list."""
        key = ("proportion: less given up", allocated)
        lists: list[GivenUp] = []  # those without the result, longest first
        shown: GivenUp | None = victims
        result: Vec3 | None = None
        while shown is not None:
            known = shown.derived.get(key)
            if isinstance(known, tuple):  # (only this method writes the key)
                result = known
                break
            lists.append(shown)
            shown = shown.shorter
        if result is None:
            base = lists.pop()  # built on no shorter list: every one of its jobs
            result = base.derived[key] = self._less_each(allocated, base)
        for shown in reversed(lists):
            result = add(result, self._job_allocated(shown[-1]), -1.0)
            shown.derived[key] = result
        return result

    def _subtract_victims(
        self, allocated: Vec3, victims: list[JobInfo], states: tuple[object, ...]
    ) -> Vec3:
        before = self._less_victims.get((allocated, states[:-1])) if len(victims) > 1 else None
        if before is not None:
            return add(before[0], self._job_allocated(victims[-1]), -1.0)
        return self._less_each(allocated, victims)

    def _less_each(self, allocated: Vec3, jobs: Iterable[JobInfo]) -> Vec3:
        """``allocated`` less each job's allocation, one after the other."""
        result = allocated
        for v in jobs:
            result = add(result, self._job_allocated(v), -1.0)
        return result

    def _job_allocated(self, job: JobInfo) -> Vec3:
        return _memo(
            self._allocated,
            job_state(job, self.ssn.jobs),
            job,
            lambda: self._tasks_request(
                t for t in job.tasks.values() if t.status in ALLOCATED_SHARE
            ),
        )

    # -- capacity --------------------------------------------------------------------------------
    def over_capacity(self, job: JobInfo, tasks: list[TaskInfo]) -> Verdict:
        requested = self._tasks_request(tasks)
        for qs in self._chain(self.queues, job.queue):
            for r, v in zip(RESOURCES, requested, strict=True):
                s = qs.by_resource[r]
                if v > 0 and s.limit != INF and s.limit < s.allocated + v:
                    return refuse(
                        self.name,
                        f"queue {qs.name} would exceed its {r} limit: {_fmt(r, s.limit)} allowed, "
                        f"{_fmt(r, s.allocated)} allocated, {_fmt(r, v)} requested",
                    )
        return self.non_preemptible_over_quota(job, tasks)

    def satisfiable(self, job: JobInfo) -> Verdict:
        """Can the job's queues ever hold what it needs at once? Each queue's limit up the
        hierarchy, and for a non-preemptible job each one's deserved quota, say."""
        preemptible = is_preemptible(job)
        bounded = any(  # a limit, or a quota that binds the job (most queues have neither)
            s.limit != INF or (not preemptible and s.deserved != INF)
            for qs in self._chain(self.queues, job.queue)
            for s in qs.by_resource.values()
        )
        need = job.least_at_once(self._quantities) if bounded else None
        if need is None:
            return ALLOWED
        amounts = need.tolist()
        for qs in self._chain(self.queues, job.queue):
            above = job.queue if qs.name != job.queue else ""
            shares = [qs.by_resource[r] for r in RESOURCES]
            limits = [s.limit for s in shares]
            short = _short(amounts, limits)
            if short:
                return beyond_limit(self.name, job, qs.name, short, "limit", of=above)
            short = [] if preemptible else _short(amounts, [s.deserved for s in shares])
            if short:
                quota = "deserved quota (a non-preemptible job's bound)"
                return beyond_limit(self.name, job, qs.name, short, quota, of=above)
        return ALLOWED

    def non_preemptible_over_quota(self, job: JobInfo, tasks: list[TaskInfo]) -> Verdict:
        if is_preemptible(job):
            return ALLOWED
        requested = self._tasks_request(tasks)
        for qs in self._chain(self.queues, job.queue):
            for r, v in zip(RESOURCES, requested, strict=True):
                s = qs.by_resource[r]
                if v > 0 and s.deserved != INF and s.deserved < s.allocated_np + v:
                    return refuse(
                        self.name,
                        f"non-preemptible job over queue {qs.name}'s {r} quota: {_fmt(r, s.deserved)} deserved, "
                        f"{_fmt(r, s.allocated_np)} allocated to non-preemptible jobs, {_fmt(r, v)} requested",
                    )
        return ALLOWED

    # -- reclaim ---------------------------------------------------------------------------------
    def can_reclaim(self, job: JobInfo) -> bool:
        q = self.queues.get(job.queue)
        if q is None:
            return False
        requested = self._job_request(job)
        if not less_equal(add(q.get("allocated"), requested), q.get("fair")):
            return False
        if is_preemptible(job):
            return True
        return less_equal(add(q.get("allocated_np"), requested), q.get("deserved"))

    def _path(self, queues: dict[str, QueueShares], leaf: str) -> list[QueueShares]:
        return list(reversed(self._chain(queues, leaf)))

    def _leveled(
        self, queues: dict[str, QueueShares], a: str, b: str
    ) -> tuple[QueueShares, QueueShares]:
        pa, pb = self._path(queues, a), self._path(queues, b)
        x, y = pa[0], pb[0]
        for i in range(min(len(pa), len(pb))):
            x, y = pa[i], pb[i]
            if x.name != y.name:
                break
        return x, y

    def reclaimable(self, job: JobInfo, tasks: list[TaskInfo], victims: list[TaskInfo]) -> bool:
        queues = self.frozen
        required = self._tasks_request(tasks)
        by_queue: dict[str, list[Vec3]] = {}
        for vjob, vtasks in _by_job(self.ssn, victims):
            bundles = self._victim_bundles(vjob, vtasks)
            if bundles:
                by_queue.setdefault(vjob.queue, []).extend(bundles)
        remaining: dict[str, Vec3] = {}
        involved: dict[str, set[str]] = {}
        for vq, bundles in by_queue.items():
            if vq not in queues or job.queue not in queues:
                return False
            rq, eq = self._leveled(queues, job.queue, vq)
            involved[vq] = {r for b in bundles for r, v in zip(RESOURCES, b, strict=True) if v > 0}
            remaining.setdefault(eq.name, eq.get("allocated"))
            for bundle in bundles:
                if not self._fits_strategy(required, rq, eq, remaining[eq.name]):
                    return False
                for qs in self._chain(queues, vq):
                    remaining[qs.name] = add(
                        remaining.get(qs.name, qs.get("allocated")), bundle, -1.0
                    )
                    involved.setdefault(qs.name, set()).update(involved[vq])
        return self._within_boundaries(queues, job, required, remaining, involved)

    def _victim_bundles(self, vjob: JobInfo, vtasks: list[TaskInfo]) -> list[Vec3]:
        """A victim job's reclaimed resources: each elastic task alone, its gang part together;
        victims placed again elsewhere (consolidating reclaim) do not count."""
        allow_moves = flag(self.ssn.config.session, "allowConsolidatingReclaim", True)
        minimums = {ps.name: ps.min_available for ps in pod_sets(vjob)}
        named = set(vjob.subgroup_min_member)
        per_set: dict[str, list[TaskInfo]] = {}
        for t in vtasks:
            per_set.setdefault(t.sub_group if t.sub_group in named else "", []).append(t)
        bundles: list[Vec3] = []
        core: list[TaskInfo] = []
        for name, ts in per_set.items():
            m = minimums.get(name, len(ts))
            core += ts[:m]
            for t in ts[m:]:
                b = self._counted([t], allow_moves)
                if b is not None:
                    bundles.append(b)
        b = self._counted(core, allow_moves)
        if b is not None:
            bundles.append(b)
        return bundles

    def _counted(self, tasks: list[TaskInfo], allow_moves: bool) -> Vec3 | None:
        kept = [t for t in tasks if not (allow_moves and t.status in _ACTIVE_ALLOCATED)]
        if not kept:
            return None
        return self._tasks_request(kept)

    def _fits_strategy(
        self, required: Vec3, rq: QueueShares, eq: QueueShares, remaining: Vec3
    ) -> bool:
        # Maintain fair share: the victim queue stays above what it may hold.
        allocatable = tuple(s.allocatable() for s in eq.by_resource.values())
        if not less_equal(remaining, allocatable):  # type: ignore[arg-type]
            return True
        # Guarantee deserved quota: the reclaimer stays within deserved, the victim above its own.
        if not less_equal(add(rq.get("allocated"), required), rq.get("deserved")):
            return False
        return not less_equal(remaining, eq.get("deserved"))

    def _within_boundaries(
        self,
        queues: dict[str, QueueShares],
        job: JobInfo,
        required: Vec3,
        remaining: dict[str, Vec3],
        involved: dict[str, set[str]],
    ) -> bool:
        reclaimer_involved = {r for r, v in zip(RESOURCES, required, strict=True) if v > 0}
        preemptible = is_preemptible(job)
        for q in self._chain(queues, job.queue):
            mine = add(remaining.get(q.name, q.get("allocated")), required)
            for sib_name, sib_remaining in remaining.items():
                sib = queues[sib_name]
                if sib.parent != q.parent or sib.name == q.name:
                    continue
                resources = involved.get(sib_name, set()) | reclaimer_involved
                if not self._saturation_lower(resources, mine, q, sib_remaining, sib):
                    return False
            if preemptible:
                continue
            if not less_equal(add(q.get("allocated_np"), required), q.get("deserved")):
                return False
        return True

    def _saturation_lower(
        self, resources: set[str], mine: Vec3, q: QueueShares, theirs: Vec3, sib: QueueShares
    ) -> bool:
        for r in resources:
            i = RESOURCES.index(r)
            my_fair, sib_fair = q.by_resource[r].fair, sib.by_resource[r].fair
            if my_fair == INF and sib_fair == INF:
                continue
            mine_ratio, sib_ratio = _ratio(mine[i], my_fair), _ratio(theirs[i], sib_fair)
            if mine_ratio > 1 and sib_fair > 0 and mine_ratio * self.multiplier >= sib_ratio:
                return False
        return True


_ACTIVE_ALLOCATED = frozenset(
    {
        TaskStatus.ALLOCATED,
        TaskStatus.PIPELINED,
        TaskStatus.BINDING,
        TaskStatus.BOUND,
        TaskStatus.RUNNING,
    }
)


def _ratio(allocated: float, fair: float) -> float:
    if fair == 0:
        return INF if allocated > 0 else 0.0
    if fair == INF:
        return 0.0
    return allocated / fair


def _by_job(ssn: Session, tasks: list[TaskInfo]) -> list[tuple[JobInfo, list[TaskInfo]]]:
    out: dict[str, tuple[JobInfo, list[TaskInfo]]] = {}
    for t in tasks:
        job = ssn.jobs.get(t.job)
        if job is not None:
            out.setdefault(job.uid, (job, []))[1].append(t)
    return list(out.values())


_EPS = 1e-9  # sums of GPU fractions are not exact


def _short(need: list[float], bounds: list[float]) -> list[tuple[str, str, str]]:
    """(resource, needed, bound) of the quota resources where ``need`` is above ``bounds``."""
    return [
        (r, _quantity(r, v), _quantity(r, bound))
        for r, v, bound in zip(RESOURCES, need, bounds, strict=True)
        if v > 0 and bound + _EPS < v
    ]


def _quantity(resource: str, value: float) -> str:
    """A quota amount as quantities are written (GPUs counted in units here)."""
    return from_canonical(resource, value * UNIT if resource == NVIDIA_GPU else value)


def _fmt(resource: str, value: float) -> str:
    if value == INF:
        return "unlimited"
    if resource == CPU:
        return f"{value / 1000:g} cpu"
    if resource == MEMORY:
        return f"{value / 2**30:.3g}Gi"
    return f"{value:g} GPUs"
