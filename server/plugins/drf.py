"""drf: Dominant Resource Fairness between jobs (Volcano ``plugins/drf``).

A job's share is its dominant share: max over resources of allocated / cluster total. Registers:
job_order (lower share first), preemptable (a victim's job, after losing the victim, must still
have a share >= the preemptor job's share after gaining the task, within 1e-6), and event
handlers that keep shares incremental. ``enableHierarchy`` (hierarchical DRF over queues) is
served by the queue order and reclaimable functions of ``drf_hierarchy`` when switched on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from server.plugins.base import Plugin
from server.session.extension_points import PERMIT
from server.session.info import JobInfo, TaskInfo

if TYPE_CHECKING:
    from server.session.session import Session

SHARE_DELTA = 0.000001


def dominant_share(allocated: np.ndarray, total: np.ndarray) -> float:
    """max over resources of allocated / total (Volcano helpers.Share: x/0 is 1, 0/0 is 0)."""
    shares = np.divide(allocated, total, out=(allocated != 0).astype(float), where=total != 0)
    return float(shares.max(initial=0.0))


class DrfPlugin(Plugin):
    name = "drf"
    ARGUMENTS = {"drf.namespace.order": False}

    def on_session_open(self, ssn: Session) -> None:
        total = ssn.total_resource
        allocated: dict[str, np.ndarray] = {}
        shares: dict[str, float] = {}
        for job in ssn.jobs.values():
            allocated[job.uid] = job.allocated.copy()
            shares[job.uid] = dominant_share(job.allocated, total)
        self.shares = shares

        def preemptable(preemptor: TaskInfo, preemptees: list[TaskInfo]) -> tuple[list[TaskInfo], int]:
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

        def on_allocate(task: TaskInfo) -> None:
            if task.job in allocated:
                allocated[task.job] += task.resreq
                shares[task.job] = dominant_share(allocated[task.job], total)

        def on_deallocate(task: TaskInfo) -> None:
            if task.job in allocated:
                allocated[task.job] -= task.resreq
                shares[task.job] = dominant_share(allocated[task.job], total)

        from server.session.session import EventHandler

        ssn.register("preemptable", self.name, preemptable)
        ssn.register("job_order", self.name, job_order)
        ssn.add_event_handler(EventHandler(on_allocate, on_deallocate))
