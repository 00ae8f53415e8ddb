"""gpuspread (KAI): a fractional task takes the shared GPU least used; a whole free GPU scores as
an unused one (1). The opposite of gpupack; a configuration names one of the two. Registers:
gpu_order."""

from __future__ import annotations

from typing import ClassVar

from server.plugins.base import Plugin
from server.session.extension_points import GPU_ORDER
from server.session.info import TaskInfo
from server.session.session import Session


class GpuSpreadPlugin(Plugin):
    name: ClassVar[str] = "gpuspread"

    def on_session_open(self, ssn: Session) -> None:
        def order(task: TaskInfo, row: int, group: str) -> float:
            return 1.0 - ssn.nodes.used_gpu_portion(row, group) if group else 1.0

        ssn.register(GPU_ORDER, self.name, order)
