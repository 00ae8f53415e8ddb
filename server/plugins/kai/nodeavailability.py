"""nodeavailability (KAI): nodes where the task fits on free resources now (+100) before nodes
where it would wait for releasing ones. Registers: node_order (shape scope: a
function of the task's request and the node's row, cached per shape and re-scored where a row changed)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from server.plugins.base import Plugin
from server.session.extension_points import NODE_ORDER, Scorer
from server.session.info import TaskInfo
from server.session.kai import fit_rows, fits_now_row
from server.session.session import Session

AVAILABILITY_SCORE = 100.0


class NodeAvailabilityPlugin(Plugin):
    name: ClassVar[str] = "nodeavailability"

    def on_session_open(self, ssn: Session) -> None:
        def score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            if task.best_effort and not task.gpu_fraction:
                return np.full(len(rows), AVAILABILITY_SCORE)
            _, now = fit_rows(ssn.nodes, task, rows)
            return np.where(now, AVAILABILITY_SCORE, 0.0)

        def row(task: TaskInfo, i: int) -> float:
            if task.best_effort and not task.gpu_fraction:
                return AVAILABILITY_SCORE
            return AVAILABILITY_SCORE if fits_now_row(ssn.nodes, task, i) else 0.0

        ssn.register(NODE_ORDER, self.name, Scorer("shape", score, plugin=self.name, row=row))
