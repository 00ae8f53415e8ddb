"""Helpers more than one plugin needs (plugins never import each other's modules).

* A job's inqueue and elastic resources (Volcano ``util.GetInqueueResource`` and the elastic part
  of allocations above minResources): proportion and capacity.
* Their refusal of a task over the queue's share (``allocatable``), in the words of ``muster explain``.
* A job that can never fit a queue limit (``job_satisfiable``): what it needs at once against the
  limit, and the refusal that says so (capacity, proportion, KAI's proportion).
"""

from __future__ import annotations

import numpy as np

from muster.quantity import MIN_RESOURCE, from_canonical
from server.session.extension_points import Verdict, refuse
from server.session.info import JobInfo, QueueInfo, ResourceSpace, TaskInfo, less_equal


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


def least_request(job: JobInfo) -> np.ndarray | None:
    """What ``job`` must hold at once to run (``JobInfo.least_at_once`` of the tasks' requests)."""
    return job.least_at_once(lambda t: t.resreq)


def hard_limit(capability: np.ndarray) -> np.ndarray | None:
    """A queue's capability as a limit: cpu and memory of 0 or less are unlimited (Volcano's real
    capability); None when nothing is limited (every amount unlimited or unset)."""
    limit = capability.copy()
    limit[:2] = np.where(limit[:2] <= 0, np.inf, limit[:2])  # cpu and memory come first
    return limit if bool(np.isfinite(limit).any()) else None


def over_limit(
    space: ResourceSpace, need: np.ndarray, limit: np.ndarray
) -> list[tuple[str, str, str]]:
    """The resources where ``need`` is more than ``limit`` (a limit of +inf or NaN: none), as
    (resource, needed, limit) written as quantities."""
    over = (need > MIN_RESOURCE) & (need > limit + MIN_RESOURCE)
    return [
        (
            space.dims[d],
            from_canonical(space.dims[d], need[d]),
            from_canonical(space.dims[d], limit[d]),
        )
        for d in np.nonzero(over)[0]
    ]


def beyond_limit(
    plugin: str,
    job: JobInfo,
    queue: str,
    short: list[tuple[str, str, str]],
    limit: str = "capability",
    of: str = "",
) -> Verdict:
    """``plugin`` finds that ``job`` can never run in its queues: what it needs at once is more
    than ``queue``'s ``limit`` (an ancestor of the job's queue: ``of`` names that queue). ``short``:
    (resource, needed, limit) per resource that does not fit, as quantities are written."""
    needs = ", ".join(f"{r} {need}" for r, need, _ in short)
    limits = ", ".join(f"{r} {cap}" for r, _, cap in short)
    gang = f" for the {job.min_available} tasks it needs at once" if job.min_available > 1 else ""
    where = f" (above {of})" if of else ""
    return refuse(
        plugin, f"job {job.name} requests {needs}{gang} > queue {queue}{where} {limit} {limits}"
    )
