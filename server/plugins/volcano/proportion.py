"""proportion: queues share the cluster by weight (Volcano ``plugins/proportion``).

Each queue's *deserved* share is found by water-filling the cluster's resources by weight, capped
by the queue's request, its capability and (from below) its guarantee. Registers: queue_order
(queue priority, then lower share first) and the same as queue_order_key, overused (deserved <= allocated), allocatable
(allocated + request <= deserved on the requested dimensions; queue must be Open), preemptive,
reclaimable (victims from queues above their deserved share), job_enqueueable (minResources
fit under the real capability, counting what is already allocated and inqueue), job_enqueued and
job_satisfiable (what the job needs at once within the queue's capability: beyond it, never).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from muster.quantity import MIN_RESOURCE
from server.model import ALLOCATED, PodGroupPhase, TaskStatus
from server.plugins.base import Plugin
from server.plugins.util import (
    beyond_limit,
    elastic_resource,
    exceeded,
    hard_limit,
    inqueue_resource,
    least_request,
    over_limit,
    over_share,
)
from server.session.extension_points import (
    ALLOCATABLE,
    ALLOWED,
    JOB_ENQUEUEABLE,
    JOB_ENQUEUED,
    JOB_SATISFIABLE,
    OVERUSED,
    PERMIT,
    PREEMPTIVE,
    QUEUE_ORDER,
    QUEUE_ORDER_KEY,
    RECLAIMABLE,
    EventHandler,
    Verdict,
    refuse,
)
from server.session.info import JobInfo, QueueInfo, TaskInfo, dominant_share, less_equal
from server.session.session import Session

_PENDING = TaskStatus.PENDING  # bound once: read per job at open


def less_equal_on(left: Iterable[float], right: Iterable[float], req: Iterable[float]) -> bool:
    """Volcano LessEqualWithDimension: compare only the dimensions ``req`` asks for. In plain
    floats (asked before every placement, on vectors of a few resources: numpy's per-call cost
    would be ~10x the arithmetic; a plain loop, not any() over a generator: half the cost)."""
    for a, b, r in zip(left, right, req, strict=True):
        if r > MIN_RESOURCE and a > b + MIN_RESOURCE:
            return False
    return True


@dataclass
class QueueAttr:
    name: str
    weight: float
    deserved: np.ndarray
    allocated: np.ndarray
    request: np.ndarray
    elastic: np.ndarray
    inqueue: np.ndarray
    guarantee: np.ndarray
    real_capability: np.ndarray
    _share: float | None = None  # None: allocated or deserved changed since it was computed
    # The deserved array ``deserved_bounds`` was last read from, and its bounds.
    _bounds: tuple[np.ndarray, list[float]] | None = None

    def update_share(self) -> None:
        self._share = None

    def deserved_bounds(self) -> list[float]:
        """deserved per resource plus the epsilon, as Python floats: what ``allocatable``
        compares with at every placement. Read again once ``deserved`` is another array (the
        water-filling replaces it; nothing changes it in place)."""
        known = self._bounds
        if known is None or known[0] is not self.deserved:
            known = self._bounds = (
                self.deserved,
                [d + MIN_RESOURCE for d in self.deserved.tolist()],
            )
        return known[1]

    @property
    def share(self) -> float:
        """Dominant share of allocated over deserved, computed when asked (the queue order asks
        once per visit; a gang's placements change allocated task by task)."""
        if self._share is None:
            self._share = dominant_share(self.allocated, self.deserved)
        return self._share


class ProportionPlugin(Plugin):
    name = "proportion"

    def on_session_open(self, ssn: Session) -> None:
        self.ssn = ssn
        self.attrs = self._build(ssn)
        self._limits: dict[str, np.ndarray | None] = {}  # per queue: its capability as a limit
        water_fill(self.attrs.values(), ssn.total_resource)
        # Volcano reports each queue's deserved share as a metric here (UpdateQueueDeserved).
        ssn.result.queue_deserved.update(
            {a.name: ssn.space.to_dict(a.deserved) for a in self.attrs.values()}
        )
        ssn.register(QUEUE_ORDER, self.name, self.queue_order)
        ssn.register(QUEUE_ORDER_KEY, self.name, self.queue_key)
        ssn.register(RECLAIMABLE, self.name, self.reclaimable)
        ssn.register(OVERUSED, self.name, self.overused)
        ssn.register(ALLOCATABLE, self.name, self.allocatable)
        ssn.register(PREEMPTIVE, self.name, self.preemptive)
        ssn.register(JOB_ENQUEUEABLE, self.name, self.enqueueable)
        ssn.register(JOB_ENQUEUED, self.name, self.enqueued)
        ssn.register(JOB_SATISFIABLE, self.name, self.satisfiable)
        ssn.add_event_handler(EventHandler(self.on_allocate, self.on_deallocate))

    # -- building -------------------------------------------------------------------------------
    @staticmethod
    def _build(ssn: Session) -> dict[str, QueueAttr]:
        """One attr per queue that has a job: its real capability and its jobs' allocated,
        request, inqueue and elastic resources (deserved still zero)."""
        total = ssn.total_resource
        zeros = ssn.space.zeros
        total_guarantee = zeros()
        for q in ssn.queues.values():
            total_guarantee += q.guarantee
        attrs: dict[str, QueueAttr] = {}
        # (request vector, task count) -> the sum of that many of it, added one by one: most
        # jobs' pending tasks share one request vector (``ResourceSpace.request``).
        sums: dict[tuple[int, int], np.ndarray] = {}

        def pending_sum(tasks: list[TaskInfo]) -> np.ndarray:
            """The tasks' requests added up in order (a new array): the same additions, made
            once per request vector and count when every task shares the first's vector."""
            first = tasks[0].resreq
            shared = all(t.resreq is first for t in tasks)
            key = (id(first), len(tasks))
            known = sums.get(key) if shared else None
            if known is None:
                known = first.copy()
                for t in tasks[1:]:
                    known += t.resreq
                if shared:
                    sums[key] = known
            return known

        def attr_of(queue: QueueInfo) -> QueueAttr:
            attr = attrs.get(queue.name)
            if attr is None:
                cap = queue.capability.copy()
                cap[0] = np.inf if cap[0] <= 0 else cap[0]
                cap[1] = np.inf if cap[1] <= 0 else cap[1]
                real = np.minimum(exceeded(total, total_guarantee) + queue.guarantee, cap)
                attr = QueueAttr(
                    queue.name,
                    queue.weight,
                    zeros(),
                    zeros(),
                    zeros(),
                    zeros(),
                    zeros(),
                    queue.guarantee.copy(),
                    real,
                )
                attrs[queue.name] = attr
            return attr

        for name in ssn.window.queue_order:  # a window: the queues in the whole snapshot's order
            attr_of(ssn.queues[name])
        for job in ssn.jobs.values():
            queue = ssn.queues.get(job.queue)
            if queue is None:
                continue
            attr = attr_of(queue)
            # job.allocated sums the tasks in Volcano's AllocatedStatus; request adds the pending ones.
            # A job with no task in those statuses adds its zeros: left out (most jobs; the sums
            # start at +0.0, which adding +0.0 leaves as it is).
            if not ALLOCATED.isdisjoint(job.index):
                attr.allocated += job.allocated
                attr.request += job.allocated
            waiting = job.index.get(_PENDING)
            if waiting:  # the job's pending sum first, then added (as a numpy sum of them)
                attr.request += pending_sum(list(waiting.values()))
            if job.phase == PodGroupPhase.INQUEUE and job.min_resources is not None:
                attr.inqueue += inqueue_resource(job)
            if job.min_resources is None:
                continue  # neither inqueue nor elastic resources without minResources
            allocated_num = job.count(
                TaskStatus.ALLOCATED,
                TaskStatus.BINDING,
                TaskStatus.BOUND,
                TaskStatus.RUNNING,
                TaskStatus.SUCCEEDED,
            )
            if job.phase == PodGroupPhase.RUNNING and allocated_num >= job.min_available:
                attr.inqueue += inqueue_resource(job)
            attr.elastic += elastic_resource(job)
        # The queue's waiting jobs past the session's window ask as they would if opened.
        for name, past in ssn.window.beyond.items():
            queue = ssn.queues.get(name)
            if queue is not None:
                attr = attr_of(queue)
                attr.request += ssn.space.vec(past.request)
                attr.inqueue += ssn.space.vec(past.inqueue)
        return attrs

    # -- queue order ----------------------------------------------------------------------------
    def queue_order(self, left: QueueInfo, right: QueueInfo) -> int:
        if left.priority != right.priority:
            return right.priority - left.priority
        attrs = self.attrs
        ls = attrs[left.name].share if left.name in attrs else 0.0
        rs = attrs[right.name].share if right.name in attrs else 0.0
        return 0 if ls == rs else (-1 if ls < rs else 1)

    def queue_key(self, queue: QueueInfo) -> tuple[int, float]:
        """``queue_order`` as a key: higher priority, then the smaller share. (A NaN share, which
        only a NaN allocation gives, has no place in the comparator's order: last here.)"""
        share = self.attrs[queue.name].share if queue.name in self.attrs else 0.0
        return -queue.priority, share if share == share else math.inf

    # -- reclaim and allocation -----------------------------------------------------------------
    def reclaimable(
        self, reclaimer: TaskInfo, reclaimees: list[TaskInfo]
    ) -> tuple[list[TaskInfo], int]:
        victims = []
        # What-if allocations: victims taken are deducted here, never from the live attrs.
        allocations: dict[str, np.ndarray] = {}
        for t in reclaimees:
            job = self.ssn.jobs.get(t.job)
            if job is None or job.queue not in self.attrs:
                continue
            attr = self.attrs[job.queue]
            allocated = allocations.setdefault(job.queue, attr.allocated.copy())
            if not less_equal(allocated, attr.deserved):
                allocated -= t.resreq
                victims.append(t)
        return victims, PERMIT

    def overused(self, queue: QueueInfo) -> bool:
        attr = self.attrs.get(queue.name)
        return attr is not None and less_equal(attr.deserved, attr.allocated)

    def allocatable(self, queue: QueueInfo, task: TaskInfo) -> Verdict:
        """allocated + request <= deserved on the requested resources; the queue is Open."""
        if not queue.is_open():
            return refuse(self.name, f"queue {queue.name} is {queue.state}")
        attr = self.attrs.get(queue.name)
        if attr is None:
            return ALLOWED
        # less_equal_on(allocated + request, deserved, request), written out (asked before every
        # placement): allocated + request element by element, the same float sums numpy makes.
        for a, r, bound in zip(
            attr.allocated.tolist(), task.request_floats, attr.deserved_bounds(), strict=True
        ):
            if r > MIN_RESOURCE and a + r > bound:
                return over_share(self.name, queue, task)
        return ALLOWED

    def preemptive(self, queue: QueueInfo, task: TaskInfo) -> bool:
        return self.allocatable(queue, task).ok

    # -- enqueue --------------------------------------------------------------------------------
    def enqueueable(self, job: JobInfo) -> int:
        ssn = self.ssn
        queue = ssn.queues[job.queue]
        if not queue.is_open():
            return refuse(self.name, f"queue {queue.name} is {queue.state}")
        attr = self.attrs.get(job.queue)
        if attr is None or job.min_resources is None:
            return PERMIT
        need = job.min_resources + attr.allocated + attr.inqueue - attr.elastic
        if less_equal_on(need.tolist(), attr.real_capability.tolist(), job.min_resources.tolist()):
            return PERMIT
        short = [
            ssn.space.dims[i]
            for i in np.nonzero(
                (need > attr.real_capability + MIN_RESOURCE) & (job.min_resources > MIN_RESOURCE)
            )[0]
        ]
        return refuse(
            self.name, f"queue resource quota insufficient: insufficient {', '.join(short)}"
        )

    def satisfiable(self, job: JobInfo) -> Verdict:
        """Can the queue ever hold what the job needs at once? Its deserved share never goes
        above its capability (cpu or memory of 0 or less: unlimited, as for the real capability)."""
        queue = self.ssn.queues.get(job.queue)
        if queue is None:
            return ALLOWED
        if queue.name not in self._limits:
            self._limits[queue.name] = hard_limit(queue.capability)
        cap = self._limits[queue.name]
        need = least_request(job) if cap is not None else None
        if cap is None or need is None:
            return ALLOWED
        short = over_limit(self.ssn.space, need, cap)
        return beyond_limit(self.name, job, queue.name, short) if short else ALLOWED

    def enqueued(self, job: JobInfo) -> None:
        attr = self.attrs.get(job.queue)
        if attr is not None and job.min_resources is not None:
            attr.inqueue += job.min_resources

    # -- events ---------------------------------------------------------------------------------
    def _job_attr(self, task: TaskInfo) -> QueueAttr | None:
        job = self.ssn.jobs.get(task.job)
        return None if job is None else self.attrs.get(job.queue)

    def on_allocate(self, task: TaskInfo) -> None:
        attr = self._job_attr(task)
        if attr is not None:
            attr.allocated += task.resreq
            attr.update_share()

    def on_deallocate(self, task: TaskInfo) -> None:
        attr = self._job_attr(task)
        if attr is not None:
            attr.allocated -= task.resreq
            attr.update_share()


def water_fill(attrs: Iterable[QueueAttr], total: np.ndarray) -> None:
    """Volcano's deserved loop: hand out ``total`` by weight, round after round, each queue's
    deserved capped by its real capability and request and raised to its guarantee; a queue whose
    request is met or whose deserved stopped growing leaves the rounds, and what it gives back or
    did not take is shared again."""
    queues = list(attrs)
    remaining = total.copy()
    met: set[str] = set()
    while True:
        total_weight = sum(a.weight for a in queues if a.name not in met)
        if total_weight == 0:
            break
        old_remaining = remaining.copy()
        increased, decreased = np.zeros_like(total), np.zeros_like(total)
        for a in queues:
            if a.name in met:
                continue
            old = a.deserved.copy()
            a.deserved = a.deserved + remaining * (a.weight / total_weight)
            a.deserved = np.minimum(a.deserved, a.real_capability)
            a.deserved = np.minimum(a.deserved, a.request)
            a.deserved = np.maximum(a.deserved, a.guarantee)
            a.update_share()
            if less_equal(a.request, a.deserved) or np.array_equal(a.deserved, old):
                met.add(a.name)
            diff = a.deserved - old
            increased += np.maximum(diff, 0)
            decreased += np.maximum(-diff, 0)
        remaining = exceeded(remaining + decreased, increased)
        if np.all(remaining < MIN_RESOURCE) or np.array_equal(remaining, old_remaining):
            break
