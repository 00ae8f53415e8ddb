"""gpusharingorder (KAI): a fractional task prefers nodes with a shared GPU it fits on (+1000), so
shares fill GPUs already shared before a new GPU is split. Registers: node_order (task scope)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from server.plugins.base import Plugin
from server.session.extension_points import NODE_ORDER, Scorer
from server.session.info import TaskInfo
from server.session.session import Session

GPU_SHARING_SCORE = 1000.0


class GpuSharingOrderPlugin(Plugin):
    name: ClassVar[str] = "gpusharingorder"

    def on_session_open(self, ssn: Session) -> None:
        nodes = ssn.nodes

        def score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            out = np.zeros(len(rows))
            if not task.gpu_fraction:
                return out
            shared = nodes.shared
            # Plain ints, and past the (most) nodes that share no GPU without a call.
            for k, i in enumerate(rows.tolist()):
                for group in shared[i]:
                    if nodes.group_fractions(i, group)[1] >= task.gpu_fraction - 1e-9:
                        out[k] = GPU_SHARING_SCORE
                        break
            return out

        ssn.register(NODE_ORDER, self.name, Scorer("task", score, plugin=self.name))
