"""What users ask of the server that changes state: submit and cancel jobs, create, update and
delete queues.

Each function validates the whole request first (``DomainError`` naming the field), then changes
the ``ClusterState`` and calls ``state.on_change()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import structlog

from muster.jobcontrol import element_id, parse_array
from muster.jsonmap import short_enum_name
from muster.timelimit import format_time_limit
from muster.v1 import muster_pb2 as pb
from server.model import TaskStatus
from server.service import control, convert, validate
from server.service.errors import DomainError, already_exists, invalid, not_found, precondition
from server.service.lifecycle import ended_summary
from server.service.records import JobRecord, JobStatusRecord
from server.service.state import PLACED, ClusterState
from server.service.tables import new_job_record
from server.service.views import job_proto

log = structlog.get_logger("muster.commands")


MAX_JOBS_PER_BATCH = 10_000
UNASSIGNED = -1  # a prepared job's creation index until it is created


class Submitted(NamedTuple):
    """What a submission did: the job (an array's first element), whether it was created (False:
    the same spec was submitted before) and, for an array, its elements' ids."""

    job: pb.Job
    created: bool
    element_ids: list[str]


def submit_job(state: ClusterState, spec: pb.JobSpec, owner: str = "") -> tuple[pb.Job, bool]:
    """Returns the job and whether it was created (False: the same spec was submitted before).
    ``owner`` (who submits it) replaces whatever the spec says."""
    done = submit(state, spec, owner)
    return done.job, done.created


def submit(state: ClusterState, spec: pb.JobSpec, owner: str = "") -> Submitted:
    """``submit_job``, an array's elements' ids too (``SubmitJobResponse.element_ids``)."""
    return commit_jobs(state, [prepare_job(spec, owner)], batch=False)[0]


def submit_jobs(
    state: ClusterState, specs: Sequence[pb.JobSpec], owner: str = ""
) -> list[tuple[pb.Job, bool]]:
    """All or nothing: every job is checked before any is created; the first refusal refuses the
    batch, its message prefixed with the job's place (``jobs[2].job.queue: ...``)."""
    return [(s.job, s.created) for s in commit_jobs(state, prepare_jobs(specs, owner))]


@dataclass(slots=True)
class ArrayJob:
    """An array (``JobSpec.array``) prepared: one record per index, created together."""

    id: str
    elements: list[JobRecord]


# A batch's jobs validated and built, before the state is consulted: each a record (its creation
# index not yet given), an array's records, or the refusal its validation met. The work that needs
# no state (most of it), so the server can do it away from its event loop.
PreparedJobs = list[JobRecord | ArrayJob | DomainError]


def prepare_job(spec: pb.JobSpec, owner: str) -> JobRecord | ArrayJob:
    """The job's record from its normalized spec (an array: its elements' records, Slurm's
    ``<id>_<index>``); DomainError when the spec is invalid. Reads no state (safe in a worker
    thread)."""
    valid = validate.normalize_job(spec)
    valid.spec.owner = owner
    if not valid.spec.array:
        return _prepared_record(valid)
    elements = []
    for index in parse_array(valid.spec.array).indexes:
        element = pb.JobSpec()
        element.CopyFrom(valid.spec)
        element.id = element_id(valid.spec.id, index)
        element.array_job_id = valid.spec.id
        element.array_index = index
        elements.append(_prepared_record(replace(valid, spec=element)))
    return ArrayJob(valid.spec.id, elements)


def _prepared_record(valid: validate.ValidJob) -> JobRecord:
    status = JobStatusRecord(phase=pb.JOB_PHASE_PENDING)
    if valid.spec.hold:  # submitted held: a hold of its owner's
        status.hold, status.held_by = control.USER_HOLD, valid.spec.owner
    rec = new_job_record(valid.spec, UNASSIGNED, status, template=False)
    # The core's view from the quantities validation parsed: none is parsed twice.
    rec.adopt_template(convert.valid_job_to_model(valid, UNASSIGNED))
    return rec


def prepare_jobs(specs: Sequence[pb.JobSpec], owner: str = "") -> PreparedJobs:
    """``prepare_job`` for each job of a batch, stopping at the first invalid one (no later job can
    change the batch's answer). Reads no state."""
    if len(specs) > MAX_JOBS_PER_BATCH:
        raise invalid(f"jobs: {len(specs)} jobs exceed the limit of {MAX_JOBS_PER_BATCH} per batch")
    jobs: PreparedJobs = []
    for spec in specs:
        try:
            jobs.append(prepare_job(spec, owner))
        except DomainError as exc:
            jobs.append(DomainError(exc.code, exc.message + _naming(spec.id)))
            break
    return jobs


def _naming(job_id: str) -> str:
    """The suffix that names the refused job of a batch: ``jobs[3]`` alone says little to whoever
    submitted several files."""
    return f" (job {job_id!r})" if job_id else ""


def commit_jobs(
    state: ClusterState, prepared: PreparedJobs, *, batch: bool = True
) -> list[Submitted]:
    """Check a prepared batch against the state, in order (the first refusal, from validation or
    from the state, refuses the batch), then create every new job. On the event loop: nothing can
    change the state between the checks and the creation. ``batch`` False: one SubmitJob (its
    refusal names the field only)."""
    # Per entry: (record, identical job already submitted) for each job (an array: each element).
    checked: list[list[tuple[JobRecord, JobRecord | None]]] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(prepared):
        try:
            if isinstance(item, DomainError):
                raise item
            try:
                entry = _check_entry(state, item, seen)
            except DomainError as exc:
                if not batch:
                    raise
                raise DomainError(exc.code, exc.message + _naming(item.id)) from None
        except DomainError as exc:
            if not batch:
                raise
            raise DomainError(exc.code, f"jobs[{i}].{exc.message}") from None
        names = [item.id] if isinstance(item, JobRecord) else [item.id, *(r.id for r, _ in entry)]
        for name in names:
            if name in seen:
                raise invalid(
                    f"jobs[{i}].job.id: job {name!r} is also jobs[{seen[name]}] of this batch"
                )
            seen[name] = i
        checked.append(entry)
    out: list[Submitted] = []
    for item, entry in zip(prepared, checked, strict=True):
        created = False
        for rec, existing in entry:
            if existing is None:
                _create_job(state, rec)
                created = True
        first, existing = entry[0]
        job = job_proto(first if existing is None else existing)
        ids = [rec.id for rec, _ in entry] if isinstance(item, ArrayJob) else []
        out.append(Submitted(job, created, ids))
    if any(s.created for s in out):
        state.on_change()
    return out


def _check_entry(
    state: ClusterState, item: JobRecord | ArrayJob, batch: Mapping[str, int]
) -> list[tuple[JobRecord, JobRecord | None]]:
    """``_check_job`` of a job, or of each element of an array (whose id must not be a job's)."""
    if isinstance(item, JobRecord):
        if item.id in state.arrays:
            raise already_exists(f"job.id: {item.id!r} is the id of a job array")
        return [_check_job(state, item, batch)]
    if state.jobs.get(item.id) is not None:
        raise already_exists(
            f"job.id: job {item.id!r} exists; an array's id names its elements, so it must "
            "not be a job's"
        )
    return [_check_job(state, rec, batch) for rec in item.elements]


def _check_job(
    state: ClusterState, rec: JobRecord, batch: Mapping[str, int] | None = None
) -> tuple[JobRecord, JobRecord | None]:
    """The prepared record and the identical job already submitted (None: a new job); DomainError
    when the job may not be submitted. ``batch``: the ids (jobs and arrays) submitted before it in
    its batch, which its dependencies may name. Changes nothing."""
    normalized = rec.spec
    _queue_time_limit(state, rec)
    existing = state.jobs.get(normalized.id)
    if existing is not None:
        if existing.spec_bytes == rec.spec_bytes:
            return rec, existing
        raise already_exists(f"job.id: job {normalized.id!r} already exists with a different spec")
    for k, dep in enumerate(normalized.depends_on):
        if dep.job not in (batch or {}) and not control.known(state, dep.job):
            raise not_found(
                f"job.depends_on[{k}].job: job {dep.job!r} does not exist (a dependency names a "
                "job or an array submitted before)"
            )
    queue = state.queues.get(normalized.queue)
    if queue is None:
        raise not_found(f"job.queue: queue {normalized.queue!r} does not exist")
    children = sorted(
        name for name, q in state.queues.items() if q.proto.parent == normalized.queue
    )
    if children:
        raise precondition(
            f"job.queue: queue {normalized.queue!r} is not a leaf (it has child queues "
            f"{', '.join(children[:5])}); jobs go into leaf queues"
        )
    if queue.proto.state in (pb.QUEUE_STATE_CLOSED, pb.QUEUE_STATE_CLOSING):
        raise precondition(
            f"job.queue: queue {normalized.queue!r} is "
            f"{short_enum_name(pb.QueueState.DESCRIPTOR, queue.proto.state)}"
        )
    most = queue.proto.max_time_limit_seconds
    if most and normalized.time_limit_seconds > most:
        limit = normalized.time_limit_seconds
        raise invalid(
            f"job.time_limit_seconds: {limit} ({format_time_limit(limit)}) is more than the "
            f"maximum time limit of queue {normalized.queue!r}, {most} ({format_time_limit(most)})"
        )
    # The k8s adapter resolves PriorityClasses itself (it sends the value); a class named through
    # the API must be one the configuration declares, not silently priority 0.
    if normalized.priority_class and normalized.priority_class not in state.priority_classes:
        known = ", ".join(sorted(state.priority_classes)) or "none"
        raise invalid(
            f"job.priority_class: {normalized.priority_class!r} is not a configured priority class"
            f" (configured: {known}; the scheduler configuration declares them under"
            " priorityClasses, docs/config.md)"
        )
    return rec, None


def _queue_time_limit(state: ClusterState, rec: JobRecord) -> None:
    """A job without a time limit takes its queue's default, else its queue's maximum (Slurm's
    partition DefaultTime, then MaxTime), written into its spec -- and the bytes that identify it --
    before it is compared with a job already submitted."""
    queue = state.queues.get(rec.spec.queue)
    if queue is None or rec.spec.time_limit_seconds:
        return
    default = queue.proto.default_time_limit_seconds or queue.proto.max_time_limit_seconds
    if default:
        rec.spec.time_limit_seconds = default
        rec.spec_bytes = rec.spec.SerializeToString(deterministic=True)


def _create_job(state: ClusterState, rec: JobRecord) -> None:
    """A prepared job enters the state: its creation index (the order among submissions) and
    submit time are given now."""
    rec.set_creation_index(state.next_creation_index)
    rec.status.submit_time = state.clock()
    state.next_creation_index += 1
    state.set_meta("next_creation_index", str(state.next_creation_index))
    state.index_job(rec)
    state.changes.jobs.add(rec.id)
    state.changes.tasks.update(t.uid for t in rec.tasks)
    state.changes.events[rec.id] = pb.JobEvent.TYPE_ADDED
    control.submitted(state, rec)
    log.info(
        "job.submitted",
        job=rec.id,
        queue=rec.spec.queue,
        tasks=len(rec.tasks),
        min_member=rec.min_member,
    )


def cancel_job(state: ClusterState, job_id: str) -> pb.Job:
    rec = state.job_or_error(job_id)
    if rec.status.cancelled:
        return job_proto(rec)
    if not rec.active:
        raise precondition(
            f"id: job {job_id!r} already ended "
            f"({short_enum_name(pb.JobPhase.DESCRIPTOR, rec.status.phase)})"
        )
    _cancel(state, rec)
    state.on_change()
    return job_proto(rec)


def cancel(state: ClusterState, job_id: str) -> tuple[pb.Job, list[str]]:
    """CancelJob: ``cancel_job``, or for an array's id every element not ended yet (their ids;
    the job answered is the first of them, without its tasks)."""
    recs, is_array = control.jobs_named(state, job_id)
    if not is_array:
        return cancel_job(state, job_id), []
    active = [r for r in recs if r.active]
    if not active:
        cancelled = [r for r in recs if r.status.cancelled]
        if cancelled:  # a retry of a cancel already done: answered as for one job
            return job_proto(cancelled[0], with_tasks=False), [r.id for r in cancelled]
        raise precondition(f"id: every element of array {job_id!r} already ended")
    for rec in active:
        _cancel(state, rec)
    state.on_change()
    return job_proto(active[0], with_tasks=False), [r.id for r in active]


def _cancel(state: ClusterState, rec: JobRecord) -> None:
    rec.status.cancelled = True
    rec.status.phase = pb.JOB_PHASE_CANCELLED
    rec.status.finish_time = state.clock()
    for t in rec.tasks:
        if t.status in PLACED:
            state.evict(t, "cancel", 0)
        elif t.status == TaskStatus.PENDING:
            t.status = TaskStatus.CANCELLED
            t.message = "cancelled before it was placed"
            state.changes.tasks.add(t.uid)
    state.set_ended(rec, ended_summary(rec, pb.JOB_PHASE_CANCELLED))
    state.changes.jobs.add(rec.id)
    state.changes.events[rec.id] = pb.JobEvent.TYPE_MODIFIED
    log.info("job.cancelled", job=rec.id)


def _check_parent(state: ClusterState, q: pb.Queue) -> None:
    if q.name == "root":
        return
    if q.parent not in state.queues:
        raise not_found(f"queue.parent: queue {q.parent!r} does not exist")
    seen, cur = {q.name}, q.parent
    while cur:
        if cur in seen:
            raise invalid(f"queue.parent: {q.parent!r} would make a cycle in the queue tree")
        seen.add(cur)
        cur = state.queues[cur].proto.parent if cur in state.queues else ""


def create_queue(state: ClusterState, queue: pb.Queue) -> pb.Queue:
    valid = validate.normalize_queue(queue)
    q = valid.spec
    if q.name in state.queues:
        raise already_exists(f"queue.name: queue {q.name!r} already exists")
    _check_parent(state, q)
    state.put_queue(valid)
    state.on_change()
    return q


def update_queue(state: ClusterState, queue: pb.Queue) -> pb.Queue:
    valid = validate.normalize_queue(queue)
    q = valid.spec
    if q.name not in state.queues:
        raise not_found(f"queue.name: queue {q.name!r} does not exist")
    _check_parent(state, q)
    state.put_queue(valid)
    state.on_change()
    return q


def delete_queue(state: ClusterState, name: str) -> None:
    if not name:
        raise invalid("name: must not be empty")
    if name not in state.queues:
        raise not_found(f"name: queue {name!r} does not exist")
    if name in ("root", "default"):
        raise precondition(f"name: queue {name!r} is built in and cannot be deleted")
    children = sorted(n for n, e in state.queues.items() if e.proto.parent == name)
    if children:
        raise precondition(
            f"name: queue {name!r} still has child queues: {', '.join(children[:5])}"
        )
    jobs = [r.id for r in state.jobs.values() if r.active and r.queue == name]
    if jobs:
        raise precondition(
            f"name: queue {name!r} still has {len(jobs)} active jobs (e.g. {jobs[0]!r})"
        )
    state.remove_queue(name)
    state.on_change()
