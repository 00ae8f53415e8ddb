"""priority (KAI): higher job priority first. Registers: job_order (only: in KAI, who may preempt
whom is the preempt action's rule, not this plugin's), and its sort key."""

from __future__ import annotations

from typing import ClassVar

from server.plugins.base import Plugin
from server.session.extension_points import JOB_ORDER, JOB_ORDER_KEY
from server.session.session import Session


class KaiPriorityPlugin(Plugin):
    name: ClassVar[str] = "priority"

    def on_session_open(self, ssn: Session) -> None:
        ssn.register(
            JOB_ORDER,
            self.name,
            lambda a, b: 0 if a.priority == b.priority else (-1 if a.priority > b.priority else 1),
        )
        ssn.register(JOB_ORDER_KEY, self.name, lambda job: -job.priority)
