"""elastic (KAI): jobs below their gang minimum go first, jobs exactly at it before jobs above it,
so an elastic job grows only after the others have their minimum. Registers: job_order (and its
sort key, the state itself: 0 below, 1 at, 2 above)."""

from __future__ import annotations

from typing import ClassVar

from server.plugins.base import Plugin
from server.session.extension_points import JOB_ORDER, JOB_ORDER_KEY
from server.session.info import JobInfo
from server.session.kai import min_available_state
from server.session.session import Session


class ElasticPlugin(Plugin):
    name: ClassVar[str] = "elastic"

    def on_session_open(self, ssn: Session) -> None:
        def order(left: JobInfo, right: JobInfo) -> int:
            a, b = min_available_state(left), min_available_state(right)
            if a == 0 and b != 0 or a == 1 and b == 2:
                return -1
            if b == 0 and a != 0 or b == 1 and a == 2:
                return 1
            return 0

        ssn.register(JOB_ORDER, self.name, order)
        ssn.register(JOB_ORDER_KEY, self.name, min_available_state)
