"""backfill: place best-effort tasks (no resource request) on any node that passes the
predicates (Volcano ``actions/backfill``). Each placement is committed at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from server.actions.base import Action
from server.model import PodGroupPhase, TaskStatus

if TYPE_CHECKING:
    from server.session.session import Session


class BackfillAction(Action):
    name = "backfill"

    def execute(self, ssn: Session) -> None:
        names = ssn.nodes.names
        for job in list(ssn.jobs.values()):
            if job.phase == PodGroupPhase.PENDING:
                continue
            vr = ssn.job_valid(job)
            if vr is not None and not vr.passed:
                continue
            for task in list(job.index[TaskStatus.PENDING].values()):
                if not task.best_effort:
                    continue
                choice = ssn.evaluator.select(task)
                if choice is None:
                    job.fit_errors[task.uid] = ssn.evaluator.fit_errors(task)
                    break
                stmt = ssn.statement()
                stmt.allocate(task, names[choice[0]])
                stmt.commit()
