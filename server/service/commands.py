"""What users ask of the server that changes state: submit and cancel jobs, create, update and
delete queues.

Each function validates the whole request first (``DomainError`` naming the field), then changes
the ``ClusterState`` and calls ``state.on_change()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from muster.jsonmap import short_enum_name
from muster.v1 import muster_pb2 as pb
from server.model import TaskStatus
from server.service import convert, validate
from server.service.errors import DomainError, already_exists, invalid, not_found, precondition
from server.service.lifecycle import ended_summary
from server.service.records import JobRecord, JobStatusRecord
from server.service.state import PLACED, ClusterState
from server.service.tables import new_job_record
from server.service.views import job_proto

log = structlog.get_logger("muster.commands")


MAX_JOBS_PER_BATCH = 10_000
UNASSIGNED = -1  # a prepared job's creation index until it is created


def submit_job(state: ClusterState, spec: pb.JobSpec, owner: str = "") -> tuple[pb.Job, bool]:
    """Returns the job and whether it was created (False: the same spec was submitted before).
    ``owner`` (who submits it) replaces whatever the spec says."""
    prepared = prepare_job(spec, owner)
    rec, existing = _check_job(state, prepared)
    if existing is not None:
        return job_proto(existing), False
    _create_job(state, rec)
    state.on_change()
    return job_proto(rec), True


def submit_jobs(
    state: ClusterState, specs: Sequence[pb.JobSpec], owner: str = ""
) -> list[tuple[pb.Job, bool]]:
    """All or nothing: every job is checked before any is created; the first refusal refuses the
    batch, its message prefixed with the job's place (``jobs[2].job.queue: ...``)."""
    return commit_jobs(state, prepare_jobs(specs, owner))


# A batch's jobs validated and built, before the state is consulted: each a record (its creation
# index not yet given) or the refusal its validation met. The work that needs no state (most of
# it), so the server can do it away from its event loop.
PreparedJobs = list[JobRecord | DomainError]


def prepare_job(spec: pb.JobSpec, owner: str) -> JobRecord:
    """The job's record from its normalized spec; DomainError when the spec is invalid. Reads no
    state (safe in a worker thread)."""
    valid = validate.normalize_job(spec)
    valid.spec.owner = owner
    status = JobStatusRecord(phase=pb.JOB_PHASE_PENDING)
    rec = new_job_record(valid.spec, UNASSIGNED, status, template=False)
    # The core's view from the quantities validation parsed: none is parsed twice.
    rec.adopt_template(convert.valid_job_to_model(valid, UNASSIGNED))
    return rec


def prepare_jobs(specs: Sequence[pb.JobSpec], owner: str = "") -> PreparedJobs:
    """``prepare_job`` for each job of a batch, stopping at the first invalid one (no later job can
    change the batch's answer). Reads no state."""
    if len(specs) > MAX_JOBS_PER_BATCH:
        raise invalid(f"jobs: {len(specs)} jobs exceed the limit of {MAX_JOBS_PER_BATCH} per batch")
    jobs: list[JobRecord | DomainError] = []
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


def commit_jobs(state: ClusterState, prepared: PreparedJobs) -> list[tuple[pb.Job, bool]]:
    """Check a prepared batch against the state, in order (the first refusal, from validation or
    from the state, refuses the batch), then create every new job. On the event loop: nothing can
    change the state between the checks and the creation."""
    checked: list[tuple[JobRecord, JobRecord | None]] = []
    seen: dict[str, int] = {}
    for i, rec in enumerate(prepared):
        try:
            if isinstance(rec, DomainError):
                raise rec
            try:
                fresh, existing = _check_job(state, rec)
            except DomainError as exc:
                raise DomainError(exc.code, exc.message + _naming(rec.id)) from None
        except DomainError as exc:
            raise DomainError(exc.code, f"jobs[{i}].{exc.message}") from None
        if fresh.id in seen:
            raise invalid(
                f"jobs[{i}].job.id: job {fresh.id!r} is also jobs[{seen[fresh.id]}] of this batch"
            )
        seen[fresh.id] = i
        checked.append((fresh, existing))
    out: list[tuple[pb.Job, bool]] = []
    for rec, existing in checked:
        if existing is not None:
            out.append((job_proto(existing), False))
        else:
            _create_job(state, rec)
            out.append((job_proto(rec), True))
    if any(created for _, created in out):
        state.on_change()
    return out


def _check_job(state: ClusterState, rec: JobRecord) -> tuple[JobRecord, JobRecord | None]:
    """The prepared record and the identical job already submitted (None: a new job); DomainError
    when the job may not be submitted. Changes nothing."""
    normalized = rec.spec
    existing = state.jobs.get(normalized.id)
    if existing is not None:
        if existing.spec_bytes == rec.spec_bytes:
            return rec, existing
        raise already_exists(f"job.id: job {normalized.id!r} already exists with a different spec")
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
    log.info("job.cancelled", job=job_id)
    state.on_change()
    return job_proto(rec)


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
    jobs = [r.id for r in state.jobs.values() if r.spec.queue == name and r.active]
    if jobs:
        raise precondition(
            f"name: queue {name!r} still has {len(jobs)} active jobs (e.g. {jobs[0]!r})"
        )
    state.remove_queue(name)
    state.on_change()
