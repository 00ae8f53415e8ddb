"""The victim search shared by consolidation, reclaim and preempt (KAI's job solver).

For a pending job the tasks of this attempt are solved one more at a time: each step searches for
victims that make room for the tasks so far, starting from the victims the previous step needed.
Candidate victims come from the action's victim queue, a victim job at a time (an elastic job gives
up one task above its minimum at a time, a gang all of its tasks); each new candidate job is tried
node by node: on one of its nodes, every candidate task of the jobs with candidates there is evicted,
then the victims' jobs and the pending job are placed again in job-queue order, pipelined (victims
may land elsewhere: consolidation). The first arrangement in which the pending job fits and the
action's validator accepts is the step's solution. A solved job's statement holds the evictions and
the pipelined placements; the action commits it.

What cannot succeed is not simulated (``scenario_filters.py``, KAI's accumulated scenario filters):
a search whose job cannot fit even with every candidate gone, a scenario or a node's attempt whose
victims gone still leave no room, and the rest of a simulation once the victims placed back before
the pending job's turn have taken the room it needed. The placements are the same without them.

Two shortcuts more (session parameter ``solverPruning``, default true; the placements and the
budget spent are the same without them):

* a node's attempt that evicts the same victims as an earlier node's attempt of the same scenario
  (a victim job on several of its nodes) is not simulated again: it starts from the same session
  and fails the same way, and is charged to the budget as the first one was;
* the retaken room (``_retakes_room``): when the next job a simulation places is a victim job, its
  tasks alike, and the room check after it is sure to refuse -- its tasks surely fit the nodes
  they may take, and those are nodes the pending tasks may use whose room in all, less what the
  victim's tasks take, cannot hold them -- the simulation is given up without placing it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from muster.devices import UNIT
from muster.quantity import MIN_RESOURCE
from server.actions.kai.common import allocate_job
from server.actions.kai.job_queue import Filters, JobsByQueue, per_action, queue_depth
from server.actions.kai.scenario_filters import ScenarioFilters, room_for_moves
from server.model import TaskStatus
from server.session.info import JobInfo, TaskInfo
from server.session.kai import (
    ACTIVE_ALLOCATED,
    ACTIVE_USED,
    gang_satisfied,
    tasks_to_allocate,
    tasks_to_evict,
)
from server.session.options import flag
from server.session.session import Session
from server.session.statement import Statement

# (pending job, its tasks placed in this step, every candidate victim of the arrangement) -> accept?
Validator = Callable[[JobInfo, list[TaskInfo], list[TaskInfo]], bool]
VictimQueueFactory = Callable[[], JobsByQueue]


@dataclass
class Solution:
    statement: Statement
    # Evicted for good, then the ones moved elsewhere. (KAI's allowConsolidatingReclaim changes only
    # when its solver adds the moved ones, not the list: the setting matters to proportion alone.)
    victims: list[TaskInfo]


@dataclass
class Budget:
    """Session parameter ``simulationBudgetPerAction``: how many more scenarios one job's victim
    search may simulate (None: no bound, KAI's way). Once a simulation is refused the search gives
    up, as if no victims could help the job; the action goes on with the next job."""

    left: int | None = None
    refused: bool = False
    spent: int = 0  # scenarios simulated so far (a repeated one is charged as it was)

    def spend(self) -> bool:
        if self.left is not None:
            if self.left <= 0:
                self.refused = True
                return False
            self.left -= 1
        self.spent += 1
        return True


@dataclass
class JobSolver:
    ssn: Session
    validator: Validator
    victim_queue: VictimQueueFactory
    action: str
    # KAI's accumulated scenario filters (scenario_filters.py): off, every scenario is simulated.
    use_filters: bool = True
    # Every victim must be placed again (consolidation): the cluster's room is only moved about.
    moves_only: bool = False
    budget: Budget = field(default_factory=Budget)
    # The shortcuts that keep the placements exactly as they are (session parameter
    # ``solverPruning``, default true; off: the search as KAI runs it, for comparison).
    pruning: bool = True
    _recorded: list[TaskInfo] = field(default_factory=list)
    _waiting: JobsByQueue | None = None
    _filters: ScenarioFilters | None = None
    # KAI's feasible nodes (``feasible_nodes``): those of the search, then those of the step, with
    # the recorded victims' nodes (None: every node).
    _search_nodes: np.ndarray | None = None
    _step_nodes: np.ndarray | None = None

    def solve(self, job: JobInfo) -> tuple[bool, Statement | None, list[TaskInfo]]:
        ssn = self.ssn
        before = sum(1 for t in job.tasks.values() if t.status in ACTIVE_USED)
        tasks = tasks_to_allocate(job, ssn.task_order_fn, real=False)
        statement: Statement | None = None
        self._recorded = []
        self._waiting = None
        # Every step starts from the session as the search found it (a step's statement is
        # discarded before the next), so every step's victim queue is this one, copied.
        queue = self.victim_queue()
        if self.use_filters and not self._may_solve(tasks, queue):
            return False, None, []
        self._search_nodes = feasible_nodes(ssn, job)  # (nothing has changed the session yet)
        for k in range(1, len(tasks) + 1):
            solution = self._solve_partial(job, tasks[:k], queue.copy())
            if solution is None:
                if statement is not None:
                    statement.discard()
                    statement = None
                break
            if k < len(tasks):
                solution.statement.discard()
            else:
                statement = solution.statement
            self._recorded = solution.victims
        after = sum(1 for t in job.tasks.values() if t.status in ACTIVE_USED)
        solved = statement is not None and gang_satisfied(job) and after > before
        if not solved and statement is not None:
            statement.discard()
            statement = None
        return solved, statement, list(self._recorded)

    def _may_solve(self, tasks: list[TaskInfo], queue: JobsByQueue) -> bool:
        """Whole-search filters: the last step places every task, so a search is given up before
        it starts when not even every candidate victim gone would make room for them all -- or,
        when victims may only move, when the cluster's room in all cannot hold them."""
        if self.moves_only and not room_for_moves(self.ssn, tasks):
            return False
        everyone = [
            t
            for jobs in queue.jobs.values()
            for j in jobs
            for t in j.tasks.values()
            if t.status in ACTIVE_ALLOCATED
        ]
        return ScenarioFilters(self.ssn, tasks).accepts_with(everyone)

    # -- one step --------------------------------------------------------------------------------
    def _solve_partial(
        self, job: JobInfo, pending: list[TaskInfo], queue: JobsByQueue
    ) -> Solution | None:
        recorded_uids = {t.uid for t in self._recorded}
        self._step_nodes = with_nodes_of(self.ssn, self._search_nodes, self._recorded)
        potential = _Candidates()
        latest: JobInfo | None = None
        filters = self._filters = (
            ScenarioFilters(self.ssn, pending, self._recorded) if self.use_filters else None
        )
        # The scenario with no new candidates: the recorded victims alone.
        if self._recorded and (filters is None or filters.accepts()):
            found = self._attempt(job, pending, _Candidates(), latest=None)
            if found is not None or self.budget.refused:
                return found
        while not queue.empty():
            victim_job = queue.pop_unchanged()  # (every attempt is undone before the next pop)
            chosen, more = tasks_to_evict(victim_job, self.ssn.task_order_fn)
            if any(t.uid in recorded_uids for t in chosen):
                rest = [t for t in victim_job.tasks.values() if t.uid not in recorded_uids]
                if rest:
                    queue.push(victim_job.with_tasks(rest))
                continue
            if more:
                kept = {t.uid for t in chosen}
                queue.push(
                    victim_job.with_tasks(t for t in victim_job.tasks.values() if t.uid not in kept)
                )
            if not chosen:
                continue
            potential.add(chosen)
            latest = self.ssn.jobs[victim_job.uid]
            if filters is not None:  # what even all of these victims gone cannot hold: skipped
                filters.add_victims(chosen)
                if not filters.accepts():
                    continue
            found = self._attempt(job, pending, potential, latest)
            if found is not None or self.budget.refused:
                return found
        return None

    def _attempt(
        self,
        job: JobInfo,
        pending: list[TaskInfo],
        potential: _Candidates,
        latest: JobInfo | None,
    ) -> Solution | None:
        ssn = self.ssn
        stmt = ssn.statement()
        stmt.simulation = True
        if latest is None:
            self._wait_in_order()
            self._evict_recorded(stmt, job)
            found = self._simulate(
                job, pending, stmt, list(self._recorded), list(self._recorded), self._step_nodes
            )
            if found is not None:
                return found
            stmt.discard()
            return None
        nodes = sorted({t.node for t in latest.tasks.values() if t.node is not None})
        filters = self._filters
        recorded_evicted = False
        candidates: list[TaskInfo] | None = None
        # The eviction sets tried on earlier nodes, and whether trying each spent the budget.
        tried: dict[tuple[str, ...], bool] = {}
        for node in nodes:
            evicted = potential.of_jobs_on(node)
            if self.pruning:
                # A job on several of these nodes gives the same eviction set on each: every attempt
                # starts from the same session (the last one was rolled back), so the same set
                # fails again. It is charged as its first try was.
                key = tuple(t.uid for t in evicted)
                charged = tried.get(key)
                if charged is not None:
                    if charged and not self.budget.spend():
                        break
                    continue
                tried[key] = False
            if filters is not None and not filters.accepts_with(evicted):
                continue  # not even these victims gone make room: nothing to evict or simulate
            if not recorded_evicted:  # (first the recorded victims, for every node alike)
                self._wait_in_order()
                self._evict_recorded(stmt, job)
                recorded_evicted = True
            mark = stmt.checkpoint()
            for t in evicted:
                if t.status in ACTIVE_ALLOCATED:
                    stmt.evict(t, self._reason(t, job))
            if candidates is None:
                candidates = [*self._recorded, *potential.tasks]
            spent_before = self.budget.spent
            within = with_nodes_of(ssn, self._step_nodes, evicted)
            found = self._simulate(
                job, pending, stmt, [*self._recorded, *evicted], candidates, within
            )
            if found is not None:
                return found
            if self.pruning:
                tried[key] = self.budget.spent > spent_before
            stmt.rollback(mark)
            if self.budget.refused:
                break
        stmt.discard()
        return None

    def _wait_in_order(self) -> None:
        """The pending jobs in job-queue order, taken once per search, before its first eviction:
        a simulation places only the victims' jobs and the pending job (these join the order
        afresh), so every other job is as the search found it."""
        if self._waiting is None:
            ssn = self.ssn
            self._waiting = JobsByQueue(ssn).fill(
                [j for j in ssn.jobs.values() if j.index[TaskStatus.PENDING]], Filters()
            )

    def _evict_recorded(self, stmt: Statement, job: JobInfo) -> None:
        for t in self._recorded:
            if t.status != TaskStatus.RELEASING:
                stmt.evict(t, self._reason(t, job))

    def _room_now(self) -> bool:
        """Can the pending tasks still fit the session as it stands (the attempt's evictions
        made, victims placed again so far)? What is left before the pending job's turn only places,
        so a simulation where they cannot is given up."""
        return self._filters is None or self._filters.accepts_now()

    def _simulate(
        self,
        job: JobInfo,
        pending: list[TaskInfo],
        stmt: Statement,
        victims: list[TaskInfo],
        candidates: list[TaskInfo],
        within: np.ndarray | None,
    ) -> Solution | None:
        """Place the victims' jobs and the pending job again (pipelined), in job-queue order, on
        the nodes ``within`` (the attempt's feasible nodes; None: every node)."""
        ssn = self.ssn
        mark = stmt.checkpoint()
        victim_jobs = {t.job for t in victims}
        # KAI orders them with every pending job (a queue's next job decides its turn) and places only
        # them. The other jobs wait unchanged: their order is taken once per search, these join it.
        if not self._room_now() or not self.budget.spend():
            return None
        assert self._waiting is not None
        order = self._waiting.copy()
        relevant = [ssn.jobs[uid] for uid in victim_jobs | {job.uid} if uid in ssn.jobs]
        for j in relevant:
            order.remove(j)
            order.push(j)
        wanted = {j.uid for j in relevant}
        placed = False
        # Only the relevant jobs are placed, so nothing changes between two of them: the jobs
        # before each are popped past without placing (``pop_until``), not one pop each.
        while wanted:
            other = order.pop_until(wanted)
            if other is None:
                break
            wanted.discard(other.uid)
            if other.uid == job.uid:
                if not allocate_job(ssn, stmt, job, pending, pipeline_only=True, within=within):
                    stmt.rollback(mark)
                    return None
                placed = True
            else:
                tasks = tasks_to_allocate(other, ssn.task_order_fn, real=False)
                if not placed and self._retakes_room(other, tasks, within):
                    stmt.rollback(mark)  # (as below, without placing it)
                    return None
                inner = stmt.checkpoint()
                if not allocate_job(ssn, stmt, other, tasks, pipeline_only=True, within=within):
                    stmt.rollback(inner)
                elif not placed and not self._room_now():
                    stmt.rollback(mark)  # the victims placed again took the room it needed
                    return None
        if not placed:
            stmt.rollback(mark)
            return None
        evicted = [t for t in victims if t.status == TaskStatus.RELEASING]
        moved = [t for t in victims if t.status == TaskStatus.PIPELINED]
        if not self.validator(job, pending, candidates):
            stmt.rollback(mark)
            return None
        return Solution(stmt, evicted + moved)

    def _retakes_room(
        self, victim: JobInfo, tasks: list[TaskInfo], within: np.ndarray | None
    ) -> bool:
        """Shortcut: will placing ``victim`` now (before the pending job's turn) surely succeed and
        leave no room for the pending tasks (``_room_now`` false)? Then the simulation fails
        there, and it is given up without placing the victim. Told only for a victim whose tasks
        to place are alike (one shape, no GPU share), where nothing but resources and pod counts
        decide the nodes they fit (no task-scope predicate, every shape predicate a pod count --
        ``Predicate.counts`` -- and no topology): one placed on a node takes its request there and
        one pod, so if the nodes they fit now have room for all of them in all, the placement
        succeeds wherever the scores send each. (``tasks``: the victim's tasks to place;
        ``within``: the nodes it may take.)"""
        filters = self._filters
        if not self.pruning or filters is None or not tasks or not self._counts_only:
            return False
        ssn = self.ssn
        first = tasks[0]
        if first.gpu_fraction or any(t.shape_key != first.shape_key for t in tasks):
            return False
        if not ssn.job_over_capacity(victim, tasks).ok or ssn.node_sets(victim, tasks) is not None:
            return False
        rows, _ = ssn.evaluator.feasible(first, within)
        room = ssn.nodes.future_idle()
        if _room_for(ssn, first.resreq, rows, room) < len(tasks):
            return False
        return filters.refuses_after(first.resreq, len(tasks), rows, room)

    @cached_property
    def _counts_only(self) -> bool:
        """Nothing but resources and pod counts decides where a task fits (no task-scope
        predicate, every shape predicate a pod count): the session's, asked once."""
        evaluator = self.ssn.evaluator
        return not evaluator.predicates["task"] and all(
            p.counts == "pods" for p in evaluator.predicates["shape"]
        )

    def _reason(self, victim: TaskInfo, job: JobInfo) -> str:
        return f"{self.action}: evicted to make room for {job.uid}"


def feasible_nodes(ssn: Session, job: JobInfo) -> np.ndarray | None:
    """KAI's FeasibleNodesForJob, where a victim search may place (the pending job and the victims
    again): for a job every task of which asks for a GPU (whole or a share), the nodes with GPUs
    idle or being released, whole GPUs and shared ones' shares counted together (``_gpu_shares``)
    -- else every node (None). The search adds the nodes of the victims it evicts
    (``with_nodes_of``)."""
    nodes = ssn.nodes
    d = nodes.gpu_dim
    if d is None or not job.tasks:
        return None
    if any(t.resreq[d] <= 0 and not t.gpu_fraction for t in job.tasks.values()):
        return None
    idle = nodes.idle[:, d] / UNIT
    releasing = (nodes.releasing[:, d] - nodes.pipelined[:, d]) / UNIT
    for row, groups in enumerate(nodes.shared):
        for holders in groups.values():
            idle_share, releasing_share = _gpu_shares(holders)
            idle[row] += idle_share
            releasing[row] += releasing_share
    mask: np.ndarray = (idle > 0) | (releasing > 0)
    return mask


def _gpu_shares(holders: list[TaskInfo]) -> tuple[float, float]:
    """What a shared GPU adds to its node's idle and releasing GPUs in KAI (GetSumOfIdleGPUs,
    GetSumOfReleasingGPUs): the share its running and releasing tasks leave free, and its
    releasing tasks' share not yet promised to pipelined ones -- unless every task on it releases
    (then it is a whole GPU being released, in the node's GPU column already). KAI rounds each
    share taken up to a hundredth of a GPU."""
    running = releasing = pipelined = 0.0
    for t in holders:
        if t.status == TaskStatus.RELEASING:
            releasing += t.gpu_fraction
        elif t.status == TaskStatus.PIPELINED:
            pipelined += t.gpu_fraction
        else:
            running += t.gpu_fraction
    held = running + releasing
    idle = 1.0 - _hundredths_up(held) if held > 0 else 0.0
    leaving = releasing - pipelined
    all_releasing = running <= 0 and pipelined <= 0
    return idle, (_hundredths_up(leaving) if leaving > 0 and not all_releasing else 0.0)


def _hundredths_up(share: float) -> float:
    """``share`` rounded up to a hundredth (KAI's getGpuMemoryFractionalOnNode, on memory it
    holds in whole units; here a share 0.3 must stay 0.30 although 0.3 * 100 is not 30)."""
    return math.ceil(share * 100 - 1e-9) / 100


def with_nodes_of(
    ssn: Session, mask: np.ndarray | None, tasks: list[TaskInfo]
) -> np.ndarray | None:
    """``mask`` with the nodes ``tasks`` are on (a new mask; None stays None: every node)."""
    if mask is None:
        return None
    index = ssn.nodes.index
    rows = [index[t.node] for t in tasks if t.node is not None and t.node in index]
    if not rows:
        return mask
    out = mask.copy()
    out[rows] = True
    return out


def _room_for(
    ssn: Session, request: np.ndarray, rows: np.ndarray, room: np.ndarray | None = None
) -> float:
    """How many tasks asking ``request`` the ``rows`` hold in all, by resources (a fit allows the
    epsilon) and pod counts -- at most: rounding down, and counting a victim evicted from a node
    as holding its pod there (the pod-count predicate does not). ``room``: the nodes' future
    idle, if the caller has it."""
    nodes = ssn.nodes
    at = np.nonzero(rows)[0]
    if not len(at):
        return 0.0
    held = nodes.max_tasks[at] - nodes.task_count[at]
    asked = request > 0
    if asked.any():
        idle = nodes.future_idle(at) if room is None else room[at]
        room_at = idle[:, asked] + MIN_RESOURCE
        fits = np.floor(room_at / request[asked] - 1e-9).min(axis=1)
        held = np.minimum(held, fits)
    return float(np.maximum(held, 0.0).sum())


class _Candidates:
    """A step's candidate victims in the order they came, indexed by node and by job: what an
    attempt on one node evicts (every candidate of the jobs with candidates there) is gathered from
    those jobs' positions rather than by going through every candidate again."""

    def __init__(self) -> None:
        self.tasks: list[TaskInfo] = []
        self._jobs_on: dict[str, set[str]] = {}
        self._positions: dict[str, list[int]] = {}

    def add(self, tasks: list[TaskInfo]) -> None:
        for t in tasks:
            self._positions.setdefault(t.job, []).append(len(self.tasks))
            self.tasks.append(t)
            if t.node is not None:
                self._jobs_on.setdefault(t.node, set()).add(t.job)

    def of_jobs_on(self, node: str) -> list[TaskInfo]:
        """The candidates of the jobs with a candidate on ``node``, in the order they came."""
        jobs = self._jobs_on.get(node)
        if not jobs:
            return []
        positions = sorted(i for uid in jobs for i in self._positions[uid])
        return [self.tasks[i] for i in positions]


class FailedJobs:
    """KAI's minimal job representatives (session parameter ``useSchedulingSignatures``): once a
    job found no solution, a later job with the same scheduling constraints is skipped unless it is
    easier -- fewer pending tasks, or task by task (largest first) no larger and somewhere smaller."""

    def __init__(self, ssn: Session) -> None:
        self.enabled = flag(ssn.config.session, "useSchedulingSignatures", False)
        self.smallest: dict[tuple[object, ...], list[TaskInfo]] = {}

    @staticmethod
    def _key(job: JobInfo) -> tuple[object, ...]:
        return (
            job.queue,
            tuple(sorted({repr(t.static_key) for t in job.index[TaskStatus.PENDING].values()})),
        )

    @staticmethod
    def _requests(tasks: list[TaskInfo]) -> list[tuple[float, ...]]:
        return sorted((tuple(t.resreq.tolist()) + (t.gpu_fraction,) for t in tasks), reverse=True)

    def worth_trying(self, job: JobInfo) -> bool:
        if not self.enabled:
            return True
        known = self.smallest.get(self._key(job))
        mine = list(job.index[TaskStatus.PENDING].values())
        if known is None:
            return True
        if not mine or not known:
            return False
        if len(known) > len(mine):
            return True
        for a, b in zip(self._requests(mine), self._requests(known), strict=False):
            if all(x <= y for x, y in zip(a, b, strict=True)):
                if a != b:
                    return True
                continue
            return False
        return False

    def failed(self, job: JobInfo) -> None:
        if not self.enabled:
            return
        mine = list(job.index[TaskStatus.PENDING].values())
        known = self.smallest.get(self._key(job))
        if known is not None and (
            len(mine) > len(known)
            or not all(
                all(x <= y for x, y in zip(a, b, strict=True))
                for a, b in zip(self._requests(mine), self._requests(known), strict=False)
            )
        ):
            return
        self.smallest[self._key(job)] = mine


def solve_pending_jobs(
    ssn: Session,
    action: str,
    *,
    pending: Filters,
    may_try: Callable[[JobInfo], bool],
    victim_jobs: Callable[[JobInfo], list[JobInfo]],
    victim_filters: Filters,
    validator: Validator,
    moves_only: bool = False,
) -> None:
    """The loop consolidation, reclaim and preempt share: pending jobs in job-queue order, each one
    the action may try gets a victim search (a fresh solution start) over the victim queue of
    ``victim_jobs``; a solution is committed, a failure remembered (scheduling signatures).
    ``moves_only``: the validator accepts only solutions that place every victim again."""
    queue = JobsByQueue(ssn, depth=queue_depth(ssn, action)).fill(ssn.jobs.values(), pending)
    failed = FailedJobs(ssn)
    use_filters = flag(ssn.config.session, "scenarioFilters", True)
    budget = per_action(ssn, "simulationBudgetPerAction", action)
    pruning = flag(ssn.config.session, "solverPruning", True)
    while not queue.empty():
        job = queue.pop()
        if not failed.worth_trying(job) or job.uid in ssn.invalid_jobs or not may_try(job):
            continue
        ssn.solution_start()

        def victims(preemptor: JobInfo = job) -> JobsByQueue:
            return JobsByQueue(ssn, victims=True).fill(victim_jobs(preemptor), victim_filters)

        solver = JobSolver(
            ssn, validator, victims, action, use_filters, moves_only, Budget(budget), pruning
        )
        solved, stmt, _ = solver.solve(job)
        if solved and stmt is not None:
            stmt.commit()
        else:
            failed.failed(job)
