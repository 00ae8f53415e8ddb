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
from server.session.info import TaskInfo
from server.session.kai import all_rows, is_gpu_task
from server.session.session import Session

MAX_HIGH_DENSITY = 9.0
STRATEGIES = ("binpack", "spread")


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
        # Per resource, over every node: which nodes have some of it, and whether all or any do
        # (a node's allocatable does not change in a session): found once, for whole-column scores.
        having: dict[int, tuple[np.ndarray, bool, bool]] = {}

        def score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            gpu = is_gpu_task(task, dims)
            d = nodes.gpu_dim if gpu else dims.get(CPU)
            if d is None or not len(rows):
                return np.zeros(len(rows))
            spread = self.arguments.get("gpu" if gpu else "cpu") == "spread"
            if not spread and rows is all_rows(len(nodes)):
                return binpack_all(d)
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
            lo, hi = free[has].min(), free[has].max()
            if hi == 0:
                return np.zeros(len(rows))
            if lo == hi:
                return np.where(has, MAX_HIGH_DENSITY, 0.0)
            return np.where(has, MAX_HIGH_DENSITY * (1 - (free - lo) / (hi - lo)), 0.0)

        def binpack_all(d: int) -> np.ndarray:
            """``score``'s binpack over every node in order: the same arithmetic on whole columns,
            in place, and no masking where every node has the resource."""
            known = having.get(d)
            if known is None:
                has = nodes.allocatable[:, d] > 0
                known = having[d] = (has, bool(has.all()), bool(has.any()))
            has, every, some = known
            n = len(nodes)
            if not some:
                return np.zeros(n)
            free = nodes.idle[:, d] + nodes.releasing[:, d]
            held = free if every else free[has]
            lo, hi = held.min(), held.max()
            if hi == 0:
                return np.zeros(n)
            if lo == hi:
                return np.where(has, MAX_HIGH_DENSITY, 0.0)
            free -= lo
            free /= hi - lo
            np.subtract(1, free, out=free)
            free *= MAX_HIGH_DENSITY
            return free if every else np.where(has, free, 0.0)

        ssn.register(NODE_ORDER, self.name, Scorer("task", score, plugin=self.name))
