"""Helpers more than one plugin needs (plugins never import each other's modules).

* A job's inqueue and elastic resources (Volcano ``util.GetInqueueResource`` and the elastic part
  of allocations above minResources): proportion and capacity.
* Their refusal of a task over the queue's share (``allocatable``), in the words of ``muster explain``.
"""

from __future__ import annotations

import numpy as np

from server.session.extension_points import Verdict, refuse
from server.session.info import JobInfo, QueueInfo, TaskInfo, less_equal


def exceeded(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    over: np.ndarray = np.maximum(left - right, 0.0)
    return over


def inqueue_resource(job: JobInfo) -> np.ndarray:
    """Volcano util.GetInqueueResource: minResources not yet covered by allocations."""
    if job.min_resources is None:
        return np.zeros_like(job.allocated)
    return exceeded(job.min_resources, job.allocated)


def elastic_resource(job: JobInfo) -> np.ndarray:
    if job.min_resources is None:
        return np.zeros_like(job.allocated)
    if less_equal(job.allocated, job.min_resources):
        return np.zeros_like(job.allocated)
    return exceeded(job.allocated, job.min_resources)


def over_share(plugin: str, queue: QueueInfo, task: TaskInfo) -> Verdict:
    """``plugin`` refuses ``task`` to ``queue``: it would go over the queue's share."""
    return refuse(
        plugin,
        f"queue {queue.name}: placing {task.name} would exceed the queue's deserved or capability share",
    )
