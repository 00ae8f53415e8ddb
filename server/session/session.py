"""Session: one scheduling cycle's consistent view of the cluster, and the extension points.

Opened from a ``ClusterSnapshot`` and a ``SchedulerConfig``; every plugin of the configured tiers
is built with its arguments and registers functions in ``on_session_open``; actions run against
the session; ``close`` lets plugins report (``on_session_close``) and produces the ``CycleResult``.
Every query of an extension point (``job_order_fn``, ``job_ready``, ``preemptable`` ...) runs the
point's combining function from the table in ``extension_points.py`` on the chain of the plugins
whose switch is on; the session adds only the order points' tie-breaks (noted in the table).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Literal, overload

import numpy as np

from muster.devices import Device
from muster.quantity import MIN_RESOURCE, from_canonical
from server.model import (
    ALLOCATED,
    ENDED,
    ClusterSnapshot,
    Condition,
    CycleResult,
    Explanation,
    JobOutcome,
    PodGroupPhase,
    TaskStatus,
)
from server.session.evaluator import NodeEvaluator
from server.session.extension_points import (
    POINTS,
    Chain,
    DeviceChoiceFn,
    EventHandler,
    EvictableFn,
    GpuOrderFn,
    Gradients,
    HyperNodeGradientFn,
    HyperNodeOrderFn,
    JobCapacityFn,
    JobCheckFn,
    JobCompareFn,
    JobKeyFn,
    JobNotifyFn,
    JobValidFn,
    NodeSetsFn,
    Predicates,
    QueueCheckFn,
    QueueCompareFn,
    QueueJobsCompareFn,
    QueueKeyFn,
    QueueTaskCheckFn,
    ScenarioCheckFn,
    Scorers,
    SolutionStartFn,
    TaskCompareFn,
    TaskKeyFn,
    ValidateResult,
    VictimQueueCompareFn,
    VictimTasksFns,
    VoteFn,
    combined,
)
from server.session.info import (
    JobInfo,
    NodeTable,
    QueueInfo,
    ResourceSpace,
    TaskInfo,
    has_constraints,
    job_phase_after,
    new_queue_infos,
)
from server.session.kai import new_group_name
from server.session.options import PluginOption, SchedulerConfig, SessionPlugin
from server.session.priority_queue import PriorityQueue
from server.session.statement import Statement

# Re-exported: plugins and tests have always found these here.
__all__ = ["EventHandler", "PriorityQueue", "Session", "ValidateResult"]


class Session:
    def __init__(
        self, snapshot: ClusterSnapshot, config: SchedulerConfig, cycle_id: int = 0
    ) -> None:
        self.cycle_id = cycle_id
        self.config = config
        self.priority_classes = {**config.priority_classes, **snapshot.priority_classes}
        self.snapshot = snapshot
        names: set[str] = set()
        for n in snapshot.nodes:
            names.update(n.allocatable)
            names.update(str(d.get("type", "")) for d in n.devices if d.get("type"))
        for j in snapshot.jobs:
            for t in j.tasks:
                names.update(t.request)
            if j.min_resources:
                names.update(j.min_resources)
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
                self._attach_existing(task, unnamed)
        for foreign in snapshot.foreign_tasks:
            self._attach_existing(TaskInfo(foreign, self.space), unnamed)
        for task, row in unnamed:
            self._give_existing_devices(task, row)
        self.nodes.count_unhealthy_as_used()
        self.total_resource = (
            self.nodes.allocatable.sum(axis=0) if len(self.nodes) else self.space.zeros()
        )
        self._ever_fits: dict[Any, bool] = {}  # shape key -> can_ever_fit
        self._constrained: list[TaskInfo] | None = None
        self.hypernodes = snapshot.hypernodes

        self.tiers: list[list[PluginOption]] = config.tiers
        self._fns: dict[str, dict[str, Any]] = {p: {} for p in POINTS}
        self.event_handlers: list[EventHandler] = []
        self.evaluator = NodeEvaluator(self.nodes, self.space)
        self.result = CycleResult(cycle_id=cycle_id)
        self.plugins: list[SessionPlugin] = []
        for tier in self.tiers:
            for option in tier:
                if option.plugin_class is None:
                    raise ValueError(
                        f"plugin option {option.name!r} was not resolved by the config parser"
                    )
                self.plugins.append(option.plugin_class(option.arguments))
        self._chains: dict[str, Chain[Any]] = {}
        # Per point: its combining function bound to its chain (vectorised points: the evaluator).
        self._combined: dict[str, Callable[..., Any]] = {}
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

    # The function a plugin registers has the point's signature (``extension_points.POINTS``).
    @overload
    def register(self, point: Literal["job_order"], plugin: str, fn: JobCompareFn) -> None: ...
    @overload
    def register(self, point: Literal["task_order"], plugin: str, fn: TaskCompareFn) -> None: ...
    @overload
    def register(self, point: Literal["job_order_key"], plugin: str, fn: JobKeyFn) -> None: ...
    @overload
    def register(self, point: Literal["task_order_key"], plugin: str, fn: TaskKeyFn) -> None: ...
    @overload
    def register(self, point: Literal["queue_order"], plugin: str, fn: QueueCompareFn) -> None: ...
    @overload
    def register(self, point: Literal["queue_order_key"], plugin: str, fn: QueueKeyFn) -> None: ...
    @overload
    def register(
        self, point: Literal["victim_queue_order"], plugin: str, fn: VictimQueueCompareFn
    ) -> None: ...
    @overload
    def register(
        self, point: Literal["job_ready", "job_starving"], plugin: str, fn: JobCheckFn
    ) -> None: ...
    @overload
    def register(
        self, point: Literal["allocatable", "preemptive"], plugin: str, fn: QueueTaskCheckFn
    ) -> None: ...
    @overload
    def register(self, point: Literal["predicate"], plugin: str, fn: Predicates) -> None: ...
    @overload
    def register(self, point: Literal["node_order"], plugin: str, fn: Scorers) -> None: ...
    @overload
    def register(self, point: Literal["job_valid"], plugin: str, fn: JobValidFn) -> None: ...
    @overload
    def register(
        self, point: Literal["job_pipelined", "job_enqueueable"], plugin: str, fn: VoteFn
    ) -> None: ...
    @overload
    def register(self, point: Literal["job_enqueued"], plugin: str, fn: JobNotifyFn) -> None: ...
    @overload
    def register(self, point: Literal["overused"], plugin: str, fn: QueueCheckFn) -> None: ...
    @overload
    def register(
        self, point: Literal["preemptable", "reclaimable"], plugin: str, fn: EvictableFn
    ) -> None: ...
    @overload
    def register(self, point: Literal["victim"], plugin: str, fn: VictimTasksFns) -> None: ...
    @overload
    def register(
        self, point: Literal["hypernode_gradient"], plugin: str, fn: HyperNodeGradientFn
    ) -> None: ...
    @overload
    def register(
        self, point: Literal["hypernode_order"], plugin: str, fn: HyperNodeOrderFn
    ) -> None: ...
    @overload
    def register(
        self, point: Literal["device_choice"], plugin: str, fn: DeviceChoiceFn
    ) -> None: ...
    @overload
    def register(
        self, point: Literal["queue_jobs_order"], plugin: str, fn: QueueJobsCompareFn
    ) -> None: ...
    @overload
    def register(
        self,
        point: Literal["job_over_capacity", "non_preemptible_over_quota"],
        plugin: str,
        fn: JobCapacityFn,
    ) -> None: ...
    @overload
    def register(self, point: Literal["can_reclaim"], plugin: str, fn: JobCheckFn) -> None: ...
    @overload
    def register(
        self, point: Literal["reclaim_scenario_valid"], plugin: str, fn: ScenarioCheckFn
    ) -> None: ...
    @overload
    def register(
        self, point: Literal["solution_start"], plugin: str, fn: SolutionStartFn
    ) -> None: ...
    @overload
    def register(self, point: Literal["gpu_order"], plugin: str, fn: GpuOrderFn) -> None: ...
    @overload
    def register(self, point: Literal["node_sets"], plugin: str, fn: NodeSetsFn) -> None: ...

    def register(self, point: str, plugin: str, fn: Any) -> None:
        if point not in POINTS:
            raise KeyError(f"unknown extension point {point!r} (known: {', '.join(POINTS)})")
        self._fns[point][plugin] = fn

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
            if not point.vectorised:
                self._combined[name] = combined(point, chain)
        self.evaluator.configure(self._chains["predicate"], self._chains["node_order"])
        self._device_choosers = any(self._chains["device_choice"])
        c = self._combined
        # The order points are asked hundreds of thousands of times a cycle: bound once.
        self._job_order, self._task_order, self._queue_order = (
            c["job_order"],
            c["task_order"],
            c["queue_order"],
        )

    def chain(self, point: str) -> Chain[Any]:
        return self._chains[point]

    def option(self, plugin: str) -> PluginOption | None:
        return self.config.plugin(plugin)

    # -- extension points: each the table's combining function over its chain ----------------------
    def job_order_compare(self, left: JobInfo, right: JobInfo) -> int:
        """Volcano ``JobOrderCompareFn``: the first non-zero plugin answer, 0 on a tie."""
        return self._job_order(left, right)

    # The order as sort keys: the plugins' keys in tier order, then the tie-breaks of the order
    # functions below (kept in step with them; tests/core/test_order_keys.py compares the two).
    def job_order_key(self) -> Callable[[JobInfo], tuple[Any, ...]] | None:
        """The job order as a sort key (the same order as ``job_order_fn``), or None when a plugin
        of the job_order chain gives no key."""
        if not _same_plugins(self._chains["job_order"], self._chains["job_order_key"]):
            return None
        keys = self._combined["job_order_key"]
        return lambda job: (keys(job), job.creation_index, job.uid)

    def task_order_key(self) -> Callable[[TaskInfo], tuple[Any, ...]] | None:
        """The task order as a sort key (the same order as ``task_order_fn``), or None."""
        if not _same_plugins(self._chains["task_order"], self._chains["task_order_key"]):
            return None
        keys = self._combined["task_order_key"]
        return lambda task: (keys(task), -task.priority, task.creation_index, task.uid)

    def queue_order_key(self) -> Callable[[QueueInfo], tuple[Any, ...]] | None:
        """The queue order as a sort key (the same order as ``queue_order_fn``), or None."""
        if not _same_plugins(self._chains["queue_order"], self._chains["queue_order_key"]):
            return None
        keys = self._combined["queue_order_key"]
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
        r = self._combined["victim_queue_order"](left, right, preemptor)
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
        r = self._combined["queue_jobs_order"](
            left, right, left_job, right_job, left_victims, right_victims
        )
        if r:
            return r < 0
        if left.creation_index != right.creation_index:
            return left.creation_index < right.creation_index
        return left.uid < right.uid

    def job_over_capacity(self, job: JobInfo, tasks: list[TaskInfo]) -> str:
        return self._combined["job_over_capacity"](job, tasks)

    def non_preemptible_over_quota(self, job: JobInfo, tasks: list[TaskInfo]) -> str:
        return self._combined["non_preemptible_over_quota"](job, tasks)

    def can_reclaim(self, job: JobInfo) -> bool:
        return self._combined["can_reclaim"](job)

    def reclaim_scenario_valid(
        self, job: JobInfo, tasks: list[TaskInfo], victims: list[TaskInfo]
    ) -> bool:
        return self._combined["reclaim_scenario_valid"](job, tasks, victims)

    def solution_start(self) -> None:
        self._combined["solution_start"]()

    def gpu_order(self, task: TaskInfo, row: int, group: str) -> float:
        return self._combined["gpu_order"](task, row, group)

    def node_sets(self, job: JobInfo, tasks: list[TaskInfo]) -> list[np.ndarray] | None:
        return self._combined["node_sets"](job, tasks)

    def job_ready(self, job: JobInfo) -> bool:
        return self._combined["job_ready"](job)

    def allocatable(self, queue: QueueInfo, task: TaskInfo) -> bool:
        return self._combined["allocatable"](queue, task)

    def preemptive(self, queue: QueueInfo, task: TaskInfo) -> bool:
        return self._combined["preemptive"](queue, task)

    def job_valid(self, job: JobInfo) -> ValidateResult | None:
        return self._combined["job_valid"](job)

    def job_pipelined(self, job: JobInfo) -> bool:
        return self._combined["job_pipelined"](job)

    def job_enqueueable(self, job: JobInfo) -> bool:
        return self._combined["job_enqueueable"](job)

    def job_enqueued(self, job: JobInfo) -> None:
        self._combined["job_enqueued"](job)

    def job_starving(self, job: JobInfo) -> bool:
        return self._combined["job_starving"](job)

    def overused(self, queue: QueueInfo) -> bool:
        return self._combined["overused"](queue)

    def preemptable(self, preemptor: TaskInfo, preemptees: list[TaskInfo]) -> list[TaskInfo]:
        return self._combined["preemptable"](preemptor, preemptees)

    def reclaimable(self, reclaimer: TaskInfo, reclaimees: list[TaskInfo]) -> list[TaskInfo]:
        return self._combined["reclaimable"](reclaimer, reclaimees)

    def victim_tasks(self, tasks: list[TaskInfo]) -> list[TaskInfo]:
        return self._combined["victim"](tasks)

    def hypernode_gradients(self, job: JobInfo) -> Gradients | None:
        """Where a job with a network topology may go: gradients of (hypernode, node mask); None
        when no plugin constrains the job."""
        return self._combined["hypernode_gradient"](job)

    def hypernode_order(self, job: JobInfo, candidates: dict[str, np.ndarray]) -> dict[str, float]:
        return self._combined["hypernode_order"](job, candidates)

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
            if job.phase == PodGroupPhase.PENDING:
                continue
            vr = self.job_valid(job)
            if vr is not None and not vr.passed:
                continue
            queue = self.queues.get(job.queue)
            if queue is not None:
                yield job, queue

    # -- state changes (used by Statement) ------------------------------------------------------
    def place_task(
        self, task: TaskInfo, node: str, status: TaskStatus, gpu_groups: list[str] | None = None
    ) -> None:
        job = self.jobs[task.job]
        job.update_task_status(task, status)
        task.node = node
        if gpu_groups is not None:
            task.gpu_groups = list(gpu_groups)
        row = self.nodes.index[node]
        if task.device_needs and not task.devices:
            task.devices = self.choose_devices(task, row, status)
        self.nodes.add_task(row, task)
        for h in self.event_handlers:
            if h.allocate:
                h.allocate(task)

    def lift_task(self, task: TaskInfo) -> None:
        """An evicted task leaves its node to be placed elsewhere (KAI moves victims): its node,
        GPU groups and device ids are let go; ``return_task`` undoes this."""
        assert task.node is not None
        self.nodes.remove_task(self.nodes.index[task.node], task)
        task.node = None
        task.gpu_groups = []
        task.devices = []

    def return_task(self, task: TaskInfo, node: str, status: TaskStatus) -> None:
        job = self.jobs[task.job]
        job.update_task_status(task, status)
        task.node = node
        rivals = self._rivals(task)
        self.nodes.add_task(self.nodes.index[node], task)
        self._take_back_devices(task, rivals)

    def unplace_task(self, task: TaskInfo, previous: TaskStatus) -> None:
        assert task.node is not None
        self.nodes.remove_task(self.nodes.index[task.node], task)
        task.last_tx_status = task.status
        self.jobs[task.job].update_task_status(task, previous)
        task.node = None
        task.devices = []
        if task.gpu_fraction:
            task.gpu_groups = []
        for h in self.event_handlers:
            if h.deallocate:
                h.deallocate(task)

    def change_status_on_node(self, task: TaskInfo, status: TaskStatus) -> None:
        """Evict / unevict: the task stays on its node with another status."""
        assert task.node is not None
        i = self.nodes.index[task.node]
        self.nodes.remove_task(i, task)
        job = self.jobs.get(task.job)
        releasing = status == TaskStatus.RELEASING
        if job is not None:
            job.update_task_status(task, status)
        else:
            task.status = status
        rivals = self._rivals(task)
        self.nodes.add_task(i, task)
        self._take_back_devices(task, rivals)
        for h in self.event_handlers:
            fn = h.deallocate if releasing else h.allocate
            if fn:
                fn(task)

    def _rivals(self, task: TaskInfo) -> tuple[list[TaskInfo], list[str]]:
        """Before a task takes its devices again (unevicted, a move undone): the pipelined tasks
        promised them while it was releasing, and the shared GPUs pipelined onto them."""
        if not task.devices or task.node is None or task.status == TaskStatus.RELEASING:
            return [], []
        row = self.nodes.index[task.node]
        promised, shared = self.nodes.devices.promised[row], self.nodes.shared[row]
        whole = {
            id(t): t for d in task.devices if (t := promised.get(d)) is not None and t is not task
        }
        groups = [
            d
            for d in task.devices
            if shared.get(d) and all(t.status == TaskStatus.PIPELINED for t in shared[d])
        ]
        return list(whole.values()), groups

    def _take_back_devices(self, task: TaskInfo, rivals: tuple[list[TaskInfo], list[str]]) -> None:
        """The rivals of a task that took its devices again take other ones."""
        whole, groups = rivals
        for other in whole:
            self.choose_devices_again(other)
        if groups:
            assert task.node is not None
            row = self.nodes.index[task.node]
            for name in groups:
                self._move_share(row, name)

    def _move_share(self, row: int, name: str) -> None:
        """The tasks of a pipelined shared GPU move to another GPU (one being released first)."""
        holders = list(self.nodes.shared[row].get(name, ()))
        for t in holders:
            self.nodes.remove_task(row, t)
        new = new_group_name(self.nodes, row, releasing=True)
        for t in holders:
            t.gpu_groups = [new]
            self.nodes.add_task(row, t)

    def dispatch_bind(self, task: TaskInfo) -> None:
        """Commit of an allocation: the task is Binding, and a bind decision is emitted. Allocated
        and Binding hold a node the same way, so the node arrays (and evaluation caches) stay."""
        self.jobs[task.job].update_task_status(task, TaskStatus.BINDING)
        self.result.binds[task.uid] = task.node  # type: ignore[assignment]
        if task.devices:
            self.result.bind_devices[task.uid] = list(task.devices)
        if task.gpu_groups:
            self.result.bind_gpu_groups[task.uid] = list(task.gpu_groups)

    def choose_devices_again(self, task: TaskInfo) -> None:
        """A placed task's device ids chosen anew for its status, and the name of a shared GPU it
        is alone on (an allocation turned pipelined must not keep free devices that a later
        allocation of the cycle would then find promised)."""
        assert task.node is not None
        row = self.nodes.index[task.node]
        if (
            task.gpu_fraction
            and task.gpu_groups
            and self.nodes.shared[row].get(task.gpu_groups[0]) == [task]
        ):
            self._move_share(row, task.gpu_groups[0])
        if task.devices:
            ledger = self.nodes.devices
            ledger.detach(row, task)
            task.devices = []
            task.devices = self.choose_devices(task, row, task.status)
            ledger.attach(row, task)

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
            ids = self._combined["device_choice"](task, row, resource, count, candidates)
            if ids is None:
                ids = [d.id for d in candidates[:count]]
            chosen += ids
        return chosen

    def release(self) -> None:
        """Drop everything the session holds, once its result is taken. Plugins' closures hold the
        session and the session holds them, so its ~10 objects per task form reference cycles:
        left alone they wait for the cycle collector, which traverses all of them inside a later
        cycle (98,000 objects, 45-110 ms at 10,000 tasks). Cut loose, reference counting frees
        them here, at once."""
        self.__dict__.clear()

    def dispatch_evict(self, task: TaskInfo, reason: str) -> None:
        self.result.evictions[task.uid] = reason

    def statement(self) -> Statement:
        return Statement(self)

    # -- closing ------------------------------------------------------------------------------
    def set_condition(self, job: JobInfo, type_: str, reason: str, message: str) -> None:
        job.conditions = [c for c in job.conditions if c[0] != type_] + [(type_, reason, message)]

    def close(self) -> CycleResult:
        for plugin in self.plugins:
            started = time.perf_counter()
            plugin.on_session_close(self)
            self.result.plugin_seconds[f"{plugin.name}.close"] = time.perf_counter() - started
        result = self.result
        for job in self.orphan_jobs:
            result.jobs[job.uid] = JobOutcome(
                job.phase, [], Explanation("queue", f"queue {job.queue!r} does not exist")
            )
        for job in self.orphan_jobs:
            for task in job.tasks.values():
                self._report_task(task)
        for job in self.jobs.values():
            invalid = self.invalid_jobs.get(job.uid)
            if invalid is not None:
                result.jobs[job.uid] = JobOutcome(
                    job.phase,
                    [Condition("Unschedulable", "True", invalid.reason, invalid.message)],
                    Explanation("gang", invalid.message),
                    job.schedule_state,
                    job.stage,
                )
                for task in job.tasks.values():
                    self._report_task(task)
                continue
            unschedulable = any(c[0] == "Unschedulable" for c in job.conditions)
            phase = job_phase_after(job, unschedulable)
            conditions = [Condition(t, "True", r, m) for t, r, m in job.conditions]
            explanation = self.explain(job, phase)
            if (
                explanation.gate != "none"
            ):  # the verdict of `muster explain` is in the condition too
                for c in conditions:
                    if c.type == "Unschedulable" and explanation.summary not in c.message:
                        head = c.message.rstrip(". ")
                        c.message = (
                            f"{head}. {explanation.summary}" if head else explanation.summary
                        )
            result.jobs[job.uid] = JobOutcome(
                phase, conditions, explanation, job.schedule_state, job.stage
            )
            for task in job.tasks.values():
                if task.status == TaskStatus.PIPELINED and task.node:
                    result.pipelined[task.uid] = task.node
                self._report_task(task)
        return result

    def _report_task(self, task: TaskInfo) -> None:
        """A task's status, node and device ids in the cycle's result."""
        node = task.node
        if node is None and task.status == TaskStatus.PENDING:
            node = (
                task.spec.node
            )  # a pending task's nominated node, reported as given (it holds nothing)
        self.result.task_status[task.uid] = (task.status, node)
        if task.devices and task.node is not None:
            self.result.task_devices[task.uid] = list(task.devices)
        if task.gpu_groups and task.node is not None:
            self.result.task_gpu_groups[task.uid] = list(task.gpu_groups)

    def can_ever_fit(self, task: TaskInfo) -> bool:
        """Would the task fit some node of this cluster if that node were empty? Cached per shape
        (static key and request): asked for every pending task of every waiting job at close."""
        known = self._ever_fits.get(task.shape_key)
        if known is None:
            fits = (self.nodes.allocatable >= task.resreq - MIN_RESOURCE).all(axis=1)
            known = self._ever_fits[task.shape_key] = bool(
                (self.evaluator.static_mask(task) & fits).any()
            )
        return known

    def never_fits_reason(self, task: TaskInfo) -> str:
        """Why a task fits no node even empty (like sbatch's "Requested node configuration is not
        available"): the resources no eligible node has enough of, with the largest there is."""
        eligible = self.evaluator.static_mask(task) if len(self.nodes) else np.zeros(0, dtype=bool)
        if not eligible.any():
            return (
                f"task {task.name} can never run on this cluster: no node passes its node selector, "
                "affinity and tolerations"
                if len(self.nodes)
                else f"task {task.name}: the cluster has no nodes"
            )
        largest = self.nodes.allocatable[eligible].max(axis=0)
        excluded = bool(
            ((self.nodes.allocatable >= task.resreq - MIN_RESOURCE).all(axis=1) & ~eligible).any()
        )
        short = [
            f"{self.space.dims[d]} {from_canonical(self.space.dims[d], task.resreq[d])} "
            f"(largest eligible node: {from_canonical(self.space.dims[d], largest[d])})"
            for d in range(self.space.size)
            if task.resreq[d] > largest[d] + MIN_RESOURCE
        ]
        if not short:  # no single resource is short, but no node has them all at once
            return f"task {task.name} can never run on this cluster: no node has all of its request at once"
        tail = (
            "; the nodes big enough are excluded by its node selector, affinity or tolerations"
            if excluded
            else ""
        )
        return f"task {task.name} can never run on this cluster: it asks " + ", ".join(short) + tail

    def explain(self, job: JobInfo, phase: PodGroupPhase) -> Explanation:
        queue = self.queues.get(job.queue)
        pending = job.index[TaskStatus.PENDING]
        if not pending or job.is_ready():
            return Explanation("none", "placed" if not pending else "gang is ready")
        if queue is None:
            return Explanation("queue", f"queue {job.queue!r} does not exist")
        if not queue.is_open():
            return Explanation("queue", f"queue {queue.name} is {queue.state}")
        if phase == PodGroupPhase.PENDING and job.enqueue_verdict:
            return Explanation("enqueue", job.enqueue_verdict)
        never = next((t for t in pending.values() if not self.can_ever_fit(t)), None)
        if never is not None:
            fe = job.fit_errors.get(never.uid) or job.explain_fit_errors.get(never.uid)
            reasons = dict(fe.reasons) if fe is not None else {}
            detail = f" ({fe.describe().rstrip('.')})" if fe is not None and fe.reasons else ""
            return Explanation("unsatisfiable", self.never_fits_reason(never) + detail, reasons)
        # Tasks that are placed, or were placed before the gang was discarded this cycle.
        fitting = job.ready_task_num() + sum(
            1 for t in pending.values() if t.last_tx_status in ALLOCATED
        )
        for errors in (job.fit_errors, job.explain_fit_errors):
            for uid in job.tasks:
                fe = errors.get(uid)
                if fe is None:
                    continue
                if fitting >= job.min_available:  # enough fit; a role's minimum is what fails
                    return Explanation(
                        "gang",
                        f"{fitting} tasks fit, but not the gang's role minimums "
                        f"({_role_minimums(job)}); the rest: {fe.describe()}",
                        dict(fe.reasons),
                    )
                if fitting:  # part of the gang fits: the gang rule, not the nodes, holds it back
                    return Explanation(
                        "gang",
                        f"{fitting} of the gang's {job.min_available} tasks fit; the rest: {fe.describe()}",
                        dict(fe.reasons),
                    )
                return Explanation("placement", fe.describe(), dict(fe.reasons))
        if job.job_fit_error:
            return Explanation("gang", job.job_fit_error)
        if job.queue_verdict:
            return Explanation("queue", job.queue_verdict)
        return Explanation("gang", job.fit_error())


def _role_minimums(job: JobInfo) -> str:
    return (
        ", ".join(f"{role}: {n}" for role, n in sorted(job.task_min_available.items()) if n > 0)
        or "none"
    )


def _same_plugins(chain: Chain[Any], keys: Chain[Any]) -> bool:
    return [[name for name, _ in row] for row in chain] == [
        [name for name, _ in row] for row in keys
    ]
