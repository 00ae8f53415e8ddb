"""KAI's accumulated scenario filters: what a victim search cannot achieve is rejected before it is
simulated.

A victim search (``solver.py``) builds its scenarios by accumulation: the victims recorded by the
previous step, then one more candidate victim job at a time. Before a scenario is simulated the
filters look at the pending tasks and at the room on every node *if every victim of the scenario
were gone and nothing were placed again* -- an upper bound on the room of every arrangement the
simulation can reach, since it only evicts victims of the scenario and then only places (victims
again, then the pending tasks, pipelined). A scenario whose pending tasks do not fit that room is
dropped; since victims are only ever added, the room only grows while a step goes on, and it is
kept up to date victim by victim (each victim counted once) rather than rebuilt.

Two filters, as KAI's pod_scenario_builder builds them:

* ``NodeAffinityFilter`` (KAI's AccumulatedNodeAffinities): every pending task needs a node its
  static predicates allow -- schedulability, node selector and affinity, taints, none of which an
  eviction changes -- with room for its whole request.
* ``IdleResourcesFilter`` (KAI's AccumulatedIdleGpus, for every resource rather than GPUs alone):
  for each resource and each request size ``t`` the pending tasks ask, the tasks asking ``t`` or
  more ask together no more than the nodes those tasks may use that have ``t`` or more free. KAI
  matches the sorted requests greedily instead, which can refuse a scenario that fits (3, 2, 2 GPUs
  on nodes of 4 and 3 free); this bound never refuses one that fits.

Both are necessary conditions only: an accepted scenario may still fail in the simulation. The
same check runs once more on the session itself after an attempt's evictions (``accepts_now``),
where the room is exact, before that attempt's simulation, and after each victim job placed
again before the pending job's turn. ``refuses_after`` tells ahead of such a placement that the
check will refuse, whatever nodes the victim takes (the solver's retaken-room shortcut). Session
parameter ``scenarioFilters`` (default true) turns both off -- the placements are the same either
way, only slower.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar, Protocol

import numpy as np

from muster.devices import UNIT
from muster.quantity import MIN_RESOURCE
from server.model import TaskStatus
from server.session.info import NodeTable, TaskInfo, rows_fit
from server.session.session import Session


class PendingNeed:
    """What the scenario's pending tasks ask: their requests (one row per task, over the session's
    resources; a GPU share asks no whole GPU here, since it may join a shared one) and the nodes
    their static predicates allow (one mask per task; tasks of one static key share theirs)."""

    def __init__(self, requests: np.ndarray, masks: list[np.ndarray]) -> None:
        self.requests = requests
        self.masks = masks
        # Distinct (request, mask) pairs: tasks of one shape are checked once.
        seen: dict[tuple[bytes, int], int] = {}
        for i in range(len(masks)):
            seen.setdefault((requests[i].tobytes(), id(masks[i])), i)
        self.distinct = list(seen.values())
        # Per task, what a node must have free of each resource to hold it (a fit allows the
        # epsilon), as floats.
        self.limits: list[list[float]] = (requests - MIN_RESOURCE).tolist()
        # The resources some task asks for (more than the epsilon every fit allows).
        self.asked = [int(d) for d in np.nonzero((requests > MIN_RESOURCE).any(axis=0))[0]]
        # What the idle-resources bound reads of the tasks, the same whatever the room, found once:
        # per asked resource, each request size ``t`` (largest first) with the tasks asking ``t``
        # or more -- the nodes they may use, what they ask in all, how many they are -- and the
        # same of all the tasks asking it (``ScenarioFilters.refuses_after``).
        self.sizes: dict[int, list[tuple[float, np.ndarray, float, int]]] = {}
        self.askers: dict[int, tuple[np.ndarray, float, int]] = {}
        for d in self.asked:
            asks = requests[:, d]
            self.sizes[d] = [
                (t, *self._of(np.nonzero(asks >= t)[0], asks))
                for t in sorted({float(a) for a in asks if a > MIN_RESOURCE}, reverse=True)
            ]
            # (the smallest size is the smallest ask above the epsilon: its askers are all)
            self.askers[d] = self.sizes[d][-1][1:]
        # Per asked resource, of its askers' nodes: those outside them, and their rows in order
        # (what ``refuses_after`` reads, the same whatever the room).
        self.outside: dict[int, np.ndarray] = {d: ~a[0] for d, a in self.askers.items()}
        self.inside: dict[int, np.ndarray] = {
            d: np.nonzero(a[0])[0] for d, a in self.askers.items()
        }

    def _of(self, chosen: np.ndarray, asks: np.ndarray) -> tuple[np.ndarray, float, int]:
        """The nodes the ``chosen`` tasks may use (the union of their masks), what they ask of one
        resource (``asks``) in all, and how many they are."""
        allowed = self.masks[int(chosen[0])]
        for k in chosen[1:]:
            if self.masks[int(k)] is not allowed:
                allowed = allowed | self.masks[int(k)]
        return allowed, float(asks[chosen].sum()), len(chosen)

    @classmethod
    def of(cls, ssn: Session, tasks: list[TaskInfo]) -> PendingNeed:
        requests = np.array([t.resreq for t in tasks], dtype=float).reshape(
            len(tasks), ssn.space.size
        )
        return cls(requests, [ssn.evaluator.static_mask(t) for t in tasks])

    def __len__(self) -> int:
        return len(self.masks)


class ScenarioFilter(Protocol):
    name: ClassVar[str]

    def accepts(self, need: PendingNeed, room: np.ndarray) -> bool:
        """May the pending tasks fit ``room`` (nodes x resources, what each node could give them)?
        False only when they cannot."""
        ...


class NodeAffinityFilter:
    """Every pending task has a node its static predicates allow with room for its whole request."""

    name: ClassVar[str] = "node-affinity"

    def accepts(self, need: PendingNeed, room: np.ndarray) -> bool:
        return all(self.fits(need, i, room).any() for i in need.distinct)

    @staticmethod
    def fits(need: PendingNeed, i: int, room: np.ndarray) -> np.ndarray:
        """Per node: task ``i`` is allowed there and has room for its whole request."""
        fits: np.ndarray = need.masks[i] & rows_fit(room, need.limits[i])
        return fits


class IdleResourcesFilter:
    """Per resource and request size ``t``: the pending tasks asking ``t`` or more of it ask no
    more than the nodes they may use with ``t`` or more free hold together. (A task fits a node
    with ``request - epsilon`` free, so a node takes at most its room plus one epsilon.)"""

    name: ClassVar[str] = "idle-resources"

    def accepts(self, need: PendingNeed, room: np.ndarray) -> bool:
        for d in need.asked:
            column = room[:, d]
            for t, allowed, asked, count in need.sizes[d]:
                holders = allowed & (column >= t - MIN_RESOURCE)
                held = float(column[holders].sum()) + MIN_RESOURCE * count
                if asked > held:
                    return False
        return True


FILTERS: tuple[ScenarioFilter, ...] = (NodeAffinityFilter(), IdleResourcesFilter())


class AccumulatedRoom:
    """Per node, the room the pending tasks could have once the scenario's victims are gone: the
    future idle resources (idle, plus what releasing tasks free, less what pipelined tasks take)
    when the step started, plus each victim's request on its node -- and a whole GPU for each
    shared GPU a victim holds a share of (the most that GPU gives back). Each victim counts once;
    one already releasing is in the future idle resources already."""

    def __init__(self, nodes: NodeTable) -> None:
        self.nodes = nodes
        self.room = nodes.future_idle()
        self._seen: set[str] = set()
        self._groups: set[tuple[int, str]] = set()

    def copy(self) -> AccumulatedRoom:
        other = AccumulatedRoom.__new__(AccumulatedRoom)
        other.nodes, other.room = self.nodes, self.room.copy()
        other._seen, other._groups = set(self._seen), set(self._groups)
        return other

    def add(self, victims: Iterable[TaskInfo]) -> None:
        room = self.room
        self._credit(room.__getitem__, victims, self._seen, self._groups)

    def plus(self, victims: Iterable[TaskInfo]) -> np.ndarray:
        """The room with these victims gone too (a new array; this room is left as it is)."""
        return self.with_rows(self.rows_plus(victims))

    def rows_plus(self, victims: Iterable[TaskInfo]) -> dict[int, np.ndarray]:
        """``plus``, only the rows it changes: row -> that row's room (new arrays)."""
        rows: dict[int, np.ndarray] = {}

        def row_of(row: int) -> np.ndarray:
            values = rows.get(row)
            if values is None:
                values = rows[row] = self.room[row].copy()
            return values

        self._credit(row_of, victims, set(), set())
        return rows

    def with_rows(self, rows: dict[int, np.ndarray]) -> np.ndarray:
        """This room with ``rows`` (``rows_plus``) in place of its own (a new array)."""
        room = self.room.copy()
        for row, values in rows.items():
            room[row] = values
        return room

    def _credit(
        self,
        row_of: Callable[[int], np.ndarray],
        victims: Iterable[TaskInfo],
        seen: set[str],
        groups: set[tuple[int, str]],
    ) -> None:
        """Credit the room with each victim not counted yet: not in this room's ``_seen`` nor in
        ``seen``, which gathers those credited now (this room's own sets for ``add``, fresh ones
        for ``plus``: the room's sets are read, not copied). ``groups`` likewise. ``row_of``: the
        room's row to add to, in place."""
        nodes, gpu = self.nodes, self.nodes.gpu_dim
        known, known_groups = self._seen, self._groups
        for t in victims:
            if t.uid in seen or t.uid in known:
                continue
            seen.add(t.uid)
            if t.node is None or t.status == TaskStatus.RELEASING:
                continue
            row = nodes.index.get(t.node)
            if row is None:
                continue
            values = row_of(row)
            values += t.resreq
            if t.gpu_fraction and gpu is not None:
                for group in t.gpu_groups:
                    if (row, group) not in groups and (row, group) not in known_groups:
                        groups.add((row, group))
                        values[gpu] += UNIT


class ScenarioFilters:
    """The filters of one step of a victim search (one list of pending tasks, the victims the
    previous step recorded)."""

    def __init__(
        self,
        ssn: Session,
        pending: list[TaskInfo],
        recorded: Iterable[TaskInfo] = (),
        filters: tuple[ScenarioFilter, ...] = FILTERS,
    ) -> None:
        self.ssn = ssn
        self.need = PendingNeed.of(ssn, pending)
        self.recorded = AccumulatedRoom(ssn.nodes)
        self.recorded.add(recorded)
        self.accumulated = self.recorded.copy()
        self.filters = filters
        # The filters that check these pending tasks, decided once: none without pending tasks, and
        # for one task no idle-resources check (a node with room for all of it -- node-affinity --
        # says more).
        self._checks = tuple(
            f
            for f in filters
            if len(self.need) and not (len(self.need) == 1 and isinstance(f, IdleResourcesFilter))
        )
        # Whether ``refuses_after`` may tell: the filter whose bound it is checks these tasks.
        judge = IdleResourcesFilter if len(self.need) > 1 else NodeAffinityFilter
        self._may_refuse = any(isinstance(f, judge) for f in self._checks)
        # Scenarios and attempts rejected, per filter name (KAI counts them as a metric).
        self.rejected: dict[str, int] = {}
        self._fits: dict[int, tuple[np.ndarray, int]] = {}  # _recorded_fits

    def add_victims(self, victims: Iterable[TaskInfo]) -> None:
        """Candidate victims join the accumulated scenario."""
        self.accumulated.add(victims)

    def accepts(self) -> bool:
        """The accumulated scenario: the recorded victims and every candidate so far gone."""
        return self._check(self.accumulated.room)

    def accepts_with(self, victims: Iterable[TaskInfo]) -> bool:
        """One attempt: the recorded victims and these gone (checked before they are evicted).
        The room differs from the recorded victims' room in a few rows: node-affinity is told
        from that room's answer per row (found once) and those rows; the whole room is made only
        for a filter that reads it all."""
        recorded = self.recorded
        rows = recorded.rows_plus(victims)
        room: np.ndarray | None = None
        for f in self._checks:
            if isinstance(f, NodeAffinityFilter):
                ok = self._affinity_with(rows)
            else:
                if room is None:
                    room = recorded.with_rows(rows)
                ok = f.accepts(self.need, room)
            if not ok:
                self.rejected[f.name] = self.rejected.get(f.name, 0) + 1
                return False
        return True

    def _affinity_with(self, rows: dict[int, np.ndarray]) -> bool:
        """NodeAffinityFilter.accepts on the recorded victims' room with ``rows`` in place of its
        own: a task has a node with room either among the other rows (as in that room) or among
        these."""
        need = self.need
        changed = list(rows)
        for i in need.distinct:
            fits, count = self._recorded_fits(i)
            if count - int(fits[changed].sum()) > 0:
                continue
            mask, limits = need.masks[i], need.limits[i]
            if not any(
                mask[row]
                and all(v >= limit for v, limit in zip(values.tolist(), limits, strict=True))
                for row, values in rows.items()
            ):
                return False
        return True

    def _recorded_fits(self, i: int) -> tuple[np.ndarray, int]:
        """Per node, whether task ``i`` (allowed there) fits the recorded victims' room, and on how
        many nodes: found once (that room does not change)."""
        known = self._fits.get(i)
        if known is None:
            fits = NodeAffinityFilter.fits(self.need, i, self.recorded.room)
            known = self._fits[i] = (fits, int(fits.sum()))
        return known

    def accepts_now(self) -> bool:
        """The session as it stands (an attempt's victims evicted, some placed again)."""
        return self._check(self.ssn.nodes.future_idle())

    def refuses_after(
        self, request: np.ndarray, count: int, rows: np.ndarray, room: np.ndarray | None = None
    ) -> bool:
        """Will ``accepts_now`` refuse once ``count`` more tasks asking ``request`` each are placed
        on ``rows`` (anywhere among them)? True only when it surely will: for some resource, the
        pending tasks asking it ask more than the nodes they may use hold in all (the bound behind
        both filters: a node with room for a task, or the holders of a size, hold no more), and
        every row the tasks may take is such a node, so each placed task takes its request (less
        the epsilon a fit allows) from that total. (Pending tasks that fit one node have no
        idle-resources check: then node-affinity, whose bound it is too, must be on.) ``room``:
        the nodes' future idle, if the caller has it."""
        need = self.need
        if count <= 0 or not self._may_refuse:
            return False
        for d in need.asked:
            take = float(request[d]) - MIN_RESOURCE
            if take <= 0:
                continue
            _, asked, askers = need.askers[d]
            if (rows & need.outside[d]).any():
                continue  # a task placed elsewhere takes nothing from these nodes
            if room is None:
                room = self.ssn.nodes.future_idle()
            # (the allowed rows by index: the same values in the same order as by the mask)
            held = float(np.maximum(room[need.inside[d], d], 0.0).sum()) + MIN_RESOURCE * askers
            held -= count * take
            # A margin for rounding: the filter sums the same rooms in another order.
            if asked > held + MIN_RESOURCE + 1e-9 * (abs(held) + asked):
                return True
        return False

    def _check(self, room: np.ndarray) -> bool:
        for f in self._checks:
            if not f.accepts(self.need, room):
                self.rejected[f.name] = self.rejected.get(f.name, 0) + 1
                return False
        return True


def room_for_moves(ssn: Session, tasks: list[TaskInfo]) -> bool:
    """Can moving running jobs about ever make room for ``tasks``? Consolidation places every victim
    again, so the cluster's room is only moved between nodes: the tasks must fit in the room the
    cluster has in all (KAI's IsEnoughGPUsAllocatableForJob, for every resource). A node may end
    one epsilon short (a fit allows it), and a shared GPU all of whose tasks move away becomes a
    whole free GPU, so each one counts as a GPU that may come back."""
    if not tasks:
        return True
    nodes = ssn.nodes
    room = np.maximum(nodes.future_idle() + MIN_RESOURCE, 0.0).sum(axis=0)
    if nodes.gpu_dim is not None:
        room[nodes.gpu_dim] += UNIT * sum(len(groups) for groups in nodes.shared)
    asked = np.sum([t.resreq for t in tasks], axis=0)
    return bool((asked <= room).all())
