"""capacity: queues with deserved / guarantee / capability, flat or hierarchical
(Volcano ``plugins/capacity``).

Per queue: *deserved* (its fair amount, reclaimable above it), *guarantee* (never reclaimed below
it; reserved out of everybody else's capability) and *capability* (hard limit). The real capability
of a queue is ``(parent real capability - sum of sibling guarantees) + own guarantee``, capped by its
capability (flat mode: the cluster is the parent). Registers:

* queue_order -- higher queue priority first, then the lower share (allocated / deserved, max over
  the deserved resources; a queue without deserved has share 1), then a queue with deserved first.
  Hierarchical: leaf queues before inner ones; two leaves compare by their ancestors just below
  their deepest common ancestor.
* victim_queue_order (hierarchical) -- victims first from queues closer to the preemptor's queue.
* allocatable -- Open (and, hierarchical, leaf) queue; allocated + request stays within the real
  capability of the queue and every ancestor, on the requested dimensions.
* preemptive -- within the real capability, and allocated + request <= deserved on at least one
  requested dimension (the queue is still under its deserved share somewhere).
* reclaimable -- in victim order: a victim with a resource in common with the reclaimer, whose
  queue stays at or above its guarantee without it, and whose queue either has no deserved amount
  of the victim's resources or is above deserved on one of them (then deducted, so later victims
  see the smaller allocation). ``ancestorReclaimLevel`` (hierarchical) also requires the victim's
  ancestors up to that level (those not shared with the reclaimer) to be above deserved.
* job_enqueueable / job_enqueued -- minResources + allocated + inqueue - elastic within the real
  capability of the queue and its ancestors; admitted jobs count as inqueue.
* job_satisfiable -- what the job needs at once (its gang minimum's smallest requests) within the
  capability of its queue and every ancestor: beyond it, the job can never run there.
* allocate / deallocate events keep queue (and ancestor) allocations incremental.

Hierarchy (``enableHierarchy: true``) follows ``QueueSpec.parent``; queues without a parent hang
under ``root`` (created implicitly when the snapshot has no queue of that name). A job in a
non-leaf queue, an unknown parent or a cycle make the plugin refuse everything this session, as
Volcano does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import structlog

from muster.quantity import CPU, MEMORY, MIN_RESOURCE
from server.model import Beyond, PodGroupPhase, QueueSpec, TaskStatus
from server.plugins.base import Plugin
from server.plugins.util import (
    beyond_limit,
    elastic_resource,
    hard_limit,
    inqueue_resource,
    least_request,
    over_limit,
    over_share,
)
from server.session.extension_points import (
    ALLOCATABLE,
    ALLOWED,
    HIERARCHY_SWITCH,
    JOB_ENQUEUEABLE,
    JOB_ENQUEUED,
    JOB_SATISFIABLE,
    PERMIT,
    PREEMPTIVE,
    QUEUE_ORDER,
    RECLAIMABLE,
    REJECT,
    VICTIM_QUEUE_ORDER,
    EventHandler,
    Verdict,
    refuse,
)
from server.session.info import JobInfo, QueueInfo, TaskInfo, dominant_share
from server.session.session import Session

ROOT = "root"
ANCESTOR_RECLAIM_LEVEL = "ancestorReclaimLevel"

log = structlog.get_logger(__name__)


@dataclass
class QueueAttr:
    name: str
    deserved: np.ndarray
    guarantee: np.ndarray
    capability: np.ndarray  # nan: not set (inherits in hierarchical mode)
    deserved_keys: (
        np.ndarray
    )  # bool per dim: deserved names this resource (Volcano map key present)
    allocated: np.ndarray
    request: np.ndarray
    inqueue: np.ndarray
    elastic: np.ndarray
    real_capability: np.ndarray
    ancestors: list[str] = field(default_factory=list)  # root first
    children: dict[str, QueueAttr] = field(default_factory=dict)
    share: float = 0.0

    def update_share(self) -> None:
        """Volcano updateQueueAttrShare: max allocated / deserved over the deserved resources."""
        self.share = dominant_share(self.allocated, self.deserved, empty=1.0)


def within(used: np.ndarray, limit: np.ndarray, req: np.ndarray) -> bool:
    """Volcano LessEqualWithDimensionAndResourcesName: ``used <= limit`` on the requested dims."""
    dims = req > 0
    return bool(np.all(used[dims] <= limit[dims] + MIN_RESOURCE))


def short_dims(used: np.ndarray, limit: np.ndarray, req: np.ndarray) -> np.ndarray:
    return (req > 0) & (used > limit + MIN_RESOURCE)


def _compare_share(left: QueueAttr, right: QueueAttr) -> int:
    """Volcano compareShareWithDeserved."""
    if left.share == right.share:
        lh, rh = (
            bool(np.any(left.deserved >= MIN_RESOURCE)),
            bool(np.any(right.deserved >= MIN_RESOURCE)),
        )
        if lh == rh:
            return 0
        return -1 if lh else 1
    return -1 if left.share < right.share else 1


def relevant(task: TaskInfo, attr: QueueAttr) -> bool:
    """Volcano hasRelevantDeserved: the task requests a resource the queue deserves."""
    return bool(np.any((task.resreq >= MIN_RESOURCE) & (attr.deserved >= MIN_RESOURCE)))


class CapacityPlugin(Plugin):
    name = "capacity"
    ARGUMENTS = {ANCESTOR_RECLAIM_LEVEL: 0}

    # -- building -----------------------------------------------------------------------------
    def _new_attr(self, ssn: Session, spec: QueueSpec) -> QueueAttr:
        space = ssn.space
        cap = np.full(space.size, np.nan)
        for name, value in spec.capability.items():
            i = space.index.get(name)
            if i is not None and value >= 0 and value != np.inf:
                cap[i] = value
        keys = np.zeros(space.size, dtype=bool)
        for name in (*spec.deserved, *spec.guarantee):
            if name in space.index:
                keys[space.index[name]] = True
        zeros = space.zeros
        return QueueAttr(
            spec.name,
            space.vec(spec.deserved),
            space.vec(spec.guarantee),
            cap,
            keys,
            zeros(),
            zeros(),
            zeros(),
            zeros(),
            np.full(space.size, np.inf),
        )

    @staticmethod
    def _add_job(
        attr: QueueAttr, job: JobInfo
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A job's contribution to its queue: allocated, request, inqueue, elastic."""
        allocated = job.allocated.copy()
        request = allocated + sum(
            (t.resreq for t in job.index[TaskStatus.PENDING].values()), np.zeros_like(allocated)
        )
        inqueue = np.zeros_like(allocated)
        if job.min_resources is not None:
            if job.phase == PodGroupPhase.INQUEUE:
                inqueue += inqueue_resource(job)
            placed = job.count(
                TaskStatus.ALLOCATED,
                TaskStatus.BINDING,
                TaskStatus.BOUND,
                TaskStatus.RUNNING,
                TaskStatus.SUCCEEDED,
            )
            if job.phase == PodGroupPhase.RUNNING and placed >= job.min_available:
                inqueue += inqueue_resource(job)
        elastic = elastic_resource(job)
        attr.allocated += allocated
        attr.request += request
        attr.inqueue += inqueue
        attr.elastic += elastic
        return allocated, request, inqueue, elastic

    @staticmethod
    def _add_beyond(
        ssn: Session, attr: QueueAttr, past: Beyond
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What a queue's waiting jobs past the session's window add: their requests, and the
        minResources of the Inqueue ones (as ``_add_job`` of each, which allocates nothing)."""
        zeros = ssn.space.zeros()
        request, inqueue = ssn.space.vec(past.request), ssn.space.vec(past.inqueue)
        attr.request += request
        attr.inqueue += inqueue
        return zeros, request, inqueue, zeros

    def _build_flat(self, ssn: Session) -> dict[str, QueueAttr]:
        total = ssn.total_resource
        total_guarantee = ssn.space.zeros()
        for q in ssn.snapshot.queues:
            total_guarantee += ssn.space.vec(q.guarantee)
        attrs: dict[str, QueueAttr] = {}

        def attr_of(queue: QueueInfo) -> QueueAttr:
            attr = attrs.get(queue.name)
            if attr is None:
                attr = self._new_attr(ssn, queue.spec)
                cap = np.where(np.isnan(attr.capability), np.inf, attr.capability)
                for dim in (ssn.space.index[CPU], ssn.space.index[MEMORY]):
                    if cap[dim] <= 0:
                        cap[dim] = np.inf
                attr.real_capability = np.minimum(
                    np.maximum(total - total_guarantee, 0) + attr.guarantee, cap
                )
                attrs[queue.name] = attr
            return attr

        for job in ssn.jobs.values():
            queue = ssn.queues.get(job.queue)
            if queue is None:
                continue
            self._add_job(attr_of(queue), job)
        for name, past in ssn.window.beyond.items():  # waiting jobs past the session's window
            if name in ssn.queues:
                self._add_beyond(ssn, attr_of(ssn.queues[name]), past)
        for attr in attrs.values():
            attr.deserved = np.maximum(
                np.minimum(attr.deserved, attr.real_capability), attr.guarantee
            )
            attr.update_share()
        return attrs

    @staticmethod
    def _add_up(
        attrs: dict[str, QueueAttr],
        leaf: QueueAttr,
        deltas: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        """A leaf queue's additions, added to each of its ancestors too."""
        for a in leaf.ancestors:
            up = attrs[a]
            up.allocated += deltas[0]
            up.request += deltas[1]
            up.inqueue += deltas[2]
            up.elastic += deltas[3]

    def _build_hierarchical(self, ssn: Session) -> tuple[dict[str, QueueAttr], bool]:
        attrs: dict[str, QueueAttr] = {
            q.name: self._new_attr(ssn, q.spec) for q in ssn.queues.values()
        }
        if ROOT not in attrs:
            attrs[ROOT] = self._new_attr(ssn, QueueSpec(ROOT))
        specs = {q.name: q.spec for q in ssn.queues.values()}

        def ancestors(name: str) -> list[str] | None:
            chain: list[str] = []
            current = name
            while current != ROOT:
                parent = specs[current].parent or ROOT if current in specs else ROOT
                if parent not in attrs or parent in chain or parent == name:
                    return None
                chain.append(parent)
                current = parent
            return list(reversed(chain))

        for name, attr in attrs.items():
            if name == ROOT:
                continue
            chain = ancestors(name)
            if chain is None:
                log.warning("capacity: invalid queue hierarchy", queue=name)
                return attrs, False
            attr.ancestors = chain
            attrs[chain[-1]].children[name] = attr
        for job in ssn.jobs.values():
            job_attr = attrs.get(job.queue)
            if job_attr is None:
                continue
            if job_attr.children:
                log.warning("capacity: job in a non-leaf queue", job=job.uid, queue=job.queue)
                return attrs, False
            self._add_up(attrs, job_attr, self._add_job(job_attr, job))
        for name, past in ssn.window.beyond.items():  # waiting jobs past the session's window
            job_attr = attrs.get(name)
            if job_attr is None:
                continue
            if job_attr.children:
                log.warning("capacity: job in a non-leaf queue", job=past.first, queue=name)
                return attrs, False
            self._add_up(attrs, job_attr, self._add_beyond(ssn, job_attr, past))
        root = attrs[ROOT]
        root.capability = np.where(np.isnan(root.capability), np.inf, root.capability)
        for dim in (ssn.space.index[CPU], ssn.space.index[MEMORY]):
            if root.capability[dim] <= 0:
                root.capability[dim] = np.inf
        root.real_capability = root.capability.copy()
        self._check_hierarchy(root, ssn)
        for attr in attrs.values():
            attr.update_share()
        return attrs, True

    def _check_hierarchy(self, attr: QueueAttr, ssn: Session) -> None:
        """Volcano checkHierarchicalQueue: children inherit unset capability; deserved >= guarantee;
        real capability = parent's minus all children's guarantees, plus own guarantee."""
        total_guarantee = ssn.space.zeros()
        total_deserved = ssn.space.zeros()
        cpu, mem = ssn.space.index[CPU], ssn.space.index[MEMORY]
        for child in attr.children.values():
            child.deserved = np.maximum(child.deserved, child.guarantee)
            total_deserved += child.deserved
            total_guarantee += child.guarantee
            cap = child.capability
            unset = np.isnan(cap)
            unset[cpu] |= not unset[cpu] and cap[cpu] <= 0
            unset[mem] |= not unset[mem] and cap[mem] <= 0
            child.capability = np.where(unset, attr.capability, cap)
        if attr.name == ROOT:
            attr.guarantee = total_guarantee
            attr.deserved = total_deserved
        for child in attr.children.values():
            real = np.maximum(attr.real_capability - total_guarantee, 0) + child.guarantee
            child.real_capability = np.minimum(real, child.capability)
        for child in attr.children.values():
            self._check_hierarchy(child, ssn)

    # -- session ------------------------------------------------------------------------------
    def on_session_open(self, ssn: Session) -> None:
        option = ssn.option(self.name)
        self.ssn = ssn
        self.hierarchical = option is not None and option.enabled(HIERARCHY_SWITCH.name)
        self.level = max(self.arg_int(ANCESTOR_RECLAIM_LEVEL, 0), 0)
        if self.hierarchical:
            attrs, ready = self._build_hierarchical(ssn)
        else:
            attrs, ready = self._build_flat(ssn), True
        self.attrs: dict[str, QueueAttr] = attrs
        # False: an invalid hierarchy; the plugin then refuses everything, as Volcano does.
        self.ready = ready
        # Per queue, the capabilities that limit it (its own, its ancestors'): job_satisfiable.
        self._limits: dict[str, list[tuple[str, np.ndarray]]] = {}

        ssn.register(QUEUE_ORDER, self.name, self.queue_order)
        if self.hierarchical:
            ssn.register(VICTIM_QUEUE_ORDER, self.name, self.victim_queue_order)
        ssn.register(ALLOCATABLE, self.name, self.allocatable)
        ssn.register(PREEMPTIVE, self.name, self.preemptive)
        ssn.register(RECLAIMABLE, self.name, self.reclaimable)
        ssn.register(JOB_ENQUEUEABLE, self.name, self.enqueueable)
        ssn.register(JOB_ENQUEUED, self.name, self.enqueued)
        ssn.register(JOB_SATISFIABLE, self.name, self.satisfiable)
        ssn.add_event_handler(EventHandler(self.on_allocate, self.on_deallocate))

    def is_leaf(self, name: str) -> bool:
        attr = self.attrs.get(name)
        return attr is None or not attr.children

    def chain(self, queue_name: str) -> list[QueueAttr]:
        """The queue, then its ancestors up to the root (Volcano checks leaf first)."""
        attr = self.attrs[queue_name]
        if not self.hierarchical:
            return [attr]
        return [attr, *(self.attrs[a] for a in reversed(attr.ancestors))]

    # -- queue order ----------------------------------------------------------------------------
    def queue_order(self, left: QueueInfo, right: QueueInfo) -> int:
        if left.priority != right.priority:
            return right.priority - left.priority
        attrs = self.attrs
        la, ra = attrs.get(left.name), attrs.get(right.name)
        if la is None or ra is None:
            return 0
        if not self.hierarchical:
            return _compare_share(la, ra)
        ll, rl = self.is_leaf(left.name), self.is_leaf(right.name)
        if ll != rl:
            return -1 if ll else 1
        if not ll:
            return _compare_share(la, ra)
        lvl = common_level(la, ra)
        lp = attrs[la.ancestors[lvl + 1]] if lvl + 1 < len(la.ancestors) else la
        rp = attrs[ra.ancestors[lvl + 1]] if lvl + 1 < len(ra.ancestors) else ra
        return _compare_share(lp, rp)

    def victim_queue_order(
        self, left: QueueInfo, right: QueueInfo, preemptor: QueueInfo | None
    ) -> int:
        attrs = self.attrs
        if preemptor is None or not all(q.name in attrs for q in (left, right, preemptor)):
            return 0
        ll = common_level(attrs[left.name], attrs[preemptor.name])
        rl = common_level(attrs[right.name], attrs[preemptor.name])
        return 0 if ll == rl else (-1 if ll > rl else 1)

    # -- allocation -----------------------------------------------------------------------------
    def allocatable(self, queue: QueueInfo, task: TaskInfo) -> Verdict:
        if not queue.is_open():
            return refuse(self.name, f"queue {queue.name} is {queue.state}")
        if not self.ready or queue.name not in self.attrs:
            return over_share(self.name, queue, task)
        if self.hierarchical and not self.is_leaf(queue.name):
            return over_share(self.name, queue, task)
        if all(
            within(a.allocated + task.resreq, a.real_capability, task.resreq)
            for a in self.chain(queue.name)
        ):
            return ALLOWED
        return over_share(self.name, queue, task)

    def preemptive(self, queue: QueueInfo, task: TaskInfo) -> bool:
        if not self.ready or not queue.is_open() or queue.name not in self.attrs:
            return False
        attr = self.attrs[queue.name]
        future = attr.allocated + task.resreq
        if not within(future, attr.real_capability, task.resreq):
            return False
        if under_deserved(future, attr.deserved, task.resreq):
            return True
        if self.hierarchical and self.level > 0:
            for depth in range(1, self.level + 1):
                if depth > len(attr.ancestors) or attr.ancestors[-depth] == ROOT:
                    continue
                up = self.attrs[attr.ancestors[-depth]]
                if under_deserved(up.allocated + task.resreq, up.deserved, task.resreq):
                    return True
        return False

    # -- reclaim --------------------------------------------------------------------------------
    def above_deserved(self, allocated: np.ndarray, attr: QueueAttr, req: np.ndarray) -> bool:
        """Volcano GreaterPartlyWithRelevantDimensions: above deserved on a requested dimension
        the queue names a deserved amount for (cpu and memory: one of at least MIN_RESOURCE)."""
        dims = (req > 0) & attr.deserved_keys
        cpu, mem = self.ssn.space.index[CPU], self.ssn.space.index[MEMORY]
        dims[cpu] = req[cpu] > 0 and attr.deserved[cpu] >= MIN_RESOURCE
        dims[mem] = req[mem] > 0 and attr.deserved[mem] >= MIN_RESOURCE
        return bool(np.any(allocated[dims] > attr.deserved[dims]))

    def reclaimee_ancestor(
        self, reclaimer: QueueAttr, reclaimee: QueueAttr, depth: int
    ) -> tuple[QueueAttr | None, bool]:
        """Volcano getReclaimeeAncestorToCheck: the reclaimee's ancestor ``depth`` levels up and
        whether to check it (not the root, not shared with the reclaimer)."""
        if depth > len(reclaimee.ancestors):
            return None, False
        theirs = reclaimee.ancestors[-depth]
        if theirs == ROOT:
            return None, False
        if depth <= len(reclaimer.ancestors) and reclaimer.ancestors[-depth] == theirs:
            return None, False
        return self.attrs.get(theirs), True

    def shares_ancestor(self, a: QueueAttr, b: QueueAttr) -> bool:
        """The two queues share an ancestor (not the root) within ``ancestorReclaimLevel``."""
        level = self.level
        mine = {a.ancestors[-d] for d in range(1, level + 1) if d <= len(a.ancestors)}
        theirs = {b.ancestors[-d] for d in range(1, level + 1) if d <= len(b.ancestors)}
        return bool((mine & theirs) - {ROOT})

    def reclaimable(
        self, reclaimer: TaskInfo, reclaimees: list[TaskInfo]
    ) -> tuple[list[TaskInfo], int]:
        if not self.ready:
            return [], REJECT
        ssn, attrs = self.ssn, self.attrs
        rjob = ssn.jobs.get(reclaimer.job)
        if rjob is None or rjob.queue not in attrs:
            return [], REJECT
        reclaimer_attr = attrs[rjob.queue]
        by_level = self.hierarchical and self.level > 0
        # What-if allocations: victims taken are deducted here, never from the live attrs.
        allocations: dict[str, np.ndarray] = {}
        victims: list[TaskInfo] = []
        for t in victim_order(ssn, reclaimees, reclaimer):
            job = ssn.jobs.get(t.job)
            if job is None or job.queue not in attrs:
                continue
            attr = attrs[job.queue]
            # shouldSkipReclaimee: no resource in common with the reclaimer.
            if not np.any((t.resreq >= MIN_RESOURCE) & (reclaimer.resreq >= MIN_RESOURCE)):
                continue
            allocated = allocations.setdefault(job.queue, attr.allocated.copy())
            if not np.all(attr.guarantee <= allocated - t.resreq + MIN_RESOURCE):
                continue
            if not relevant(t, attr):
                if (
                    by_level
                    and self.shares_ancestor(reclaimer_attr, attr)
                    and not relevant(reclaimer, reclaimer_attr)
                ):
                    continue
            elif not self.above_deserved(allocated, attr, t.resreq):
                continue
            touched: list[np.ndarray] = []
            eligible = True
            if by_level:
                for depth in range(1, self.level + 1):
                    up, check = self.reclaimee_ancestor(reclaimer_attr, attr, depth)
                    if not check:
                        continue
                    if up is None:
                        eligible = False
                        break
                    up_alloc = allocations.setdefault(up.name, up.allocated.copy())
                    touched.append(up_alloc)
                    if not relevant(t, up):
                        continue
                    if not self.above_deserved(up_alloc, up, t.resreq):
                        eligible = False
                        break
            if not eligible:
                continue
            allocated -= t.resreq
            for up_alloc in touched:
                up_alloc -= t.resreq
            victims.append(t)
        return victims, PERMIT

    # -- enqueue --------------------------------------------------------------------------------
    def enqueueable(self, job: JobInfo) -> int:
        if not self.ready:
            return REJECT
        if self.hierarchical and not self.is_leaf(job.queue):
            return REJECT
        ssn = self.ssn
        queue = ssn.queues.get(job.queue)
        if queue is None or job.queue not in self.attrs:
            return REJECT
        if not queue.is_open():
            return refuse(self.name, f"queue {queue.name} is {queue.state}")
        if job.min_resources is None:
            return PERMIT
        for a in self.chain(job.queue):
            need = job.min_resources + a.allocated + a.inqueue - a.elastic
            if not within(need, a.real_capability, job.min_resources):
                short = short_dims(need, a.real_capability, job.min_resources)
                names = ", ".join(ssn.space.dims[i] for i in np.nonzero(short)[0])
                return refuse(self.name, f"queue resource quota insufficient: insufficient {names}")
        return PERMIT

    def satisfiable(self, job: JobInfo) -> Verdict:
        """Can the queue and its ancestors ever hold what the job needs at once? Their capability
        (cpu or memory of 0 or less: unlimited, as for the real capability) says."""
        if not self.ready or job.queue not in self.attrs:
            return ALLOWED
        limits = self._limits.get(job.queue)
        if limits is None:
            found = ((a.name, hard_limit(a.capability)) for a in self.chain(job.queue))
            limits = self._limits[job.queue] = [(q, cap) for q, cap in found if cap is not None]
        need = least_request(job) if limits else None
        if need is None:
            return ALLOWED
        for name, cap in limits:
            short = over_limit(self.ssn.space, need, cap)
            if short:
                above = job.queue if name != job.queue else ""
                return beyond_limit(self.name, job, name, short, of=above)
        return ALLOWED

    def enqueued(self, job: JobInfo) -> None:
        if job.queue not in self.attrs or job.min_resources is None:
            return
        for a in self.chain(job.queue):
            a.inqueue += job.min_resources

    # -- events ---------------------------------------------------------------------------------
    def on_allocate(self, task: TaskInfo) -> None:
        self._on_event(task, 1.0)

    def on_deallocate(self, task: TaskInfo) -> None:
        self._on_event(task, -1.0)

    def _on_event(self, task: TaskInfo, sign: float) -> None:
        job = self.ssn.jobs.get(task.job)
        if job is None or job.queue not in self.attrs:
            return
        attr = self.attrs[job.queue]
        attr.allocated += sign * task.resreq
        attr.update_share()  # Volcano refreshes only the leaf's share here
        if self.hierarchical:
            for a in attr.ancestors:
                self.attrs[a].allocated += sign * task.resreq


def common_level(left: QueueAttr, right: QueueAttr) -> int:
    """Volcano getQueueLevel: index of the deepest common entry of the two ancestor lists."""
    level = 0
    for i in range(min(len(left.ancestors), len(right.ancestors))):
        if left.ancestors[i] != right.ancestors[i]:
            return level
        level = i
    return level


def under_deserved(future: np.ndarray, deserved: np.ndarray, req: np.ndarray) -> bool:
    """Volcano LessEqualPartlyWithDimensionZeroFiltered: some requested dimension (not zero on
    both sides) with ``future <= deserved``."""
    dims = (req > 0) & ~((future < MIN_RESOURCE) & (deserved < MIN_RESOURCE))
    return bool(np.any(future[dims] < deserved[dims] + MIN_RESOURCE))


def victim_order(ssn: Session, victims: list[TaskInfo], preemptor: TaskInfo) -> list[TaskInfo]:
    """Volcano BuildVictimsPriorityQueue order (``Session.victims_queue``, as the eviction actions)."""
    queue = ssn.victims_queue(list(victims), preemptor)
    out = []
    while not queue.empty():
        out.append(queue.pop())
    return out
