"""nodeplacement (KAI): where a task goes among the nodes it fits, per kind of task -- GPU tasks by
GPUs, CPU-only tasks by cpu -- ``binpack`` (the default: the node with the least of the resource not
yet allocated scores 9, the one with the most 0, linearly between) or ``spread`` (the share of the
resource not allocated). Arguments ``gpu`` and ``cpu``: binpack | spread. Registers: node_order
(task scope; binpack is relative to the nodes considered)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from muster.quantity import CPU
from server.plugins.base import Plugin
from server.session.extension_points import NODE_ORDER, Scorer
from server.session.info import NodeTable, TaskInfo
from server.session.kai import all_rows, is_gpu_task
from server.session.session import Session

MAX_HIGH_DENSITY = 9.0
STRATEGIES = ("binpack", "spread")
# More changed rows than this since the last call: the whole column is scored again rather than
# row by row in Python (one row ~1 us in Python; the whole column ~10 us in numpy at 1000 nodes).
REPLAY_ROWS = 16


class NodePlacementPlugin(Plugin):
    name: ClassVar[str] = "nodeplacement"
    ARGUMENTS: ClassVar[dict[str, object]] = {"gpu": "binpack", "cpu": "binpack"}

    @classmethod
    def validate_arguments(cls, arguments: dict[str, object]) -> None:
        super().validate_arguments(arguments)
        for key, value in arguments.items():
            if value not in STRATEGIES:
                raise ValueError(f"{key}: {value!r} is not binpack or spread")

    def on_session_open(self, ssn: Session) -> None:
        nodes, dims = ssn.nodes, ssn.space.index
        # Per resource, the binpack scores over every node, kept current with the change log.
        columns: dict[int, BinpackColumn] = {}

        def score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            gpu = is_gpu_task(task, dims)
            d = nodes.gpu_dim if gpu else dims.get(CPU)
            if d is None or not len(rows):
                return np.zeros(len(rows))
            spread = self.arguments.get("gpu" if gpu else "cpu") == "spread"
            if not spread and rows is all_rows(len(nodes)):
                column = columns.get(d)
                if column is None:
                    column = columns[d] = BinpackColumn(nodes, d)
                return column.scores()
            total = nodes.allocatable[rows, d]
            free = nodes.idle[rows, d] + nodes.releasing[rows, d]
            if spread:
                spread_score: np.ndarray = np.divide(
                    free, total, out=np.zeros(len(rows)), where=total > 0
                )
                return spread_score
            has = total > 0
            if not has.any():
                return np.zeros(len(rows))
            return binpack(free, has, float(free[has].min()), float(free[has].max()), every=False)

        ssn.register(NODE_ORDER, self.name, Scorer("task", score, plugin=self.name))


def binpack(free: np.ndarray, has: np.ndarray, lo: float, hi: float, every: bool) -> np.ndarray:
    """The binpack score of each node from its free amount of the resource (``free``, consumed:
    computed in place): 9 for the least free (``lo``), 0 for the most (``hi``), linearly between,
    over the nodes that have the resource (``has``; ``every``: all of them); 0 for the others,
    and for all when nothing is free anywhere."""
    if hi == 0:
        return np.zeros(len(free))
    if lo == hi:
        return np.where(has, MAX_HIGH_DENSITY, 0.0)
    free -= lo
    free /= hi - lo
    np.subtract(1, free, out=free)
    free *= MAX_HIGH_DENSITY
    return free if every else np.where(has, free, 0.0)


class BinpackColumn:
    """``score``'s binpack over every node in order for resource column ``d``, kept between calls:
    a placement changes one row's free amount, and the least and most free over the nodes (which
    scale every score) seldom move, so only the rows in the table's change log since the last call
    are scored again, in plain floats with the same operations as the whole-column numpy pass.
    When the least or most free moves, or many rows changed, the whole column is scored again.
    ``scores`` hands out a read-only view of the kept array: callers add it, never change it."""

    def __init__(self, nodes: NodeTable, d: int) -> None:
        self.nodes, self.d = nodes, d
        # Which nodes have the resource (a node's allocatable does not change in a session).
        has = nodes.allocatable[:, d] > 0
        self.has, self.every, self.some = has, bool(has.all()), bool(has.any())
        self.has_rows: list[bool] = has.tolist()
        self.position = -1  # change-log length the scores are current to (-1: none yet)
        self.free = np.zeros(len(nodes))  # idle + releasing per node, as of ``position``
        self.lo = self.hi = 0.0
        self.kept = np.zeros(len(nodes))
        self.view = self.kept.view()
        self.view.flags.writeable = False

    def scores(self) -> np.ndarray:
        log = self.nodes.change_log
        if self.position < 0:
            self._score_all()
        elif self.position < len(log):
            # Each changed row once (a status change logs its row twice: off, then on again).
            rows = set(log[self.position :])
            if len(rows) > REPLAY_ROWS:
                self._score_all()
            else:
                self._replay(rows)
        self.position = len(log)
        return self.view

    def _score_all(self) -> None:
        """The whole column, from the node table (the arithmetic ``binpack`` always used)."""
        n, d = self.nodes, self.d
        self.free = n.idle[:, d] + n.releasing[:, d]
        self.lo, self.hi = self._extremes()
        self.kept[:] = self._column(self.free.copy())

    def _extremes(self) -> tuple[float, float]:
        """The least and most free amount over the nodes that have the resource."""
        if not self.some:
            return 0.0, 0.0
        held = self.free if self.every else self.free[self.has]
        return float(held.min()), float(held.max())

    def _column(self, free: np.ndarray) -> np.ndarray:
        """Every node's score from its free amount (``free`` is consumed). (No node with the
        resource: its extremes are 0, so every score is 0.)"""
        return binpack(free, self.has, self.lo, self.hi, self.every)

    def _row(self, row: int) -> float:
        """``binpack``'s answer for one row, in plain floats (the same operations, in order)."""
        lo, hi = self.lo, self.hi
        if not self.has_rows[row] or hi == 0:
            return 0.0
        if lo == hi:
            return MAX_HIGH_DENSITY
        return (1 - (self.free.item(row) - lo) / (hi - lo)) * MAX_HIGH_DENSITY

    def _replay(self, rows: set[int]) -> None:
        """Score ``rows`` again after they changed; the whole column when the extremes moved."""
        n, d, free = self.nodes, self.d, self.free
        lo, hi = self.lo, self.hi
        moved = False
        for row in rows:
            old = free.item(row)
            new = n.idle.item(row, d) + n.releasing.item(row, d)
            free[row] = new
            # An extreme may move only when a node held it or goes beyond it.
            if self.has_rows[row] and (old in (lo, hi) or not lo <= new <= hi):
                moved = True
        if moved:
            extremes = self._extremes()
            if extremes != (lo, hi):
                self.lo, self.hi = extremes
                self.kept[:] = self._column(free.copy())
                return
        for row in rows:
            self.kept[row] = self._row(row)
