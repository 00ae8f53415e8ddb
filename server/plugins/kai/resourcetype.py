"""resourcetype (KAI): a task that asks no GPU prefers nodes without GPUs (+10), keeping GPU nodes
for GPU work. Registers: node_order (shape scope: it
depends on the request and the node's allocatable only, so it is computed once per shape)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from server.plugins.base import Plugin
from server.session.extension_points import NODE_ORDER, Scorer
from server.session.info import TaskInfo
from server.session.kai import is_gpu_task
from server.session.session import Session

RESOURCE_TYPE_SCORE = 10.0


class ResourceTypePlugin(Plugin):
    name: ClassVar[str] = "resourcetype"

    def on_session_open(self, ssn: Session) -> None:
        nodes, dims = ssn.nodes, ssn.space.index

        def score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            if is_gpu_task(task, dims) or nodes.gpu_dim is None:
                return (
                    np.zeros(len(rows))
                    if nodes.gpu_dim is not None
                    else np.full(len(rows), RESOURCE_TYPE_SCORE)
                )
            cpu_only = nodes.allocatable[rows, nodes.gpu_dim] <= 0
            return np.where(cpu_only, RESOURCE_TYPE_SCORE, 0.0)

        # A CPU-only task's score per node, as plain floats: a node's allocatable does not change
        # in a session, and ``row`` is asked for every row a placement changes.
        cpu_task_scores: list[float] = (
            []
            if nodes.gpu_dim is None
            else np.where(
                nodes.allocatable[:, nodes.gpu_dim] <= 0, RESOURCE_TYPE_SCORE, 0.0
            ).tolist()
        )

        def row(task: TaskInfo, i: int) -> float:  # ``score`` for one row
            if nodes.gpu_dim is None:
                return RESOURCE_TYPE_SCORE
            if is_gpu_task(task, dims):
                return 0.0
            return cpu_task_scores[i]

        ssn.register(NODE_ORDER, self.name, Scorer("shape", score, plugin=self.name, row=row))
