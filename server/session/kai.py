"""KAI Scheduler's view of a job, shared by the actions and plugins of ``profile: kai``.

KAI splits a PodGroup into pod sets (its sub-groups; a job without sub-groups is one pod set whose
minimum is the job's minMember). What an action places in one attempt, what it evicts from a victim
at once, and whether a gang is satisfied are all counted per pod set, with KAI's task statuses:
*active allocated* (Allocated, Pipelined, Binding, Bound, Running) and *active used* (those and
Releasing). Quantities follow KAI's proportion plugin: cpu (millicores), memory (bytes) and GPUs
(whole devices plus shares of shared GPUs). A job's pod sets are built once per change of its
tasks' statuses and kept on the job (``JobInfo.pod_sets_cache``); a job seen through some of its
tasks is ``JobInfo.with_tasks``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np

from muster.devices import NVIDIA_GPU, UNIT
from muster.quantity import CPU, MEMORY, MIN_RESOURCE
from server.model import TaskStatus
from server.session.info import JobInfo, NodeTable, TaskInfo

ACTIVE_ALLOCATED = frozenset(
    {
        TaskStatus.ALLOCATED,
        TaskStatus.PIPELINED,
        TaskStatus.BINDING,
        TaskStatus.BOUND,
        TaskStatus.RUNNING,
    }
)
ACTIVE_USED = ACTIVE_ALLOCATED | {TaskStatus.RELEASING}
# KAI's "allocated" statuses: what a queue's allocated share counts (Pipelined does not).
ALLOCATED_SHARE = frozenset(
    {TaskStatus.ALLOCATED, TaskStatus.BOUND, TaskStatus.BINDING, TaskStatus.RUNNING}
)
DEFAULT_POD_SET = ""
# KAI: a job of this priority or more is not preemptible unless it says otherwise.
NON_PREEMPTIBLE_PRIORITY = 100

TaskLess = Callable[[TaskInfo, TaskInfo], bool]


@dataclass
class PodSet:
    """A pod set, its tasks (in the job's task order) and how many of them are in each of KAI's
    status groups, counted when the set is built (a set is never kept past a status change)."""

    name: str
    min_available: int
    tasks: list[TaskInfo] = field(default_factory=list)
    active_allocated: int = 0
    active_used: int = 0
    alive: int = 0  # pending or active allocated: what may make up the gang
    pipelined: int = 0

    def add(self, task: TaskInfo) -> None:
        self.tasks.append(task)
        status = task.status
        if status in ACTIVE_USED:
            self.active_used += 1
            if status in ACTIVE_ALLOCATED:
                self.active_allocated += 1
                self.alive += 1
                self.pipelined += status == TaskStatus.PIPELINED
        elif status == TaskStatus.PENDING:
            self.alive += 1


_ALL_ROWS: list[np.ndarray] = [np.arange(0)]


def all_rows(n: int) -> np.ndarray:
    """``np.arange(n)``, the same read-only array while n stays the same: a scorer handed this very
    array knows it scores every node in order, and may read whole columns rather than index them."""
    rows = _ALL_ROWS[0]
    if len(rows) != n:
        rows = np.arange(n)
        rows.flags.writeable = False
        _ALL_ROWS[0] = rows
    return rows


class GivenUp(list[JobInfo]):
    """A victim queue's jobs given up so far, and the one it would give up next, as a victim search
    shows them to ``queue_jobs_order`` (``JobsByQueue.pop_unchanged``). That search leaves the
    session as it was from one pop to the next, so while the list lives every job in it holds what
    it held when the list was made: what a plugin derives from the list may be kept on it
    (``derived``, under a key of the plugin's), and ``shorter`` is the same list less its last job
    (None: the list is not built on a shorter one), whose derived figures may be extended by that
    job. The list is never changed once made."""

    __slots__ = ("derived", "shorter")

    def __init__(self, jobs: list[JobInfo], shorter: GivenUp | None) -> None:
        super().__init__(jobs)
        self.shorter = shorter
        self.derived: dict[object, object] = {}


def pod_sets(job: JobInfo) -> tuple[PodSet, ...]:
    """The job's pod sets: one per sub-group with a minimum, the rest in the default pod set
    (minimum: the job's minMember when the job has no sub-groups, else all of its tasks). Built
    once per status change of the job (its ``status_changes``, which every task added or changing
    status bumps) and kept on the job; callers read them and never change them."""
    cached = job.pod_sets_cache
    if cached is not None and cached[0] == job.status_changes:
        return cached[1]
    named = {name: PodSet(name, n) for name, n in job.subgroup_min_member.items()}
    default = PodSet(DEFAULT_POD_SET, job.min_available)
    for t in job.tasks.values():
        target = named.get(t.sub_group or "")
        (target or default).add(t)
    sets = list(named.values())
    if default.tasks:
        if named:
            default.min_available = len(default.tasks)
        sets.append(default)
    job.pod_sets_cache = (job.status_changes, tuple(sets))
    return job.pod_sets_cache[1]


def ready_for_scheduling(job: JobInfo) -> bool:
    """Every pod set has at least its minimum of alive (pending or active) tasks."""
    return all(ps.alive >= ps.min_available for ps in pod_sets(job))


def min_available_state(job: JobInfo) -> int:
    """0: some pod set below its minimum, 1: every one exactly at it, 2: at or above, some above."""
    sets = pod_sets(job)
    if not job.subgroup_min_member:
        # One pod set (none while the job has no tasks), whose minimum is the job's.
        n = sets[0].active_allocated if sets else 0
        return 0 if n < job.min_available else (1 if n == job.min_available else 2)
    exactly = True
    for ps in sets:
        n = ps.active_allocated
        if n < ps.min_available:
            return 0
        if n > ps.min_available:
            exactly = False
    return 1 if exactly else 2


def is_preemptible(job: JobInfo) -> bool:
    if job.preemptible is not None:
        return job.preemptible
    return job.priority < NON_PREEMPTIBLE_PRIORITY


def should_allocate(task: TaskInfo, real: bool) -> bool:
    """KAI ``ShouldAllocate``: pending, or (when simulating) evicted in this session."""
    return task.status == TaskStatus.PENDING or (
        not real and task.status == TaskStatus.RELEASING and task.evicted_here
    )


def tasks_to_allocate(job: JobInfo, task_less: TaskLess, real: bool) -> list[TaskInfo]:
    """What one attempt places: for every pod set below its minimum, the tasks it lacks (in task
    order); once every pod set has its minimum, one more task (an elastic job grows one at a time)."""
    sets = pod_sets(job)
    unsatisfied = [ps for ps in sets if ps.active_allocated < ps.min_available]
    chosen: list[TaskInfo] = []
    for ps in unsatisfied or sets:
        candidates = sorted_tasks([t for t in ps.tasks if should_allocate(t, real)], task_less)
        if not candidates:
            continue
        allocated = ps.active_allocated
        want = ps.min_available - allocated if allocated < ps.min_available else 1
        chosen += candidates[:want]
        if not unsatisfied:
            break
    return chosen


def has_tasks_to_allocate(job: JobInfo, real: bool) -> bool:
    if real:  # only pending tasks count: the job's status index has them
        return bool(job.index[TaskStatus.PENDING])
    return any(should_allocate(t, real) for t in job.tasks.values())


def should_pipeline_job(job: JobInfo) -> bool:
    """A pod set with a pipelined task and fewer than its minimum of other active tasks: the whole
    job waits (KAI pipelines every task of it)."""
    if not job.index[TaskStatus.PIPELINED]:  # no pod set has one: no need to build them anew
        return False
    return any(
        ps.pipelined and ps.active_allocated - ps.pipelined < ps.min_available
        for ps in pod_sets(job)
    )


def gang_satisfied(job: JobInfo) -> bool:
    return all(ps.active_used >= ps.min_available for ps in pod_sets(job))


def is_stale(job: JobInfo) -> bool:
    """KAI: a gang with active tasks, none succeeded, and a pod set below its minimum."""
    if job.index[TaskStatus.SUCCEEDED]:
        return False
    sets = pod_sets(job)  # (every task is in one of them)
    if not any(ps.active_used for ps in sets):
        return False
    return not all(ps.active_used >= ps.min_available for ps in sets)


def below_min(job: JobInfo) -> bool:
    return min_available_state(job) == 0


def tasks_to_evict(job: JobInfo, task_less: TaskLess) -> tuple[list[TaskInfo], bool]:
    """What a victim job gives up at once: one task (the last in task order) of a pod set above
    its minimum, else every active task; and whether the job keeps running tasks afterwards."""
    sets = pod_sets(job)
    elastic = [ps for ps in sets if ps.active_allocated > ps.min_available]
    chosen: list[TaskInfo] = []
    for ps in elastic[:1] or sets:
        active = sorted_tasks([t for t in ps.tasks if t.status in ACTIVE_ALLOCATED], task_less)
        active.reverse()
        chosen += active[:1] if ps in elastic else active
    total = sum(ps.active_allocated for ps in sets)
    return chosen, len(chosen) < total


def sorted_tasks(tasks: list[TaskInfo], less: TaskLess) -> list[TaskInfo]:
    out: list[TaskInfo] = []
    for t in tasks:  # insertion sort by the session's strict order: lists are a handful of tasks
        i = len(out)
        while i > 0 and less(t, out[i - 1]):
            i -= 1
        out.insert(i, t)
    return out


@dataclass
class Quantities:
    """KAI's three quota resources: cpu millicores, memory bytes, GPUs."""

    cpu: float = 0.0
    memory: float = 0.0
    gpu: float = 0.0

    def add(self, other: Quantities, sign: float = 1.0) -> None:
        self.cpu += sign * other.cpu
        self.memory += sign * other.memory
        self.gpu += sign * other.gpu

    def values(self) -> tuple[float, float, float]:
        return self.cpu, self.memory, self.gpu


def task_quantities(task: TaskInfo, dims: dict[str, int]) -> Quantities:
    r = task.resreq
    cpu = float(r[dims[CPU]]) if CPU in dims else 0.0
    memory = float(r[dims[MEMORY]]) if MEMORY in dims else 0.0
    gpu = float(r[dims[NVIDIA_GPU]]) / UNIT if NVIDIA_GPU in dims else 0.0
    return Quantities(cpu, memory, gpu + task.gpu_fraction)


def is_gpu_task(task: TaskInfo, dims: dict[str, int]) -> bool:
    return task.gpu_fraction > 0 or (NVIDIA_GPU in dims and task.resreq[dims[NVIDIA_GPU]] > 0)


def fraction_fits(nodes: NodeTable, row: int, fraction: float) -> tuple[bool, bool]:
    """Can a task asking ``fraction`` of a GPU share a GPU of the row now, and once releasing tasks
    are gone? A shared GPU with enough left, or a whole free GPU (which becomes a new group)."""
    whole_now, whole_future = nodes.whole_gpus(row)
    now, future = whole_now >= 1 - _EPS, whole_future >= 1 - _EPS
    for group in nodes.shared[row]:
        if now and future:
            break
        g_now, g_future = nodes.group_fractions(row, group)
        now = now or g_now >= fraction - _EPS
        future = future or g_future >= fraction - _EPS
    return future, now and future


def fraction_rows(
    nodes: NodeTable, rows: np.ndarray, fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """``fraction_fits`` for each of ``rows`` (an int array): (fits once releasing tasks are gone,
    fits now). Most nodes share no GPU: their answer is the whole-GPU check, done on the columns
    at once (``whole_gpus``'s arithmetic); only the rows with shared GPUs are asked one by one."""
    d = nodes.gpu_dim
    if d is None:
        return np.zeros(len(rows), dtype=bool), np.zeros(len(rows), dtype=bool)
    idle = nodes.idle[rows, d]
    now = idle / UNIT >= 1 - _EPS
    future = (idle + nodes.releasing[rows, d] - nodes.pipelined[rows, d]) / UNIT >= 1 - _EPS
    shared = nodes.shared
    for k, row in enumerate(rows.tolist()):
        if shared[row]:
            future[k], now[k] = fraction_fits(nodes, row, fraction)
    return future, now & future


def new_group_name(nodes: NodeTable, row: int, releasing: bool) -> str:
    """A new shared GPU is named by the device id of the GPU it takes (one being released when the
    task is pipelined onto it), so the agent can hand the task that GPU."""
    ledger = nodes.devices
    # Shared GPUs' names and ids promised to pipelined tasks are taken; a shared GPU all of whose
    # tasks are releasing is a whole GPU being released: joining it under its id is taking it.
    taken = (set(nodes.shared[row]) - ledger.shared_releasing[row]) | set(ledger.promised[row])
    pool = (ledger.releasing(row, NVIDIA_GPU) if releasing else []) + ledger.free(row, NVIDIA_GPU)
    for d in pool:
        if d.id not in taken:
            return d.id
    k = 0
    while f"shared-{k}" in taken:
        k += 1
    return f"shared-{k}"


def fit_rows(nodes: NodeTable, task: TaskInfo, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: does the task's request fit once releasing tasks are gone, and does it fit now
    (resources only, GPU shares included; predicates are the evaluator's)."""
    limit = task.resreq - MIN_RESOURCE
    idle = nodes.idle[rows]
    now = (idle >= limit).all(axis=1)
    future = (idle + nodes.releasing[rows] - nodes.pipelined[rows] >= limit).all(axis=1)
    if task.gpu_fraction:
        f_future, f_now = fraction_rows(nodes, rows, task.gpu_fraction)
        now &= f_now
        future &= f_future
    return future | now, now


def fits_now_row(nodes: NodeTable, task: TaskInfo, row: int) -> bool:
    """``fit_rows``'s "now" answer for one row, in plain floats (the same comparisons). Asked for
    every row a placement changes: the comparisons run in ``map`` rather than a generator."""
    limit = map(operator.sub, task.request_floats, repeat(MIN_RESOURCE))
    if not all(map(operator.ge, nodes.idle[row].tolist(), limit)):
        return False
    return not task.gpu_fraction or fraction_fits(nodes, row, task.gpu_fraction)[1]


_EPS = 1e-9
