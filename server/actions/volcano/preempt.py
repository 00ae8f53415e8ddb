"""preempt: starving jobs evict lower-priority work of their own queue (Volcano ``actions/preempt``).

Phase 1, between jobs: queues in queue order; in each, the starving jobs (``ssn.job_starving``)
in job order. For each job, while it is starving, its pending tasks in task order each try to
preempt: candidate nodes (static predicates only) by node score; on a node, the running tasks of
*other* jobs of the *same* queue that are preemptable (task flag, ``ssn.preemptable`` -- gang
keeps victims' jobs at minAvailable, priority keeps higher-priority jobs, conformance keeps
system pods) are evicted one by one in victim order until the queue may take the preemptor
(``ssn.allocatable``), it fits the node's future idle (a pod slot included: Volcano's ``pods: 1``
request, whatever the plugins) and the predicates pass; the preemptor is
then pipelined there. Each node attempt is its own statement (discarded when the node does not
work out). The job's statement is committed if the job is pipelined (``ssn.job_pipelined``),
else discarded.

Phase 2, within a job: for each job that was starving, each pending task may evict lower-
priority running tasks of its own job; every successful task is committed on its own, the first
failure ends the job.

``enableTopologyAwarePreemption``: instead of taking the first workable node in score order, dry-
run every candidate node (minimal victim set with reprieve of higher-priority victims), keep
``minCandidateNodesPercentage`` / ``minCandidateNodesAbsolute`` / ``maxCandidateNodesAbsolute``
candidates and pick kube-scheduler's best (lowest highest victim priority, then lowest priority
sum, then fewest victims).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.actions.base import Action
from server.model import TaskStatus
from server.session.eviction import (
    PREEMPTABLE_STATUSES,
    candidate_rows,
    contains_network_topology,
    could_fit,
    fits_on,
    preemption_allowed,
    preemptor_fits,
    validate_victims,
    victim_capacity,
)
from server.session.info import JobInfo, QueueInfo, TaskInfo
from server.session.priority_queue import PriorityQueue
from server.session.session import Session
from server.session.statement import Statement

VictimFilter = Callable[[TaskInfo], bool]
REASON = "preempt"


@dataclass
class _Candidate:
    row: int
    victims: list[TaskInfo]  # highest priority first (as kube-scheduler keeps them)


class PreemptAction(Action):
    name = "preempt"
    ARGUMENTS = {
        "predicateErrorCacheEnable": True,
        "enableTopologyAwarePreemption": False,
        "topologyAwarePreemptWorkerNum": 16,
        "minCandidateNodesPercentage": 10,
        "minCandidateNodesAbsolute": 1,
        "maxCandidateNodesAbsolute": 100,
    }

    def __init__(self, arguments: dict[str, Any] | None = None) -> None:
        super().__init__(arguments)
        self._capacity: dict[str, np.ndarray] = {}

    def arg_int(self, key: str) -> int:
        try:
            return int(self.arguments.get(key, self.ARGUMENTS[key]))
        except (TypeError, ValueError):
            return int(self.ARGUMENTS[key])

    # -- the action ---------------------------------------------------------------------------
    def execute(self, ssn: Session) -> None:
        preemptors: dict[str, PriorityQueue] = {}
        preemptor_tasks: dict[str, PriorityQueue] = {}
        under_request: dict[str, list[JobInfo]] = {}
        for job, _queue in ssn.admitted_jobs():
            if not ssn.job_starving(job):
                continue
            # Volcano does not preempt for jobs with a network topology (volcano#4374).
            if contains_network_topology(ssn, job.uid):
                continue
            preemptors.setdefault(job.queue, PriorityQueue(ssn.job_order_fn)).push(job)
            under_request.setdefault(job.queue, []).append(job)
            preemptor_tasks[job.uid] = PriorityQueue(
                ssn.task_order_fn, job.index[TaskStatus.PENDING].values()
            )

        self._capacity = victim_capacity(ssn, PREEMPTABLE_STATUSES)
        queues = PriorityQueue(ssn.queue_order_fn, (ssn.queues[q] for q in preemptors))
        while not queues.empty():
            queue = queues.pop()
            self._between_jobs(ssn, queue, preemptors[queue.uid], preemptor_tasks)
            for job in under_request.get(queue.uid, []):
                self._within_job(ssn, job)

    def _between_jobs(
        self,
        ssn: Session,
        queue: QueueInfo,
        jobs: PriorityQueue,
        preemptor_tasks: dict[str, PriorityQueue],
    ) -> None:
        while not jobs.empty():
            job = jobs.pop()
            stmt = ssn.statement()
            tasks = preemptor_tasks[job.uid]
            while ssn.job_starving(job) and not tasks.empty():
                preemptor = tasks.pop()
                self.preempt(ssn, stmt, preemptor, _other_jobs_of_queue(ssn, job.queue, preemptor))
            if ssn.job_pipelined(job):
                stmt.commit()
            else:
                stmt.discard()

    def _within_job(self, ssn: Session, job: JobInfo) -> None:
        tasks = PriorityQueue(ssn.task_order_fn, job.index[TaskStatus.PENDING].values())
        while not tasks.empty():
            preemptor = tasks.pop()
            stmt = ssn.statement()
            if not self.preempt(ssn, stmt, preemptor, _same_job(preemptor)):
                stmt.discard()
                break
            stmt.commit()

    # -- one preemptor ----------------------------------------------------------------------------
    def preempt(
        self, ssn: Session, stmt: Statement, preemptor: TaskInfo, victim_filter: VictimFilter
    ) -> bool:
        """Try to place ``preemptor`` by evicting tasks that pass ``victim_filter``; on success the
        evictions and the pipeline are merged into ``stmt``. Returns whether it was placed."""
        if not preemption_allowed(preemptor):
            return False
        job = ssn.jobs.get(preemptor.job)
        if job is None:
            return False
        queue = ssn.queues[job.queue]
        # Both phases take victims from the preemptor's queue only: nodes whose future idle plus
        # that queue's preemptable tasks cannot hold the preemptor are no candidates.
        rows = could_fit(
            ssn, preemptor, candidate_rows(ssn, preemptor), self._capacity.get(job.queue)
        )
        if not len(rows):
            return False
        if self.arg_bool("enableTopologyAwarePreemption"):
            return self._topology_aware(ssn, stmt, queue, preemptor, rows, victim_filter)
        return self._normal(ssn, stmt, queue, preemptor, rows, victim_filter)

    def _normal(
        self,
        ssn: Session,
        stmt: Statement,
        queue: QueueInfo,
        preemptor: TaskInfo,
        rows: np.ndarray,
        victim_filter: VictimFilter,
    ) -> bool:
        names = ssn.nodes.names
        scores = ssn.evaluator.scores(preemptor, rows)
        # Volcano SortNodes: best score first (ties: node name here, map order there).
        for k in np.lexsort((rows, -scores)):
            row = int(rows[k])
            victims = self._victims_on(ssn, preemptor, row, victim_filter)
            if not validate_victims(ssn, preemptor, row, victims):
                continue
            node_stmt = ssn.statement()
            order = ssn.victims_queue(victims, preemptor)
            fits = _fits_with_pod_slot(ssn, queue, preemptor, row)
            while not fits and not order.empty():
                node_stmt.evict(order.pop(), REASON)
                fits = _fits_with_pod_slot(ssn, queue, preemptor, row)
            if fits:
                node_stmt.pipeline(preemptor, names[row])
                stmt.merge(node_stmt)
                return True
            node_stmt.discard()
        return False

    def _victims_on(
        self, ssn: Session, preemptor: TaskInfo, row: int, victim_filter: VictimFilter
    ) -> list[TaskInfo]:
        preemptees = [t for t in ssn.nodes.tasks[row].values() if victim_filter(t)]
        return ssn.preemptable(preemptor, preemptees)

    # -- topology-aware (kube-scheduler style dry run) ---------------------------------------------
    def _topology_aware(
        self,
        ssn: Session,
        stmt: Statement,
        queue: QueueInfo,
        preemptor: TaskInfo,
        rows: np.ndarray,
        victim_filter: VictimFilter,
    ) -> bool:
        wanted = self._num_candidates(len(rows))
        candidates: list[_Candidate] = []
        # Volcano starts at a random offset among the candidate nodes; Muster starts at the first
        # node by name so that a cycle is reproducible.
        for row in rows:
            found = self._select_victims_on_node(ssn, queue, preemptor, int(row), victim_filter)
            if found:
                candidates.append(_Candidate(int(row), found))
                if len(candidates) >= wanted:
                    break
        best = _pick_one_node(candidates)
        if best is None:
            return False
        node_stmt = ssn.statement()
        for victim in best.victims:
            node_stmt.evict(victim, REASON)
        node_stmt.pipeline(preemptor, ssn.nodes.names[best.row])
        stmt.merge(node_stmt)
        return True

    def _num_candidates(self, nodes: int) -> int:
        n = nodes * self.arg_int("minCandidateNodesPercentage") // 100
        n = max(n, self.arg_int("minCandidateNodesAbsolute"))
        n = min(n, self.arg_int("maxCandidateNodesAbsolute"))
        return min(n, nodes)

    def _select_victims_on_node(
        self,
        ssn: Session,
        queue: QueueInfo,
        preemptor: TaskInfo,
        row: int,
        victim_filter: VictimFilter,
    ) -> list[TaskInfo]:
        """Volcano ``SelectVictimsOnNode``: evict potential victims in victim order until the
        preemptor fits, then reprieve them highest priority first wherever it still fits. The
        session is left unchanged; returns the victims (highest priority first), or [] when the
        node is no candidate (Volcano also wants at least one victim)."""
        victims = self._victims_on(ssn, preemptor, row, victim_filter)
        if not victims or not validate_victims(ssn, preemptor, row, victims):
            return []
        trial = ssn.statement()
        try:
            order = ssn.victims_queue(victims, preemptor)
            potential: list[TaskInfo] = []
            while not order.empty():
                task = order.pop()
                potential.append(task)
                trial.evict(task, REASON)
                if _fits_with_pod_slot(ssn, queue, preemptor, row):
                    break
            # Volcano re-checks only the predicates here (resources were validated above).
            if not potential or not fits_on(ssn, preemptor, row):
                return []
            chosen: set[str] = set()
            victims_out: list[TaskInfo] = []
            # Reprieve from the highest priority down: a victim stays when, with it back on the
            # node (and the undecided lower-priority ones still evicted), the preemptor fits.
            for j in range(len(potential) - 1, -1, -1):
                trial.discard()
                for i, t in enumerate(potential):
                    if i < j or t.uid in chosen:
                        trial.evict(t, REASON)
                if not _fits_with_pod_slot(ssn, queue, preemptor, row):
                    chosen.add(potential[j].uid)
                    victims_out.append(potential[j])
            return victims_out
        finally:
            trial.discard()


def _pod_slot_free(ssn: Session, row: int) -> bool:
    """Volcano gives every pod a ``pods: 1`` request (``api.GetPodResourceRequest``) and nodes a
    ``pods`` allocatable, so its future idle counts pod slots whatever the plugins: a slot is free
    when the node's tasks that are not releasing (pipelined ones included) are fewer than its
    ``pods``. Muster keeps pods out of the resource vector (the predicates plugin counts them),
    hence this check (Volcano #3335: a victim's eviction frees its slot)."""
    nodes = ssn.nodes
    holding = sum(1 for t in nodes.tasks[row].values() if t.status != TaskStatus.RELEASING)
    return bool(holding < nodes.max_tasks[row])


def _fits_with_pod_slot(ssn: Session, queue: QueueInfo, preemptor: TaskInfo, row: int) -> bool:
    """``preemptorFitsOnNode`` (both modes), the pod slot counted as Volcano's resources do."""
    return _pod_slot_free(ssn, row) and preemptor_fits(ssn, queue, preemptor, row)


def _basic_victim(preemptor: TaskInfo, task: TaskInfo) -> bool:
    """Volcano's common victim filter: running, preemptable, and a best-effort preemptor only
    evicts best-effort tasks."""
    if task.status not in PREEMPTABLE_STATUSES:
        return False
    if preemptor.best_effort and not task.best_effort:
        return False
    return task.preemptable


def _other_jobs_of_queue(ssn: Session, queue: str, preemptor: TaskInfo) -> VictimFilter:
    """Phase 1 victims: other jobs' tasks in the preemptor's queue."""

    def accept(task: TaskInfo) -> bool:
        if not _basic_victim(preemptor, task) or task.job == preemptor.job:
            return False
        victim_job = ssn.jobs.get(task.job)
        return victim_job is not None and victim_job.queue == queue

    return accept


def _same_job(preemptor: TaskInfo) -> VictimFilter:
    """Phase 2 victims: the preemptor's own job's tasks."""
    return lambda task: _basic_victim(preemptor, task) and task.job == preemptor.job


def _pick_one_node(candidates: list[_Candidate]) -> _Candidate | None:
    """kube-scheduler ``pickOneNodeForPreemption`` without PDBs or start times: the lowest
    highest-victim priority, then the lowest sum of priorities, then the fewest victims, then
    the first candidate."""
    if not candidates:
        return None
    offset = math.pow(2, 31)

    def key(c: _Candidate) -> tuple[int, float, int]:
        return (
            max(v.priority for v in c.victims),
            sum(v.priority + offset for v in c.victims),
            len(c.victims),
        )

    return min(candidates, key=key)
