"""taskorder (KAI): within a job, tasks with a higher task priority (KAI's task-order label; a
scenario task's ``priority``) go first. Registers: task_order."""

from __future__ import annotations

from typing import ClassVar

from server.plugins.base import Plugin
from server.session.extension_points import TASK_ORDER
from server.session.session import Session


class TaskOrderPlugin(Plugin):
    name: ClassVar[str] = "taskorder"

    def on_session_open(self, ssn: Session) -> None:
        ssn.register(
            TASK_ORDER,
            self.name,
            lambda a, b: 0 if a.priority == b.priority else (-1 if a.priority > b.priority else 1),
        )
