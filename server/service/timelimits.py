"""The server's time-limit safety net: a task its backend did not end at its job's time limit.

The backends end a task at its job's limit (``BindDecision.time_limit_seconds``) and report it
Failed (``muster.timelimit.time_limit_message``); ``enforce_time_limits``, run from the loop's
expiry pass (``server.service.loop``), stops one still Running ``ClusterState.time_limit_grace``
seconds past it. The acknowledged eviction makes it Failed (``ClusterState.released``). The shared
spellings of limits stay in ``muster.timelimit``; this mutates the state, so it is server code.
"""

from __future__ import annotations

import structlog

from muster.timelimit import TIME_LIMIT_REASON
from server.model import TaskStatus
from server.service.records import JobRecord
from server.service.state import ClusterState

# The evictions log as the state's, as they did when this was a ClusterState method.
log = structlog.get_logger("muster.state")


def enforce_time_limits(state: ClusterState, now: float | None = None) -> int:
    """The safety net behind the backends (which end a task at its job's time limit): a task
    still Running ``state.time_limit_grace`` seconds past its limit is evicted, reason TimeLimit,
    and Failed once that is acknowledged (``released``). Counted from when a backend reported it
    Running (after a server restart, from the first call). Returns how many were evicted."""
    now = state.clock() if now is None else now
    touched: dict[str, JobRecord] = {}
    evicted = 0
    for job in state.jobs_that_may_hold():
        if not job.tasks_built:  # (Pending as submitted: nothing runs)
            continue
        limit = job.spec.time_limit_seconds
        if not limit:
            continue
        for t in job.tasks:
            if t.status != TaskStatus.RUNNING:
                continue
            if not t.started:
                t.started = now
            elif now - t.started > limit + state.time_limit_grace:
                log.warning("task.time_limit", task=t.uid, limit=limit, node=t.node)
                state.evict(t, TIME_LIMIT_REASON, 0)
                touched[job.id] = job
                evicted += 1
    for job in touched.values():
        state.after_task_change(job)
    if touched:
        state.on_change()
    return evicted
