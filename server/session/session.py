"""Session: one scheduling cycle's consistent view of the cluster, and the extension points.

Opened from a ``ClusterSnapshot`` and a ``SchedulerConfig``; every plugin of the configured tiers
is built with its arguments and registers functions in ``on_session_open``; actions run against
the session; ``close`` lets plugins report (``on_session_close``) and produces the ``CycleResult``.
The combination rule of each extension point is declared in ``extension_points.py``.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.config import PluginOption, SchedulerConfig
from server.model import (
    ALLOCATED,
    ClusterSnapshot,
    Condition,
    CycleResult,
    Explanation,
    JobOutcome,
    PodGroupPhase,
    TaskStatus,
)
from server.session.evaluator import NodeEvaluator
from server.session.extension_points import POINTS
from server.session.info import (
    JobInfo,
    NodeTable,
    QueueInfo,
    ResourceSpace,
    TaskInfo,
    job_phase_after,
    new_queue_infos,
)
from server.session.statement import Statement


@dataclass
class ValidateResult:
    passed: bool
    reason: str = ""
    message: str = ""


@dataclass
class EventHandler:
    allocate: Callable[[TaskInfo], None] | None = None
    deallocate: Callable[[TaskInfo], None] | None = None



class PriorityQueue:
    """A heap ordered by a ``less(l, r)`` function (Volcano ``util.PriorityQueue``)."""

    __slots__ = ("_heap", "_less", "_seq")

    class _Item:
        __slots__ = ("value", "less", "seq")

        def __init__(self, value: Any, less: Callable[[Any, Any], bool], seq: int) -> None:
            self.value, self.less, self.seq = value, less, seq

        def __lt__(self, other: PriorityQueue._Item) -> bool:
            if self.less(self.value, other.value):
                return True
            if self.less(other.value, self.value):
                return False
            return self.seq < other.seq

    def __init__(self, less: Callable[[Any, Any], bool], items: Iterable[Any] = ()) -> None:
        self._less = less
        self._seq = 0
        self._heap: list[PriorityQueue._Item] = []
        for it in items:
            self.push(it)

    def push(self, value: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, PriorityQueue._Item(value, self._less, self._seq))

    def pop(self) -> Any:
        return heapq.heappop(self._heap).value

    def empty(self) -> bool:
        return not self._heap

    def __len__(self) -> int:
        return len(self._heap)


class Session:
    def __init__(self, snapshot: ClusterSnapshot, config: SchedulerConfig, cycle_id: int = 0) -> None:
        from server.plugins import PLUGINS

        self.cycle_id = cycle_id
        self.config = config
        self.priority_classes = {**config.priority_classes, **snapshot.priority_classes}
        self.snapshot = snapshot
        names: set[str] = set()
        for n in snapshot.nodes:
            names.update(n.allocatable)
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
        for job in (*self.jobs.values(), *self.orphan_jobs):
            for task in job.tasks.values():
                self._attach_existing(task)
        for foreign in snapshot.foreign_tasks:
            self._attach_existing(TaskInfo(foreign, self.space))
        self.total_resource = self.nodes.allocatable.sum(axis=0) if len(self.nodes) else self.space.zeros()
        self.hypernodes = snapshot.hypernodes

        self.tiers: list[list[PluginOption]] = config.tiers
        self._fns: dict[str, dict[str, Any]] = {p: {} for p in POINTS}
        self.event_handlers: list[EventHandler] = []
        self.evaluator = NodeEvaluator(self)
        self.result = CycleResult(cycle_id=cycle_id)
        self.plugins = []
        for tier in self.tiers:
            for option in tier:
                plugin = PLUGINS[option.name](option.arguments)
                self.plugins.append(plugin)
        self._chains: dict[str, list[list[tuple[str, Any]]]] = {}
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
    def _attach_existing(self, task: TaskInfo) -> None:
        """A task that already holds a node at snapshot time (running, binding, releasing ...)."""
        if task.node is None or task.status in (TaskStatus.PENDING, TaskStatus.SUCCEEDED, TaskStatus.FAILED):
            return
        i = self.nodes.index.get(task.node)
        if i is not None:
            self.nodes.add_task(i, task)

    def register(self, point: str, plugin: str, fn: Any) -> None:
        if point not in POINTS:
            raise KeyError(f"unknown extension point {point!r}")
        self._fns[point][plugin] = fn

    def add_event_handler(self, handler: EventHandler) -> None:
        self.event_handlers.append(handler)

    def _build_chains(self) -> None:
        for name, point in POINTS.items():
            chain: list[list[tuple[str, Any]]] = []
            for tier in self.tiers:
                row = []
                for option in tier:
                    fn = self._fns[name].get(option.name)
                    if fn is None:
                        continue
                    if point.switch is not None and not option.enabled(point.switch):
                        continue
                    row.append((option.name, fn))
                chain.append(row)
            self._chains[name] = chain
        self.evaluator.configure(self._chains["predicate"], self._chains["node_order"])

    def chain(self, point: str) -> list[list[tuple[str, Any]]]:
        return self._chains[point]

    def option(self, plugin: str) -> PluginOption | None:
        return self.config.plugin(plugin)

    # -- order functions: first non-zero wins ----------------------------------------------
    def _compare(self, point: str, left: Any, right: Any) -> int:
        for row in self._chains[point]:
            for _, fn in row:
                r = fn(left, right)
                if r:
                    return r
        return 0

    def job_order_compare(self, left: JobInfo, right: JobInfo) -> int:
        """Volcano ``JobOrderCompareFn``: the first non-zero plugin answer, 0 on a tie."""
        return self._compare("job_order", left, right)

    def job_order_fn(self, left: JobInfo, right: JobInfo) -> bool:
        r = self._compare("job_order", left, right)
        if r:
            return r < 0
        if left.creation_index != right.creation_index:
            return left.creation_index < right.creation_index
        return left.uid < right.uid

    def queue_order_fn(self, left: QueueInfo, right: QueueInfo) -> bool:
        r = self._compare("queue_order", left, right)
        if r:
            return r < 0
        if left.creation_index != right.creation_index:
            return left.creation_index < right.creation_index
        return left.uid < right.uid

    def victim_queue_order_fn(self, left: QueueInfo, right: QueueInfo, preemptor: Any) -> bool:
        for row in self._chains["victim_queue_order"]:
            for _, fn in row:
                r = fn(left, right, preemptor)
                if r:
                    return r < 0
        return not self.queue_order_fn(left, right)

    def task_order_fn(self, left: TaskInfo, right: TaskInfo) -> bool:
        r = self._compare("task_order", left, right)
        if r:
            return r < 0
        # Volcano helpers.CompareTask: higher pod priority first, then creation order, then uid.
        if left.priority != right.priority:
            return left.priority > right.priority
        if left.creation_index != right.creation_index:
            return left.creation_index < right.creation_index
        return left.uid < right.uid

    # -- all must pass ------------------------------------------------------------------------
    def _all(self, point: str, *args: Any) -> bool:
        for row in self._chains[point]:
            for _, fn in row:
                if not fn(*args):
                    return False
        return True

    def job_ready(self, job: JobInfo) -> bool:
        return self._all("job_ready", job)

    def allocatable(self, queue: QueueInfo, task: TaskInfo) -> bool:
        return self._all("allocatable", queue, task)

    def preemptive(self, queue: QueueInfo, task: TaskInfo) -> bool:
        return self._all("preemptive", queue, task)

    def job_valid(self, job: JobInfo) -> ValidateResult | None:
        for row in self._chains["job_valid"]:
            for _, fn in row:
                vr = fn(job)
                if vr is not None and not vr.passed:
                    return vr
        return None

    # -- votes --------------------------------------------------------------------------------
    def _vote(self, point: str, job: JobInfo) -> bool:
        for row in self._chains[point]:
            permitted = False
            for _, fn in row:
                r = fn(job)
                if r < 0:
                    return False
                if r > 0:
                    permitted = True
            if permitted:
                return True
        return True

    def job_pipelined(self, job: JobInfo) -> bool:
        return self._vote("job_pipelined", job)

    def job_enqueueable(self, job: JobInfo) -> bool:
        return self._vote("job_enqueueable", job)

    def job_enqueued(self, job: JobInfo) -> None:
        for row in self._chains["job_enqueued"]:
            for _, fn in row:
                fn(job)

    def job_starving(self, job: JobInfo) -> bool:
        for row in self._chains["job_starving"]:
            if row:
                return all(fn(job) for _, fn in row)
        return False

    def overused(self, queue: QueueInfo) -> bool:
        return any(fn(queue) for row in self._chains["overused"] for _, fn in row)

    # -- victims ------------------------------------------------------------------------------
    def _victims(self, point: str, evictor: TaskInfo, candidates: list[TaskInfo]) -> list[TaskInfo]:
        victims: list[TaskInfo] | None = None
        for row in self._chains[point]:
            for _, fn in row:
                chosen, verdict = fn(evictor, candidates)
                if verdict == 0:
                    continue
                if not chosen:
                    victims = None
                    break
                if victims is None:
                    victims = list(chosen)
                else:
                    keep = {t.uid for t in chosen}
                    # Volcano: an empty intersection is nil again, so the next plugin of the
                    # tier starts afresh and an all-empty tier falls through to the next tier.
                    victims = [v for v in victims if v.uid in keep] or None
            if victims is not None:
                return victims
        return victims or []

    def preemptable(self, preemptor: TaskInfo, preemptees: list[TaskInfo]) -> list[TaskInfo]:
        return self._victims("preemptable", preemptor, preemptees)

    def reclaimable(self, reclaimer: TaskInfo, reclaimees: list[TaskInfo]) -> list[TaskInfo]:
        return self._victims("reclaimable", reclaimer, reclaimees)

    def victim_tasks(self, tasks: list[TaskInfo]) -> list[TaskInfo]:
        for row in self._chains["victim"]:
            found: dict[str, TaskInfo] = {}
            for _, fns in row:
                for fn in fns if isinstance(fns, list) else [fns]:
                    for v in fn(tasks):
                        found[v.uid] = v
            if found:
                return list(found.values())
        return []

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

    # -- hypernodes ----------------------------------------------------------------------------
    def hypernode_gradients(self, job: JobInfo) -> list[list[tuple[str, np.ndarray]]] | None:
        """Where a job with a network topology may go: gradients of (hypernode, node mask); None
        when no plugin constrains the job."""
        for row in self._chains["hypernode_gradient"]:
            for _, fn in row:
                return fn(job)
        return None

    def hypernode_order(self, job: JobInfo, candidates: dict[str, np.ndarray]) -> dict[str, float]:
        scores = dict.fromkeys(candidates, 0.0)
        for row in self._chains["hypernode_order"]:
            for _, fn in row:
                for name, value in fn(job, candidates).items():
                    scores[name] += value
        return scores

    # -- state changes (used by Statement) ------------------------------------------------------
    def place_task(self, task: TaskInfo, node: str, status: TaskStatus) -> None:
        job = self.jobs[task.job]
        job.update_task_status(task, status)
        task.node = node
        self.nodes.add_task(self.nodes.index[node], task)
        for h in self.event_handlers:
            if h.allocate:
                h.allocate(task)

    def unplace_task(self, task: TaskInfo, previous: TaskStatus) -> None:
        assert task.node is not None
        self.nodes.remove_task(self.nodes.index[task.node], task)
        task.last_tx_status = task.status
        self.jobs[task.job].update_task_status(task, previous)
        task.node = None
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
        self.nodes.add_task(i, task)
        for h in self.event_handlers:
            fn = h.deallocate if releasing else h.allocate
            if fn:
                fn(task)

    def dispatch_bind(self, task: TaskInfo) -> None:
        """Commit of an allocation: the task is Binding, and a bind decision is emitted. Allocated
        and Binding hold a node the same way, so the node arrays (and evaluation caches) stay."""
        self.jobs[task.job].update_task_status(task, TaskStatus.BINDING)
        self.result.binds[task.uid] = task.node  # type: ignore[assignment]

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
                result.task_status[task.uid] = (task.status, task.node)
        for job in self.jobs.values():
            invalid = self.invalid_jobs.get(job.uid)
            if invalid is not None:
                result.jobs[job.uid] = JobOutcome(
                    job.phase,
                    [Condition("Unschedulable", "True", invalid.reason, invalid.message)],
                    Explanation("gang", invalid.message),
                )
                for task in job.tasks.values():
                    result.task_status[task.uid] = (task.status, task.node)
                continue
            unschedulable = any(c[0] == "Unschedulable" for c in job.conditions)
            phase = job_phase_after(job, unschedulable)
            conditions = [Condition(t, "True", r, m) for t, r, m in job.conditions]
            explanation = self.explain(job, phase)
            if explanation.gate != "none":  # the verdict of `muster explain` is in the condition too
                for c in conditions:
                    if c.type == "Unschedulable" and explanation.summary not in c.message:
                        c.message = f"{c.message}. {explanation.summary}" if c.message else explanation.summary
            result.jobs[job.uid] = JobOutcome(phase, conditions, explanation)
            for task in job.tasks.values():
                if task.status == TaskStatus.PIPELINED and task.node:
                    result.pipelined[task.uid] = task.node
                result.task_status[task.uid] = (task.status, task.node)
        return result

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
        # Tasks that are placed, or were placed before the gang was discarded this cycle.
        fitting = job.ready_task_num() + sum(1 for t in pending.values() if t.last_tx_status in ALLOCATED)
        for errors in (job.fit_errors, job.explain_fit_errors):
            for uid in job.tasks:
                fe = errors.get(uid)
                if fe is None:
                    continue
                if fitting:  # part of the gang fits: the gang rule, not the nodes, holds it back
                    return Explanation(
                        "gang",
                        f"{fitting}/{job.min_available} tasks of the gang fit; the rest: {fe.describe()}",
                        dict(fe.reasons),
                    )
                return Explanation("placement", fe.describe(), dict(fe.reasons))
        if job.job_fit_error:
            return Explanation("gang", job.job_fit_error)
        if job.queue_verdict:
            return Explanation("queue", job.queue_verdict)
        return Explanation("gang", job.fit_error())

