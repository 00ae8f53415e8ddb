"""The extension points, as one executable table (``POINTS``).

Each point has its name, the YAML switch that turns it on per plugin (Volcano's spelling, from
``conf.PluginOption``), the type of the function a plugin registers, and the function that
combines the answers of the registered plugins -- whose docstring is the rule. The session
registers functions by point name (``Session.register``, refusing an unknown point), keeps per
point the *chain* of the plugins whose switch is on (tiers in order, plugins in tier order), and
answers every query by calling the point's combining function on that chain. The rules follow
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
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import numpy as np

from muster.devices import Device
from server.session.info import JobInfo, QueueInfo, TaskInfo

# Votes (job_pipelined, job_enqueueable) and the verdict of preemptable / reclaimable answers.
PERMIT = 1
ABSTAIN = 0
REJECT = -1

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
QueueCheckFn = Callable[[QueueInfo], bool]
JobValidFn = Callable[[JobInfo], ValidateResult | None]
VoteFn = Callable[[JobInfo], int]  # PERMIT, ABSTAIN or REJECT
JobNotifyFn = Callable[[JobInfo], None]
# (evictor, candidates) -> (victims, PERMIT), or (anything, ABSTAIN) to stay out of the decision.
EvictableFn = Callable[[TaskInfo, list[TaskInfo]], tuple[list[TaskInfo], int]]
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
# (job, the tasks about to be placed) -> "" when within the queues' bounds, else why not.
JobCapacityFn = Callable[[JobInfo, list[TaskInfo]], str]
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
def first_non_zero(chain: Chain[Callable[[Any, Any], int]], left: Any, right: Any) -> int:
    """The first plugin, in tier order, with a non-zero answer decides; 0 when every plugin ties."""
    for row in chain:  # fixed arity: the order points are asked hundreds of thousands of times
        for _, fn in row:
            r = fn(left, right)
            if r:
                return r
    return 0


def first_non_zero_of(chain: Chain[Callable[..., int]], *args: Any) -> int:
    """The first plugin, in tier order, with a non-zero answer decides; 0 when every plugin ties (any arity)."""
    for row in chain:
        for _, fn in row:
            r = fn(*args)
            if r:
                return r
    return 0


def first_refusal(chain: Chain[JobCapacityFn], job: JobInfo, tasks: list[TaskInfo]) -> str:
    """The first plugin, in tier order, that refuses (a non-empty reason) decides; none refuses: ""."""
    for row in chain:
        for _, fn in row:
            reason = fn(job, tasks)
            if reason:
                return reason
    return ""


def sum_of(chain: Chain[Callable[..., float]], *args: Any) -> float:
    """The scores of every enabled plugin add up (none registered: 0)."""
    return sum(fn(*args) for row in chain for _, fn in row)


def keys_in_order(chain: Chain[Callable[[Any], Any]], item: Any) -> tuple[Any, ...]:
    """Every enabled plugin's key, in tier order, compared left to right (the order first_non_zero gives over the matching comparisons)."""
    return tuple([fn(item) for row in chain for _, fn in row])


def first_non_zero_given(
    chain: Chain[VictimQueueCompareFn], left: Any, right: Any, preemptor: Any
) -> int:
    """The first plugin, in tier order, with a non-zero answer decides (asked with the preemptor's queue); 0 when every plugin ties."""
    for row in chain:
        for _, fn in row:
            r = fn(left, right, preemptor)
            if r:
                return r
    return 0


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


def vote(chain: Chain[VoteFn], job: JobInfo) -> bool:
    """Any REJECT refuses at once; a PERMIT ends the check at the end of its tier; only ABSTAIN: permit."""
    for row in chain:
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


@dataclass(frozen=True)
class Point:
    name: str
    switch: Switch | None  # None: always on (Volcano checks no switch either)
    signature: Any  # the type of what a plugin registers
    combine: Callable[..., Any]  # how the session combines the chain's answers
    note: str = ""  # beyond the rule: the order points' tie-breaks (applied by the session) ...
    # Combined by the NodeEvaluator, per cache scope, over the flattened chain (tiers do not
    # matter for an AND or a sum): ``combine`` takes the predicates / scorers, not the chain.
    vectorised: bool = False

    @property
    def rule(self) -> str:
        doc = (self.combine.__doc__ or "").strip().splitlines()
        return doc[0] if doc else ""


# Rules under which a chain holding one plugin can be that plugin's function itself, with no
# partial and no loop over tiers per call (allocatable and job_ready are asked at every placement,
# order keys computed for every task): the checks, whose plugins return a bool, answer what the
# plugin answers; an order key's one-element tuple orders as its element.
_ONE_PLUGIN_IS_THE_RULE = (all_must_pass, any_true, keys_in_order)


def combined(point: Point, chain: Chain[Any]) -> Callable[..., Any]:
    """``point.combine`` over ``chain`` as one function."""
    fns = [fn for row in chain for _, fn in row]
    if len(fns) == 1 and point.combine in _ONE_PLUGIN_IS_THE_RULE:
        only: Callable[..., Any] = fns[0]
        return only
    return partial(point.combine, chain)


JOB_ENQUEUED = Switch(
    "enableJobEnqueued", "job_enqueued"
)  # Volcano: job_enqueueable and job_enqueued
_TIE = "Ties: creation order, then uid."

# Not a point: Volcano's sub_job_order. Volcano (1.14+) asks it only inside allocate's sub-job
# worksheet (jobs with a sub-group policy, placed sub-group by sub-group); Muster's allocate places a
# job's tasks in task order, so nothing would ask it. ``enabledSubJobOrder`` is accepted below.

POINTS: dict[str, Point] = {
    p.name: p
    for p in (
        Point(
            "job_order", Switch("enableJobOrder", "job_order"), JobCompareFn, first_non_zero, _TIE
        ),
        Point(
            "task_order",
            Switch("enableTaskOrder", "task_order"),
            TaskCompareFn,
            first_non_zero,
            "Ties: higher pod priority, then creation order, then uid.",
        ),
        Point(
            "job_order_key",
            Switch("enableJobOrder", "job_order"),
            JobKeyFn,
            keys_in_order,
            "Used only when every plugin of job_order gives its key; then the same ties.",
        ),
        Point(
            "task_order_key",
            Switch("enableTaskOrder", "task_order"),
            TaskKeyFn,
            keys_in_order,
            "Used only when every plugin of task_order gives its key; then the same ties.",
        ),
        Point(
            "queue_order",
            Switch("enableQueueOrder", "queue_order"),
            QueueCompareFn,
            first_non_zero,
            _TIE,
        ),
        Point(
            "queue_order_key",
            Switch("enableQueueOrder", "queue_order"),
            QueueKeyFn,
            keys_in_order,
            "Used only when every plugin of queue_order gives its key; then the same ties.",
        ),
        Point(
            "victim_queue_order",
            None,
            VictimQueueCompareFn,
            first_non_zero_given,
            "Ties: the reverse of the queue order.",
        ),
        Point("job_ready", Switch("enableJobReady", "job_ready"), JobCheckFn, all_must_pass),
        Point(
            "allocatable",
            Switch("enabledAllocatable", "allocatable"),
            QueueTaskCheckFn,
            all_must_pass,
        ),
        Point(
            "preemptive", Switch("enablePreemptive", "preemptive"), QueueTaskCheckFn, all_must_pass
        ),
        Point(
            "predicate",
            Switch("enablePredicate", "predicate"),
            Predicates,
            all_masks_pass,
            "Vectorised over nodes, cached per scope.",
            vectorised=True,
        ),
        Point(
            "node_order",
            Switch("enableNodeOrder", "node_order"),
            Scorers,
            node_scores_add,
            "Vectorised over nodes, cached per scope.",
            vectorised=True,
        ),
        Point("job_valid", None, JobValidFn, first_failure),
        Point("job_pipelined", Switch("enableJobPipelined", "job_pipelined"), VoteFn, vote),
        Point("job_enqueueable", JOB_ENQUEUED, VoteFn, vote),
        Point("job_enqueued", JOB_ENQUEUED, JobNotifyFn, call_all),
        Point(
            "job_starving", Switch("enableJobStarving", "job_starving"), JobCheckFn, first_tier_all
        ),
        Point("overused", Switch("enabledOverused", "overused"), QueueCheckFn, any_true),
        Point(
            "preemptable",
            Switch("enablePreemptable", "preemptable"),
            EvictableFn,
            intersect_first_tier,
        ),
        Point(
            "reclaimable",
            Switch("enableReclaimable", "reclaimable"),
            EvictableFn,
            intersect_first_tier,
        ),
        Point("victim", Switch("enabledVictim", "victim"), VictimTasksFns, union_first_tier),
        Point(
            "hypernode_gradient",
            Switch("enabledHyperNodeGradient", "hypernode_gradient"),
            HyperNodeGradientFn,
            first_answer,
            "None: the job is held to no hypernode.",
        ),
        Point(
            "hypernode_order",
            Switch("enabledHyperNodeOrder", "hypernode_order"),
            HyperNodeOrderFn,
            scores_add,
        ),
        Point(
            "device_choice",
            None,
            DeviceChoiceFn,
            first_non_none,
            "Asked when a task that needs device ids is placed; candidates exclude held and unhealthy devices; "
            "none answers: the first candidates.",
        ),
        # KAI Scheduler's points (asked by the actions of `profile: kai`).
        Point(
            "queue_jobs_order",
            None,
            QueueJobsCompareFn,
            first_non_zero_of,
            "KAI: queues compared with the job each would run next (or the victims each would lose).",
        ),
        Point(
            "job_over_capacity",
            None,
            JobCapacityFn,
            first_refusal,
            "KAI: queue limits, non-preemptible quota.",
        ),
        Point(
            "non_preemptible_over_quota",
            None,
            JobCapacityFn,
            first_refusal,
            "KAI: asked before preempting for a job.",
        ),
        Point("can_reclaim", None, JobCheckFn, all_must_pass, "KAI: may this job reclaim at all?"),
        Point(
            "reclaim_scenario_valid",
            None,
            ScenarioCheckFn,
            all_must_pass,
            "KAI: is a reclaim solution (its victims) fair to every queue?",
        ),
        Point(
            "solution_start",
            None,
            SolutionStartFn,
            call_all,
            "KAI: a victim search for one job begins.",
        ),
        Point(
            "gpu_order", None, GpuOrderFn, sum_of, "KAI: which shared GPU a fractional task takes."
        ),
        Point(
            "node_sets",
            None,
            NodeSetsFn,
            first_non_none,
            "KAI: the node sets (topology domains) a job's tasks are tried on, in order; None: all nodes.",
        ),
    )
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
    Switch("enableReservedNodes", "reserved_nodes"): "Muster has no node reservation",
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
