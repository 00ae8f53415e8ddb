"""Finished jobs leaving the server's memory (``muster-server --job-retention``).

A job Completed, Failed or Cancelled for ``ClusterState.retention`` seconds, with nothing of it
still unwritten or on a node, is dropped from memory (with its tasks). It stays in the store, and
``jobs.get`` (a ``server.service.tables.JobTable``) reads through to the store, so lookups by id
-- GetJob, Explain, CancelJob, a resubmission of the same id -- answer as before;
``server.service.api.queries.list_jobs`` merges memory and store. Run by the
loop's expiry pass under the store writer's lock (``commit_and_drop_finished``) and by a replica
that caught up with the change feed (``drop_finished``).
"""

from __future__ import annotations

from collections.abc import Set

import structlog

from server.model import ENDED, TaskStatus
from server.service.records import JobRecord
from server.service.state import ClusterState
from server.service.store import WriteBatch

# Logs as the state's, as it did when this was a ClusterState method.
log = structlog.get_logger("muster.state")


def commit_and_drop_finished(state: ClusterState) -> WriteBatch:
    """``state.commit()``, then ``drop_finished`` for the jobs this batch does not touch.

    For ``StoreWriter.flush``: it drains under the writer's lock, when every earlier batch has
    been written, so a job dropped here has its final rows in the store; the jobs in this very
    batch wait for the next call (their rows are not written yet)."""
    batch = state.commit()
    pending = set(batch.jobs)
    for uid in batch.tasks:
        job = state.task_job.get(uid)
        if job is not None:
            pending.add(job.id)
    drop_finished(state, keep=pending)
    return batch


def drop_finished(
    state: ClusterState, now: float | None = None, keep: Set[str] = frozenset()
) -> list[str]:
    """Remove from memory (not from the store) the jobs finished ``state.retention`` seconds ago
    or more whose tasks hold no node and have no decision pending, and that have no change still
    to commit (nor are in ``keep``). Returns their ids."""
    if state.archive is None:
        return []  # without a store to answer from, forgetting a job would lose it
    now = state.clock() if now is None else now
    cutoff = now - state.retention
    leaving: list[JobRecord] = []
    busy: set[str] | None = None  # tasks with a decision pending; computed once, if needed
    for job_id in state.finished:
        rec = dict.get(state.jobs, job_id)  # memory only
        if rec is None:
            continue
        if rec.status.finish_time > cutoff:
            break  # the rest finished later
        if busy is None:
            busy = {p.row.task_id for p in state.decisions.pending.values()}
        if job_id in keep or not _droppable(state, rec, busy):
            continue  # an unacknowledged eviction or an unwritten change: a later call
        leaving.append(rec)
    dropped: list[str] = []
    for rec in leaving:
        del state.finished[rec.id]
        del state.jobs[rec.id]
        forget_array_element(state, rec)
        for t in rec.built_tasks():  # (a job's tasks are indexed once built)
            state.tasks.pop(t.uid, None)
            state.task_job.pop(t.uid, None)
        dropped.append(rec.id)
    if dropped:
        log.debug("jobs.left_memory", count=len(dropped), retention=state.retention)
    return dropped


def _droppable(state: ClusterState, rec: JobRecord, busy: Set[str]) -> bool:
    changes = state.changes
    if rec.id in changes.jobs or rec.id in changes.events:
        return False
    for t in rec.built_tasks():  # (tasks not built are Pending as submitted)
        if (
            t.uid in changes.tasks
            or t.uid in busy
            or (t.status not in ENDED and t.status != TaskStatus.PENDING)
        ):
            return False
    return True


def forget_array_element(state: ClusterState, rec: JobRecord) -> None:
    """``rec`` left memory: its array's index no longer lists it."""
    array = rec.spec.array_job_id
    elements = state.arrays.get(array) if array else None
    if elements is not None:
        elements.pop(rec.id, None)
        if not elements:
            del state.arrays[array]
