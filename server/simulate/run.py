"""``muster simulate``: run scenarios on the real scheduling core, cycle after cycle, and report
the output object of docs/simulate.md. No side effects."""

from __future__ import annotations

from typing import Any

from server.model import ClusterSnapshot, CycleResult, TaskStatus
from server.scheduler import SchedulerCore
from server.simulate.scenario import Scenario, ScenarioError, parse_scenario_text


def _advance(
    snapshot: ClusterSnapshot, result: CycleResult, evicted_come_back: bool = False
) -> None:
    """Between cycles, act as a cluster would: bound tasks run, released tasks go away (under
    ``profile: kai`` they come back pending, as the job's controller recreates evicted pods -- what
    KAI's multi-round tests assume), pipelined tasks wait again, and job phases carry over."""
    for job in snapshot.jobs:
        outcome = result.jobs.get(job.uid)
        if outcome is not None:
            job.phase = outcome.phase
        kept = []
        for task in job.tasks:
            status, node = result.task_status.get(task.uid, (task.status, task.node))
            if status == TaskStatus.RELEASING:
                if not evicted_come_back:
                    continue
                status, node = TaskStatus.PENDING, None
            if status in (TaskStatus.BINDING, TaskStatus.BOUND):
                status = TaskStatus.RUNNING
            elif status in (TaskStatus.ALLOCATED, TaskStatus.PIPELINED):
                # Placements of a job that was only pipelined were never bound: they wait again.
                status, node = TaskStatus.PENDING, None
            task.status, task.node = status, node
            task.devices = list(result.task_devices.get(task.uid, [])) if node is not None else []
            task.gpu_groups = (
                list(result.task_gpu_groups.get(task.uid, [])) if node is not None else []
            )
            kept.append(task)
        job.tasks = kept


def run_scenario(scenario: Scenario, cycles: int | None = None) -> dict[str, Any]:
    core = SchedulerCore(scenario.config)
    total = cycles or scenario.cycles
    binds: dict[str, str] = {}
    evictions: list[str] = []
    moved: dict[str, dict[str, str]] = {}
    released: dict[str, tuple[TaskStatus, str | None]] = {}
    released_devices: dict[str, list[str]] = {}
    released_groups: dict[str, list[str]] = {}
    result = CycleResult(cycle_id=0)
    for cycle in range(1, total + 1):
        result = core.run_cycle(scenario.snapshot, cycle)
        binds.update(result.binds)
        for uid in result.evictions:
            if uid not in evictions:
                evictions.append(uid)
        for uid, (src, dst) in result.moved.items():
            moved[uid] = {"from": src, "to": dst}
        for uid, state in result.task_status.items():
            if state[0] == TaskStatus.RELEASING:
                released[uid] = state
                released_devices[uid] = result.task_devices.get(uid, [])
                released_groups[uid] = result.task_gpu_groups.get(uid, [])
        if cycle < total:
            _advance(scenario.snapshot, result, evicted_come_back=scenario.config.profile == "kai")
    tasks: dict[str, dict[str, Any]] = {
        uid: {
            "status": s.title,
            "node": n,
            "gpu_groups": released_groups[uid],
            "devices": released_devices[uid],
        }
        for uid, (s, n) in released.items()
    }
    for uid, (status, node) in result.task_status.items():
        tasks[uid] = {
            "status": status.title,
            "node": node,
            "gpu_groups": result.task_gpu_groups.get(uid, []) if node is not None else [],
            "devices": result.task_devices.get(uid, []) if node is not None else [],
        }
    jobs: dict[str, dict[str, Any]] = {}
    for uid, outcome in result.jobs.items():
        jobs[uid] = {
            "phase": str(outcome.phase),
            "conditions": [
                {"type": c.type, "reason": c.reason, "message": c.message}
                for c in outcome.conditions
            ],
        }
        if outcome.estimate is not None:  # the reserve action: seconds from the scenario's now
            est = outcome.estimate
            jobs[uid]["estimate"] = {
                "start": None if est.start is None else est.start - (scenario.snapshot.now or 0.0),
                "nodes": list(est.nodes),
                "reserved": est.reserved,
                "note": est.note,
            }
        if outcome.schedule_state:  # TYJobs
            jobs[uid]["scheduleState"] = outcome.schedule_state
            jobs[uid]["stage"] = outcome.stage
    return {
        "binds": binds,
        "pipelined": dict(result.pipelined),
        "evictions": evictions,
        "moved": moved,
        "tasks": tasks,
        "jobs": jobs,
    }


def simulate_text(text: str, cycles: int | None = None) -> dict[str, Any]:
    """Run a scenario (YAML or JSON text); returns the output object of docs/simulate.md."""
    if cycles is not None and cycles < 0:
        raise ScenarioError([f"cycles: {cycles} must not be negative"])
    return run_scenario(parse_scenario_text(text), cycles or None)
