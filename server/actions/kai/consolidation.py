"""consolidation (KAI): make room for a pending job by moving running preemptible jobs to other
nodes -- only if every one of them is placed again (pipelined where it goes), so nothing is lost.
Session parameter ``maxNumberConsolidationPreemptees`` bounds the candidate victim jobs (-1: no
bound, 0: the action is off)."""

from __future__ import annotations

from typing import ClassVar

from server.actions.base import Action
from server.actions.kai.job_queue import Filters
from server.actions.kai.solver import solve_pending_jobs
from server.model import TaskStatus
from server.session.info import JobInfo, TaskInfo
from server.session.kai import is_preemptible
from server.session.session import Session


def max_preemptees(ssn: Session) -> int:
    try:
        return int(ssn.config.session.get("maxNumberConsolidationPreemptees", -1))
    except (TypeError, ValueError):
        return -1


class ConsolidationAction(Action):
    name: ClassVar[str] = "consolidation"

    def execute(self, ssn: Session) -> None:
        limit = max_preemptees(ssn)
        if limit == 0:
            return

        def candidates(preemptor: JobInfo) -> list[JobInfo]:
            jobs = [j for j in ssn.jobs.values() if is_preemptible(j) and j.uid != preemptor.uid]
            return jobs[: limit + 1] if limit > 0 else jobs

        solve_pending_jobs(
            ssn,
            self.name,
            pending=Filters(unready=True, non_pending=True, non_preemptible=True),
            may_try=lambda job: True,
            victim_jobs=candidates,
            victim_filters=Filters(non_active=True),
            validator=_all_placed_again,
            moves_only=True,
        )


def _all_placed_again(job: JobInfo, tasks: list[TaskInfo], victims: list[TaskInfo]) -> bool:
    return all(t.status != TaskStatus.RELEASING for t in victims)
