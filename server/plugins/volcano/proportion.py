"""proportion: queues share the cluster by weight (Volcano ``plugins/proportion``).

Each queue's *deserved* share is found by water-filling the cluster's resources by weight, capped
by the queue's request, its capability and (from below) its guarantee. Registers: queue_order
(queue priority, then lower share first) and the same as queue_order_key, overused (deserved <= allocated), allocatable
(allocated + request <= deserved on the requested dimensions; queue must be Open), preemptive,
reclaimable (victims from queues above their deserved share), job_enqueueable (minResources
fit under the real capability, counting what is already allocated and inqueue) and job_enqueued.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from muster.quantity import MIN_RESOURCE
from server.model import PodGroupPhase, TaskStatus
from server.plugins.base import Plugin
from server.plugins.util import elastic_resource, exceeded, inqueue_resource
from server.session.extension_points import PERMIT, REJECT, EventHandler
from server.session.info import JobInfo, QueueInfo, TaskInfo, dominant_share, less_equal
from server.session.session import Session


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

    def update_share(self) -> None:
        self._share = None

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
        total = ssn.total_resource
        zeros = ssn.space.zeros
        total_guarantee = zeros()
        for q in ssn.queues.values():
            total_guarantee += q.guarantee
        attrs: dict[str, QueueAttr] = {}
        self.attrs = attrs
        for job in ssn.jobs.values():
            queue = ssn.queues.get(job.queue)
            if queue is None:
                continue
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
            # job.allocated sums the tasks in Volcano's AllocatedStatus; request adds the pending ones.
            attr.allocated += job.allocated
            attr.request += job.allocated
            pending = iter(job.index[TaskStatus.PENDING].values())
            first = next(pending, None)
            if (
                first is not None
            ):  # the job's pending sum first, then added (as a numpy sum of them)
                asked = first.resreq.copy()
                for t in pending:
                    asked += t.resreq
                attr.request += asked
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

        # Water-filling of the cluster's resources by weight.
        remaining = total.copy()
        met: set[str] = set()
        while True:
            total_weight = sum(a.weight for a in attrs.values() if a.name not in met)
            if total_weight == 0:
                break
            old_remaining = remaining.copy()
            increased, decreased = zeros(), zeros()
            for a in attrs.values():
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
        # Volcano reports each queue's deserved share as a metric here (UpdateQueueDeserved).
        ssn.result.queue_deserved.update(
            {a.name: ssn.space.to_dict(a.deserved) for a in attrs.values()}
        )

        def queue_order(left: QueueInfo, right: QueueInfo) -> int:
            if left.priority != right.priority:
                return right.priority - left.priority
            ls = attrs[left.name].share if left.name in attrs else 0.0
            rs = attrs[right.name].share if right.name in attrs else 0.0
            return 0 if ls == rs else (-1 if ls < rs else 1)

        def queue_key(queue: QueueInfo) -> tuple[int, float]:
            """``queue_order`` as a key: higher priority, then the smaller share. (A NaN share, which
            only a NaN allocation gives, has no place in the comparator's order: last here.)"""
            share = attrs[queue.name].share if queue.name in attrs else 0.0
            return -queue.priority, share if share == share else math.inf

        def reclaimable(
            reclaimer: TaskInfo, reclaimees: list[TaskInfo]
        ) -> tuple[list[TaskInfo], int]:
            victims = []
            allocations: dict[str, np.ndarray] = {}
            for t in reclaimees:
                job = ssn.jobs.get(t.job)
                if job is None or job.queue not in attrs:
                    continue
                attr = attrs[job.queue]
                allocated = allocations.setdefault(job.queue, attr.allocated.copy())
                if not less_equal(allocated, attr.deserved):
                    allocated -= t.resreq
                    victims.append(t)
            return victims, PERMIT

        def overused(queue: QueueInfo) -> bool:
            attr = attrs.get(queue.name)
            return attr is not None and less_equal(attr.deserved, attr.allocated)

        def task_allocatable(queue: QueueInfo, task: TaskInfo) -> bool:
            """allocated + request <= deserved on the requested resources; the queue is Open."""
            if not queue.is_open():
                return False
            attr = attrs.get(queue.name)
            if attr is None:
                return True
            req = task.request_floats
            # allocated + request element by element: the same float sums numpy would make.
            return less_equal_on(
                map(operator.add, attr.allocated.tolist(), req), attr.deserved.tolist(), req
            )

        def enqueueable(job: JobInfo) -> int:
            queue = ssn.queues[job.queue]
            if not queue.is_open():
                job.enqueue_verdict = f"queue {queue.name} is {queue.state}"
                return REJECT
            attr = attrs.get(job.queue)
            if attr is None or job.min_resources is None:
                return PERMIT
            need = job.min_resources + attr.allocated + attr.inqueue - attr.elastic
            if less_equal_on(
                need.tolist(), attr.real_capability.tolist(), job.min_resources.tolist()
            ):
                return PERMIT
            short = [
                ssn.space.dims[i]
                for i in np.nonzero(
                    (need > attr.real_capability + MIN_RESOURCE)
                    & (job.min_resources > MIN_RESOURCE)
                )[0]
            ]
            job.enqueue_verdict = (
                f"queue resource quota insufficient: insufficient {', '.join(short)}"
            )
            return REJECT

        def enqueued(job: JobInfo) -> None:
            attr = attrs.get(job.queue)
            if attr is not None and job.min_resources is not None:
                attr.inqueue += job.min_resources

        def on_allocate(task: TaskInfo) -> None:
            attr = attrs.get(ssn.jobs[task.job].queue) if task.job in ssn.jobs else None
            if attr is not None:
                attr.allocated += task.resreq
                attr.update_share()

        def on_deallocate(task: TaskInfo) -> None:
            attr = attrs.get(ssn.jobs[task.job].queue) if task.job in ssn.jobs else None
            if attr is not None:
                attr.allocated -= task.resreq
                attr.update_share()

        ssn.register("queue_order", self.name, queue_order)
        ssn.register("queue_order_key", self.name, queue_key)
        ssn.register("reclaimable", self.name, reclaimable)
        ssn.register("overused", self.name, overused)
        ssn.register("allocatable", self.name, task_allocatable)
        ssn.register("preemptive", self.name, task_allocatable)
        ssn.register("job_enqueueable", self.name, enqueueable)
        ssn.register("job_enqueued", self.name, enqueued)
        ssn.add_event_handler(EventHandler(on_allocate, on_deallocate))
