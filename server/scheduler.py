"""Entry point of the scheduling core: one cycle over a snapshot.

``SchedulerCore.run_cycle`` is pure: snapshot in, decisions out (open session -> configured
actions -> close session). It runs with the cycle collector paused and frees the session's
objects itself when it ends (``Session.release``). The server runs it in its cycle worker process
(or a thread, ``--cycle-worker thread``); ``muster simulate`` runs it directly.

Quarantine: a cycle that raises is not allowed to stop all scheduling. ``run_cycle`` then looks
for the job that makes it raise -- the shortest prefix of the snapshot's jobs whose cycle raises
ends with it (a binary search: about log2(jobs) trial cycles, the jobs after the prefix only
holding their nodes) -- and runs the cycle again without that job, up to
``MAX_QUARANTINED_PER_CYCLE`` jobs. The jobs left out get the ``Quarantined`` condition (reason
``CycleFailed``, the error in its message) and are listed in ``CycleResult.quarantined``; the
server skips them in later cycles until they are cancelled. A cycle that raises with no job at
all, or still raises once the bound is reached, raises its first error as before.
"""

from __future__ import annotations

import dataclasses
import gc
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from server.actions import ACTIONS
from server.config import SchedulerConfig, default_config
from server.model import (
    OCCUPYING,
    QUARANTINED,
    ClusterSnapshot,
    Condition,
    CycleResult,
    Explanation,
    JobOutcome,
    JobSpec,
    TaskSpec,
)
from server.plugins.muster.gang_backend import NAME as GANG_BACKEND
from server.plugins.muster.gang_backend import GangBackendPlugin
from server.session.options import GANG_ACROSS_BACKENDS, PluginOption
from server.session.session import Session
from server.session.window import open_window

# The most jobs one failing cycle leaves out before it gives up (and raises): a cycle that fails
# whatever jobs it has is not any job's fault.
MAX_QUARANTINED_PER_CYCLE = 5


def with_backend_rule(config: SchedulerConfig) -> SchedulerConfig:
    """``config`` plus a last tier holding the gang-backend plugin (a gang stays inside one
    backend), unless the configuration allows spanning backends or already lists the plugin."""
    if config.session.get(GANG_ACROSS_BACKENDS) is True or config.plugin(GANG_BACKEND) is not None:
        return config
    rule = PluginOption(GANG_BACKEND, {"predicate": True}, plugin_class=GangBackendPlugin)
    return dataclasses.replace(config, tiers=[*config.tiers, [rule]])


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic garbage collection inside the block; the collector's state as it was after it.

    For a cycle: its objects stay alive until the session is released at its end, so a collection
    inside it traverses ~100,000 live objects (at 10,000 tasks) and frees nothing: ~5 % of the
    cycle. With the session's own reference cycles broken by ``Session.release``, the collection
    that follows finds almost nothing to do (2 ms measured)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class SchedulerCore:
    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or default_config()
        self._effective = with_backend_rule(self.config)

    def update_config(self, config: SchedulerConfig) -> None:
        """Takes effect at the next cycle."""
        self.config = config
        self._effective = with_backend_rule(config)

    def run_cycle(self, snapshot: ClusterSnapshot, cycle_id: int) -> CycleResult:
        config = self._effective  # one config for the whole cycle, even if swapped meanwhile
        # The session's objects live until it is released: a collection in between would only
        # traverse them (see collector_paused).
        with collector_paused():
            try:
                return self._run(config, snapshot, cycle_id)
            except Exception as exc:  # noqa: BLE001 - a job may break it: the others still get a cycle
                return self._quarantining(config, snapshot, cycle_id, exc)

    def _run(
        self, config: SchedulerConfig, snapshot: ClusterSnapshot, cycle_id: int
    ) -> CycleResult:
        started = time.perf_counter()
        opened, window = open_window(snapshot, config)
        ssn = Session(opened, config, cycle_id, window)
        try:  # released even when an action raises: a failed cycle leaves no reference cycles
            ssn.result.action_seconds["session.open"] = time.perf_counter() - started
            for name in config.actions:
                action = (config.action_classes.get(name) or ACTIONS[name])(
                    config.action_arguments.get(name)
                )
                t0 = time.perf_counter()
                ssn.action = name
                action.execute(ssn)
                ssn.result.action_seconds[name] = time.perf_counter() - t0
            t0 = time.perf_counter()
            result = ssn.close()
            result.beyond_window = window.report()
        finally:
            ssn.release()
        result.action_seconds["session.close"] = time.perf_counter() - t0
        return result

    def _quarantining(
        self, config: SchedulerConfig, snapshot: ClusterSnapshot, cycle_id: int, error: Exception
    ) -> CycleResult:
        """The cycle of ``snapshot``, which raised ``error``, without the jobs that make it raise
        (see the module's docstring); ``error`` again when no job is to blame."""
        jobs = list(snapshot.jobs)
        left_out: list[tuple[JobSpec, str]] = []
        why = describe_error(error)
        while len(left_out) < MAX_QUARANTINED_PER_CYCLE:
            found = self._culprit(config, snapshot, jobs, [j for j, _ in left_out], cycle_id, why)
            if found is None:
                break
            index, why = found
            left_out.append((jobs.pop(index), why))
            try:
                result = self._run(
                    config, _some_jobs(snapshot, jobs, [j for j, _ in left_out]), cycle_id
                )
            except Exception as exc:  # noqa: BLE001 - bisecting for the job that breaks a cycle
                why = describe_error(exc)
                continue
            for job, reason in left_out:
                message = (
                    f"left out of scheduling: a cycle fails with this job ({reason}); "
                    "it stays out until it is cancelled"
                )
                result.quarantined[job.uid] = reason
                result.jobs[job.uid] = JobOutcome(
                    job.phase,
                    [Condition(QUARANTINED, "True", "CycleFailed", message)],
                    Explanation("quarantined", message),
                )
                for task in job.tasks:  # as they were: the cycle did nothing with them
                    result.task_status.setdefault(task.uid, (task.status, task.node))
            return result
        raise error

    def _culprit(
        self,
        config: SchedulerConfig,
        snapshot: ClusterSnapshot,
        jobs: list[JobSpec],
        left_out: list[JobSpec],
        cycle_id: int,
        why: str,
    ) -> tuple[int, str] | None:
        """(index in ``jobs``, the error) of the job whose cycle fails, given that the cycle of all
        of ``jobs`` fails with ``why``: the end of the shortest failing prefix. None when the cycle
        fails with no job at all (no job is to blame)."""

        def failure(count: int) -> str | None:
            try:
                self._run(
                    config, _some_jobs(snapshot, jobs[:count], [*left_out, *jobs[count:]]), cycle_id
                )
            except Exception as exc:  # noqa: BLE001 - bisecting for the job that breaks a cycle
                return describe_error(exc)
            return None

        if not jobs or failure(0) is not None:
            return None
        good, bad = 0, len(jobs)  # the cycle of jobs[:good] runs, that of jobs[:bad] fails
        while bad - good > 1:
            middle = (good + bad) // 2
            failed = failure(middle)
            if failed is None:
                good = middle
            else:
                bad, why = middle, failed
        return bad - 1, why


def _some_jobs(
    snapshot: ClusterSnapshot, jobs: list[JobSpec], others: Sequence[JobSpec]
) -> ClusterSnapshot:
    """``snapshot`` with only ``jobs``; the tasks of ``others`` that hold a node still hold it, as
    foreign work (nothing may take their place)."""
    holding: list[TaskSpec] = [
        dataclasses.replace(t, job="")
        for job in others
        for t in job.tasks
        if t.node and t.status in OCCUPYING
    ]
    return dataclasses.replace(
        snapshot, jobs=jobs, foreign_tasks=[*snapshot.foreign_tasks, *holding]
    )


def describe_error(exc: BaseException) -> str:
    """An error in a line: its type, message (cut short) and where it was raised."""
    text = str(exc)
    if len(text) > 300:
        text = text[:300] + "..."
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        where = f" at {Path(last.filename).name}:{last.lineno} in {last.name}"
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"
