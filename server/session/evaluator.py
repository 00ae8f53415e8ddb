"""Vectorised predicate and score evaluation over every node at once, with caches.

Plugins register ``Predicate`` and ``Scorer`` objects (extension points ``predicate`` and
``node_order``, declared with their combining functions in ``extension_points.py``: masks are ANDed,
scores add up). Each declares its *scope*, which tells the evaluator what it may cache:

* ``static`` -- depends on the task's static key (selector, tolerations, affinity) and on node
  attributes that never change within a session (labels, taints, schedulability). Computed once
  per static key per session.
* ``shape`` -- also depends on the task's request and on node rows that allocations change (idle,
  used, task count). Cached per shape key (static key + request); when nodes change, only the
  changed rows (``NodeTable.change_log``) are recomputed.
* ``task`` -- depends on anything else (the job's other tasks, pod affinity ...): evaluated fresh,
  on the candidate rows only.

So tasks of identical shape are evaluated together and an allocation costs one row update, not a
pass over the cluster.

A ``task`` predicate that passes whole *domains* of nodes (a ``DomainPredicate``: gang-backend,
whose domains are backends) says which domains a task may use rather than answering per node.
``select`` then keeps the cached per-shape answers and looks only at the allowed domains: per shape
and domain the best row is cached and recomputed only for the domains whose rows changed, so a task
held to a few backends costs what a single-backend cluster costs, not a pass over every node.
``NodeEvaluator.use_domains = False`` turns this off (the predicate is then asked per node like any
other ``task`` predicate: the same placements, the reference in tests).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from muster.quantity import MIN_RESOURCE
from server.session.extension_points import (
    POINTS,
    Chain,
    Predicate,
    Predicates,
    Rows,
    Scope,
    Scorer,
    Scorers,
)
from server.session.info import FitErrors, NodeTable, ResourceSpace, TaskInfo, rows_fit

__all__ = ["DomainPredicate", "NodeEvaluator", "Predicate", "Rows", "Scope", "Scorer"]

# Up to this many changed rows are re-checked one by one in plain Python (when every shape
# predicate and scorer can); more go through numpy at once.
SCALAR_ROWS = 14  # measured: one row 3.5 us in Python; 16 rows ~55 us either way
NEG_INF = float(
    "-inf"
)  # what no node scores (a constant: ``-np.inf`` looks up and negates per use)


@dataclass(kw_only=True)
class DomainPredicate(Predicate):
    """A ``task`` predicate that passes or fails whole domains of nodes (e.g. backends): node row
    ``i`` belongs to domain ``domain_of[i]`` (0 .. D-1), and ``allowed(task)`` answers which domains
    the task may use (their indexes, any order), or None: every one. ``check`` must pass exactly
    the rows of those domains (it explains failures and serves the per-node path); ``select``
    asks ``allowed`` instead and looks only at the allowed domains' rows. Honoured without a
    ``now`` form."""

    domain_of: np.ndarray  # int64 per node row
    allowed: Callable[[TaskInfo], Collection[int] | None]


# A domain's rows: a slice when they are contiguous (a view, no copy), else their indexes.
DomainRows = slice | np.ndarray


class _DomainBest:
    """Per domain, the best row of one of a shape entry's score arrays (the first of the highest
    score) and its score, recomputed for a domain only after one of its rows changed."""

    __slots__ = ("at", "row", "value")

    def __init__(self, domains: int) -> None:
        self.at = [-1] * domains  # change-log length when computed (-1: never)
        self.row = [0] * domains
        self.value = [NEG_INF] * domains

    def best(
        self,
        scores: np.ndarray,
        parts: Sequence[DomainRows],
        domains: Iterable[int],
        changed: list[int],
        now: int,
    ) -> tuple[int, float]:
        """The first row of the highest score over ``domains``' rows, and that score (-inf: none),
        as ``argmax`` over exactly those rows would pick it (domains may interleave). ``changed``:
        per domain, the change-log length when one of its rows last changed; ``now``: the log's
        length (``scores`` is current up to it)."""
        at, rows, values = self.at, self.row, self.value
        best_row, best = -1, NEG_INF
        for d in domains:
            if changed[d] > at[d]:
                part = parts[d]
                sub = scores[part]
                if len(sub):  # an empty domain keeps -inf
                    i = int(sub.argmax())
                    values[d] = sub.item(i)
                    rows[d] = part.start + i if isinstance(part, slice) else int(part[i])
                at[d] = now
            value = values[d]
            if value > best or (value == best and rows[d] < best_row):
                best, best_row = value, rows[d]
        return best_row, best


@dataclass
class _StaticEntry:
    mask: np.ndarray
    score: np.ndarray


@dataclass(slots=True)
class _ShapeEntry:
    static: _StaticEntry
    future_ok: np.ndarray  # static & fits future idle & shape predicates
    idle_ok: np.ndarray  # future_ok & fits idle
    score: np.ndarray  # static + shape scores
    log_position: int
    limit: list[float]  # the request less the epsilon: what idle must reach, per resource
    # score where idle_ok (else -inf), and where future_ok but not idle_ok (else -inf): one argmax
    # picks the node when no task-scope plugin is active.
    idle_score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    future_score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # Per domain best of idle_score / future_score (when a DomainPredicate is active, made on
    # first use).
    idle_best: _DomainBest | None = None
    future_best: _DomainBest | None = None

    def refresh(self) -> None:
        self.idle_score = np.where(self.idle_ok, self.score, NEG_INF)
        self.future_score = np.where(self.future_ok & ~self.idle_ok, self.score, NEG_INF)

    def update(
        self, rows: np.ndarray, future_ok: np.ndarray, idle_ok: np.ndarray, score: np.ndarray
    ) -> None:
        """New answers for ``rows``."""
        self.future_ok[rows] = future_ok
        self.idle_ok[rows] = idle_ok
        self.score[rows] = score
        self.idle_score[rows] = np.where(idle_ok, score, NEG_INF)
        if idle_ok is future_ok:  # one mask (see ``_shape_rows``): no row is future-only
            self.future_score[rows] = NEG_INF
        else:
            self.future_score[rows] = np.where(future_ok & ~idle_ok, score, NEG_INF)


class NodeEvaluator:
    # Answer a DomainPredicate per domain in ``select`` (False: per node, like any ``task``
    # predicate; the same placements, slower: kept as the reference for tests).
    use_domains = True

    def __init__(self, nodes: NodeTable, space: ResourceSpace) -> None:
        self.nodes = nodes
        self.space = space
        self._static: dict[Any, _StaticEntry] = {}
        self._shape: dict[Any, _ShapeEntry] = {}
        self._fit_errors: dict[Any, tuple[int, FitErrors]] = {}
        self._static_fit: dict[Any, tuple[dict[str, int], np.ndarray]] = {}
        # Per shape key: (change-log length, reasons, rows left) of ``_shape_failures``.
        self._shape_fit: dict[Any, tuple[int, dict[str, int], np.ndarray]] = {}
        self.predicates: dict[Scope, list[Predicate]] = {"static": [], "shape": [], "task": []}
        self.scorers: dict[Scope, list[Scorer]] = {"static": [], "shape": [], "task": []}
        self._all_rows = np.arange(len(self.nodes))
        # Every shape predicate and scorer can re-check one row in plain Python (``row``).
        self._scalar_rows = True
        self._shape_predicate_rows: list[Callable[[TaskInfo, int], bool]] = []
        self._shape_scorer_rows: list[Callable[[TaskInfo, int], float]] = []
        # A shape predicate has a ``now`` form (idle now is then stricter than fitting idle).
        self._shape_now = False
        # The table's combining functions of the two vectorised points, applied per scope.
        self._all_pass = POINTS["predicate"].combine
        self._add = POINTS["node_order"].combine
        # The domain predicate select answers per domain, its domains' rows, each row's domain.
        self._domain: DomainPredicate | None = None
        self._domain_parts: list[DomainRows] = []
        self._domain_of: list[int] = []
        # Per domain, the change-log length when one of its rows last changed, as read up to
        # ``_domain_seen``: the log is read once for every shape's per-domain bests.
        self._domain_changed: list[int] = []
        self._domain_seen = 0

    def configure(self, predicate_chain: Chain[Predicates], score_chain: Chain[Scorers]) -> None:
        """Flatten the enabled chains by cache scope (tiers do not matter for an AND or a sum)."""
        for row in predicate_chain:
            for name, preds in row:
                for p in preds if isinstance(preds, list) else [preds]:
                    p.plugin = p.plugin or name
                    self.predicates[p.scope].append(p)
        for score_row in score_chain:
            for name, scorers in score_row:
                for s in scorers if isinstance(scorers, list) else [scorers]:
                    s.plugin = s.plugin or name
                    self.scorers[s.scope].append(s)
        self._scalar_rows = all(
            p.row is not None and p.now is None for p in self.predicates["shape"]
        ) and all(s.row is not None for s in self.scorers["shape"])
        self._shape_predicate_rows = [p.row for p in self.predicates["shape"] if p.row is not None]
        self._shape_scorer_rows = [s.row for s in self.scorers["shape"] if s.row is not None]
        self._shape_now = any(p.now is not None for p in self.predicates["shape"])
        self._configure_domains()
        self._static.clear()
        self._shape.clear()
        self._fit_errors.clear()
        self._static_fit.clear()
        self._shape_fit.clear()

    def _configure_domains(self) -> None:
        """The first DomainPredicate without a ``now`` form, and its domains' rows."""
        self._domain, self._domain_parts, self._domain_of = None, [], []
        self._domain_changed, self._domain_seen = [], 0
        if not self.use_domains or not len(self.nodes):
            return
        for p in self.predicates["task"]:
            if isinstance(p, DomainPredicate) and p.now is None:
                domain_of = np.asarray(p.domain_of, dtype=np.int64)
                if len(domain_of) != len(self.nodes):
                    continue
                order = np.argsort(domain_of, kind="stable")
                bounds = np.searchsorted(domain_of[order], np.arange(int(domain_of.max()) + 2))
                for d in range(len(bounds) - 1):
                    rows = order[bounds[d] : bounds[d + 1]]
                    contiguous = len(rows) > 0 and rows[-1] - rows[0] + 1 == len(rows)
                    self._domain_parts.append(
                        slice(int(rows[0]), int(rows[-1]) + 1) if contiguous else rows
                    )
                self._domain, self._domain_of = p, domain_of.tolist()
                self._domain_changed = [0] * len(self._domain_parts)
                return

    # -- caches -------------------------------------------------------------------------------
    def _static_entry(self, task: TaskInfo) -> _StaticEntry:
        entry = self._static.get(task.static_key)
        if entry is None:
            rows = self._all_rows
            mask = self._all_pass(
                self.predicates["static"], task, rows, np.ones(len(rows), dtype=bool)
            )
            score = self._add(self.scorers["static"], task, rows, np.zeros(len(rows)), passing=mask)
            entry = _StaticEntry(mask, score)
            self._static[task.static_key] = entry
        return entry

    def _shape_rows(
        self, task: TaskInfo, static: _StaticEntry, rows: Rows, limit: list[float] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(passes and fits future idle, that and fits idle now, score) of ``rows`` (an int64
        array); ``limit``: the request less the epsilon, when known. The two masks are one array
        when nothing is releasing or pipelined and no shape predicate has a ``now`` form (they
        are equal then)."""
        n = self.nodes
        if limit is None:
            limit = (task.resreq - MIN_RESOURCE).tolist()
        # ``take``: the rows ``idle[rows]`` gives, at half its cost.
        idle = n.idle.take(rows, axis=0)
        fits_idle = rows_fit(idle, limit)
        if n.has_future_resources():
            idle += n.releasing.take(rows, axis=0)
            idle -= n.pipelined.take(rows, axis=0)
            fits_future = rows_fit(idle, limit)
        else:
            fits_future = fits_idle
        ok = self._all_pass(self.predicates["shape"], task, rows, static.mask[rows] & fits_future)
        # (a fancy index is a copy: the scorers add to it, not to the cached static scores)
        score = self._add(self.scorers["shape"], task, rows, static.score[rows])
        if fits_future is fits_idle and not self._shape_now:
            return ok, ok, score  # ``ok`` already fits idle: ``ok & fits_idle`` is ``ok``
        idle_ok = ok & fits_idle
        for p in self.predicates["shape"]:
            if p.now is not None and idle_ok.any():
                idle_ok &= p.now(task, rows)
        return ok, idle_ok, score

    def _shape_row(self, task: TaskInfo, entry: _ShapeEntry, row: int, has_future: bool) -> None:
        """``_shape_rows`` for one row, in plain Python: the same answers (same float operations in
        the same order), at a tenth of numpy's per-call cost on a one-row array."""
        n = self.nodes
        idle = n.idle[row].tolist()
        limit = entry.limit
        fits_idle = all(map(operator.ge, idle, limit))
        if has_future:
            future = map(
                operator.sub,
                map(operator.add, idle, n.releasing[row].tolist()),
                n.pipelined[row].tolist(),
            )
            fits_future = all(map(operator.ge, future, limit))
        else:
            fits_future = fits_idle
        static = entry.static
        ok = fits_future and static.mask.item(row)
        if ok:
            for check in self._shape_predicate_rows:
                if not check(task, row):
                    ok = False
                    break
        score = static.score.item(row)
        for add in self._shape_scorer_rows:
            score += add(task, row)
        idle_ok = ok and fits_idle
        entry.future_ok[row] = ok
        entry.idle_ok[row] = idle_ok
        entry.score[row] = score
        entry.idle_score[row] = score if idle_ok else NEG_INF
        entry.future_score[row] = score if ok and not idle_ok else NEG_INF

    def _shape_entry(self, task: TaskInfo) -> _ShapeEntry:
        log = self.nodes.change_log
        entry = self._shape.get(task.shape_key)
        if entry is None:
            static = self._static_entry(task)
            future_ok, idle_ok, score = self._shape_rows(task, static, self._all_rows)
            if idle_ok is future_ok:  # two masks from here on, each changed on its own
                idle_ok = future_ok.copy()
            entry = _ShapeEntry(
                static, future_ok, idle_ok, score, len(log), (task.resreq - MIN_RESOURCE).tolist()
            )
            entry.refresh()
            self._shape[task.shape_key] = entry
        elif entry.log_position < len(log):
            changed = log[entry.log_position :]
            if len(changed) == 1 and self._scalar_rows:  # most often: the last placement's row
                self._shape_row(task, entry, changed[0], self.nodes.has_future_resources())
            else:
                # Each changed row once, in any order (every answer is per row). Counted once
                # too: a status change logs its row twice (off, then on again), and a victim
                # search evicts and rolls back several tasks of a few nodes.
                rows = set(changed)
                if self._scalar_rows and len(rows) <= SCALAR_ROWS:
                    has_future = self.nodes.has_future_resources()
                    for row in rows:
                        self._shape_row(task, entry, row, has_future)
                else:
                    dirty = np.fromiter(rows, dtype=np.int64)
                    entry.update(dirty, *self._shape_rows(task, entry.static, dirty, entry.limit))
            entry.log_position = len(log)
        return entry

    # -- queries --------------------------------------------------------------------------------
    def static_mask(self, task: TaskInfo) -> np.ndarray:
        """Nodes that pass the static predicates (schedulability, node selector / affinity,
        taints): what no eviction can change. Cached per static key for the session."""
        return self._static_entry(task).mask

    def feasible(
        self, task: TaskInfo, restrict: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows that pass every predicate and fit future idle, and the subset that fits idle now."""
        entry = self._shape_entry(task)
        future_ok, idle_ok = entry.future_ok, entry.idle_ok
        if restrict is not None:
            future_ok = future_ok & restrict
            idle_ok = idle_ok & restrict
        if self.predicates["task"]:
            rows = np.nonzero(future_ok)[0]
            if len(rows):
                ok = self._all_pass(
                    self.predicates["task"], task, rows, np.ones(len(rows), dtype=bool)
                )
                future_ok = np.zeros(len(self.nodes), dtype=bool)
                future_ok[rows[ok]] = True
                idle_ok = idle_ok & future_ok
                for p in self.predicates["task"]:
                    if p.now is not None:
                        now_rows = np.nonzero(idle_ok)[0]
                        if len(now_rows):
                            idle_ok[now_rows] = p.now(task, now_rows)
        return future_ok, idle_ok

    def scores(self, task: TaskInfo, rows: Rows) -> np.ndarray:
        entry = self._shape_entry(task)
        # ``take``: the copy the scorers add to (``score[rows].copy()`` copied twice).
        scores: np.ndarray = self._add(self.scorers["task"], task, rows, entry.score.take(rows))
        return scores

    def select(self, task: TaskInfo, restrict: np.ndarray | None = None) -> tuple[int, bool] | None:
        """Volcano ``prioritizeNodes``: the best node that fits idle now, else the best that fits
        future idle (pipelining). Returns (row, fits_idle) or None. Ties go to the first node by
        name (Volcano picks one of the tied nodes at random)."""
        if not len(self._all_rows):  # e.g. a restarted server before any backend synced its nodes
            return None
        task_predicates = self.predicates["task"]
        if restrict is not None or self.scorers["task"]:
            return self._select_by_rows(task, restrict)
        if len(task_predicates) == 1 and task_predicates[0] is self._domain:
            return self._select_in_domains(task, self._domain)
        if task_predicates:
            return self._select_by_rows(task, restrict)
        # No task-scope plugin: the cached shape answers. Written out, not a loop over the two
        # arrays: asked once per placement.
        entry = self._shape_entry(task)
        best = int(entry.idle_score.argmax())
        if entry.idle_score.item(best) > NEG_INF:
            return best, True
        best = int(entry.future_score.argmax())
        if entry.future_score.item(best) > NEG_INF:
            return best, False
        return None

    def _select_in_domains(
        self, task: TaskInfo, domain: DomainPredicate
    ) -> tuple[int, bool] | None:
        """``select`` when the only ``task`` predicate is ``domain``: the cached shape answers over
        the allowed domains' rows (the same row as asking the predicate per node)."""
        allowed = domain.allowed(task)
        entry = self._shape_entry(task)
        parts = self._domain_parts
        domains: Iterable[int] = range(len(parts)) if allowed is None else allowed
        log = self.nodes.change_log
        now = len(log)
        changed = self._domain_changed
        if self._domain_seen < now:
            domain_of = self._domain_of
            for row in log[self._domain_seen :]:
                changed[domain_of[row]] = now
            self._domain_seen = now
        if entry.idle_best is None or entry.future_best is None:
            entry.idle_best, entry.future_best = _DomainBest(len(parts)), _DomainBest(len(parts))
        row, best = entry.idle_best.best(entry.idle_score, parts, domains, changed, now)
        if best > NEG_INF:
            return row, True
        row, best = entry.future_best.best(entry.future_score, parts, domains, changed, now)
        if best > NEG_INF:
            return row, False
        return None

    def _select_by_rows(
        self, task: TaskInfo, restrict: np.ndarray | None
    ) -> tuple[int, bool] | None:
        """``select`` through ``feasible``: every ``task`` predicate and scorer asked per row."""
        future_ok, idle_ok = self.feasible(task, restrict)
        for mask, on_idle in ((idle_ok, True), (future_ok & ~idle_ok, False)):
            rows = np.nonzero(mask)[0]
            if len(rows) == 0:
                continue
            if len(rows) == 1:
                return int(rows[0]), on_idle
            score = self.scores(task, rows)
            return int(rows[int(np.argmax(score))]), on_idle
        return None

    def fit_errors(self, task: TaskInfo, restrict: np.ndarray | None = None) -> FitErrors:
        """Per-reason node counts for a task that fits nowhere (first failing check per node).
        Cached per shape until a node changes: a saturated cluster asks this for job after job."""
        cacheable = restrict is None and not self.predicates["task"]
        if cacheable:
            known = self._fit_errors.get(task.shape_key)
            if known is not None and known[0] == len(self.nodes.change_log):
                return known[1]
        fe = self._compute_fit_errors(task, restrict)
        if cacheable:
            self._fit_errors[task.shape_key] = (len(self.nodes.change_log), fe)
        return fe

    def _static_failures(
        self, task: TaskInfo, rows: np.ndarray
    ) -> tuple[dict[str, int], np.ndarray]:
        """Per reason, the rows the static predicates fail (first failing check per row), and the
        rows they pass. Over every row: cached per static key for the session."""
        known = self._static_fit.get(task.static_key) if rows is self._all_rows else None
        if known is not None:
            return known
        reasons: dict[str, int] = {}
        remaining = self._count_failures(task, self.predicates["static"], rows, reasons)
        if rows is self._all_rows:
            self._static_fit[task.static_key] = (reasons, remaining)
        return reasons, remaining

    def _compute_fit_errors(self, task: TaskInfo, restrict: np.ndarray | None) -> FitErrors:
        reasons, remaining = self._shape_failures(task, restrict)
        fe = FitErrors(total_nodes=len(self.nodes), reasons=dict(reasons))
        self._count_failures(task, self.predicates["task"], remaining, fe.reasons)
        return fe

    def _shape_failures(
        self, task: TaskInfo, restrict: np.ndarray | None
    ) -> tuple[dict[str, int], np.ndarray]:
        """Per reason, the rows the static predicates, resources and shape predicates fail (first
        failing check per row), and the rows they pass. Over every row, cached per shape until a
        node changes: with ``task`` predicates active, only those are asked per failing task."""
        log_position = len(self.nodes.change_log)
        # (without task predicates ``fit_errors`` keeps the whole answer: nothing to keep here)
        cacheable = restrict is None and bool(self.predicates["task"])
        if cacheable:
            known = self._shape_fit.get(task.shape_key)
            if known is not None and known[0] == log_position:
                return known[1], known[2]
        n = self.nodes
        rows = self._all_rows if restrict is None else np.nonzero(restrict)[0]
        static_reasons, remaining = self._static_failures(task, rows)
        reasons = dict(static_reasons)
        if len(remaining):
            future = n.future_idle(remaining)
            # ``task.resreq > future + MIN_RESOURCE`` column by column (see ``rows_fit``).
            fits = np.ones(len(remaining), dtype=bool)
            for d, asked in enumerate(task.request_floats):
                short = future[:, d] + MIN_RESOURCE < asked
                nodes_short = int(np.count_nonzero(short))
                if nodes_short:
                    reason = f"Insufficient {self.space.dims[d]}"
                    reasons[reason] = reasons.get(reason, 0) + nodes_short
                    fits &= ~short
            remaining = remaining[fits]
        remaining = self._count_failures(task, self.predicates["shape"], remaining, reasons)
        if cacheable:
            self._shape_fit[task.shape_key] = (log_position, reasons, remaining)
        return reasons, remaining

    @staticmethod
    def _count_failures(
        task: TaskInfo, predicates: list[Predicate], remaining: np.ndarray, reasons: dict[str, int]
    ) -> np.ndarray:
        """Count into ``reasons`` the rows of ``remaining`` each predicate in turn fails; the rows
        that pass them all."""
        for p in predicates:
            if not len(remaining):
                break
            ok = p.check(task, remaining)
            failed = remaining[~ok]
            if len(failed):
                for r in p.reasons(task, failed) if p.reasons else [p.reason] * len(failed):
                    reasons[r] = reasons.get(r, 0) + 1
            remaining = remaining[ok]
        return remaining
