"""Helpers shared by the eviction actions (preempt, reclaim): candidate nodes and victim checks
(Volcano ``util.ValidateVictims``, ``api.PreemptableStatus``, ``Session.PredicateForPreemptAction``).
The victim order itself is ``Session.victims_queue`` (Volcano ``BuildVictimsPriorityQueue``).

Part of the framework because actions never import each other."""

from __future__ import annotations

import numpy as np

from muster.quantity import MIN_RESOURCE
from server.model import TaskStatus
from server.session.info import QueueInfo, TaskInfo, less_equal
from server.session.session import Session

# Volcano ``api.PreemptableStatus``: only tasks holding a node and not already leaving it.
PREEMPTABLE_STATUSES = frozenset({TaskStatus.BOUND, TaskStatus.RUNNING})
PREEMPT_NEVER = "Never"


def preemption_allowed(task: TaskInfo) -> bool:
    """A pod whose ``preemptionPolicy`` is ``Never`` may not evict others (Volcano #3642)."""
    return task.spec.preemption_policy != PREEMPT_NEVER


def contains_network_topology(ssn: Session, job_uid: str) -> bool:
    job = ssn.jobs.get(job_uid)
    return bool(job is not None and job.spec.network_topology)


def candidate_rows(ssn: Session, task: TaskInfo) -> np.ndarray:
    """Rows that could host ``task`` once victims leave (Volcano ``PredicateForPreemptAction``).

    Only failures eviction cannot resolve rule a node out: the session's static predicates
    (unschedulable node, node selector / affinity, untolerated taints), Kubernetes'
    UnschedulableAndUnresolvable. Resource fit, pod count and inter-pod anti-affinity are left to
    the per-node check after evictions (``fits_on``)."""
    # The evaluator's static mask is exactly that, computed once per static key per session.
    return np.nonzero(ssn.evaluator.static_mask(task))[0]


def victim_capacity(ssn: Session, statuses: frozenset[TaskStatus]) -> dict[str, np.ndarray]:
    """Per queue, per node: the summed requests of the preemptable tasks in ``statuses``.

    Computed once per action. A node can only host a preemptor if its future idle plus the
    requests of the victims it could offer holds the task, so ``future idle + capacity`` of the
    victim queues is a vectorised upper bound that rules nodes out before any victim is looked at.
    It stays an upper bound during the action: an evicted task moves its request into future idle
    while still being counted here, and pipelining lowers future idle itself."""
    nodes = ssn.nodes
    out: dict[str, np.ndarray] = {}
    for job in ssn.jobs.values():
        for status in statuses:
            for t in job.index[status].values():
                if not t.preemptable or t.node is None:
                    continue
                row = nodes.index.get(t.node)
                if row is None:
                    continue
                arr = out.get(job.queue)
                if arr is None:
                    arr = out[job.queue] = np.zeros((len(nodes), ssn.space.size))
                arr[row] += t.resreq
    return out


def could_fit(
    ssn: Session, task: TaskInfo, rows: np.ndarray, capacity: np.ndarray | None
) -> np.ndarray:
    """The rows among ``rows`` where future idle plus ``capacity`` holds the task."""
    room = ssn.nodes.future_idle(rows)
    if capacity is not None:
        room = room + capacity[rows]
    return rows[np.all(task.resreq <= room + MIN_RESOURCE, axis=1)]


def fits_on(ssn: Session, task: TaskInfo, row: int) -> bool:
    """Resources (future idle) and every predicate pass for ``task`` on node ``row`` now."""
    restrict = np.zeros(len(ssn.nodes), dtype=bool)
    restrict[row] = True
    future_ok, _ = ssn.evaluator.feasible(task, restrict)
    return bool(future_ok[row])


def preemptor_fits(ssn: Session, queue: QueueInfo, task: TaskInfo, row: int) -> bool:
    """Volcano ``preemptorFitsOnNode``: the queue may take the task, it fits future idle, and the
    predicates pass (the last two in one vectorised query)."""
    return ssn.allocatable(queue, task).ok and fits_on(ssn, task, row)


def validate_victims(ssn: Session, task: TaskInfo, row: int, victims: list[TaskInfo]) -> bool:
    """Volcano ``ValidateVictims``: node future idle plus every victim's request covers the task.
    An empty victim list is valid when the node alone suffices."""
    future = ssn.nodes.future_idle(row).copy()
    for v in victims:
        future += v.resreq
    return less_equal(task.resreq, future)
