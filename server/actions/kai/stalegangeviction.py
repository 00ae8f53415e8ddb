"""stalegangeviction (KAI): a gang that has been below its minimum of running tasks for longer than
the grace period loses all its active tasks (they are evicted), so it does not hold resources it
cannot use. The grace period is the session parameter ``globalDefaultStalenessGracePeriod`` (default
0 as in KAI's sessions; KAI's scheduler binary and examples/config-kai.yaml give 60s; a job
annotation ``kai.scheduler/staleness-grace-period`` overrides it); how long a job has been stale is
its ``staleFor``."""

from __future__ import annotations

from typing import ClassVar

from server.actions.base import Action
from server.session.kai import ACTIVE_ALLOCATED, is_stale
from server.session.options import parse_go_duration
from server.session.session import Session

GRACE_ANNOTATION = "kai.scheduler/staleness-grace-period"


class StaleGangEvictionAction(Action):
    name: ClassVar[str] = "stalegangeviction"

    def execute(self, ssn: Session) -> None:
        # Absent: 0, the value KAI's own sessions start with (its scheduler binary passes 60s, as
        # examples/config-kai.yaml does).
        default = _seconds(ssn.config.session.get("globalDefaultStalenessGracePeriod", "0s"), 0.0)
        for job in ssn.jobs.values():
            if not is_stale(job):
                continue
            stale = job.spec.stale_seconds or 0.0  # just found stale: its clock starts now
            grace = _seconds(job.spec.annotations.get(GRACE_ANNOTATION), default)
            if grace < 0 or stale < grace:
                continue
            stmt = ssn.statement()
            for task in job.tasks.values():
                if task.status in ACTIVE_ALLOCATED and task.node is not None:
                    stmt.evict(task, f"stalegangeviction: gang below its minimum for {stale:g}s")
            stmt.commit()


def _seconds(value: object, default: float) -> float:
    if value is None or value == "":
        return default
    if isinstance(value, int | float):
        return float(value)
    try:
        return parse_go_duration(str(value))
    except ValueError:
        return default
