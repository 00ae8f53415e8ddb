"""binpack: prefer nodes that are already full (Volcano ``plugins/binpack``).

Arguments (Volcano defaults): ``binpack.weight`` (1), ``binpack.cpu`` (1), ``binpack.memory`` (1),
``binpack.resources`` (comma-separated extended resources to weigh, e.g. ``nvidia.com/gpu``) and
``binpack.resources.<name>`` (weight of that resource, default 1). For each requested resource with
a weight: ``(used + request) * weight / allocatable``; the weighted mean times 100 times
``binpack.weight`` is the node's score. A node the request would overflow scores 0.
"""

from __future__ import annotations

import numpy as np

from muster.quantity import CPU, MEMORY
from server.plugins.base import Plugin
from server.session.evaluator import Scorer
from server.session.extension_points import NODE_ORDER
from server.session.info import TaskInfo
from server.session.session import Session

MAX_NODE_SCORE = 100.0


class BinpackPlugin(Plugin):
    name = "binpack"
    ARGUMENTS = {
        "binpack.weight": 1,
        "binpack.cpu": 1,
        "binpack.memory": 1,
        "binpack.resources": "",
        "binpack.resources.*": 1,
    }

    def resource_weights(self) -> dict[str, int]:
        weights: dict[str, int] = {}
        for name in str(self.arguments.get("binpack.resources") or "").split(","):
            name = name.strip()
            if not name:
                continue
            w = self.arg_int(f"binpack.resources.{name}", 1)
            weights[name] = w if w >= 0 else 1
        cpu_w = self.arg_int("binpack.cpu", 1)
        mem_w = self.arg_int("binpack.memory", 1)
        weights[CPU] = cpu_w if cpu_w >= 0 else 1
        weights[MEMORY] = mem_w if mem_w >= 0 else 1
        return weights

    def on_session_open(self, ssn: Session) -> None:
        weight = self.arg_int("binpack.weight", 1)
        if weight == 0:
            return
        nodes = ssn.nodes
        dims = [
            (ssn.space.index[n], w)
            for n, w in self.resource_weights().items()
            if n in ssn.space.index
        ]

        def score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            total = np.zeros(len(rows))
            weight_sum = 0
            overflow = np.zeros(len(rows), dtype=bool)
            for d, w in dims:
                request = task.resreq[d]
                if request == 0:
                    continue
                weight_sum += w
                cap = nodes.allocatable[rows, d]
                used = nodes.used[rows, d] + request
                if w == 0:
                    continue
                with np.errstate(divide="ignore", invalid="ignore"):
                    part = np.where(cap > 0, used * w / np.where(cap > 0, cap, 1), 0.0)
                overflow |= (cap > 0) & (used > cap)
                total += part
            if weight_sum > 0:
                total /= weight_sum
            total *= MAX_NODE_SCORE * weight
            total[overflow] = 0.0
            return total

        def row_score(task: TaskInfo, i: int) -> float:
            # ``score`` for one row in plain floats, the same operations in the same order.
            total = 0.0
            weight_sum = 0
            overflow = False
            for d, w in dims:
                request = float(task.resreq[d])
                if request == 0:
                    continue
                weight_sum += w
                cap = float(nodes.allocatable[i, d])
                used = float(nodes.used[i, d]) + request
                if w == 0:
                    continue
                total += used * w / cap if cap > 0 else 0.0
                overflow = overflow or (cap > 0 and used > cap)
            if weight_sum > 0:
                total /= weight_sum
            total *= MAX_NODE_SCORE * weight
            return 0.0 if overflow else total

        ssn.register(NODE_ORDER, self.name, Scorer("shape", score, row=row_score))
