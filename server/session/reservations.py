"""Reservations and start estimates: a timeline of free resources from running tasks' expected ends.

Slurm's backfill, in Muster's terms (docs/plugins/reservation.md). Every task that holds a node is
expected to end: a releasing task now, a running one at its job's start plus its time limit (or its
queue's default runtime, an argument of the ``reservation`` plugin), a task placed this cycle that
long from now; a task past its expected end is expected to end within ``resolution``; one with no
limit and no default never (it holds its resources for good). From these ends, a ``Timeline`` gives
every node's free resources at every future instant (piecewise constant, one breakpoint per
distinct end, rounded up to ``resolution``).

``plan`` walks the jobs that wait for their gang in about the order allocate considers them (queues
in their order -- fair share --, one job per queue per round, each queue's jobs in job order) and
gives each the earliest breakpoint at which its gang's missing tasks fit on nodes that pass its
static predicates (node selector, affinity, taints, schedulability), inside one topology domain or
backend where the job or the configuration asks for it, for the job's whole expected runtime. That
instant is "now" for a job that fits already. Each job, once planned, holds what it takes from then
on in the timeline, so the next job plans around it. The first ``depth`` jobs that cannot start now
get *reservations*: their nodes are theirs from that instant, and the ``reservation`` plugin lets
another job onto those nodes only if it ends before, or leaves the reservation room enough there
(``Enforcement``). The others get estimates. The plan is a function of the session alone (the
snapshot, its ``now``): nothing is kept between cycles, so a restarted server plans the same.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from muster.devices import UNIT, Device
from muster.display import clock_text, folded_names
from muster.quantity import MIN_RESOURCE
from server.model import ALLOCATED, JobEstimate, PodGroupPhase, TaskStatus
from server.session.info import JobInfo, QueueInfo, TaskInfo
from server.session.options import GANG_ACROSS_BACKENDS, parse_go_duration

if TYPE_CHECKING:  # the session is handed in: annotation only
    from server.session.session import Session

PLUGIN = "reservation"  # the plugin whose arguments configure planning
NODE_SETS_POINT = "node_sets"  # KAI's topology domains: asked only whether a plugin answers it
# Actions whose placements respect reservations ("" : an action run outside SchedulerCore). Those
# that evict (preempt, reclaim, consolidation ...) keep their own semantics.
PLACING_ACTIONS = frozenset({"allocate", "backfill", "consolidation", ""})
# The most breakpoints a timeline starts with per million cells (nodes x resources): a big cluster
# gets a coarser resolution rather than a timeline that does not fit in memory.
MAX_CELLS = 4_000_000
MAX_BREAKPOINTS = 512
INF = math.inf

NO_LIMIT = "no estimate: running tasks have no time limit"
AHEAD_NO_LIMIT = "no estimate: a job ahead of it has no time limit"
NEVER = "no estimate: no nodes can ever hold its gang"
NOT_ADMITTED = "no estimate: not admitted yet (enqueue)"
SHARES = "no estimate: it asks for a share of a GPU"
FREE_NOW = "no estimate: nodes are free for it now; something else holds it (muster explain)"


def beyond(limit: int) -> str:
    return f"no estimate: beyond the first {limit} jobs in line (maxEstimates)"


# -- arguments ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """The ``reservation`` plugin's arguments (docs/plugins/reservation.md)."""

    depth: int = 1
    default_runtime: Mapping[str, float] = field(default_factory=dict)  # queue ("" : any) -> s
    max_estimates: int = 100
    resolution: float = 60.0

    def runtime(self, job: JobInfo) -> float | None:
        """The job's expected runtime: its time limit, else its queue's default; None: unknown."""
        limit = job.spec.time_limit_seconds
        if limit and limit > 0:
            return float(limit)
        found = self.default_runtime.get(job.queue, self.default_runtime.get(""))
        return found if found is not None and found > 0 else None


def _seconds(value: Any) -> float | None:
    """A duration argument: a Go duration ("4h", "90m") or a number of seconds; None: unusable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = parse_go_duration(value)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                return None
    else:
        return None
    return number if math.isfinite(number) and number > 0 else None


def _int(value: Any, default: int, low: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return max(number, low)


def settings_from(arguments: Mapping[str, Any]) -> Settings:
    """Read leniently, as Volcano reads plugin arguments: a value that does not convert is the
    default. ``defaultRuntime`` applies to every queue, ``defaultRuntime.<queue>`` to one."""
    runtimes: dict[str, float] = {}
    for key, value in arguments.items():
        if key == "defaultRuntime" or key.startswith("defaultRuntime."):
            seconds = _seconds(value)
            if seconds is not None:
                runtimes[key.partition(".")[2]] = seconds
    resolution = _seconds(arguments.get("resolution", 60.0)) or 60.0
    return Settings(
        depth=_int(arguments.get("depth", 1), 1, 0),
        default_runtime=runtimes,
        max_estimates=_int(arguments.get("maxEstimates", 100), 100, 0),
        resolution=resolution,
    )


def session_settings(ssn: Session) -> Settings:
    option = ssn.option(PLUGIN)
    return settings_from(option.arguments if option is not None else {})


# -- the timeline -----------------------------------------------------------------------------------------
@dataclass
class Gang:
    """The missing tasks of a job, by shape: (request with a pod slot, static mask, count), and
    one task of each shape (what a ``device_choice`` chooser is asked about)."""

    groups: list[tuple[np.ndarray, np.ndarray, int]]
    tasks: list[TaskInfo] = field(default_factory=list)


@dataclass
class Slot:
    """Where and when a gang fits: the start, per row what it takes there, and the device ids it
    takes on the nodes whose devices a chooser places (row -> ids)."""

    start: float
    rows: np.ndarray  # int rows
    need: np.ndarray  # len(rows) x width
    devices: dict[int, list[str]] = field(default_factory=dict)


class Timeline:
    """Every node's free resources (columns: the session's resources, then pod slots) from now on:
    ``free[k]`` holds during ``[times[k], times[k + 1])``, the last one for ever."""

    def __init__(
        self,
        now: float,
        base: np.ndarray,
        releases: list[tuple[float, int, np.ndarray]],
        resolution: float,
    ) -> None:
        self.now = now
        ends = sorted({t for t, _, _ in releases if t != INF})
        cells = max(base.size, 1)
        cap = max(16, min(MAX_BREAKPOINTS, MAX_CELLS // cells))
        step = max(resolution, 1e-6)
        while True:
            grid = sorted({self._round(t, step) for t in ends})
            if len(grid) < cap:
                break
            step *= 2
        self.resolution = step
        self.times: list[float] = [now, *[t for t in grid if t > now]]
        index = {t: k for k, t in enumerate(self.times)}
        deltas = np.zeros((len(self.times), *base.shape))
        # Everything that never ends stays held; what ends is given back at its (rounded) end.
        self.released = base.copy()  # free once every finite end has passed, without holds
        for t, row, vec in releases:
            if t == INF:
                continue
            k = index[max(self._round(t, step), now)] if t > now else 0
            deltas[k, row] += vec
            self.released[row] += vec
        self.free = base[None, :, :] + np.cumsum(deltas, axis=0)
        self._levels: list[np.ndarray] | None = None  # range minima of ``free`` (sparse table)
        self.devices: DeviceTimes | None = None  # device ids over time, where a chooser places them

    @staticmethod
    def _round(t: float, step: float) -> float:
        return math.ceil(t / step) * step

    def at(self, t: float) -> int:
        """The breakpoint at ``t`` (inserted, copying the interval it splits, if new)."""
        times = self.times
        lo, hi = 0, len(times)
        while lo < hi:
            mid = (lo + hi) // 2
            if times[mid] < t:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(times) and times[lo] == t:
            return lo
        times.insert(lo, t)
        self.free = np.insert(self.free, lo, self.free[lo - 1], axis=0)
        self._levels = None
        return lo

    def hold(self, slot: Slot, runtime: float | None) -> None:
        """``slot`` taken from its start for ``runtime`` seconds (None: for good)."""
        start = self.at(slot.start)
        if runtime is None:
            end = len(self.times)
        else:
            end = self.at(self._round(slot.start + runtime, self.resolution))
        self.free[start:end, slot.rows] -= slot.need
        self._levels = None
        if self.devices is not None and slot.devices:
            until = INF if runtime is None else self._round(slot.start + runtime, self.resolution)
            self.devices.hold(slot.devices, slot.start, until)

    def window_mins(self, runtime: float | None) -> np.ndarray | None:
        """``window_min`` at every breakpoint at once (a sparse table of range minima), or None
        where the table would be too big (a large cluster: each breakpoint is then looked at on
        its own)."""
        k = len(self.times)
        if k * self.free[0].size * max(1, k.bit_length()) > MAX_CELLS:
            return None
        if self._levels is None:
            levels = [self.free]
            span = 1
            while span * 2 <= k:
                prev = levels[-1]
                levels.append(np.minimum(prev[: len(prev) - span], prev[span:]))
                span *= 2
            self._levels = levels
        starts = np.arange(k)
        if runtime is None:
            ends = np.full(k, k)
        else:
            times = np.asarray(self.times)
            ends = np.maximum(np.searchsorted(times, times + runtime, side="left"), starts + 1)
        lengths = ends - starts
        level = np.floor(np.log2(lengths)).astype(np.int64)
        out: np.ndarray = np.empty_like(self.free)
        for lv in np.unique(level).tolist():
            at = np.nonzero(level == lv)[0]
            table = self._levels[lv]
            out[at] = np.minimum(table[at], table[ends[at] - (1 << lv)])
        return out

    def window_min(self, k: int, runtime: float | None) -> np.ndarray:
        """Per node, the least free during ``runtime`` seconds from breakpoint ``k``."""
        if runtime is None:
            last = len(self.times)
        else:
            end = self.times[k] + runtime
            last = k + 1
            while last < len(self.times) and self.times[last] < end:
                last += 1
        if last == k + 1:
            first: np.ndarray = self.free[k]
            return first
        out: np.ndarray = self.free[k:last].min(axis=0)
        return out

    def earliest(
        self,
        gang: Gang,
        masks: list[np.ndarray | None],
        runtime: float | None,
        prefer: np.ndarray,
    ) -> Slot | None:
        """The earliest breakpoint at which the gang fits for its runtime, within one of ``masks``
        (None: anywhere); ties go to the first mask."""
        best: Slot | None = None
        for mask in masks:
            found = self._earliest_in(gang, mask, runtime, prefer)
            if found is not None and (best is None or found.start < best.start):
                best = found
        return best

    def _earliest_in(
        self, gang: Gang, mask: np.ndarray | None, runtime: float | None, prefer: np.ndarray
    ) -> Slot | None:
        # A test at every breakpoint at once, each shape alone: exact for a gang of one shape
        # over its window's minima, a necessary one at the breakpoint alone otherwise.
        mins = self.window_mins(runtime)
        over = self.free if mins is None else mins
        ok = np.ones(len(self.times), dtype=bool)
        for vec, static, count in gang.groups:
            allowed = static if mask is None else static & mask
            ok &= capacity(over[:, allowed, :], vec).sum(axis=1) >= count
        for k in np.nonzero(ok)[0]:
            room = self.window_min(int(k), runtime) if mins is None else mins[k]
            start = self.times[int(k)]
            check = None
            if self.devices is not None:
                check = self.devices.check(gang, start, INF if runtime is None else start + runtime)
            placed = place(gang, room, mask, prefer, check)
            if placed is not None:
                rows, need = placed
                return Slot(start, rows, need, {} if check is None else check.chosen())
        return None


class DeviceTimes:
    """Device ids over time on the nodes whose devices a ``device_choice`` chooser places (an
    Ascend 910's HCCS rings): per row and id, the intervals it is busy, from the tasks holding it
    now (until their expected ends, rounded as the timeline rounds them) and the jobs planned so
    far. Built per row on first use; only asked for tasks that ask whole devices."""

    def __init__(self, ssn: Session, settings: Settings, tl: Timeline) -> None:
        self.ssn = ssn
        self.ledger = ssn.nodes.devices
        self.settings = settings
        self.now = tl.now
        self.step = tl.resolution
        self.busy: dict[int, dict[str, list[tuple[float, float]]]] = {}
        self.opinions: dict[tuple[int, str, int], bool] = {}

    def _busy(self, row: int) -> dict[str, list[tuple[float, float]]]:
        known = self.busy.get(row)
        if known is not None:
            return known
        busy: dict[str, list[tuple[float, float]]] = {}
        held = [*self.ledger.held[row].items(), *self.ledger.promised[row].items()]
        for ident, task in held:
            if task.status == TaskStatus.RELEASING:
                continue  # free now, as the timeline counts it
            end = expected_end(task, self.ssn.jobs.get(task.job), self.settings, self.now)
            until = INF if end == INF else Timeline._round(end, self.step)
            busy.setdefault(ident, []).append((-INF, until))
        for ident in self.ledger.shared[row]:  # a shared GPU: not planned by id, held for good
            busy.setdefault(ident, []).append((-INF, INF))
        self.busy[row] = busy
        return busy

    def hold(self, devices: dict[int, list[str]], start: float, until: float) -> None:
        for row, ids in devices.items():
            busy = self._busy(row)
            for ident in ids:
                busy.setdefault(ident, []).append((start, until))

    def free(self, row: int, resource: str, start: float, end: float) -> list[Device]:
        """Healthy devices busy at no point of ``[start, end)``, in listing order."""
        busy = self._busy(row)
        return [
            d
            for d in self.ledger.of(row).get(resource, ())
            if d.healthy and not any(a < end and b > start for a, b in busy.get(d.id, ()))
        ]

    def ask(
        self, task: TaskInfo, row: int, resource: str, count: int, candidates: list[Device]
    ) -> list[str] | None:
        """The chooser's answer, with the node's ledger showing as held only what is not among
        the candidates (the node as it will be then: a chooser may look at who holds a chip)."""
        ledger, ids = self.ledger, {d.id for d in candidates}
        saved = ledger.held[row]
        ledger.held[row] = {k: t for k, t in saved.items() if k not in ids}
        try:
            return self.ssn.device_choice(task, row, resource, count, candidates)
        finally:
            ledger.held[row] = saved

    def opinion(self, task: TaskInfo, row: int, resource: str, count: int) -> bool:
        """Does a chooser place ``resource`` on ``row`` (it answers for the node's devices all
        free)? None there: the devices are counted, as without a chooser."""
        key = (row, resource, count)
        known = self.opinions.get(key)
        if known is None:
            every = [d for d in self.ledger.of(row).get(resource, ()) if d.healthy]
            known = len(every) >= count and self.ask(task, row, resource, count, every) is not None
            self.opinions[key] = known
        return known

    def check(self, gang: Gang, start: float, end: float) -> DeviceCheck | None:
        if not any(t.device_needs for t in gang.tasks):
            return None
        return DeviceCheck(self, gang, start, end)


class DeviceCheck:
    """One placement's device ids at one instant: how many tasks of a shape a node's free ids
    take, each in turn from what the ones before left, and which ids the placement takes."""

    def __init__(self, times: DeviceTimes, gang: Gang, start: float, end: float) -> None:
        self.times, self.gang, self.start, self.end = times, gang, start, end
        self.taken: dict[int, list[str]] = {}
        self.pending: dict[int, list[list[str]]] = {}

    def fit(self, group: int, row: int, most: int) -> int:
        """How many of ``most`` tasks of the group the row's ids take (their choices kept until
        ``commit``)."""
        task = self.gang.tasks[group]
        times = self.times
        needs = [
            (resource, count)
            for resource, count in task.device_needs.items()
            if times.ledger.of(row).get(resource) and times.opinion(task, row, resource, count)
        ]
        if not needs:
            self.pending[row] = []
            return most
        taken = set(self.taken.get(row, ()))
        free = {r: times.free(row, r, self.start, self.end) for r, _ in needs}
        choices: list[list[str]] = []
        while len(choices) < most:
            ids: list[str] = []
            for resource, count in needs:
                candidates = [d for d in free[resource] if d.id not in taken]
                answer = times.ask(task, row, resource, count, candidates) if candidates else None
                known = {d.id for d in candidates}
                if answer is None or len(set(answer)) != count or not set(answer) <= known:
                    break
                ids += answer
                taken.update(answer)
            else:
                choices.append(ids)
                continue
            break
        self.pending[row] = choices
        return len(choices)

    def commit(self, row: int, n: int) -> None:
        for ids in self.pending.pop(row, [])[:n]:
            self.taken.setdefault(row, []).extend(ids)

    def chosen(self) -> dict[int, list[str]]:
        return {row: ids for row, ids in self.taken.items() if ids}


def capacity(free: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """How many tasks asking ``vec`` fit in each of ``free``'s rows (last axis: resources)."""
    asked = vec > MIN_RESOURCE
    if not asked.any():
        return np.full(free.shape[:-1], 1 << 30, dtype=np.int64)
    ratio = (free[..., asked] + MIN_RESOURCE) / vec[asked]
    out: np.ndarray = np.floor(np.maximum(ratio.min(axis=-1), 0.0)).astype(np.int64)
    return out


def place(
    gang: Gang,
    room: np.ndarray,
    mask: np.ndarray | None,
    prefer: np.ndarray,
    devices: DeviceCheck | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The gang's tasks on ``room`` (free per node), most demanding shape first, each shape on
    the nodes ``prefer`` ranks first (the busiest now: what is idle now stays free for others);
    per row what it takes, or None when it does not fit. With ``devices``, a node takes only as
    many tasks as its free device ids do (asked in node order until the shape is placed)."""
    room = room.copy()
    need = np.zeros_like(room)
    order_of = sorted(range(len(gang.groups)), key=lambda g: _demand(gang.groups[g]))
    for g in order_of:
        vec, static, count = gang.groups[g]
        allowed = static if mask is None else static & mask
        rows = np.nonzero(allowed)[0]
        if not len(rows):
            return None
        cap = capacity(room[rows], vec)
        order = np.lexsort((prefer[rows], cap == 0))
        cap, rows = cap[order], rows[order]
        checked = devices is not None and bool(gang.tasks[g].device_needs)
        if devices is not None and checked:
            found = 0
            for i in range(len(rows)):
                if found >= count:
                    break
                if cap[i] > 0:
                    cap[i] = devices.fit(g, int(rows[i]), int(min(cap[i], count - found)))
                    found += int(cap[i])
        total = np.cumsum(cap)
        if not len(total) or total[-1] < count:
            return None
        last = int(np.searchsorted(total, count))  # the row that completes the group
        take = cap[: last + 1].copy()
        take[last] -= int(total[last]) - count
        if devices is not None and checked:
            for i in range(last + 1):
                devices.commit(int(rows[i]), int(take[i]))
        amounts = take[:, None] * vec[None, :]
        room[rows[: last + 1]] -= amounts
        need[rows[: last + 1]] += amounts
    used = np.nonzero(need.any(axis=1))[0]
    return used, need[used]


def _demand(group: tuple[np.ndarray, np.ndarray, int]) -> float:
    """Most demanding shape first (placed first, it has the widest choice)."""
    return -float(group[0][:-1].sum())


# -- the plan ------------------------------------------------------------------------------------------
@dataclass
class Reservation:
    job: str
    rank: int
    start: float
    end: float | None  # None: for good
    rows: np.ndarray
    need: np.ndarray
    nodes: list[str]
    slack: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    reason: str = ""


@dataclass
class Plan:
    now: float
    reservations: list[Reservation] = field(default_factory=list)
    estimates: dict[str, JobEstimate] = field(default_factory=dict)


def expected_end(task: TaskInfo, job: JobInfo | None, settings: Settings, now: float) -> float:
    """When a task holding a node is expected to give it back (INF: never known)."""
    if task.status == TaskStatus.RELEASING:
        return now
    runtime = settings.runtime(job) if job is not None else None
    if runtime is None:
        return INF
    started = job.spec.started_at if job is not None else None
    if (
        task.status in (TaskStatus.ALLOCATED, TaskStatus.PIPELINED, TaskStatus.BINDING)
        or started is None
        or started <= 0
    ):
        started = now  # placed this cycle, or not running yet: its runtime starts now
    end = started + runtime
    return end if end > now else now + settings.resolution  # past its end: any moment now


def _width(ssn: Session) -> int:
    return ssn.space.size + 1  # the resources, then a pod slot


def task_vec(task: TaskInfo, width: int) -> np.ndarray:
    vec = np.zeros(width)
    vec[: width - 1] = task.resreq
    vec[-1] = 1.0
    return vec


def timeline(ssn: Session, settings: Settings) -> Timeline:
    """The session's nodes now: free resources (what releasing tasks hold counted free, what
    pipelined ones are promised taken) and what each holder gives back when."""
    nodes, width, now = ssn.nodes, _width(ssn), ssn.now
    base = np.zeros((len(nodes), width))
    if len(nodes):
        base[:, :-1] = nodes.idle - nodes.pipelined
        base[:, -1] = nodes.max_tasks - nodes.task_count
    releases: list[tuple[float, int, np.ndarray]] = []
    gpu = nodes.gpu_dim if len(nodes) else None
    for row in range(len(nodes)):
        for task in nodes.tasks[row].values():
            vec = task_vec(task, width)
            if task.status == TaskStatus.RELEASING:
                base[row] += vec  # free once released: counted now
                continue
            releases.append((expected_end(task, ssn.jobs.get(task.job), settings, now), row, vec))
        # A shared GPU (KAI GPU sharing) is a whole GPU again once all its tasks are gone.
        for holders in nodes.shared[row].values() if gpu is not None else ():
            end = max(expected_end(t, ssn.jobs.get(t.job), settings, now) for t in holders)
            if holders and gpu is not None:
                vec = np.zeros(width)
                vec[gpu] = UNIT
                releases.append((end, row, vec))
    tl = Timeline(now, base, releases, settings.resolution)
    if any(ssn.chain("device_choice")):  # device topology: ids planned where a chooser places them
        tl.devices = DeviceTimes(ssn, settings, tl)
    return tl


def preference(ssn: Session, tl: Timeline) -> np.ndarray:
    """Per node, its share free now (mean over the resources it has): a reservation takes the
    busiest nodes that will be free in time, leaving what is idle now to jobs that can use it."""
    nodes = ssn.nodes
    if not len(nodes):
        return np.zeros(0)
    alloc = nodes.allocatable
    has = alloc > MIN_RESOURCE
    share = np.where(has, tl.free[0][:, :-1] / np.where(has, alloc, 1.0), 0.0)
    counted = np.maximum(has.sum(axis=1), 1)
    out: np.ndarray = share.sum(axis=1) / counted
    return out


def waiting(job: JobInfo) -> int:
    """How many more tasks the job needs placed for its gang (0: none, it is not waiting)."""
    placed = job.waiting_task_num() + job.ready_task_num() + job.pending_best_effort_num()
    return max(job.min_available, 1) - placed


def missing_tasks(ssn: Session, job: JobInfo, count: int) -> list[TaskInfo]:
    """The ``count`` pending tasks the gang needs: those its roles' minimums ask first, then in
    task order."""
    pending = sorted(
        (t for t in job.index[TaskStatus.PENDING].values() if not t.best_effort),
        key=functools.cmp_to_key(_cmp(ssn.task_order_fn)),
    )
    chosen: list[TaskInfo] = []
    picked: set[str] = set()  # uids of ``chosen``
    if job.task_min_available:
        have = job.allocated_roles()
        for t in list(job.index[TaskStatus.PIPELINED].values()):
            have[t.role] = have.get(t.role, 0) + 1
        for role, least in job.task_min_available.items():
            lack = least - have.get(role, 0)
            for t in pending:
                if lack <= 0:
                    break
                if t.role == role and t.uid not in picked:
                    chosen.append(t)
                    picked.add(t.uid)
                    lack -= 1
    for t in pending:
        if len(chosen) >= count:
            break
        if t.uid not in picked:
            chosen.append(t)
            picked.add(t.uid)
    return chosen


def gang_of(ssn: Session, tasks: list[TaskInfo]) -> Gang:
    width = _width(ssn)
    groups: dict[Any, tuple[np.ndarray, np.ndarray, int]] = {}
    first: dict[Any, TaskInfo] = {}
    schedulable = ssn.nodes.schedulable
    for t in tasks:
        key = t.shape_key
        known = groups.get(key)
        if known is None:
            static = ssn.evaluator.static_mask(t) & schedulable
            groups[key] = (task_vec(t, width), static, 1)
            first[key] = t
        else:
            groups[key] = (known[0], known[1], known[2] + 1)
    return Gang(list(groups.values()), list(first.values()))


def backend_masks(ssn: Session) -> list[np.ndarray]:
    """Per backend (in name order), the mask of its nodes, where a gang must stay on one backend:
    empty where gangs may span backends or there is one at most. Built once per plan."""
    if ssn.config.session.get(GANG_ACROSS_BACKENDS) is True or not len(ssn.nodes):
        return []
    of = [s.backend for s in ssn.nodes.specs]
    backends = sorted(set(of))
    if len(backends) < 2:
        return []
    return [np.array([b == name for b in of], dtype=bool) for name in backends]


def domains(ssn: Session, job: JobInfo, backends: list[np.ndarray]) -> list[np.ndarray | None]:
    """The node sets the gang must stay within: a topology domain (Volcano's hard network
    topology, KAI's topology) and, unless gangs may span backends, one backend (``backends``:
    ``backend_masks``)."""
    masks: list[np.ndarray | None] = [None]
    if job.spec.network_topology:
        hypernodes = hypernode_masks(ssn, job)
        if hypernodes is not None:
            masks = list(hypernodes)
    else:
        domains_now = topology_masks(ssn, job)
        if domains_now is not None:
            masks = list(domains_now)
    if backends:
        masks = [p if m is None else m & p for m in masks for p in backends]
    return masks


def _held_rows(ssn: Session, job: JobInfo) -> list[int]:
    """The rows of the nodes the job's allocated or pipelined tasks hold."""
    index = ssn.nodes.index
    return [
        index[t.node]
        for t in job.tasks.values()
        if t.node in index and t.status in (*ALLOCATED, TaskStatus.PIPELINED)
    ]


def hypernode_masks(ssn: Session, job: JobInfo) -> list[np.ndarray] | None:
    """For a job the network topology plugin holds to one hypernode (hard mode): the node masks of
    every hypernode of a tier it allows (lowest tier first), holding the nodes it already holds --
    whatever their room now (the plugin's gradients keep only those with room now). None: the job
    is held to no hypernode."""
    if ssn.hypernode_gradients(job) is None:  # no plugin, or soft mode
        return None
    specs = {h.name: h for h in ssn.hypernodes}
    max_tier = max((h.tier for h in specs.values()), default=1)
    topology = job.spec.network_topology
    try:
        highest = int(
            topology.get("highestTierAllowed", topology.get("highest_tier_allowed", max_tier))
        )
    except (TypeError, ValueError):
        highest = max_tier
    index, n = ssn.nodes.index, len(ssn.nodes)
    held = _held_rows(ssn, job)
    out: list[np.ndarray] = []
    for spec in sorted(specs.values(), key=lambda h: (h.tier, h.name)):
        if spec.tier > highest:
            continue
        mask = np.zeros(n, dtype=bool)
        stack, seen = [spec.name], {spec.name}
        while stack:  # its nodes and, through its child hypernodes, theirs
            h = specs[stack.pop()]
            for name in h.nodes:
                if name in index:
                    mask[index[name]] = True
            for child in h.hypernodes:
                if child in specs and child not in seen:
                    seen.add(child)
                    stack.append(child)
        if not held or mask[held].all():
            out.append(mask)
    return out


def topology_masks(ssn: Session, job: JobInfo) -> list[np.ndarray] | None:
    """For a job with a required topology level (KAI's topology plugin, the ``node_sets`` point):
    the node masks of every domain of that level (the nodes carrying every level's label, grouped
    by their labels down to it), whatever their room now (the point keeps only those with room
    now), holding the nodes the job already holds. None: the job is held to no domain."""
    constraint = job.spec.topology or {}
    name, required = constraint.get("topology"), str(constraint.get("requiredLevel") or "")
    if not name or not required or not any(ssn.chain(NODE_SETS_POINT)):
        return None
    levels = next(
        (
            [str(lv) for lv in t.get("levels") or []]
            for t in ssn.snapshot.topologies
            if t.get("name") == name
        ),
        None,
    )
    if levels is None or required not in levels:
        return []
    upto = levels[: levels.index(required) + 1]
    groups: dict[tuple[str, ...], list[int]] = {}
    for row, labels in enumerate(ssn.nodes.labels):
        if all(level in labels for level in levels):
            groups.setdefault(tuple(labels[level] for level in upto), []).append(row)
    held = _held_rows(ssn, job)
    out = []
    for key in sorted(groups):
        mask = np.zeros(len(ssn.nodes), dtype=bool)
        mask[groups[key]] = True
        if not held or mask[held].all():
            out.append(mask)
    return out


def _cmp(less: Callable[[Any, Any], bool]) -> Callable[[Any, Any], int]:
    return lambda a, b: -1 if less(a, b) else (1 if less(b, a) else 0)


def line(ssn: Session) -> tuple[list[JobInfo], list[JobInfo]]:
    """(jobs waiting for their gang in about allocate's order, jobs not admitted yet)."""
    enqueue = "enqueue" in ssn.config.actions
    by_queue: dict[str, list[JobInfo]] = {}
    not_admitted: list[JobInfo] = []
    for job in ssn.jobs.values():
        if job.uid in ssn.invalid_jobs or job.queue not in ssn.queues:
            continue
        # Every pending task best-effort (the job counts those): nothing to plan.
        if waiting(job) <= 0 or not job.pending_asks():
            continue
        # Not admitted yet: enqueue admits a job without minResources at once (this cycle, when
        # planned before it); one with them waits for the enqueue votes.
        if enqueue and job.phase == PodGroupPhase.PENDING and job.spec.min_resources:
            not_admitted.append(job)
            continue
        by_queue.setdefault(job.queue, []).append(job)
    key = ssn.job_order_key()
    for jobs in by_queue.values():
        if key is not None:
            jobs.sort(key=key)
        else:
            jobs.sort(key=functools.cmp_to_key(_cmp(ssn.job_order_fn)))
    queues = [ssn.queues[q] for q in by_queue]
    kai = ssn.config.profile == "kai"
    ordered: list[JobInfo] = []
    heads = dict.fromkeys(by_queue, 0)
    while queues:
        if kai:

            def before(left: QueueInfo, right: QueueInfo) -> bool:
                return ssn.queue_jobs_order(
                    left,
                    right,
                    by_queue[left.uid][heads[left.uid]],
                    by_queue[right.uid][heads[right.uid]],
                    [],
                    [],
                )

            queues.sort(key=functools.cmp_to_key(_cmp(before)))
        else:
            queues.sort(key=functools.cmp_to_key(_cmp(ssn.queue_order_fn)))
        for q in queues:
            ordered.append(by_queue[q.uid][heads[q.uid]])
            heads[q.uid] += 1
        queues = [q for q in queues if heads[q.uid] < len(by_queue[q.uid])]
    return ordered, not_admitted


def plan(ssn: Session, settings: Settings, *, estimates: bool) -> Plan:
    """Reservations for the first ``depth`` jobs in line that cannot start now; with
    ``estimates``, every job in line (up to ``max_estimates``) gets its estimate too."""
    now = ssn.now
    out = Plan(now)
    line_jobs, not_admitted = line(ssn)
    if not line_jobs and not (estimates and not_admitted):
        return out
    tl = timeline(ssn, settings)
    prefer = preference(ssn, tl)
    backends = backend_masks(ssn)
    limit = settings.max_estimates if estimates else max(settings.max_estimates, settings.depth)
    walked = 0  # jobs considered
    for job in line_jobs:
        if not estimates and len(out.reservations) >= settings.depth:
            break
        if walked >= limit:
            if estimates:
                out.estimates[job.uid] = JobEstimate(None, note=beyond(settings.max_estimates))
            continue
        walked += 1
        tasks = missing_tasks(ssn, job, waiting(job))
        if not tasks:
            continue
        if any(t.gpu_fraction for t in tasks):
            out.estimates[job.uid] = JobEstimate(None, note=SHARES)
            continue
        gang = gang_of(ssn, tasks)
        runtime = settings.runtime(job)
        masks = domains(ssn, job, backends)
        slot = tl.earliest(gang, masks, runtime, prefer)
        if slot is None:
            out.estimates[job.uid] = JobEstimate(None, note=_why_never(ssn, tl, gang, masks))
            continue
        tl.hold(slot, runtime)
        names = [ssn.nodes.names[int(r)] for r in slot.rows]
        if slot.start <= now:
            out.estimates[job.uid] = JobEstimate(None, names, note=FREE_NOW)
            continue
        if len(out.reservations) < settings.depth:
            end = None if runtime is None else slot.start + runtime
            out.reservations.append(
                Reservation(
                    job.uid, len(out.reservations), slot.start, end, slot.rows, slot.need, names
                )
            )
            out.estimates[job.uid] = JobEstimate(slot.start, names, reserved=True)
        else:
            out.estimates[job.uid] = JobEstimate(slot.start, names)
    if estimates:
        for job in not_admitted:
            out.estimates[job.uid] = JobEstimate(None, note=NOT_ADMITTED)
    if out.reservations:
        _slack(ssn, settings, out)
    return out


def _why_never(ssn: Session, tl: Timeline, gang: Gang, masks: list[np.ndarray | None]) -> str:
    """Why a gang fits at no point of the timeline."""
    if any(place(gang, tl.released, m, np.zeros(len(tl.released))) for m in masks):
        return AHEAD_NO_LIMIT
    width = _width(ssn)
    empty = np.zeros((len(ssn.nodes), width))
    if len(ssn.nodes):
        empty[:, :-1] = ssn.nodes.allocatable
        empty[:, -1] = ssn.nodes.max_tasks
    if any(place(gang, empty, m, np.zeros(len(empty))) for m in masks):
        return NO_LIMIT
    return NEVER


def _slack(ssn: Session, settings: Settings, out: Plan) -> None:
    """Per reserved node, what the reservation leaves free during its window once every
    reservation holds its nodes: what others may take there and keep past its start."""
    tl = timeline(ssn, settings)
    for r in out.reservations:
        runtime = None if r.end is None else r.end - r.start
        tl.hold(Slot(r.start, r.rows, r.need), runtime)
    for r in out.reservations:
        k = tl.at(r.start)
        runtime = None if r.end is None else r.end - r.start
        r.slack = tl.window_min(k, runtime)[r.rows].copy()
        r.reason = (
            f"would delay reservation of job {r.job} on nodes {folded_names(r.nodes)} "
            f"from {clock_text(r.start, out.now)}"
        )


class Enforcement:
    """A plan's reservations as a node filter: another job's task goes onto a reserved node only
    if it ends before the reservation starts or the reservation keeps room enough there. Kept up
    to date by the session's allocate / deallocate events (what is placed there takes room)."""

    def __init__(self, ssn: Session, settings: Settings, found: Plan) -> None:
        self.now = found.now
        self.settings = settings
        self.reservations = found.reservations
        self.width = _width(ssn)
        self.jobs = ssn.jobs
        n = len(ssn.nodes)
        self.position: list[np.ndarray] = []
        for r in self.reservations:
            pos = np.full(n, -1, dtype=np.int64)
            pos[r.rows] = np.arange(len(r.rows))
            self.position.append(pos)
        self.ranks = {r.job: r.rank for r in self.reservations}
        self.index = ssn.nodes.index
        self.taken: dict[str, list[tuple[int, int, np.ndarray]]] = {}

    def end(self, task: TaskInfo) -> float:
        job = self.jobs.get(task.job)
        runtime = self.settings.runtime(job) if job is not None else None
        return INF if runtime is None else self.now + runtime

    def _applies(self, task: TaskInfo, r: Reservation, end: float) -> bool:
        """Does reservation ``r`` bind ``task``'s job? Not its own job, nor a job reserved ahead
        of it, nor a task that ends before it starts or asks for nothing."""
        if task.job == r.job or task.best_effort:
            return False
        rank = self.ranks.get(task.job)
        if rank is not None and rank < r.rank:
            return False
        return end > r.start

    def check(self, task: TaskInfo, rows: np.ndarray) -> np.ndarray:
        ok = np.ones(len(rows), dtype=bool)
        end = self.end(task)
        vec = task_vec(task, self.width)
        for i, r in enumerate(self.reservations):
            if not self._applies(task, r, end):
                continue
            pos = self.position[i][rows]
            inside = pos >= 0
            if inside.any():
                fits = np.all(vec <= r.slack[pos[inside]] + MIN_RESOURCE, axis=1)
                ok[np.nonzero(inside)[0][~fits]] = False
        return ok

    def reasons(self, task: TaskInfo, rows: np.ndarray) -> list[str]:
        end = self.end(task)
        vec = task_vec(task, self.width)
        out: list[str] = []
        for row in rows.tolist():
            why = "node(s) are reserved"
            for i, r in enumerate(self.reservations):
                p = int(self.position[i][row])
                if (
                    p >= 0
                    and self._applies(task, r, end)
                    and not np.all(vec <= r.slack[p] + MIN_RESOURCE)
                ):
                    why = r.reason
                    break
            out.append(why)
        return out

    def allocated(self, task: TaskInfo) -> None:
        """A task placed this cycle (allocated or pipelined) takes room from the reservations it
        is bound by, on its node."""
        if task.uid in self.taken or task.node is None:
            return
        if task.status not in (TaskStatus.ALLOCATED, TaskStatus.PIPELINED):
            return  # a running task placed back (an eviction undone): counted in the plan
        row = self.index.get(task.node, -1)
        if row < 0:
            return
        end = self.end(task)
        vec = task_vec(task, self.width)
        took: list[tuple[int, int, np.ndarray]] = []
        for i, r in enumerate(self.reservations):
            p = int(self.position[i][row])
            if p >= 0 and self._applies(task, r, end):
                r.slack[p] -= vec
                took.append((i, p, vec))
        if took:
            self.taken[task.uid] = took

    def deallocated(self, task: TaskInfo) -> None:
        """Its placement undone: the room it took is the reservations' again."""
        for i, p, vec in self.taken.pop(task.uid, ()):
            self.reservations[i].slack[p] += vec
