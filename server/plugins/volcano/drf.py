"""drf: Dominant Resource Fairness between jobs, and hierarchical DRF between queues
(Volcano ``plugins/drf``).

A job's share is its dominant share: max over the cluster's resources of allocated / total.
Registers: job_order (lower share first), preemptable (a victim's job, after losing the victim,
must still have a share >= the preemptor job's share after gaining the task, within 1e-6), and
event handlers that keep shares incremental.

With ``enableHierarchy: true`` (off by default) queues form a tree given by their annotations
``volcano.sh/hierarchy`` (``root/eng/dev``) and ``volcano.sh/hierarchy-weights`` (``100/50/50``,
one weight per level; below 1 counts as 1); jobs are the leaves. Each inner node's allocation is
its children's allocations rescaled to the smallest dominant share among its demanding
(unsaturated) children, so a child that cannot use more does not hold its siblings back. The
plugin then also registers queue_order (walk both queues' paths from the root; at the first level
where the nodes differ, an unsaturated node goes before a saturated one, else the lower
share / weight first) and reclaimable (a task may be reclaimed when, after the move, the reclaimer's
queue would still compare lower than the victim's queue).
"""

from __future__ import annotations

import math

import numpy as np

from muster.quantity import MIN_RESOURCE
from server.model import ALLOCATED
from server.plugins.base import Plugin
from server.session.extension_points import (
    HIERARCHY_SWITCH,
    JOB_ORDER,
    JOB_ORDER_KEY,
    PERMIT,
    PREEMPTABLE,
    QUEUE_ORDER,
    RECLAIMABLE,
    EventHandler,
)
from server.session.info import JobInfo, QueueInfo, TaskInfo, dominant_share
from server.session.session import Session

SHARE_DELTA = 0.000001
HIERARCHY = "volcano.sh/hierarchy"
HIERARCHY_WEIGHTS = "volcano.sh/hierarchy-weights"


class HNode:
    """A node of the hierarchical DRF tree: the root, a queue level, or a job (leaf)."""

    __slots__ = ("name", "weight", "allocated", "share", "request", "saturated", "children", "job")

    def __init__(
        self,
        name: str,
        weight: float,
        allocated: np.ndarray,
        request: np.ndarray,
        children: dict[str, HNode] | None,
        job: str = "",
    ) -> None:
        self.name = name
        self.weight = weight
        self.allocated = allocated
        self.share = 0.0
        self.request = request
        self.saturated = False
        self.children = children
        self.job = job  # leaf: the job uid (its allocation lives in DrfState.allocated)

    def clone(self) -> HNode:
        node = HNode(self.name, self.weight, self.allocated.copy(), self.request, None, self.job)
        node.share, node.saturated = self.share, self.saturated
        if self.children is not None:
            node.children = {k: c.clone() for k, c in self.children.items()}
        return node


def _saturated(allocated: np.ndarray, request: np.ndarray, demanding: np.ndarray) -> bool:
    """Volcano resourceSaturated, over the dimensions the job holds: it has all it asked for in
    one of them, or it asks for a resource the cluster has no more of."""
    held = allocated >= MIN_RESOURCE
    if np.any(held & (request != 0) & (allocated >= request)):
        return True
    return bool(np.any(held & ~demanding & (request != 0)))


class HierarchicalDrf:
    """The hierarchical DRF tree and its incremental updates."""

    def __init__(self, total: np.ndarray) -> None:
        self.total = total
        self.total_allocated = np.zeros_like(total)
        self.root = HNode("root", 1.0, np.zeros_like(total), np.zeros_like(total), {})

    @staticmethod
    def path(queue: QueueInfo) -> tuple[list[str], list[str]]:
        return (
            queue.annotations.get(HIERARCHY, "").split("/"),
            queue.annotations.get(HIERARCHY_WEIGHTS, "").split("/"),
        )

    def place(
        self, root: HNode, job: JobInfo, allocated: np.ndarray, share: float, queue: QueueInfo
    ) -> None:
        """Volcano buildHierarchy: find or create the queue's levels, (re)attach the job's leaf."""
        paths, weights = self.path(queue)
        node = root
        for i in range(1, len(paths)):
            assert node.children is not None
            child = node.children.get(paths[i])
            if child is None:
                try:
                    weight = float(weights[i]) if i < len(weights) else 1.0
                except ValueError:
                    weight = 1.0
                zeros = np.zeros_like(self.total)
                child = HNode(paths[i], max(weight, 1.0), zeros, zeros.copy(), {})
                node.children[paths[i]] = child
            node = child
        assert node.children is not None
        leaf = HNode(job.uid, 1.0, allocated, job.total_request, None, job.uid)
        leaf.share = share
        node.children[job.uid] = leaf

    def update(self, root: HNode, total_allocated: np.ndarray) -> None:
        demanding = total_allocated < self.total
        self._update(root, demanding)

    def _update(self, node: HNode, demanding: np.ndarray) -> None:
        if node.children is None:
            node.saturated = _saturated(node.allocated, node.request, demanding)
            return
        mdr = 1.0
        for child in node.children.values():
            self._update(child, demanding)
            if child.share != 0 and not child.saturated:
                mdr = min(mdr, dominant_share(child.allocated, self.total))
        allocated = np.zeros_like(self.total)
        saturated = True
        for child in node.children.values():
            if not child.saturated:
                saturated = False
            if child.share != 0:
                allocated += (
                    child.allocated if child.saturated else child.allocated * (mdr / child.share)
                )
        node.allocated = allocated
        node.share = dominant_share(allocated, self.total)
        node.saturated = saturated

    def compare(self, root: HNode, left: QueueInfo, right: QueueInfo) -> float:
        """Volcano compareQueues: < 0 when ``left`` goes first."""
        lpaths, rpaths = self.path(left)[0], self.path(right)[0]
        lnode: HNode | None = root
        rnode: HNode | None = root
        depth = min(len(lpaths), len(rpaths))
        for i in range(depth):
            ls, lsat, lw = _view(lnode)
            rs, rsat, rw = _view(rnode)
            if not lsat and rsat:
                return -1
            if lsat and not rsat:
                return 1
            if ls / lw != rs / rw:
                return ls / lw - rs / rw
            if i < depth - 1:
                lnode = _child(lnode, lpaths[i + 1])
                rnode = _child(rnode, rpaths[i + 1])
        return 0


def _view(node: HNode | None) -> tuple[float, bool, float]:
    # A queue level with no job yet is not in the tree: it holds nothing and is not saturated.
    return (0.0, False, 1.0) if node is None else (node.share, node.saturated, node.weight)


def _child(node: HNode | None, name: str) -> HNode | None:
    if node is None or node.children is None:
        return None
    return node.children.get(name)


class _Shares:
    """Each job's dominant share of the cluster, recomputed when asked after its allocation
    changed: a gang's placements change it task by task, the job order reads it once per push."""

    def __init__(self, allocated: dict[str, np.ndarray], total: np.ndarray) -> None:
        self._allocated, self._total = allocated, total
        # Job -> its share, while its allocation is unchanged (the owner drops it on a change).
        self.known: dict[str, float] = {}

    def changed(self, job: str) -> None:
        self.known.pop(job, None)

    def get(self, job: str, default: float = 0.0) -> float:
        share = self.known.get(job)
        if share is None:
            alloc = self._allocated.get(job)
            if alloc is None:
                return default
            share = self.known[job] = dominant_share(alloc, self._total)
        return share

    def __getitem__(self, job: str) -> float:
        if job not in self._allocated:
            raise KeyError(job)
        return self.get(job)


class DrfPlugin(Plugin):
    name = "drf"
    ARGUMENTS = {"drf.namespace.order": False}

    def on_session_open(self, ssn: Session) -> None:
        total = ssn.total_resource
        allocated: dict[str, np.ndarray] = {}
        shares = _Shares(allocated, total)
        option = ssn.option(self.name)
        hierarchy_enabled = option is not None and option.enabled(HIERARCHY_SWITCH.name)
        hdrf = HierarchicalDrf(total)
        self.shares = shares
        self.hdrf = hdrf if hierarchy_enabled else None
        for job in ssn.jobs.values():
            alloc = ssn.space.zeros()
            index = job.index
            holds = False
            for status in ALLOCATED:
                held = index.get(status)  # (not ``index[status]``: most jobs hold nothing)
                if held:
                    holds = True
                    for t in held.values():
                        alloc += t.resreq
            allocated[job.uid] = alloc
            if not holds:
                # The dominant share of zeros is 0.0 (0 / b for every b counted): known without
                # computing it, for the job order's first keys of every waiting job.
                shares.known[job.uid] = 0.0
            queue = ssn.queues.get(job.queue)
            if hierarchy_enabled and queue is not None:
                hdrf.total_allocated += alloc
                hdrf.place(hdrf.root, job, alloc, shares[job.uid], queue)
        if hierarchy_enabled:
            # Volcano updates after each job; every update recomputes the tree from the leaves, so
            # only the last one (with the final total) counts.
            hdrf.update(hdrf.root, hdrf.total_allocated)

        def preemptable(
            preemptor: TaskInfo, preemptees: list[TaskInfo]
        ) -> tuple[list[TaskInfo], int]:
            if preemptor.job not in allocated:
                return [], PERMIT
            ls = dominant_share(allocated[preemptor.job] + preemptor.resreq, total)
            victims = []
            seen: dict[str, np.ndarray] = {}
            for t in preemptees:
                if t.job not in allocated:
                    continue
                alloc = seen.setdefault(t.job, allocated[t.job].copy())
                alloc -= t.resreq
                rs = dominant_share(alloc, total)
                if ls < rs or abs(ls - rs) <= SHARE_DELTA:
                    victims.append(t)
            return victims, PERMIT

        def job_order(left: JobInfo, right: JobInfo) -> int:
            ls, rs = shares.get(left.uid, 0.0), shares.get(right.uid, 0.0)
            return 0 if ls == rs else (-1 if ls < rs else 1)

        def job_share_key(job: JobInfo) -> float:
            share = shares.get(job.uid, 0.0)
            # NaN (infinite quantities) compares after everything in job_order: last here too.
            return math.inf if share != share else share

        def rehang(
            root: HNode, total_allocated: np.ndarray, job: JobInfo, alloc: np.ndarray
        ) -> None:
            queue = ssn.queues.get(job.queue)
            if queue is not None:
                hdrf.place(root, job, alloc, dominant_share(alloc, total), queue)
                hdrf.update(root, total_allocated)

        def queue_order(left: QueueInfo, right: QueueInfo) -> int:
            r = hdrf.compare(hdrf.root, left, right)
            return -1 if r < 0 else (1 if r > 0 else 0)

        def reclaimable(
            reclaimer: TaskInfo, reclaimees: list[TaskInfo]
        ) -> tuple[list[TaskInfo], int]:
            ljob = ssn.jobs.get(reclaimer.job)
            if ljob is None or ljob.queue not in ssn.queues or ljob.uid not in allocated:
                return [], PERMIT
            lqueue = ssn.queues[ljob.queue]
            root = hdrf.root.clone()
            total_allocated = hdrf.total_allocated + reclaimer.resreq
            rehang(root, total_allocated, ljob, allocated[ljob.uid] + reclaimer.resreq)
            victims = []
            for t in reclaimees:
                rjob = ssn.jobs.get(t.job)
                if rjob is None or rjob.queue not in ssn.queues or rjob.uid not in allocated:
                    continue
                rqueue = ssn.queues[rjob.queue]
                # What-if: the victim's job without the task; compare; then put the task back.
                total_allocated = total_allocated - t.resreq
                rehang(root, total_allocated, rjob, allocated[rjob.uid] - t.resreq)
                verdict = hdrf.compare(root, lqueue, rqueue)
                total_allocated = total_allocated + t.resreq
                rehang(root, total_allocated, rjob, allocated[rjob.uid].copy())
                if verdict < 0:
                    victims.append(t)
            return victims, PERMIT

        jobs = ssn.jobs

        def on_event(task: TaskInfo, sign: float = 1.0) -> None:
            uid = task.job
            alloc = allocated.get(uid)
            if alloc is None or uid not in jobs:
                return
            # In place, no temporary (every placement): sign is +-1, so the same sums.
            if sign > 0:
                alloc += task.resreq
            else:
                alloc -= task.resreq
            shares.changed(uid)
            if hierarchy_enabled:
                job = jobs[uid]
                if job.queue in ssn.queues:
                    hdrf.total_allocated += sign * task.resreq
                    rehang(hdrf.root, hdrf.total_allocated, job, allocated[uid])

        def on_deallocate(task: TaskInfo) -> None:
            on_event(task, -1.0)

        ssn.register(PREEMPTABLE, self.name, preemptable)
        ssn.register(JOB_ORDER, self.name, job_order)
        ssn.register(JOB_ORDER_KEY, self.name, job_share_key)
        if hierarchy_enabled:
            ssn.register(QUEUE_ORDER, self.name, queue_order)
            ssn.register(RECLAIMABLE, self.name, reclaimable)
        ssn.add_event_handler(EventHandler(on_event, on_deallocate))
