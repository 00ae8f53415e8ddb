"""Per-session scheduling state: tasks, jobs, queues, and nodes as arrays.

Resources are dense float64 vectors over the session's resource dimensions (``ResourceSpace``):
node state is one ``(nodes x dims)`` array per quantity (allocatable, idle, used, releasing,
pipelined) so that predicates and scores evaluate every node in one vectorised expression, and an
allocation updates one row in place. Comparisons use Volcano's epsilon (``MIN_RESOURCE``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from muster.devices import NVIDIA_GPU, UNIT, device_needs
from muster.quantity import CPU, MEMORY, MIN_RESOURCE, PODS
from server.model import (
    ALLOCATED,
    ENDED,
    JobSpec,
    NodeSpec,
    PodGroupPhase,
    QueueSpec,
    Taint,
    TaskSpec,
    TaskStatus,
)
from server.session.devices import DeviceLedger

if TYPE_CHECKING:
    from server.session.kai import PodSet

Vec = np.ndarray


class ResourceSpace:
    """The resource dimensions of a session: cpu, memory, then every other name, sorted."""

    def __init__(self, names: Iterable[str]) -> None:
        rest = sorted({n for n in names if n not in (CPU, MEMORY, PODS)})
        self.dims: list[str] = [CPU, MEMORY, *rest]
        self.index: dict[str, int] = {n: i for i, n in enumerate(self.dims)}
        self.size = len(self.dims)
        self._requests: dict[
            tuple[tuple[str, float], ...],
            tuple[Vec, tuple[float, ...], bool, dict[str, int], bytes],
        ] = {}

    def vec(self, resources: Mapping[str, float] | None) -> Vec:
        """A fresh vector (callers may mutate it)."""
        return np.array(self.values(resources), dtype=float)

    def values(self, resources: Mapping[str, float] | None) -> list[float]:
        """The vector as Python floats (resources outside the space are left out)."""
        row = [0.0] * self.size
        if resources:
            for name, value in resources.items():
                i = self.index.get(name)
                if i is not None:
                    row[i] = value
        return row

    def request(
        self, resources: Mapping[str, float]
    ) -> tuple[Vec, tuple[float, ...], bool, dict[str, int], bytes]:
        """A task request as a shared, read-only vector (many tasks ask for the same), the same as
        Python floats (for one-row checks, where numpy scalars cost ~5x), whether it is best-effort
        (empty), the whole devices it asks per device resource (shared too), and the vector's bytes
        (a cache key)."""
        key = tuple(resources.items())
        known = self._requests.get(key)
        if known is None:
            v = self.vec(resources)
            v.flags.writeable = False
            known = self._requests[key] = (
                v,
                tuple(v.tolist()),
                is_empty(v),
                device_needs(resources),
                v.tobytes(),
            )
        return known

    def to_dict(self, v: Vec) -> dict[str, float]:
        return {n: float(v[i]) for i, n in enumerate(self.dims) if v[i] != 0.0}

    def zeros(self) -> Vec:
        return np.zeros(self.size)


def less_equal(left: Vec, right: Vec) -> bool:
    """Volcano ``Resource.LessEqual(right, Zero)``: every dimension within epsilon. In plain floats,
    like ``dominant_share``: asked per queue visit and per victim on vectors of a few resources."""
    return all(a <= b + MIN_RESOURCE for a, b in zip(left.tolist(), right.tolist(), strict=True))


def dominant_share(amount: Vec, base: Vec, empty: float = 0.0) -> float:
    """max over resources of amount / base, counting only the resources ``base`` has (>= the
    epsilon); ``empty`` when it has none. DRF's job share, proportion's and capacity's queue share."""
    # Plain floats: the vectors hold a handful of resources, where numpy's per-call overhead is
    # ~10x the arithmetic (this runs at every placement). Same IEEE results, NaN included.
    best: float | None = None
    for a, b in zip(amount.tolist(), base.tolist(), strict=True):
        if b >= MIN_RESOURCE:
            r: float = a / b
            if r != r:  # NaN (inf / inf): numpy's max propagates it
                return r
            if best is None or r > best:
                best = r
    return empty if best is None else best


def rows_fit(values: Vec, limit: Sequence[float]) -> Vec:
    """Per row of ``values`` (rows x resources): is every resource at least its ``limit``? What
    ``(values >= limit).all(axis=1)`` gives, column by column: numpy compares a (rows x resources)
    array with a per-resource vector, and reduces across a row, a few elements at a time (on 5,000
    nodes several times the cost; on a few dozen rows, about the same)."""
    ok: Vec = values[:, 0] >= limit[0]
    for d in range(1, len(limit)):
        ok &= values[:, d] >= limit[d]
    return ok


def is_empty(v: Vec) -> bool:
    return bool(np.all(v < MIN_RESOURCE))


class TaskInfo:
    __slots__ = (
        "uid",
        "name",
        "namespace",
        "job",
        "role",
        "spec",
        "resreq",
        "best_effort",
        "status",
        "node",
        "priority",
        "preemptable",
        "sub_group",
        "shape_key",
        "static_key",
        "creation_index",
        "last_tx_status",
        "devices",
        "device_needs",
        "gpu_fraction",
        "gpu_groups",
        "evicted_here",
        "request_floats",
    )

    def __init__(self, spec: TaskSpec, space: ResourceSpace) -> None:
        self.spec = spec
        self.uid = spec.uid
        self.name = spec.name
        self.namespace = spec.namespace
        self.job = spec.job
        self.role = spec.role
        # Read-only after construction: tasks of one shape share the vector.
        self.resreq, self.request_floats, self.best_effort, self.device_needs, request_bytes = (
            space.request(spec.request)
        )
        self.status = spec.status
        # A pending task holds no node, whatever the snapshot says (a nominated node is no hold).
        self.node: str | None = spec.node if spec.status != _PENDING else None
        self.priority = spec.priority
        self.preemptable = spec.preemptable
        self.sub_group = spec.sub_group
        self.creation_index = spec.creation_index
        # Tasks with the same static key pass the same label / taint / affinity predicates; with the
        # same shape key they also compete identically for resources (cache key for evaluation).
        # (Most tasks carry no constraint: that case without the call.)
        self.static_key = (
            _NO_CONSTRAINTS
            if not spec.node_selector and not spec.tolerations and not spec.affinity
            else _static_key(spec)
        )
        self.shape_key = (self.static_key, request_bytes, spec.gpu_fraction)
        # Status of the last discarded placement (Volcano LastTransaction): the gang plugin counts
        # such tasks as schedulable in its Unschedulable message.
        self.last_tx_status: TaskStatus | None = None
        # Device ids held on ``node`` (kept by the session's DeviceLedger).
        self.devices: list[str] = list(spec.devices) if spec.devices else []
        # KAI GPU sharing: the share of one GPU asked (0: none) and the shared GPU group it sits on.
        self.gpu_fraction = spec.gpu_fraction
        self.gpu_groups: list[str] = list(spec.gpu_groups) if spec.gpu_fraction else []
        # Evicted in this session (KAI's virtual Releasing status): such a task may be placed again.
        self.evicted_here = False

    def __repr__(self) -> str:
        return f"<Task {self.uid} {self.status.title} {self.node}>"


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


_NO_CONSTRAINTS: tuple[Any, ...] = ((), (), ())


def has_constraints(task: TaskInfo) -> bool:
    """Does the task carry a node selector, tolerations or an affinity (pod affinity included)?"""
    return task.static_key is not _NO_CONSTRAINTS


def _static_key(spec: TaskSpec) -> tuple[Any, ...]:
    if not spec.node_selector and not spec.tolerations and not spec.affinity:
        return _NO_CONSTRAINTS
    tolerations = tuple((t.key, t.operator, t.value, t.effect) for t in spec.tolerations)
    return (_freeze(spec.node_selector), tolerations, _freeze(spec.affinity))


# Statuses counted by Volcano's ReadyTaskNum.
_READY = frozenset(
    {
        TaskStatus.BOUND,
        TaskStatus.BINDING,
        TaskStatus.RUNNING,
        TaskStatus.ALLOCATED,
        TaskStatus.SUCCEEDED,
    }
)
# (ALLOCATED and Succeeded: what job_phase_after counts as allocated, read from the ready count.)
assert ALLOCATED | {TaskStatus.SUCCEEDED} == _READY
# The statuses the role and sub-group checks count, made once (asked at every placement).
_HELD = (*ALLOCATED, TaskStatus.SUCCEEDED)
_HELD_OR_PIPELINED = (*_HELD, TaskStatus.PIPELINED)
# Statuses counted by Volcano's ValidTaskNum.
_VALID = frozenset({*ALLOCATED, TaskStatus.SUCCEEDED, TaskStatus.PIPELINED, TaskStatus.PENDING})
# The statuses NodeTable.add_task / remove_task and JobInfo tell apart at every placement, bound
# once: an enum class attribute costs ~0.2 us per lookup on Python 3.11.
_RELEASING, _PIPELINED, _PENDING = TaskStatus.RELEASING, TaskStatus.PIPELINED, TaskStatus.PENDING


@dataclass
class FitErrors:
    """Why a task fits no node: per-reason node counts (kube-scheduler style) or one message."""

    total_nodes: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    message: str = ""

    def describe(self) -> str:
        if self.message:
            return self.message
        # Most common reason first (what matters on 5,000 nodes), counts with thousands separators.
        ranked = sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0]))
        parts = [f"{n:,} {r}" for r, n in ranked]
        return f"0/{self.total_nodes:,} nodes are unavailable: {', '.join(parts)}."


class _StatusIndex(dict[TaskStatus, dict[str, TaskInfo]]):
    """Status -> the job's tasks in it. A status's map is made when a task first enters it (most
    jobs hold tasks in two or three of the dozen statuses, and a session opens thousands of jobs);
    reading a status no task is in gives an empty map and stores nothing, so only ``file`` (the
    job's own writes) may add to what it reads."""

    __slots__ = ()

    def __missing__(self, status: TaskStatus) -> dict[str, TaskInfo]:
        return {}

    def file(self, status: TaskStatus) -> dict[str, TaskInfo]:
        """The map of ``status``, made and kept when missing: where a task entering it goes."""
        tasks = self.get(status)
        if tasks is None:
            tasks = self[status] = {}
        return tasks


class JobInfo:
    def __init__(self, spec: JobSpec, space: ResourceSpace) -> None:
        self.spec = spec
        self.uid = spec.uid
        self.name = spec.name
        self.namespace = spec.namespace
        self.queue = spec.queue
        self.priority = spec.priority
        self.creation_index = spec.creation_index
        self.phase = spec.phase
        self._clear_tasks(space.zeros())
        # ``add_task`` written out for a pending task that asks for resources (a session files
        # thousands of them): it enters the map and the pending index, and counts as valid.
        tasks, pending, filed = self.tasks, None, 0
        for ts in spec.tasks:
            task = TaskInfo(ts, space)
            if task.status == _PENDING and not task.best_effort:
                if pending is None:
                    pending = self.index.file(_PENDING)
                tasks[task.uid] = pending[task.uid] = task
                filed += 1
            else:
                self.add_task(task)
        self.status_changes += filed
        self.valid_count += filed
        self.min_available = spec.min_member if spec.min_member is not None else len(spec.tasks)
        # (Most jobs have no role minimums and no sub-groups: nothing to copy or count then.)
        self.task_min_available: dict[str, int] = (
            dict(spec.min_task_member) if spec.min_task_member else {}
        )
        self.task_min_available_total = (
            sum(self.task_min_available.values()) if self.task_min_available else 0
        )
        self.min_resources: Vec | None = (
            space.vec(spec.min_resources) if spec.min_resources else None
        )
        self.subgroup_min_member: dict[str, int] = (
            {g.name: g.min_member for g in spec.sub_groups if g.min_member > 0}
            if spec.sub_groups
            else {}
        )
        self.preemptible = spec.preemptible
        self.fit_errors: dict[str, FitErrors] = {}
        self.job_fit_error = ""
        # TY-Arranger's schedule state and stage (set by the tyarranger plugin; "" otherwise).
        self.schedule_state = ""
        self.stage = ""

    # -- task index -------------------------------------------------------------------------
    def _clear_tasks(self, zeros: Vec) -> None:
        """No tasks: every figure derived from the tasks, in one place so that ``with_tasks``
        cannot miss one."""
        self.tasks: dict[str, TaskInfo] = {}
        self.index = _StatusIndex()
        self.allocated: Vec = zeros
        # Kept by the task index: is_ready() is on the hot path (job order, gang checks).
        self.pending_best_effort = 0
        self.ready_count = 0
        self.valid_count = 0  # tasks in Volcano's ValidTaskNum statuses (the gang's check at open)
        self.status_changes = 0  # bumped at every task added or changing status (a cache key)
        # KAI's pod sets, built by server.session.kai when asked, valid while status_changes is
        # the one they were built at.
        self.pod_sets_cache: tuple[int, tuple[PodSet, ...]] | None = None

    def with_tasks(self, tasks: Iterable[TaskInfo]) -> JobInfo:
        """KAI ``CloneWithTasks``: the job seen through some of its tasks (a victim given up in
        pieces), every task-derived figure counted over those tasks alone. The tasks themselves
        are shared, not cloned, so that evicting one evicts the session's task; the figures are
        those at the clone (as KAI's cloned tasks are): read a view before its tasks change status.
        What the session records about the job (fit errors, conditions, verdicts) stays shared."""
        view = copy.copy(self)
        view._clear_tasks(np.zeros_like(self.allocated))
        for task in tasks:
            view.add_task(task)
        return view

    def add_task(self, task: TaskInfo) -> None:
        self.status_changes += 1
        status = task.status
        self.tasks[task.uid] = task
        self.index.file(status)[task.uid] = task
        if status in ALLOCATED:
            self.allocated += task.resreq
        if task.best_effort and status == _PENDING:
            self.pending_best_effort += 1
        if status in _READY:
            self.ready_count += 1
        if status in _VALID:
            self.valid_count += 1

    @property
    def total_request(self) -> Vec:
        """What every task of the job asks, added up (hierarchical DRF; computed when asked)."""
        total = np.zeros_like(self.allocated)
        for task in self.tasks.values():
            total += task.resreq
        return total

    def update_task_status(self, task: TaskInfo, status: TaskStatus) -> None:
        old = task.status
        if old == status:
            return
        self.status_changes += 1
        index, uid = self.index, task.uid
        del index[old][uid]
        was, now = old in ALLOCATED, status in ALLOCATED
        if was != now:  # (Allocated -> Binding at commit: both hold; nothing to add up)
            if was:
                self.allocated -= task.resreq
            else:
                self.allocated += task.resreq
        task.status = status
        index.file(status)[uid] = task
        if task.best_effort:
            self.pending_best_effort += (status == _PENDING) - (old == _PENDING)
        ready, valid = _READY, _VALID
        self.ready_count += (status in ready) - (old in ready)
        self.valid_count += (status in valid) - (old in valid)

    def count(self, *statuses: TaskStatus) -> int:
        return sum(len(self.index[s]) for s in statuses)

    # -- Volcano JobInfo readiness -----------------------------------------------------------
    def ready_task_num(self) -> int:
        return self.ready_count

    # (``index.get``: a status no task is in costs no ``__missing__`` call)
    def waiting_task_num(self) -> int:
        return len(self.index.get(_PIPELINED, ()))

    def pending_best_effort_num(self) -> int:
        return self.pending_best_effort

    def pending_asks(self) -> bool:
        """Some pending task asks for resources (not every one best-effort)."""
        return len(self.index.get(_PENDING, ())) > self.pending_best_effort

    def valid_task_num(self) -> int:
        return self.valid_count

    # ``ready_task_num() + pending_best_effort_num()``, written out: asked at every placement.
    def is_ready(self) -> bool:
        return self.ready_count + self.pending_best_effort >= self.min_available

    def is_pipelined(self) -> bool:
        return (
            len(self.index.get(_PIPELINED, ())) + self.ready_count + self.pending_best_effort
            >= self.min_available
        )

    def is_starving(self) -> bool:
        return self.waiting_task_num() + self.ready_task_num() < self.min_available

    def _roles(
        self, statuses: Iterable[TaskStatus], pending_best_effort: bool = False
    ) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s in statuses:
            for t in self.index[s].values():
                counts[t.role] = counts.get(t.role, 0) + 1
        if pending_best_effort:
            for t in self.index[TaskStatus.PENDING].values():
                if t.best_effort:
                    counts[t.role] = counts.get(t.role, 0) + 1
        return counts

    def _roles_meet_minimum(self, counts: dict[str, int]) -> bool:
        return all(counts.get(role, 0) >= n for role, n in self.task_min_available.items() if n > 0)

    def check_task_valid(self) -> bool:
        if not self.task_min_available or self.min_available < self.task_min_available_total:
            return True
        return self._roles_meet_minimum(self._roles(_VALID))

    def allocated_roles(self) -> dict[str, int]:
        return self._roles(_HELD, pending_best_effort=True)

    def check_task_ready(self) -> bool:
        if not self.task_min_available or self.min_available < self.task_min_available_total:
            return True
        return self._roles_meet_minimum(self.allocated_roles())

    def check_task_pipelined(self) -> bool:
        if not self.task_min_available or self.min_available < self.task_min_available_total:
            return True
        return self._roles_meet_minimum(self._roles(_HELD_OR_PIPELINED, pending_best_effort=True))

    # -- sub-groups (KAI PodGroup subGroups / Volcano sub-jobs): each needs its own minimum -----
    def _subgroups_meet(self, statuses: Iterable[TaskStatus]) -> bool:
        minimums = self.subgroup_min_member
        if not minimums:
            return True
        counts: dict[str, int] = {}
        for s in statuses:
            for t in self.index[s].values():
                if t.sub_group is not None:
                    counts[t.sub_group] = counts.get(t.sub_group, 0) + 1
        return all(counts.get(name, 0) >= n for name, n in minimums.items())

    def check_subjob_valid(self) -> bool:
        return self._subgroups_meet(_VALID)

    def check_subjob_ready(self) -> bool:
        return self._subgroups_meet(_HELD)

    def check_subjob_pipelined(self) -> bool:
        return self._subgroups_meet(_HELD_OR_PIPELINED)

    def fit_failed_roles(self) -> set[str]:
        return {
            self.tasks[uid].role
            for uid in self.fit_errors
            if uid in self.tasks and self.tasks[uid].role
        }

    def need_continue_allocating(self) -> bool:
        """Volcano ``NeedContinueAllocating``: keep placing other roles after a task fit no node?"""
        if self.min_available == len(self.tasks):
            return False
        failed = self.fit_failed_roles()
        if self.min_available < self.task_min_available_total:
            left = sum(1 for t in self.index[TaskStatus.PENDING].values() if t.role not in failed)
            return self.ready_task_num() + left >= self.min_available
        allocated = self.allocated_roles()
        for role in failed:
            minimum = self.task_min_available.get(role, 0)
            if minimum and allocated.get(role, 0) < minimum:
                return False
        return True

    def least_at_once(self, amount: Callable[[TaskInfo], Vec | Sequence[float]]) -> Vec | None:
        """The least the job must hold at once to run, per resource (``amount``: what a task
        holds, one value per resource), or None when it needs nothing more (no live task, or the
        tasks that succeeded meet its minimums). A lower bound on every set of its live tasks (not
        ended) that meets its gang minimum and its roles' minimums, less what succeeded, per
        resource on its own: the smallest amounts the gang minimum takes, or those each role's
        minimum takes plus the smallest of any tasks for the rest of the gang, whichever is more."""
        succeeded = list(self.index[TaskStatus.SUCCEEDED].values())
        live = [t for t in self.tasks.values() if t.status not in ENDED]
        if not live:
            return None
        if len(live) == 1 and not self.task_min_available:  # most jobs: one task, no roles
            one: Vec = np.array(amount(live[0]), dtype=float)
            return one if self.min_available > len(succeeded) else None
        smallest_first = np.sort(np.array([amount(t) for t in live], dtype=float), axis=0)
        by_roles: Vec = np.zeros(smallest_first.shape[1])
        taken = 0  # tasks the roles' minimums take
        for role, minimum in self.task_min_available.items():
            left = minimum - sum(1 for t in succeeded if t.role == role)
            amounts = [amount(t) for t in live if t.role == role]
            if left > 0 and amounts:
                by_roles += np.sort(np.array(amounts, dtype=float), axis=0)[:left].sum(axis=0)
                taken += left
        needed = self.min_available - len(succeeded)
        if needed <= 0 and not taken:
            return None
        least: Vec = smallest_first[: max(needed, 0)].sum(axis=0)
        by_roles += smallest_first[: max(needed - taken, 0)].sum(axis=0)
        bound: Vec = np.maximum(least, by_roles)
        return bound

    def task_has_fit_errors(self, task: TaskInfo) -> bool:
        return bool(self.fit_errors) and bool(task.role) and task.role in self.fit_failed_roles()

    def fit_error(self, found: Mapping[str, FitErrors] | None = None) -> str:
        """Volcano ``JobInfo.FitError``: a histogram of task states plus the first node-fit error
        (``found``: per task, fit errors found only to explain the job)."""
        hist = {s.title: len(ts) for s, ts in self.index.items() if ts}
        hist["minAvailable"] = self.min_available
        ready = "pod group is ready" if self.is_ready() else "pod group is not ready"
        msg = f"{ready}, " + ", ".join(sorted(f"{v} {k}" for k, v in hist.items()))
        if self.job_fit_error:
            return msg + ". Origin reason is: " + self.job_fit_error
        # Volcano reports the first task's node-fit error; when the queue stopped every task before
        # any node was tried, Muster reports the node-level reason it found for the explanation.
        for errors in (self.fit_errors, found or {}):
            for uid in self.tasks:
                fe = errors.get(uid)
                if fe is not None:
                    return msg + f". Origin reason is {self.tasks[uid].name}: {fe.describe()}"
        return msg

    def __repr__(self) -> str:
        return f"<Job {self.uid} q={self.queue} min={self.min_available} tasks={len(self.tasks)}>"


class QueueInfo:
    def __init__(self, spec: QueueSpec, space: ResourceSpace, creation_index: int) -> None:
        self.spec = spec
        self.uid = spec.name
        self.name = spec.name
        self.parent = spec.parent
        self.weight = max(spec.weight, 1)  # Volcano: weights below 1 count as 1
        self.over_quota_weight = spec.weight  # KAI: 0 takes no share of what is left over quota
        self.priority = spec.priority
        self.reclaimable = spec.reclaimable
        self.state = spec.state
        self.creation_index = creation_index
        self.capability: Vec = np.full(space.size, np.inf)
        for name, value in spec.capability.items():
            if name in space.index:
                self.capability[space.index[name]] = value
        self.deserved: Vec = space.vec(spec.deserved)
        self.guarantee: Vec = space.vec(spec.guarantee)
        self.annotations = spec.annotations

    def is_open(self) -> bool:
        return self.state == "Open"

    def __repr__(self) -> str:
        return f"<Queue {self.name}>"


class NodeTable:
    """All nodes of a session as arrays; row ``i`` is node ``names[i]`` (sorted by name)."""

    def __init__(self, specs: list[NodeSpec], space: ResourceSpace) -> None:
        specs = sorted(specs, key=lambda n: n.name)
        self.space = space
        self.specs = specs
        self.names: list[str] = [n.name for n in specs]
        self.index: dict[str, int] = {n: i for i, n in enumerate(self.names)}
        n = len(specs)
        # One array from Python rows (a numpy row assignment per node costs more).
        self.allocatable = np.array(
            [space.values(s.allocatable) for s in specs], dtype=float
        ).reshape(n, space.size)
        self.used = np.zeros((n, space.size))
        self.releasing = np.zeros((n, space.size))
        self.pipelined = np.zeros((n, space.size))
        self.task_count = np.zeros(n, dtype=np.int64)
        self.max_tasks = np.array([n_.allocatable.get(PODS, np.inf) for n_ in specs], dtype=float)
        self.schedulable = np.array([not s.unschedulable and s.ready for s in specs], dtype=bool)
        self.labels: list[dict[str, str]] = [s.labels for s in specs]
        self.taints: list[list[Taint]] = [s.taints for s in specs]
        self.tasks: list[dict[str, TaskInfo]] = [{} for _ in specs]
        self.devices = DeviceLedger(specs)
        # A node that lists its devices has exactly those (allocatable follows the list).
        for i, spec in enumerate(specs):
            if spec.devices:
                for name, devs in self.devices.of(i).items():
                    d = space.index.get(name)
                    if d is not None:
                        self.allocatable[i, d] = len(devs) * UNIT
        self.idle = self.allocatable.copy()
        # KAI GPU sharing: per row, shared GPU group -> the fractional tasks on it. A group takes
        # one whole GPU of the row (``shared_state``); its tasks split that GPU by fraction.
        self.gpu_dim: int | None = space.index.get(NVIDIA_GPU)
        self.shared: list[dict[str, list[TaskInfo]]] = [{} for _ in specs]
        self._releasing_tasks = 0
        self._pipelined_tasks = 0
        # Rows changed since the session opened, in order: evaluation caches replay it.
        self.change_log: list[int] = []

    def __len__(self) -> int:
        return len(self.names)

    def has_future_resources(self) -> bool:
        """Is any node releasing or expecting pipelined resources? (If not, future idle == idle.)"""
        return self._releasing_tasks > 0 or self._pipelined_tasks > 0

    def future_idle(self, i: int | slice | np.ndarray | None = None) -> np.ndarray:
        """Idle, plus what releasing tasks free, less what pipelined tasks take: a new array."""
        if not self.has_future_resources():  # idle + 0 - 0 is idle: one copy, not three arrays
            return self.idle.copy() if i is None else np.array(self.idle[i])
        if i is None:
            return self.idle + self.releasing - self.pipelined
        return self.idle[i] + self.releasing[i] - self.pipelined[i]

    def add_task(self, i: int, task: TaskInfo) -> None:
        """Volcano ``NodeInfo.AddTask``: how a task holds a node depends on its status."""
        r = task.resreq
        # In place through row views: ``a[i] -= r`` would also write the row back (a copy).
        status = task.status
        if status == _RELEASING:
            idle, used, releasing = self.idle[i], self.used[i], self.releasing[i]
            idle -= r
            releasing += r
            used += r
            self._releasing_tasks += 1
        elif status == _PIPELINED:
            pipelined = self.pipelined[i]
            pipelined += r
            self._pipelined_tasks += 1
        else:
            idle, used = self.idle[i], self.used[i]
            idle -= r
            used += r
        self.task_count[i] += 1
        self.tasks[i][task.uid] = task
        if task.devices:
            self.devices.attach(i, task)
        if task.gpu_fraction and task.gpu_groups:
            self._share(i, task, joining=True)
        self.change_log.append(i)

    def remove_task(self, i: int, task: TaskInfo) -> None:
        r = task.resreq
        status = task.status
        if status == _RELEASING:
            idle, used, releasing = self.idle[i], self.used[i], self.releasing[i]
            idle += r
            releasing -= r
            used -= r
            self._releasing_tasks -= 1
        elif status == _PIPELINED:
            pipelined = self.pipelined[i]
            pipelined -= r
            self._pipelined_tasks -= 1
        else:
            idle, used = self.idle[i], self.used[i]
            idle += r
            used -= r
        self.task_count[i] -= 1
        self.tasks[i].pop(task.uid, None)
        if task.devices:
            self.devices.detach(i, task)
        if task.gpu_fraction and task.gpu_groups:
            self._share(i, task, joining=False)
        self.change_log.append(i)

    # -- KAI GPU sharing ----------------------------------------------------------------------
    def _share(self, i: int, task: TaskInfo, joining: bool) -> None:
        """A fractional task joins or leaves its shared GPU group(s); the row's whole-GPU columns
        follow the group's state."""
        d = self.gpu_dim
        groups = self.shared[i]
        for name in task.gpu_groups:
            holders = groups.setdefault(name, [])
            before = shared_state(holders)
            if joining:
                holders.append(task)
            else:
                holders[:] = [t for t in holders if t is not task]
            after = shared_state(holders)
            if not holders:
                del groups[name]
                self.devices.shared[i].discard(name)
            else:
                self.devices.shared[i].add(name)
            if after == (1, 1, 0):  # only releasing tasks left on it: a whole GPU being released
                self.devices.shared_releasing[i].add(name)
            else:
                self.devices.shared_releasing[i].discard(name)
            if d is not None and before != after:
                used, releasing, pipelined = (
                    UNIT * (a - b) for a, b in zip(after, before, strict=True)
                )
                self.idle[i, d] -= used
                self.used[i, d] += used
                self.releasing[i, d] += releasing
                self.pipelined[i, d] += pipelined

    def group_fractions(self, i: int, name: str) -> tuple[float, float]:
        """A shared GPU's free share now (every holder counted) and once its releasing tasks are
        gone (pipelined holders counted). A GPU all of whose tasks are releasing is no longer
        shared: it is a whole GPU being released (offered as such), so it has no share to give."""
        holders = self.shared[i].get(name, ())
        if holders and all(t.status == TaskStatus.RELEASING for t in holders):
            return 0.0, 0.0
        now = future = 1.0
        if holders and all(t.status == TaskStatus.PIPELINED for t in holders):
            now = 0.0  # a GPU only promised to pipelined tasks is not free now: joining it pipelines too
        for t in holders:
            now -= t.gpu_fraction
            if t.status != TaskStatus.RELEASING:
                future -= t.gpu_fraction
        return now, future

    def used_gpu_portion(self, i: int, name: str) -> float:
        return sum(t.gpu_fraction for t in self.shared[i].get(name, ()))

    def whole_gpus(self, i: int) -> tuple[float, float]:
        """Whole GPUs free now and once releasing tasks are gone (pipelined ones counted)."""
        d = self.gpu_dim
        if d is None:
            return 0.0, 0.0
        return self.idle[i, d] / UNIT, (
            self.idle[i, d] + self.releasing[i, d] - self.pipelined[i, d]
        ) / UNIT

    def count_unhealthy_as_used(self) -> None:
        """Unhealthy devices no task holds are used capacity: nothing may be placed on them."""
        for i, spec in enumerate(self.specs):
            if not spec.devices:  # made-up devices are all healthy
                continue
            for name, n in self.devices.unhealthy_unheld(i).items():
                d = self.space.index.get(name)
                if d is not None:
                    self.idle[i, d] -= n * UNIT
                    self.used[i, d] += n * UNIT


def shared_state(holders: list[TaskInfo]) -> tuple[int, int, int]:
    """How a shared GPU counts in its row's whole-GPU columns, as (used, releasing, pipelined):
    held by a running (allocated ...) task: used; held only by releasing tasks (and tasks pipelined
    behind them): used and releasing, plus pipelined when some wait; only pipelined tasks: pipelined."""
    active = [t for t in holders if t.status != TaskStatus.PIPELINED]
    waiting = len(active) < len(holders)
    if active:
        if all(t.status == TaskStatus.RELEASING for t in active):
            return 1, 1, int(waiting)
        return 1, 0, 0
    return (0, 0, 1) if holders else (0, 0, 0)


def new_queue_infos(specs: list[QueueSpec], space: ResourceSpace) -> dict[str, QueueInfo]:
    return {q.name: QueueInfo(q, space, i) for i, q in enumerate(specs)}


def job_phase_after(job: JobInfo, unschedulable: bool) -> PodGroupPhase:
    """Volcano ``jobStatus``: the PodGroup phase written back when the session closes."""
    if job.index[TaskStatus.RUNNING] and unschedulable:
        return PodGroupPhase.UNKNOWN
    # Its tasks in ALLOCATED or Succeeded: the statuses its ready count counts (kept by the index).
    if job.ready_count >= job.min_available:
        return PodGroupPhase.RUNNING
    if job.phase != PodGroupPhase.INQUEUE:
        return PodGroupPhase.PENDING
    return job.phase
