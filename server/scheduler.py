"""Entry point of the scheduling core: one cycle over a snapshot.

``SchedulerCore.run_cycle`` is pure: snapshot in, decisions out. The server runs it in a worker
thread; ``muster simulate`` runs it directly.

INTERIM: a plain gang first-fit, replaced by the session/actions/plugins framework.
"""

from __future__ import annotations

from server.config import SchedulerConfig, default_config
from server.model import (
    OCCUPYING,
    ClusterSnapshot,
    Condition,
    CycleResult,
    Explanation,
    JobOutcome,
    PodGroupPhase,
    TaskStatus,
)
from server.quantity import MIN_RESOURCE


class SchedulerCore:
    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or default_config()

    def update_config(self, config: SchedulerConfig) -> None:
        """Takes effect at the next cycle."""
        self.config = config

    def run_cycle(self, snapshot: ClusterSnapshot, cycle_id: int) -> CycleResult:
        result = CycleResult(cycle_id=cycle_id)
        idle = {n.name: dict(n.allocatable) for n in snapshot.nodes}
        usable = {n.name for n in snapshot.nodes if not n.unschedulable and n.ready}
        all_tasks = [t for j in snapshot.jobs for t in j.tasks] + list(snapshot.foreign_tasks)
        for t in all_tasks:
            if t.status in OCCUPYING and t.node in idle:
                for r, v in t.request.items():
                    idle[t.node][r] = idle[t.node].get(r, 0.0) - v
        for job in snapshot.jobs:
            pending = [t for t in job.tasks if t.status == TaskStatus.PENDING]
            placed = [t for t in job.tasks if t.status in OCCUPYING]
            need = (job.min_member or len(job.tasks)) - len(placed)
            trial: dict[str, str] = {}
            for t in pending:
                for name in sorted(usable):
                    free = idle[name]
                    if all(free.get(r, 0.0) + MIN_RESOURCE >= v for r, v in t.request.items()):
                        for r, v in t.request.items():
                            free[r] = free.get(r, 0.0) - v
                        trial[t.uid] = name
                        break
            if len(trial) >= need:
                result.binds.update(trial)
                result.jobs[job.uid] = JobOutcome(PodGroupPhase.RUNNING if trial or placed else job.phase)
            else:
                for uid, name in trial.items():
                    req = next(t.request for t in pending if t.uid == uid)
                    for r, v in req.items():
                        idle[name][r] += v
                msg = f"{len(trial)}/{len(pending)} tasks in gang unschedulable: gang needs {need}"
                result.jobs[job.uid] = JobOutcome(
                    job.phase,
                    [Condition("Unschedulable", "True", "NotEnoughResources", msg)],
                    Explanation("placement", msg),
                )
        return result
