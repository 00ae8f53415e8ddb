"""gpupack (KAI): a fractional task takes the shared GPU already most used (a whole free GPU
scores 0). Registers: gpu_order."""

from __future__ import annotations

from typing import ClassVar

from server.plugins.base import Plugin
from server.session.extension_points import GPU_ORDER
from server.session.info import TaskInfo
from server.session.session import Session


class GpuPackPlugin(Plugin):
    name: ClassVar[str] = "gpupack"

    def on_session_open(self, ssn: Session) -> None:
        def order(task: TaskInfo, row: int, group: str) -> float:
            return ssn.nodes.used_gpu_portion(row, group) if group else 0.0

        ssn.register(GPU_ORDER, self.name, order)
