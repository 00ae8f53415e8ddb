"""The extension points, as one executable table (``POINTS``).

Each point is one row (a ``Point``): its name, the YAML switch that turns it on per plugin
(Volcano's spelling, from ``conf.PluginOption``), the type of the function a plugin registers and
of what asking the point gives (its type arguments), and the function that combines the answers of
the registered plugins -- whose docstring is the rule. Plugins register functions with the row
(``ssn.register(JOB_READY, self.name, fn)``, typed by it); the session keeps per point the *chain*
of the plugins whose switch is on (tiers in order, plugins in tier order), and answers every query
by calling the point's combining function on that chain (a row named on the session is asked as its
method: ``ssn.job_ready(job)``). Checks that say why answer a ``Verdict``. The rules follow
Volcano's ``framework/session_plugins.go``. ``markdown_table`` renders the table for
docs/config.md (``render_docs``; a test keeps the two equal). Event handlers (allocate /
deallocate) are not points: every plugin's handler is called, with no switch, as in Volcano.

Switches Volcano accepts that reach no Muster extension point are declared once, below the
table: ``PLUGIN_SWITCHES`` (read by plugins themselves) and ``COMPATIBILITY_SWITCHES`` (accepted,
no effect). ``server/config.py`` derives the YAML keys it accepts from ``ALL_SWITCHES``.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import (
    Any,
    Generic,
    Literal,
    Never,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
    overload,
)

import numpy as np

from muster.devices import Device
from server.session.info import JobInfo, QueueInfo, TaskInfo

# Votes (job_pipelined, job_enqueueable) and the verdict of preemptable / reclaimable answers.
PERMIT = 1
ABSTAIN = 0
REJECT = -1


class Verdict(int):
    """An answer that says why, like the Kubernetes scheduling framework's ``Status`` (a code, the
    reason, the plugin). Its value is the code, a vote's (``PERMIT``, ``ABSTAIN``, ``REJECT``), so
    it votes and compares like the plain ints plugins return; it is true unless it refuses
    (``ok``). Plugins name themselves in their refusals (``refuse(self.name, why)``)."""

    reason: str
    plugin: str

    def __new__(cls, code: int, reason: str = "", plugin: str = "") -> Verdict:
        verdict = super().__new__(cls, code)
        verdict.reason, verdict.plugin = reason, plugin
        return verdict

    @property
    def ok(self) -> bool:
        return self >= 0

    def __bool__(self) -> bool:
        return self >= 0

    def __repr__(self) -> str:
        return f"Verdict({int(self)}, {self.reason!r}, {self.plugin!r})"


ALLOWED = Verdict(PERMIT)


def refuse(plugin: str, reason: str) -> Verdict:
    """``plugin`` refuses, saying why."""
    return Verdict(REJECT, reason, plugin)


Scope = Literal["static", "shape", "task"]
Rows = np.ndarray  # int64 node row indices

F = TypeVar("F")
# The enabled registrations of one point: tiers in order, each a list of (plugin, function).
Chain = list[list[tuple[str, F]]]


# -- what plugins hand to the session ---------------------------------------------------------------
@dataclass
class ValidateResult:
    passed: bool
    reason: str = ""
    message: str = ""


@dataclass
class EventHandler:
    """Called on every Statement operation and its undo (no switch, every plugin's handler)."""

    allocate: Callable[[TaskInfo], None] | None = None
    deallocate: Callable[[TaskInfo], None] | None = None


@dataclass
class Predicate:
    """A vectorised node filter. Its scope tells the NodeEvaluator what it may cache:
    ``static`` (task's static key, fixed node attributes), ``shape`` (also the request and node
    rows allocations change), ``task`` (anything else: evaluated fresh on the candidate rows)."""

    scope: Scope
    check: Callable[[TaskInfo, Rows], np.ndarray]  # -> bool per row
    # Reason per failing row (kube-scheduler wording); default: ``reason`` for every row.
    reasons: Callable[[TaskInfo, Rows], list[str]] | None = None
    reason: str = "node(s) didn't pass the predicate"
    plugin: str = ""
    # Stricter check for placing on idle resources now rather than on resources still being
    # released (pipelining): e.g. device topology, where a chip being released is not free yet.
    # None: ``check`` decides both. Honoured for ``shape`` and ``task`` scope.
    now: Callable[[TaskInfo, Rows], np.ndarray] | None = None
    # ``check`` for one row in plain Python (same answer): a placement changes one row, and
    # re-checking one row through numpy costs ~10x the arithmetic. Used for ``shape`` scope when
    # every shape predicate and scorer has one.
    row: Callable[[TaskInfo, int], bool] | None = None
    # This predicate only checks a per-node count that each placed task consumes by one, e.g.
    # "pods": code that knows that count may reason about it (the KAI solver's shortcuts).
    counts: str | None = None


@dataclass
class Scorer:
    """A vectorised node score, with a cache scope like ``Predicate``'s."""

    scope: Scope
    score: Callable[[TaskInfo, Rows], np.ndarray]  # -> float per row
    # Applied to a static scorer's raw scores over the nodes that pass the static predicates.
    normalize: Callable[[np.ndarray], np.ndarray] | None = None
    plugin: str = ""
    # ``score`` for one row in plain floats, the same value bit for bit (see ``Predicate.row``).
    row: Callable[[TaskInfo, int], float] | None = None


# -- signatures of the registered functions -------------------------------------------------------
JobCompareFn = Callable[[JobInfo, JobInfo], int]  # < 0: left first, > 0: right first, 0: no opinion
TaskCompareFn = Callable[[TaskInfo, TaskInfo], int]
# A plugin's order as a sort key, smaller first: compare(a, b) < 0 exactly when key(a) < key(b), and
# 0 when the keys are equal. Asked once when an item is queued, rather than at every comparison.
JobKeyFn = Callable[[JobInfo], Any]
TaskKeyFn = Callable[[TaskInfo], Any]
QueueKeyFn = Callable[[QueueInfo], Any]
QueueCompareFn = Callable[[QueueInfo, QueueInfo], int]
VictimQueueCompareFn = Callable[
    [QueueInfo, QueueInfo, QueueInfo | None], int
]  # (l, r, preemptor's queue)
JobCheckFn = Callable[[JobInfo], bool]
QueueTaskCheckFn = Callable[[QueueInfo, TaskInfo], bool]
QueueTaskVerdictFn = Callable[
    [QueueInfo, TaskInfo], Verdict
]  # may the queue take the task? why not
QueueCheckFn = Callable[[QueueInfo], bool]
JobValidFn = Callable[[JobInfo], ValidateResult | None]
VoteFn = Callable[[JobInfo], int]  # PERMIT, ABSTAIN or REJECT (a Verdict: a REJECT that says why)
JobVerdictFn = Callable[[JobInfo], Verdict]
JobNotifyFn = Callable[[JobInfo], None]
# (evictor, candidates) -> (victims, PERMIT), or (anything, ABSTAIN) to stay out of the decision.
EvictableFn = Callable[[TaskInfo, list[TaskInfo]], tuple[list[TaskInfo], int]]
VictimsFn = Callable[[TaskInfo, list[TaskInfo]], list[TaskInfo]]  # (evictor, candidates) -> victims
VictimTasksFn = Callable[[list[TaskInfo]], list[TaskInfo]]
Gradients = list[list[tuple[str, np.ndarray]]]  # tiers of (hypernode, node mask), tried in order
HyperNodeGradientFn = Callable[[JobInfo], Gradients | None]
HyperNodeOrderFn = Callable[[JobInfo, dict[str, np.ndarray]], dict[str, float]]
# (task, node row, device resource, count, candidate devices best first) -> the ids, or None.
DeviceChoiceFn = Callable[[TaskInfo, int, str, int, list[Device]], list[str] | None]
# KAI's points. (left queue, right queue, left's next job, right's next job, left's victims, right's).
QueueJobsCompareFn = Callable[
    [QueueInfo, QueueInfo, JobInfo | None, JobInfo | None, list[JobInfo], list[JobInfo]], int
]
# (job, the tasks about to be placed) -> within the queues' bounds, or a refusal saying why not.
JobCapacityFn = Callable[[JobInfo, list[TaskInfo]], Verdict]
# (reclaimer job, the tasks it places, the victim tasks of a candidate solution) -> is it fair?
ScenarioCheckFn = Callable[[JobInfo, list[TaskInfo], list[TaskInfo]], bool]
SolutionStartFn = Callable[[], None]
# (job, the tasks about to be placed) -> node masks to try in order (topology domains), or None.
NodeSetsFn = Callable[[JobInfo, list[TaskInfo]], list[np.ndarray] | None]
# (task, node row, shared GPU group, or "" for a whole free GPU) -> score: the best group first.
GpuOrderFn = Callable[[TaskInfo, int, str], float]
# Points where a plugin registers several functions at once may take one or a list.
Predicates = Predicate | list[Predicate]
Scorers = Scorer | list[Scorer]
VictimTasksFns = VictimTasksFn | list[VictimTasksFn]


# -- combining functions: the docstring's first line is the rule ----------------------------------
def first_non_zero(chain: Chain[Callable[..., int]], *args: Any) -> int:
    """The first plugin, in tier order, with a non-zero answer decides; 0 when every plugin ties."""
    for row in chain:
        for _, fn in row:
            r = fn(*args)
            if r:
                return r
    return 0


def first_refusal(chain: Chain[Callable[..., Verdict]], *args: Any) -> Verdict:
    """The first plugin, in tier order, that refuses decides, saying why; none refuses: allowed."""
    for row in chain:
        for _, fn in row:
            verdict = fn(*args)
            if not verdict:
                return verdict
    return ALLOWED


def sum_of(chain: Chain[Callable[..., float]], *args: Any) -> float:
    """The scores of every enabled plugin add up (none registered: 0)."""
    return sum(fn(*args) for row in chain for _, fn in row)


def keys_in_order(chain: Chain[Callable[[Any], Any]], item: Any) -> tuple[Any, ...]:
    """Every enabled plugin's key, in tier order, compared left to right (the order first_non_zero gives over the matching comparisons)."""
    return tuple([fn(item) for row in chain for _, fn in row])


def all_must_pass(chain: Chain[Callable[..., bool]], *args: Any) -> bool:
    """Every enabled plugin must answer true (none registered: true)."""
    for row in chain:
        for _, fn in row:
            if not fn(*args):
                return False
    return True


def all_masks_pass(
    predicates: Iterable[Predicate], task: TaskInfo, rows: Rows, mask: np.ndarray
) -> np.ndarray:
    """Every enabled plugin's predicates must pass a node: their masks are ANDed."""
    for p in predicates:
        mask &= p.check(task, rows)
    return mask


def node_scores_add(
    scorers: Iterable[Scorer],
    task: TaskInfo,
    rows: Rows,
    total: np.ndarray,
    passing: np.ndarray | None = None,
) -> np.ndarray:
    """The node scores of every enabled plugin add up."""
    for s in scorers:
        raw = s.score(task, rows)
        # Static scope: a scorer's normaliser sees only the nodes that pass the static predicates.
        if passing is not None and s.normalize is not None and passing.any():
            normalized = np.zeros(len(rows))
            normalized[passing] = s.normalize(raw[passing])
            raw = normalized
        total += raw
    return total


def first_failure(chain: Chain[JobValidFn], job: JobInfo) -> ValidateResult | None:
    """The first plugin, in tier order, that fails the job decides; none fails: valid (None)."""
    for row in chain:
        for _, fn in row:
            vr = fn(job)
            if vr is not None and not vr.passed:
                return vr
    return None


def vote(chain: Chain[VoteFn], job: JobInfo) -> Verdict:
    """Any REJECT refuses at once; a PERMIT ends the check at the end of its tier; only ABSTAIN: permit."""
    for row in chain:
        permitted = False
        for name, fn in row:
            r = fn(job)
            if r < 0:  # a plain REJECT says nothing more than who
                return r if isinstance(r, Verdict) else Verdict(REJECT, "", name)
            if r > 0:
                permitted = True
        if permitted:
            return ALLOWED
    return ALLOWED


def first_tier_all(chain: Chain[JobCheckFn], job: JobInfo) -> bool:
    """The first tier with a function decides, all of its functions answering true; none anywhere: false."""
    for row in chain:
        if row:
            return all(fn(job) for _, fn in row)
    return False


def any_true(chain: Chain[Callable[..., bool]], *args: Any) -> bool:
    """Any enabled plugin answering true makes it true (none registered: false)."""
    return any(fn(*args) for row in chain for _, fn in row)


def intersect_first_tier(
    chain: Chain[EvictableFn], evictor: TaskInfo, candidates: list[TaskInfo]
) -> list[TaskInfo]:
    """Victims are intersected within a tier (no victims empties it, ABSTAIN is skipped); the first tier with victims decides."""
    victims: list[TaskInfo] | None = None
    for row in chain:
        for _, fn in row:
            chosen, verdict = fn(evictor, candidates)
            if verdict == ABSTAIN:
                continue
            if not chosen:
                victims = None
                break
            if victims is None:
                victims = list(chosen)
            else:
                keep = {t.uid for t in chosen}
                # Volcano: an empty intersection is nil again, so the next plugin of the tier
                # starts afresh and an all-empty tier falls through to the next tier.
                victims = [v for v in victims if v.uid in keep] or None
        if victims is not None:
            return victims
    return victims or []


def union_first_tier(chain: Chain[VictimTasksFns], tasks: list[TaskInfo]) -> list[TaskInfo]:
    """The victims of a tier's functions are united; the first tier with victims decides."""
    for row in chain:
        found: dict[str, TaskInfo] = {}
        for _, fns in row:
            for fn in fns if isinstance(fns, list) else [fns]:
                for v in fn(tasks):
                    found[v.uid] = v
        if found:
            return list(found.values())
    return []


def call_all(chain: Chain[Callable[..., None]], *args: Any) -> None:
    """Every enabled plugin is called, in tier order (a notification)."""
    for row in chain:
        for _, fn in row:
            fn(*args)


def first_answer(chain: Chain[Callable[..., Any]], *args: Any) -> Any:
    """The first enabled plugin with a function answers; none registered: None."""
    for row in chain:
        for _, fn in row:
            return fn(*args)
    return None


def first_non_none(chain: Chain[Callable[..., Any]], *args: Any) -> Any:
    """The first enabled plugin, in tier order, that answers (not None) decides; none answers: None."""
    for row in chain:
        for _, fn in row:
            r = fn(*args)
            if r is not None:
                return r
    return None


def scores_add(
    chain: Chain[HyperNodeOrderFn], job: JobInfo, candidates: dict[str, np.ndarray]
) -> dict[str, float]:
    """The scores of every enabled plugin add up, per candidate (each starts at 0)."""
    scores = dict.fromkeys(candidates, 0.0)
    for row in chain:
        for _, fn in row:
            for name, value in fn(job, candidates).items():
                scores[name] += value
    return scores


# -- the table ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Switch:
    key: str  # the YAML key, Volcano's spelling (its enable/enabled inconsistencies included)
    name: str  # what ``PluginOption.enabled`` is asked
    default: bool = True  # its value when not written (``extension_points_not_listed: enabled``)


R = TypeVar("R")  # what a plugin registers at a point
A = TypeVar("A")  # what asking a point gives: the combined function of its chain


class Point(Generic[R, A]):
    """One row of the table. Its type arguments, written once in the row
    (``Point[JobCheckFn, JobCheckFn](...)``), are what a plugin registers (``R``: ``Session.register``
    is typed by it) and what asking the point gives (``A``). Named as an attribute of the session
    (``job_ready = JOB_READY``), a point is asked as a method, ``ssn.job_ready(job)``, typed by
    ``A``: the session binds that attribute to the point's combined function once its chains are
    built, shadowing this descriptor."""

    def __init__(
        self,
        name: str,
        switch: Switch | None,  # None: always on (Volcano checks no switch either)
        combine: Callable[..., Any],  # how the session combines the chain's answers
        note: str = "",  # beyond the rule: the order points' tie-breaks (applied by the session) ...
        # Combined by the NodeEvaluator, per cache scope, over the flattened chain (tiers do not
        # matter for an AND or a sum): ``combine`` takes the predicates / scorers, not the chain.
        vectorised: bool = False,
    ) -> None:
        self.name, self.switch, self.combine = name, switch, combine
        self.note, self.vectorised = note, vectorised

    @property
    def signature(self) -> Any:
        """The type of what a plugin registers: the row's first type argument."""
        alias = vars(self).get("__orig_class__")  # set by Python when made as Point[R, A](...)
        if alias is None:
            raise TypeError(f"point {self.name} was made without its type arguments")
        return get_args(alias)[0]

    @property
    def rule(self) -> str:
        doc = (self.combine.__doc__ or "").strip().splitlines()
        return doc[0] if doc else ""

    @overload
    def __get__(self, ssn: None, owner: type[Any]) -> Point[R, A]: ...
    @overload
    def __get__(self, ssn: object, owner: type[Any]) -> A: ...
    def __get__(self, ssn: object, owner: type[Any]) -> Point[R, A] | A:
        if ssn is None:  # the class's attribute: the row itself
            return self
        raise AttributeError(f"extension point {self.name} is asked outside its session's chains")

    def __repr__(self) -> str:
        return f"<Point {self.name}>"


# Rules under which a chain holding one plugin can be that plugin's function itself, with no
# partial and no loop over tiers per call (allocatable and job_ready are asked at every placement,
# order keys computed for every task, orders compared hundreds of thousands of times a cycle): the
# checks answer what the plugin answers (its verdict: plugins name themselves in refusals); an
# order key's one-element tuple orders as its element; a comparison's answer is its own first
# non-zero answer.
_ONE_PLUGIN_IS_THE_RULE = (all_must_pass, any_true, keys_in_order, first_refusal, first_non_zero)


def combined(point: Point[Any, A], chain: Chain[Any]) -> A:
    """``point.combine`` over ``chain`` as one function."""
    fns = [fn for row in chain for _, fn in row]
    if len(fns) == 1 and point.combine in _ONE_PLUGIN_IS_THE_RULE:
        only: A = fns[0]
        return only
    return cast(A, partial(point.combine, chain))  # the row's type arguments say what it is


_ENQUEUE_SWITCH = Switch("enableJobEnqueued", "job_enqueued")  # Volcano: both enqueue points
_TIE = "Ties: creation order, then uid."
_KEY = "Used only when every plugin of {} gives its key; then the same ties."

# Not a point: Volcano's sub_job_order. Volcano (1.14+) asks it only inside allocate's sub-job
# worksheet (jobs with a sub-group policy, placed sub-group by sub-group); Muster's allocate places a
# job's tasks in task order, so nothing would ask it. ``enabledSubJobOrder`` is accepted below.

# The table: one row per point, in the order of docs/config.md. The first type argument is what a
# plugin registers, the second what asking the point gives.
JOB_ORDER = Point[JobCompareFn, JobCompareFn](
    "job_order", Switch("enableJobOrder", "job_order"), first_non_zero, _TIE
)
TASK_ORDER = Point[TaskCompareFn, TaskCompareFn](
    "task_order",
    Switch("enableTaskOrder", "task_order"),
    first_non_zero,
    "Ties: higher pod priority, then creation order, then uid.",
)
JOB_ORDER_KEY = Point[JobKeyFn, JobKeyFn](
    "job_order_key", Switch("enableJobOrder", "job_order"), keys_in_order, _KEY.format("job_order")
)
TASK_ORDER_KEY = Point[TaskKeyFn, TaskKeyFn](
    "task_order_key",
    Switch("enableTaskOrder", "task_order"),
    keys_in_order,
    _KEY.format("task_order"),
)
QUEUE_ORDER = Point[QueueCompareFn, QueueCompareFn](
    "queue_order", Switch("enableQueueOrder", "queue_order"), first_non_zero, _TIE
)
QUEUE_ORDER_KEY = Point[QueueKeyFn, QueueKeyFn](
    "queue_order_key",
    Switch("enableQueueOrder", "queue_order"),
    keys_in_order,
    _KEY.format("queue_order"),
)
VICTIM_QUEUE_ORDER = Point[VictimQueueCompareFn, VictimQueueCompareFn](
    "victim_queue_order", None, first_non_zero, "Ties: the reverse of the queue order."
)
JOB_READY = Point[JobCheckFn, JobCheckFn](
    "job_ready", Switch("enableJobReady", "job_ready"), all_must_pass
)
_ALLOCATABLE_SWITCH = Switch("enabledAllocatable", "allocatable")
ALLOCATABLE = Point[QueueTaskVerdictFn, QueueTaskVerdictFn](
    "allocatable", _ALLOCATABLE_SWITCH, first_refusal
)
# Asked of a job that waits, to explain it: can its queues ever hold what it needs at once (a
# limit that no allocation frees)? A refusal says why, and the job is Unsatisfiable.
JOB_SATISFIABLE = Point[JobVerdictFn, JobVerdictFn](
    "job_satisfiable",
    _ALLOCATABLE_SWITCH,
    first_refusal,
    "Asked to explain a waiting job: a queue limit it can never fit (the job is Unsatisfiable).",
)
PREEMPTIVE = Point[QueueTaskCheckFn, QueueTaskCheckFn](
    "preemptive", Switch("enablePreemptive", "preemptive"), all_must_pass
)
PREDICATE = Point[Predicates, Never](
    "predicate",
    Switch("enablePredicate", "predicate"),
    all_masks_pass,
    "Vectorised over nodes, cached per scope.",
    vectorised=True,
)
NODE_ORDER = Point[Scorers, Never](
    "node_order",
    Switch("enableNodeOrder", "node_order"),
    node_scores_add,
    "Vectorised over nodes, cached per scope.",
    vectorised=True,
)
JOB_VALID = Point[JobValidFn, JobValidFn]("job_valid", None, first_failure)
JOB_PIPELINED = Point[VoteFn, JobVerdictFn](
    "job_pipelined", Switch("enableJobPipelined", "job_pipelined"), vote
)
JOB_ENQUEUEABLE = Point[VoteFn, JobVerdictFn]("job_enqueueable", _ENQUEUE_SWITCH, vote)
JOB_ENQUEUED = Point[JobNotifyFn, JobNotifyFn]("job_enqueued", _ENQUEUE_SWITCH, call_all)
JOB_STARVING = Point[JobCheckFn, JobCheckFn](
    "job_starving", Switch("enableJobStarving", "job_starving"), first_tier_all
)
OVERUSED = Point[QueueCheckFn, QueueCheckFn](
    "overused", Switch("enabledOverused", "overused"), any_true
)
PREEMPTABLE = Point[EvictableFn, VictimsFn](
    "preemptable", Switch("enablePreemptable", "preemptable"), intersect_first_tier
)
RECLAIMABLE = Point[EvictableFn, VictimsFn](
    "reclaimable", Switch("enableReclaimable", "reclaimable"), intersect_first_tier
)
VICTIM = Point[VictimTasksFns, VictimTasksFn](
    "victim", Switch("enabledVictim", "victim"), union_first_tier
)
HYPERNODE_GRADIENT = Point[HyperNodeGradientFn, HyperNodeGradientFn](
    "hypernode_gradient",
    Switch("enabledHyperNodeGradient", "hypernode_gradient"),
    first_answer,
    "None: the job is held to no hypernode.",
)
HYPERNODE_ORDER = Point[HyperNodeOrderFn, HyperNodeOrderFn](
    "hypernode_order", Switch("enabledHyperNodeOrder", "hypernode_order"), scores_add
)
DEVICE_CHOICE = Point[DeviceChoiceFn, DeviceChoiceFn](
    "device_choice",
    None,
    first_non_none,
    "Asked when a task that needs device ids is placed; candidates exclude held and unhealthy devices; "
    "none answers: the first candidates.",
)
# KAI Scheduler's points (asked by the actions of `profile: kai`).
QUEUE_JOBS_ORDER = Point[QueueJobsCompareFn, QueueJobsCompareFn](
    "queue_jobs_order",
    None,
    first_non_zero,
    "KAI: queues compared with the job each would run next (or the victims each would lose).",
)
JOB_OVER_CAPACITY = Point[JobCapacityFn, JobCapacityFn](
    "job_over_capacity", None, first_refusal, "KAI: queue limits, non-preemptible quota."
)
NON_PREEMPTIBLE_OVER_QUOTA = Point[JobCapacityFn, JobCapacityFn](
    "non_preemptible_over_quota", None, first_refusal, "KAI: asked before preempting for a job."
)
CAN_RECLAIM = Point[JobCheckFn, JobCheckFn](
    "can_reclaim", None, all_must_pass, "KAI: may this job reclaim at all?"
)
RECLAIM_SCENARIO_VALID = Point[ScenarioCheckFn, ScenarioCheckFn](
    "reclaim_scenario_valid",
    None,
    all_must_pass,
    "KAI: is a reclaim solution (its victims) fair to every queue?",
)
SOLUTION_START = Point[SolutionStartFn, SolutionStartFn](
    "solution_start", None, call_all, "KAI: a victim search for one job begins."
)
GPU_ORDER = Point[GpuOrderFn, GpuOrderFn](
    "gpu_order", None, sum_of, "KAI: which shared GPU a fractional task takes."
)
NODE_SETS = Point[NodeSetsFn, NodeSetsFn](
    "node_sets",
    None,
    first_non_none,
    "KAI: the node sets (topology domains) a job's tasks are tried on, in order; None: all nodes.",
)

# Every row above, by name, in order: a point is its row, nothing else.
POINTS: dict[str, Point[Any, Any]] = {
    row.name: row for row in list(globals().values()) if isinstance(row, Point)
}

# Switches that reach no extension point. A plugin reads these itself from its option.
HIERARCHY_SWITCH = Switch("enableHierarchy", "hierarchy", default=False)
PLUGIN_SWITCHES: dict[Switch, str] = {
    HIERARCHY_SWITCH: "read by drf and capacity (hierarchical queues); off unless written true",
}
# Accepted for compatibility with Volcano files, no effect: Muster has no such point.
COMPATIBILITY_SWITCHES: dict[Switch, str] = {
    Switch(
        "enabledClusterOrder", "cluster_order"
    ): "Volcano's multi-cluster order; Muster schedules one cluster",
    Switch(
        "enableBestNode", "best_node"
    ): "the best-scoring node always wins, ties going to the first by name",
    Switch("enableTargetJob", "target_job"): "no action of Muster asks for a target job",
    Switch(
        "enableReservedNodes", "reserved_nodes"
    ): "Volcano's reserved nodes; Muster's reservations are the reservation plugin's",
    Switch("enabledSubJobReady", "subjob_ready"): "gang checks sub-group minimums inside job_ready",
    Switch(
        "enabledSubJobPipelined", "subjob_pipelined"
    ): "gang checks sub-group minimums inside job_pipelined",
    Switch(
        "enabledSubJobOrder", "subjob_order"
    ): "allocate does not schedule sub-group by sub-group",
}


def _all_switches() -> list[Switch]:
    out: dict[str, Switch] = {}
    for p in POINTS.values():
        if p.switch is not None:
            out.setdefault(p.switch.key, p.switch)
    for s in (*PLUGIN_SWITCHES, *COMPATIBILITY_SWITCHES):
        if s.key in out:
            raise ValueError(f"switch {s.key} is declared twice")
        out[s.key] = s
    return list(out.values())


ALL_SWITCHES: list[Switch] = _all_switches()


# -- documentation ------------------------------------------------------------------------------------
def describe(tp: Any) -> str:
    """A type as a reader writes it: ``(JobInfo, JobInfo) -> int``, ``Predicate | list[Predicate]``."""
    if tp is None or tp is type(None):
        return "None"
    origin, args = get_origin(tp), get_args(tp)
    if origin is Callable:
        params, result = args
        return f"({', '.join(describe(a) for a in params)}) -> {describe(result)}"
    if origin is Union or origin is types.UnionType:
        return " | ".join(
            f"({describe(a)})" if get_origin(a) is Callable else describe(a) for a in args
        )
    if origin is not None:
        return f"{origin.__name__}[{', '.join(describe(a) for a in args)}]"
    return str(getattr(tp, "__name__", tp))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """The extension points for docs/config.md (between its ``extension-points`` markers)."""
    lines = [
        "| point | switch | a plugin registers | how the answers combine |",
        "|---|---|---|---|",
    ]
    for p in POINTS.values():
        switch = f"`{p.switch.key}`" if p.switch else "always on"
        rule = f"{p.rule} {p.note}".strip()
        lines.append(
            f"| `{p.name}` | {switch} | `{_cell(describe(p.signature))}` | {_cell(rule)} |"
        )
    return "\n".join(lines) + "\n"


def switches_markdown_table() -> str:
    """Every switch Muster accepts, and what it turns on (docs/config.md, ``switches`` markers)."""
    lines = ["| switch | turns on |", "|---|---|"]
    for s in ALL_SWITCHES:
        points = [f"`{p.name}`" for p in POINTS.values() if p.switch == s]
        if points:
            effect = ", ".join(points)
        elif s in PLUGIN_SWITCHES:
            effect = f"no extension point: {PLUGIN_SWITCHES[s]}"
        else:
            effect = f"nothing: accepted for compatibility ({COMPATIBILITY_SWITCHES[s]})"
        lines.append(f"| `{s.key}` | {_cell(effect)} |")
    return "\n".join(lines) + "\n"


def render_docs(text: str) -> str:
    """``text`` (docs/config.md) with its generated sections replaced by the current tables.

    Regenerate: ``python -c "from pathlib import Path; from server.session.extension_points import
    render_docs as r; p = Path('docs/config.md'); p.write_text(r(p.read_text()))"``."""
    for marker, table in (
        ("switches", switches_markdown_table()),
        ("extension-points", markdown_table()),
    ):
        begin, end = f"<!-- {marker}:begin (generated) -->\n", f"<!-- {marker}:end -->"
        head, found, rest = text.partition(begin)
        if not found or end not in rest:
            raise ValueError(f"no {marker} markers")
        text = head + begin + table + end + rest.split(end, 1)[1]
    return text
