"""Applying a cycle's result to the state: binds, evictions and each job's outcome.

The result was computed on a ``Capture`` while the world went on; whatever changed since is
dropped here (job cancelled or replaced, node gone or cordoned, task no longer pending, victim
moved). Binds are all or nothing per job: a partial gang would hold resources uselessly.
``apply_result`` applies a large result in chunks, by job, yielding to the event loop in between
so big cycles never stall the API.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import anyio

from muster.conditions import SCHEDULED, UNSATISFIABLE, UNSCHEDULABLE
from server import model
from server.model import OCCUPYING, CycleResult, PodGroupPhase, TaskStatus
from server.service.records import JobRecord, JobStatusRecord, TaskRecord
from server.service.snapshot import Capture
from server.service.state import PLACED, ClusterState

# Decisions applied per event-loop turn. Each job's part of a result is applied whole (the gang
# checks are per job), so splitting by job keeps apply's all-or-nothing guarantees.
APPLY_CHUNK = 250


@dataclass
class ApplyStats:
    binds: int = 0
    evictions: int = 0
    dropped_binds: int = 0
    dropped_evictions: int = 0

    def add(self, other: ApplyStats) -> None:
        self.binds += other.binds
        self.evictions += other.evictions
        self.dropped_binds += other.dropped_binds
        self.dropped_evictions += other.dropped_evictions


async def apply_result(
    state: ClusterState,
    capture: Capture,
    result: CycleResult,
    chunk: int = APPLY_CHUNK,
    after_part: Callable[[], Awaitable[None]] | None = None,
) -> ApplyStats:
    """``apply`` in parts of about ``chunk`` items (whole jobs), letting RPCs in between parts.
    ``after_part`` (the loop's store flush) runs after each part, so committing the changes (rows,
    watch events) is spread over the parts too rather than paid at once after the last."""
    stats = ApplyStats()
    # The jobs past each queue's window get no outcome: explain says why from this.
    state.last_window = (capture.cycle_id, dict(result.beyond_window))
    for part in split_result(result, state.job_of_task, chunk):
        stats.add(apply(state, capture, part))
        if after_part is not None:
            await after_part()
        await anyio.sleep(0)
    return stats


def split_result(
    result: CycleResult, job_of_task: Callable[[str], str], max_items: int
) -> Iterator[CycleResult]:
    """Split a CycleResult into parts of about ``max_items`` binds/evictions/outcomes, by job."""
    by_job: dict[str, CycleResult] = {}

    def part(job_id: str) -> CycleResult:
        if job_id not in by_job:
            by_job[job_id] = CycleResult(result.cycle_id)
        return by_job[job_id]

    for uid, node in result.binds.items():
        p = part(job_of_task(uid))
        p.binds[uid] = node
        if uid in result.bind_devices:
            p.bind_devices[uid] = result.bind_devices[uid]
        if uid in result.bind_gpu_groups:
            p.bind_gpu_groups[uid] = result.bind_gpu_groups[uid]
    for uid, reason in result.evictions.items():
        part(job_of_task(uid)).evictions[uid] = reason
    for job_id, outcome in result.jobs.items():
        part(job_id).jobs[job_id] = outcome
    chunk = CycleResult(result.cycle_id)
    size = 0
    for p in by_job.values():
        chunk.binds.update(p.binds)
        chunk.bind_devices.update(p.bind_devices)
        chunk.bind_gpu_groups.update(p.bind_gpu_groups)
        chunk.evictions.update(p.evictions)
        chunk.jobs.update(p.jobs)
        size += len(p.binds) + len(p.evictions) + len(p.jobs)
        if size >= max_items:
            yield chunk
            chunk, size = CycleResult(result.cycle_id), 0
    if size or not by_job:
        yield chunk


def apply(state: ClusterState, capture: Capture, result: CycleResult) -> ApplyStats:
    """Apply a cycle's decisions, dropping whatever the world changed since ``capture``."""
    stats = ApplyStats()
    cycle_id = capture.cycle_id
    captured = capture.by_job
    binds_by_job: dict[str, list[tuple[TaskRecord, str]]] = {}
    for uid, node in result.binds.items():
        rec = state.tasks.get(uid)
        job = state.task_job.get(uid)
        if rec is None or job is None:
            stats.dropped_binds += 1
            continue
        binds_by_job.setdefault(job.id, []).append((rec, node))
    touched: set[str] = set()
    bound_jobs: set[str] = set()
    # Device ids held now, per node: a bind may not take one the world gave away since the capture.
    held = _held_devices(state) if result.bind_devices else {}
    for job_id, binds in binds_by_job.items():
        job = state.jobs[job_id]
        # (held since the capture: a held job is placed by no cycle, server.service.control)
        ok = captured.get(job_id, (None,))[0] is job and job.active and not job.status.hold
        for rec, node in binds if ok else ():
            entry = state.nodes.get(node)
            devices = result.bind_devices.get(rec.uid, ())
            if (
                rec.status != TaskStatus.PENDING
                or entry is None
                or entry.spec.unschedulable
                or not entry.spec.ready
                or entry.spec.backend not in state.backends
                or any(d in held.get(node, ()) for d in devices)
            ):
                ok = False
                break
        if ok:
            for rec, node in binds:
                held.setdefault(node, set()).update(result.bind_devices.get(rec.uid, ()))
        if not ok:  # all or nothing per job: a partial gang would hold resources uselessly
            stats.dropped_binds += len(binds)
            continue
        for rec, node in binds:
            # A fractional task holds no whole device: it shares one GPU (the core names one).
            groups = result.bind_gpu_groups.get(rec.uid)
            devices = list(result.bind_devices.get(rec.uid, ()))
            state.bind(job, rec, node, devices, cycle_id, groups[0] if groups else "")
            stats.binds += 1
        touched.add(job_id)
        bound_jobs.add(job_id)
    for uid, reason in result.evictions.items():
        rec = state.tasks.get(uid)
        owner = state.task_job.get(uid)
        then = captured.get(owner.id) if owner else None
        if rec is None or owner is None or then is None or then[0] is not owner:
            stats.dropped_evictions += 1
            continue
        pos = next(i for i, t in enumerate(owner.tasks) if t is rec)
        status_then, node_then, _, _ = then[1][pos]
        if rec.status not in PLACED or rec.node != node_then or status_then not in PLACED:
            stats.dropped_evictions += 1
            continue
        state.evict(rec, reason or "preempt", cycle_id)
        stats.evictions += 1
        touched.add(owner.id)
    now = state.clock()
    outcomes = dict(result.jobs)
    for job_id in bound_jobs:
        outcomes.setdefault(job_id, model.JobOutcome(PodGroupPhase.RUNNING))
    for job_id, outcome in outcomes.items():
        current = state.jobs.get(job_id)
        if (
            current is None
            or captured.get(job_id, (None,))[0] is not current
            or not current.active
            or current.status.hold  # its Held condition and explanation stand
        ):
            continue
        _record_outcome(state, current, outcome, cycle_id, now, placed=job_id in bound_jobs)
        if job_id not in touched:  # (a touched job's phase is refreshed just below)
            state.refresh_phase(current)
    for job_id in touched:
        state.after_task_change(state.jobs[job_id])
    return stats


def _held_devices(state: ClusterState) -> dict[str, set[str]]:
    held: dict[str, set[str]] = {}
    for rec in state.tasks.values():
        if (rec.devices or rec.gpu_group) and rec.node and rec.status in OCCUPYING:
            mine = held.setdefault(rec.node, set())
            mine.update(rec.devices)
            if rec.gpu_group:  # a shared GPU is taken whole by its group
                mine.add(rec.gpu_group)
    for f in state.foreign.values():
        if f.spec.devices and f.spec.node:
            held.setdefault(f.spec.node, set()).update(f.spec.devices)
    return held


def _scheduling_conditions(
    st: JobStatusRecord, outcome: model.JobOutcome, cycle_id: int, placed: bool
) -> list[model.Condition]:
    """The conditions to record from a cycle's outcome. A cycle reports only what holds; stored
    conditions are kept Kubernetes-style: one that stopped holding turns False rather than
    lingering, and Scheduled and Unschedulable are never True at once.

    * Once the job's gang is placed (bound this cycle, reported Scheduled, or ready with nothing
      holding it back): Scheduled holds, and Unschedulable turns False (reason Placed). One the
      cycle reported is about tasks beyond the gang's minimum: False too, its message kept.
    * A job reported Unschedulable whose gang is not placed: a Scheduled that held turns False
      (its gang came apart).
    * Unsatisfiable holds only while a cycle reports it."""
    reported = {c.type: c for c in outcome.conditions if c.status == "True"}
    stored = {c.type: c.status for c in st.conditions}
    held = {kind for kind, status in stored.items() if status == "True"}
    out = [c for c in outcome.conditions if c.type != UNSCHEDULABLE]
    exp = outcome.explanation
    gang_placed = placed or SCHEDULED in reported or (exp is not None and exp.gate == "none")
    waits = reported.get(UNSCHEDULABLE)
    if gang_placed:
        if placed and SCHEDULED not in reported:
            out.append(
                model.Condition(SCHEDULED, "True", "Placed", f"tasks bound in cycle {cycle_id}")
            )
        elif SCHEDULED not in reported and SCHEDULED not in held:
            out.append(model.Condition(SCHEDULED, "True", "Placed", "the gang is placed"))
        if waits is not None:  # about the tasks beyond the gang's minimum
            more = f"the gang is placed; tasks beyond its minimum wait: {waits.message}"
            out.append(model.Condition(UNSCHEDULABLE, "False", "Placed", more))
        elif UNSCHEDULABLE in held or (placed and UNSCHEDULABLE not in stored):
            out.append(model.Condition(UNSCHEDULABLE, "False", "Placed", ""))
    else:
        if waits is not None:
            out.append(waits)
        if waits is not None and SCHEDULED in held:
            out.append(model.Condition(SCHEDULED, "False", UNSCHEDULABLE, "the gang is not placed"))
    if UNSATISFIABLE in held and UNSATISFIABLE not in reported:
        out.append(model.Condition(UNSATISFIABLE, "False", "Fits", ""))
    return out


def _record_outcome(
    state: ClusterState,
    job: JobRecord,
    outcome: model.JobOutcome,
    cycle_id: int,
    now: float,
    *,
    placed: bool,
) -> None:
    """The cycle's verdict on a job: its scheduling phase, conditions and explanation."""
    st = job.status
    before = (
        st.sched_phase,
        st.schedule_state,
        [(c.type, c.status, c.reason, c.message) for c in st.conditions],
    )
    st.sched_phase = outcome.phase
    st.estimate = outcome.estimate  # memory only: not a change to store or watch
    if outcome.schedule_state:
        st.schedule_state = outcome.schedule_state
    conditions = _scheduling_conditions(st, outcome, cycle_id, placed)
    for cond in conditions:
        changed = st.put_condition(cond.type, cond.status, cond.reason, cond.message, cycle_id, now)
        if changed and cond.type == model.QUARANTINED and cond.status == "True":
            st.quarantined = True  # the cycle failed with it
    if outcome.explanation is not None:
        exp = outcome.explanation
        st.explanation = {
            "gate": exp.gate,
            "summary": exp.summary,
            "node_reasons": dict(exp.node_reasons),
            "cycle_id": cycle_id,
        }
    elif placed:
        st.explanation = {
            "gate": "none",
            "summary": "placed",
            "node_reasons": {},
            "cycle_id": cycle_id,
        }
    after = (
        st.sched_phase,
        st.schedule_state,
        [(c.type, c.status, c.reason, c.message) for c in st.conditions],
    )
    if after != before:
        state.changes.job_modified(job.id)
