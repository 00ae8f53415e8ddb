"""reclaim (KAI): a pending job of a queue below its fair share takes resources back from other
queues' preemptible jobs, as far as the proportion plugin finds it fair (``can_reclaim`` before the
search, ``reclaim_scenario_valid`` for each candidate solution); victims re-placed elsewhere count
as moved when ``allowConsolidatingReclaim`` (session parameter, default true)."""

from __future__ import annotations

from typing import ClassVar

from server.actions.base import Action
from server.actions.kai.job_queue import Filters
from server.actions.kai.solver import solve_pending_jobs
from server.session.session import Session


class KaiReclaimAction(Action):
    name: ClassVar[str] = "reclaim"

    def execute(self, ssn: Session) -> None:
        solve_pending_jobs(
            ssn,
            self.name,
            pending=Filters(unready=True, non_pending=True),
            may_try=ssn.can_reclaim,
            victim_jobs=lambda reclaimer: [
                j for j in ssn.jobs.values() if j.queue != reclaimer.queue
            ],
            victim_filters=Filters(non_preemptible=True, non_active=True),
            validator=ssn.reclaim_scenario_valid,
        )
