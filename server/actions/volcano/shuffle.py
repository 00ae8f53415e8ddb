"""shuffle: evict the running tasks that plugins' victim functions select (Volcano
``actions/shuffle``), e.g. rescheduling or tdm's revocable-zone eviction.

Every Running task of every job in the session is offered to ``ssn.victim_tasks`` (union within a
tier, first tier with victims decides); each victim is evicted at once with reason "shuffle".
Volcano walks a Go map here; Muster evicts in task uid order so that a cycle is reproducible.
"""

from __future__ import annotations

from server.actions.base import Action
from server.model import TaskStatus
from server.session.session import Session

REASON = "shuffle"


class ShuffleAction(Action):
    name = "shuffle"

    def execute(self, ssn: Session) -> None:
        running = [t for job in ssn.jobs.values() for t in job.index[TaskStatus.RUNNING].values()]
        if not running:
            return
        for victim in sorted(ssn.victim_tasks(running), key=lambda t: t.uid):
            # A victim fn may hand back a task that is no longer running (or one it invented):
            # only a running task of the session can be evicted.
            if victim.status != TaskStatus.RUNNING or victim.node is None:
                continue
            stmt = ssn.statement()
            stmt.evict(victim, REASON)
            stmt.commit()
