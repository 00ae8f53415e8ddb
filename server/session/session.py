"""Session: one scheduling cycle's consistent view of the cluster, and the extension points.

Opened from a ``ClusterSnapshot`` and a ``SchedulerConfig``; every plugin of the configured tiers
is built with its arguments and registers functions in ``on_session_open``; actions run against
the session and change where tasks are only through a ``Statement``; ``close`` lets plugins report
(``on_session_close``) and produces the ``CycleResult`` (``outcomes.report``: the job outcomes and
explanations, from what the cycle found). Every extension point is a row of the table in
``extension_points.py``; the rows named below as attributes (``job_ready = JOB_READY`` ...) are
asked as methods, each bound to the point's combining function over the chain of the plugins whose
switch is on. The session adds only the order points' tie-breaks (noted in the table) and keeps
the enqueue vote's verdict for the job's explanation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from muster.devices import Device
from server.model import ENDED, ClusterSnapshot, CycleResult, PodGroupPhase, TaskStatus, Window
from server.session.evaluator import NodeEvaluator
from server.session.extension_points import (
    ALLOCATABLE,
    CAN_RECLAIM,
    DEVICE_CHOICE,
    GPU_ORDER,
    HYPERNODE_GRADIENT,
    HYPERNODE_ORDER,
    JOB_ENQUEUEABLE,
    JOB_ENQUEUED,
    JOB_ORDER,
    JOB_ORDER_KEY,
    JOB_OVER_CAPACITY,
    JOB_PIPELINED,
    JOB_READY,
    JOB_SATISFIABLE,
    JOB_STARVING,
    JOB_VALID,
    NODE_SETS,
    NON_PREEMPTIBLE_OVER_QUOTA,
    OVERUSED,
    POINTS,
    PREEMPTABLE,
    PREEMPTIVE,
    QUEUE_JOBS_ORDER,
    QUEUE_ORDER,
    QUEUE_ORDER_KEY,
    RECLAIM_SCENARIO_VALID,
    RECLAIMABLE,
    SOLUTION_START,
    TASK_ORDER,
    TASK_ORDER_KEY,
    VICTIM,
    VICTIM_QUEUE_ORDER,
    Chain,
    EventHandler,
    Point,
    ValidateResult,
    combined,
)
from server.session.info import (
    JobInfo,
    NodeTable,
    QueueInfo,
    ResourceSpace,
    TaskInfo,
    has_constraints,
    new_queue_infos,
)
from server.session.options import PluginOption, SchedulerConfig, SessionPlugin, flag
from server.session.outcomes import Outcomes, report
from server.session.priority_queue import PriorityQueue
from server.session.shape_classes import SESSION_PARAMETER as SHAPE_CLASSES
from server.session.shape_classes import ShapeClasses
from server.session.statement import Statement

# Re-exported: plugins and tests have always found these here.
__all__ = ["EventHandler", "PriorityQueue", "Session", "ValidateResult"]

R = TypeVar("R")
_PENDING_PHASE = PodGroupPhase.PENDING  # bound once: read per job by every action


class Session:
    # The points asked as methods: each attribute is the table's row (which types it), bound per
    # session to the row's combining function over its chain (``_build_chains``).
    job_order_compare = JOB_ORDER  # Volcano ``JobOrderCompareFn``: the raw answer, 0 on a tie
    job_ready = JOB_READY
    allocatable = ALLOCATABLE
    preemptive = PREEMPTIVE
    job_valid = JOB_VALID
    job_enqueued = JOB_ENQUEUED
    job_starving = JOB_STARVING
    job_satisfiable = JOB_SATISFIABLE  # can its queues ever hold the job? (explanations)
    overused = OVERUSED
    preemptable = PREEMPTABLE
    reclaimable = RECLAIMABLE
    victim_tasks = VICTIM
    # Where a job with a network topology may go: gradients of (hypernode, node mask); None when
    # no plugin constrains the job.
    hypernode_gradients = HYPERNODE_GRADIENT
    hypernode_order = HYPERNODE_ORDER
    # KAI's points.
    job_over_capacity = JOB_OVER_CAPACITY
    non_preemptible_over_quota = NON_PREEMPTIBLE_OVER_QUOTA
    can_reclaim = CAN_RECLAIM
    reclaim_scenario_valid = RECLAIM_SCENARIO_VALID
    solution_start = SOLUTION_START
    gpu_order = GPU_ORDER
    node_sets = NODE_SETS
    # Asked through the methods below (tie-breaks, keys, votes kept), or by the session itself.
    _job_order = JOB_ORDER
    _task_order = TASK_ORDER
    _queue_order = QUEUE_ORDER
    _victim_queue_order = VICTIM_QUEUE_ORDER
    _queue_jobs_order = QUEUE_JOBS_ORDER
    _job_order_keys = JOB_ORDER_KEY
    _task_order_keys = TASK_ORDER_KEY
    _queue_order_keys = QUEUE_ORDER_KEY
    _job_pipelined = JOB_PIPELINED
    _job_enqueueable = JOB_ENQUEUEABLE
    device_choice = DEVICE_CHOICE

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        config: SchedulerConfig,
        cycle_id: int = 0,
        window: Window | None = None,
    ) -> None:
        self.cycle_id = cycle_id
        # What the session opened of each queue (server.session.window): the waiting jobs past a
        # queue's window still count for its share (proportion, capacity, overcommit).
        self.window = window if window is not None else Window()
        self.config = config
        # The time the cycle plans from (reservations, start estimates): the snapshot's, else now.
        self.now: float = snapshot.now if snapshot.now is not None else time.time()
        # The action running now (set by ``SchedulerCore``; "" outside it).
        self.action = ""
        self.priority_classes = {**config.priority_classes, **snapshot.priority_classes}
        self.snapshot = snapshot
        names: set[str] = set()
        for n in snapshot.nodes:
            names.update(n.allocatable)
            if n.devices:
                names.update(str(d.get("type", "")) for d in n.devices if d.get("type"))
        for j in snapshot.jobs:
            names.update(*[t.request for t in j.tasks])  # one call per job, not per task
            if j.min_resources:
                names.update(j.min_resources)
        for past in self.window.beyond.values():
            names.update(past.request)
            names.update(past.inqueue)
        self.space = ResourceSpace(names)
        self.nodes = NodeTable(snapshot.nodes, self.space)
        self.queues: dict[str, QueueInfo] = new_queue_infos(snapshot.queues, self.space)
        self.jobs: dict[str, JobInfo] = {}
        self.tasks: dict[str, TaskInfo] = {}
        # Volcano's snapshot leaves out jobs whose queue does not exist; they are reported, not scheduled.
        self.orphan_jobs: list[JobInfo] = []
        for spec in snapshot.jobs:
            job = JobInfo(spec, self.space)
            if job.queue not in self.queues:
                self.orphan_jobs.append(job)
                continue
            self.jobs[job.uid] = job
            self.tasks.update(job.tasks)
        # Tasks holding nodes hold them whatever their job's fate (orphans included).
        # Holders that name no device ids get the lowest free ones, in snapshot order, once every
        # holder that names its ids has them.
        unnamed: list[tuple[TaskInfo, int]] = []
        for job in (*self.jobs.values(), *self.orphan_jobs):
            for task in job.tasks.values():
                if task.node is not None:  # (a pending task holds none: most, not asked)
                    self._attach_existing(task, unnamed)
        for foreign in snapshot.foreign_tasks:
            self._attach_existing(TaskInfo(foreign, self.space), unnamed)
        for task, row in unnamed:
            self._give_existing_devices(task, row)
        self.nodes.count_unhealthy_as_used()
        self.total_resource = (
            self.nodes.allocatable.sum(axis=0) if len(self.nodes) else self.space.zeros()
        )
        self._constrained: list[TaskInfo] | None = None
        self.hypernodes = snapshot.hypernodes

        self.tiers: list[list[PluginOption]] = config.tiers
        self._fns: dict[str, dict[str, Any]] = {p: {} for p in POINTS}
        self.event_handlers: list[EventHandler] = []
        self.evaluator = NodeEvaluator(self.nodes, self.space)
        self.result = CycleResult(cycle_id=cycle_id)
        self.outcomes = Outcomes()  # what the cycle finds about each job, for its report
        # Job shapes that found no room this cycle, until resources come back (allocate skips
        # later jobs of the shape; statements say when resources come back).
        self.shape_classes = ShapeClasses(flag(config.session, SHAPE_CLASSES, True))
        self.plugins: list[SessionPlugin] = []
        for tier in self.tiers:
            for option in tier:
                if option.plugin_class is None:
                    raise ValueError(
                        f"plugin option {option.name!r} was not resolved by the config parser"
                    )
                self.plugins.append(option.plugin_class(option.arguments))
        self._chains: dict[str, Chain[Any]] = {}
        for plugin in self.plugins:
            started = time.perf_counter()
            plugin.on_session_open(self)
            self.result.plugin_seconds[f"{plugin.name}.open"] = time.perf_counter() - started
        self._build_chains()
        # Volcano keeps invalid jobs in the session (enqueue may still admit them); each action
        # skips them through job_valid, and they close with the validation's Unschedulable reason.
        self.invalid_jobs: dict[str, ValidateResult] = {}
        for uid, job in self.jobs.items():
            vr = self.job_valid(job)
            if vr is not None and not vr.passed:
                self.invalid_jobs[uid] = vr
        # A plugin that plans over the complete session (chains built, invalid jobs known) before
        # any action changes it has ``on_session_ready`` (the reservation plugin).
        for plugin in self.plugins:
            ready = getattr(plugin, "on_session_ready", None)
            if ready is not None:
                started = time.perf_counter()
                ready(self)
                self.result.plugin_seconds[f"{plugin.name}.ready"] = time.perf_counter() - started

    # -- building ---------------------------------------------------------------------------
    def _attach_existing(self, task: TaskInfo, unnamed: list[tuple[TaskInfo, int]]) -> None:
        """A task that already holds a node at snapshot time (running, binding, releasing ...);
        one that needs device ids but names none goes to ``unnamed``."""
        if task.node is None or task.status == TaskStatus.PENDING or task.status in ENDED:
            return
        i = self.nodes.index.get(task.node)
        if i is not None:
            self.nodes.add_task(i, task)
            if task.device_needs and not task.devices:
                unnamed.append((task, i))

    def _give_existing_devices(self, task: TaskInfo, i: int) -> None:
        ledger = self.nodes.devices
        for resource, count in task.device_needs.items():
            task.devices += [d.id for d in ledger.free(i, resource, count)]
        ledger.attach(i, task)

    def register(self, point: Point[R, Any], plugin: str, fn: R) -> None:
        """``plugin``'s function for ``point``: a row of the table, whose first type argument types
        ``fn``. (Tests that build registrations from tables of names may name the row.)"""
        name = point if isinstance(point, str) else point.name
        if name not in POINTS or not (isinstance(point, str) or POINTS[name] is point):
            raise KeyError(f"unknown extension point {point!r} (known: {', '.join(POINTS)})")
        self._fns[name][plugin] = fn

    def add_event_handler(self, handler: EventHandler) -> None:
        self.event_handlers.append(handler)

    def _build_chains(self) -> None:
        for name, point in POINTS.items():
            chain: Chain[Any] = []
            for tier in self.tiers:
                row = []
                for option in tier:
                    fn = self._fns[name].get(option.name)
                    if fn is None:
                        continue
                    if point.switch is not None and not option.enabled(point.switch.name):
                        continue
                    row.append((option.name, fn))
                chain.append(row)
            self._chains[name] = chain
        # Each point asked as a method, bound once (instance attributes shadow the rows): the
        # order points are asked hundreds of thousands of times a cycle.
        answers: dict[str, Any] = {}
        for attr, point in _ASKED:
            answer = answers.get(point.name)
            if answer is None:
                answer = answers[point.name] = combined(point, self._chains[point.name])
            self.__dict__[attr] = answer
        self.evaluator.configure(self._chains["predicate"], self._chains["node_order"])
        self._device_choosers = any(self._chains["device_choice"])

    def chain(self, point: str) -> Chain[Any]:
        return self._chains[point]

    def option(self, plugin: str) -> PluginOption | None:
        return self.config.plugin(plugin)

    # -- the points asked with the session's own additions -----------------------------------------
    # The order as sort keys: the plugins' keys in tier order, then the tie-breaks of the order
    # functions below (kept in step with them; tests/core/test_order_keys.py compares the two).
    def job_order_key(self) -> Callable[[JobInfo], tuple[Any, ...]] | None:
        """The job order as a sort key (the same order as ``job_order_fn``), or None when a plugin
        of the job_order chain gives no key."""
        if not _same_plugins(self._chains["job_order"], self._chains["job_order_key"]):
            return None
        keys = self._job_order_keys
        return lambda job: (keys(job), job.creation_index, job.uid)

    def task_order_key(self) -> Callable[[TaskInfo], tuple[Any, ...]] | None:
        """The task order as a sort key (the same order as ``task_order_fn``), or None."""
        if not _same_plugins(self._chains["task_order"], self._chains["task_order_key"]):
            return None
        keys = self._task_order_keys
        return lambda task: (keys(task), -task.priority, task.creation_index, task.uid)

    def queue_order_key(self) -> Callable[[QueueInfo], tuple[Any, ...]] | None:
        """The queue order as a sort key (the same order as ``queue_order_fn``), or None."""
        if not _same_plugins(self._chains["queue_order"], self._chains["queue_order_key"]):
            return None
        keys = self._queue_order_keys
        return lambda queue: (keys(queue), queue.creation_index, queue.uid)

    # The order points' tie-breaks (Volcano's defaults when no plugin decides), written out here
    # rather than called: these run hundreds of thousands of times a cycle.
    def job_order_fn(self, left: JobInfo, right: JobInfo) -> bool:
        r = self._job_order(left, right)
        if r:
            return r < 0
        # Ties: creation order, then uid.
        if left.creation_index != right.creation_index:
            return left.creation_index < right.creation_index
        return left.uid < right.uid

    def queue_order_fn(self, left: QueueInfo, right: QueueInfo) -> bool:
        r = self._queue_order(left, right)
        if r:
            return r < 0
        # Ties: creation order, then uid.
        if left.creation_index != right.creation_index:
            return left.creation_index < right.creation_index
        return left.uid < right.uid

    def victim_queue_order_fn(
        self, left: QueueInfo, right: QueueInfo, preemptor: QueueInfo | None
    ) -> bool:
        r = self._victim_queue_order(left, right, preemptor)
        if r:
            return r < 0
        return not self.queue_order_fn(left, right)

    def task_order_fn(self, left: TaskInfo, right: TaskInfo) -> bool:
        r = self._task_order(left, right)
        if r:
            return r < 0
        # Ties: Volcano helpers.CompareTask: higher pod priority first, then creation order, then uid.
        if left.priority != right.priority:
            return left.priority > right.priority
        if left.creation_index != right.creation_index:
            return left.creation_index < right.creation_index
        return left.uid < right.uid

    # -- KAI's points ---------------------------------------------------------------------------
    def queue_jobs_order(
        self,
        left: QueueInfo,
        right: QueueInfo,
        left_job: JobInfo | None,
        right_job: JobInfo | None,
        left_victims: list[JobInfo],
        right_victims: list[JobInfo],
    ) -> bool:
        """Does ``left`` go first? The plugins' answer; ties: creation order, then name."""
        r = self._queue_jobs_order(left, right, left_job, right_job, left_victims, right_victims)
        if r:
            return r < 0
        if left.creation_index != right.creation_index:
            return left.creation_index < right.creation_index
        return left.uid < right.uid

    def job_pipelined(self, job: JobInfo) -> bool:
        return bool(self._job_pipelined(job))

    def job_enqueueable(self, job: JobInfo) -> bool:
        """The enqueue vote; its verdict (why a job is not admitted) is kept for the job's report."""
        verdict = self._job_enqueueable(job)
        self.outcomes.enqueue_answered(job, verdict)
        return verdict.ok

    # -- victims (Volcano ``Session.BuildVictimsPriorityQueue``) -----------------------------------
    def victims_queue(self, victims: list[TaskInfo], preemptor: TaskInfo) -> PriorityQueue:
        """The victims in eviction order: the first popped is evicted first.

        Same job: reverse task order. A task whose job left the session goes first. Different
        queues (preemptor job known): the victim queue order. Otherwise: reverse job order, then
        reverse task order."""
        jobs = self.jobs
        preemptor_job = jobs.get(preemptor.job)

        def job_then_task(lj: JobInfo, rj: JobInfo, left: TaskInfo, right: TaskInfo) -> bool:
            cmp = self.job_order_compare(lj, rj)
            if cmp != 0:
                return cmp > 0
            return not self.task_order_fn(left, right)

        def less(left: TaskInfo, right: TaskInfo) -> bool:
            if left.job == right.job:
                return not self.task_order_fn(left, right)
            lj, rj = jobs.get(left.job), jobs.get(right.job)
            if lj is None or rj is None:
                if lj is None and rj is None:
                    return not self.task_order_fn(left, right)
                return lj is None
            if preemptor_job is None:
                return job_then_task(lj, rj, left, right)
            if lj.queue != rj.queue:
                return self.victim_queue_order_fn(
                    self.queues[lj.queue],
                    self.queues[rj.queue],
                    self.queues.get(preemptor_job.queue),
                )
            return job_then_task(lj, rj, left, right)

        return PriorityQueue(less, victims)

    def constrained_tasks(self) -> list[TaskInfo]:
        """The session's tasks with a node selector, tolerations or an affinity: what plugins scan
        at open to learn whether pod affinity is used at all (most tasks carry none)."""
        if self._constrained is None:
            self._constrained = [t for t in self.tasks.values() if has_constraints(t)]
        return self._constrained

    # -- job selection shared by actions ---------------------------------------------------------
    def admitted_jobs(self) -> Iterator[tuple[JobInfo, QueueInfo]]:
        """Jobs past enqueue (not Pending) that pass job_valid, with their queue: what backfill,
        preempt and reclaim work on (Volcano repeats this filter in each of them)."""
        for job in list(self.jobs.values()):
            if job.phase == _PENDING_PHASE:
                continue
            vr = self.job_valid(job)
            if vr is not None and not vr.passed:
                continue
            queue = self.queues.get(job.queue)
            if queue is not None:
                yield job, queue

    def choose_devices(self, task: TaskInfo, row: int, status: TaskStatus) -> list[str]:
        """Device ids for a task placed on ``row`` with ``status``: per device resource, the
        ``device_choice`` point's answer, else the first candidates (the lowest free ids)."""
        ledger = self.nodes.devices
        chosen: list[str] = []
        for resource, count in task.device_needs.items():
            if not self._device_choosers:  # the first candidates: found without listing the rest
                chosen += [d.id for d in ledger.candidates(row, resource, status, count)]
                continue
            candidates: list[Device] = ledger.candidates(row, resource, status)
            ids = self.device_choice(task, row, resource, count, candidates)
            if ids is None:
                ids = [d.id for d in candidates[:count]]
            chosen += ids
        return chosen

    def statement(self) -> Statement:
        return Statement(self)

    def close(self) -> CycleResult:
        for plugin in self.plugins:
            started = time.perf_counter()
            plugin.on_session_close(self)
            self.result.plugin_seconds[f"{plugin.name}.close"] = time.perf_counter() - started
        return report(self)

    def release(self) -> None:
        """Cut the session out of the reference cycles it is in, once its result is taken.
        Plugins' functions hold the session (closures, bound methods) and the session holds them:
        the plugins, their registrations and the chains of them, the points bound to those, the
        event handlers, the evaluator with their predicates and scorers. Left alone, these cycles
        and the ~10 objects per task they reach wait for the cycle collector, which traverses all
        of them inside a later cycle (98,000 objects, 45-110 ms at 10,000 tasks). Cut here,
        reference counting frees the session and everything it holds once the last reference from
        outside goes; its data (jobs, nodes, result) stay readable until then, its points cannot
        be asked. This needs plugins that form no cycle of their own (a recursive closure holds
        itself, and with it the plugin and the session): tests/core/test_cycle_memory.py checks
        that a cycle leaves no garbage for the collector."""
        for attr, _ in _ASKED:  # the points asked as methods: the class's rows again
            self.__dict__.pop(attr, None)
        self.plugins = []
        self._fns = {}
        self._chains = {}
        self.event_handlers = []
        del self.evaluator


# The rows named on the session, asked as its methods once bound (``Session._build_chains``).
_ASKED: tuple[tuple[str, Point[Any, Any]], ...] = tuple(
    (attr, row) for attr, row in vars(Session).items() if isinstance(row, Point)
)


def _same_plugins(chain: Chain[Any], keys: Chain[Any]) -> bool:
    return [[name for name, _ in row] for row in chain] == [
        [name for name, _ in row] for row in keys
    ]
