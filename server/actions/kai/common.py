"""Placing one job the KAI way, shared by allocate and the victim search (consolidation, reclaim,
preempt): the job's tasks for this attempt (its missing gang members, or one more task of an elastic
job) must all be placed, each on the best-scoring node it fits -- on free resources, or pipelined onto
resources being released (always pipelined when the caller only simulates) -- within its queues'
limits; a fractional GPU task takes the shared GPU ``gpu_order`` ranks first, or a whole free GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from server.session.info import JobInfo, TaskInfo
from server.session.kai import (
    all_rows,
    fraction_rows,
    new_group_name,
    tasks_to_allocate,
)
from server.session.session import Session
from server.session.statement import Statement


def allocate_job(
    ssn: Session,
    stmt: Statement,
    job: JobInfo,
    tasks: list[TaskInfo] | None = None,
    pipeline_only: bool = False,
    within: np.ndarray | None = None,
) -> bool:
    """Place ``tasks`` (default: the job's tasks for this attempt) or none: False leaves the
    statement's new operations for the caller to discard. ``within``: a mask of the nodes the
    tasks may go to (a victim search's feasible nodes); None: every node."""
    if tasks is None:
        tasks = tasks_to_allocate(job, ssn.task_order_fn, real=not pipeline_only)
    verdict = ssn.job_over_capacity(job, tasks)
    if not verdict.ok:
        if not pipeline_only:
            ssn.outcomes.queue_refused(job, verdict)
            ssn.outcomes.set_condition(job, "Unschedulable", "OverLimit", verdict.reason)
        return False
    node_sets = ssn.node_sets(job, tasks) if tasks else None
    if node_sets is None:
        return _place_all(ssn, stmt, job, tasks, pipeline_only, within)
    for nodes in node_sets:  # topology domains, best first: the first that holds every task
        if within is not None:
            nodes = nodes & within
        mark = stmt.checkpoint()
        if _place_all(ssn, stmt, job, tasks, pipeline_only, nodes):
            return True
        stmt.rollback(mark)
    if not node_sets and not pipeline_only:
        job.job_fit_error = job.job_fit_error or f"no topology domain can hold job {job.uid}"
        ssn.outcomes.set_condition(job, "Unschedulable", "TopologyNotSatisfied", job.job_fit_error)
    return False


def _place_all(
    ssn: Session,
    stmt: Statement,
    job: JobInfo,
    tasks: list[TaskInfo],
    pipeline_only: bool,
    nodes: np.ndarray | None,
) -> bool:
    for placed, task in enumerate(tasks):
        if not allocate_task(ssn, stmt, task, pipeline_only, nodes):
            if not pipeline_only:
                _record_failure(ssn, job, task, placed)
            return False
    return True


def allocate_task(
    ssn: Session,
    stmt: Statement,
    task: TaskInfo,
    pipeline_only: bool,
    nodes: np.ndarray | None = None,
) -> bool:
    rows = ordered_rows(ssn, task, nodes)
    if rows is None:
        return False
    for row, fits_now in rows:
        node = ssn.nodes.names[row]
        if task.gpu_fraction:
            group, on_idle = choose_group(ssn, task, row, pipeline_only or not fits_now)
            if group is None:
                continue
            if on_idle:
                stmt.allocate(task, node, [group])
            else:
                stmt.pipeline(task, node, [group])
            return True
        if fits_now and not pipeline_only:
            stmt.allocate(task, node)
        else:
            stmt.pipeline(task, node)
        return True
    return False


def ordered_rows(
    ssn: Session, task: TaskInfo, nodes: np.ndarray | None = None
) -> Iterator[tuple[int, bool]] | None:
    """The nodes (of ``nodes``, a mask, when given) the task fits (predicates, and resources once
    releasing tasks are gone), best score first (ties: by node name), each with whether it fits
    free resources now. Lazy: the best node usually takes the task, so the rest is sorted only when
    asked for."""
    n = len(ssn.nodes)
    if not n:
        return None
    future_ok, idle_ok = ssn.evaluator.feasible(task, nodes)
    if task.gpu_fraction:
        future_ok, idle_ok = future_ok.copy(), idle_ok.copy()
        rows = np.nonzero(future_ok)[0]
        f_future, f_now = fraction_rows(ssn.nodes, rows, task.gpu_fraction)
        future_ok[rows] = f_future
        idle_ok[rows] &= f_now
    if not future_ok.any():
        return iter(())
    # Scores over every node of the set: binpacking is relative to all of them, fitting or not.
    scores = ssn.evaluator.scores(task, all_rows(n) if nodes is None else np.nonzero(nodes)[0])
    if nodes is not None:
        full = np.full(n, -np.inf)
        full[nodes] = scores
        scores = full
    best = int(scores.argmax())
    if not future_ok[best]:
        # The best node overall is not one the task fits: the first best of those it fits. (When
        # it is one, it is also the first best of them: masking the others is not needed.)
        best = int(np.where(future_ok, scores, -np.inf).argmax())
    return _walk(best, scores, future_ok, idle_ok)


def _walk(
    best: int, scores: np.ndarray, future_ok: np.ndarray, idle_ok: np.ndarray
) -> Iterator[tuple[int, bool]]:
    """``best``, then the other rows the task fits by score, best first (ties: by row)."""
    yield best, bool(idle_ok[best])
    # A stable sort orders the rows it fits among themselves by their own scores and rows alone:
    # the scores of the others need no masking.
    for i in np.argsort(-scores, kind="stable"):
        if i != best and future_ok[i]:
            yield int(i), bool(idle_ok[i])


def choose_group(ssn: Session, task: TaskInfo, row: int, pipeline: bool) -> tuple[str | None, bool]:
    """The shared GPU for a fractional task on ``row``: the group ``gpu_order`` scores highest
    among those it fits (now, or once releasing tasks are gone), or a whole free GPU as a new
    group. Returns (group, placed on free resources now)."""
    nodes = ssn.nodes
    f = task.gpu_fraction
    candidates: list[tuple[float, int, str, bool]] = []
    for k, group in enumerate(sorted(nodes.shared[row])):
        now, future = nodes.group_fractions(row, group)
        if future >= f - 1e-9:
            candidates.append((ssn.gpu_order(task, row, group), k, group, now >= f - 1e-9))
    whole_now, whole_future = nodes.whole_gpus(row)
    if whole_future >= 1 - 1e-9:
        candidates.append(
            (ssn.gpu_order(task, row, ""), len(candidates) + 10**6, "", whole_now >= 1 - 1e-9)
        )
    if not candidates:
        return None, False
    candidates.sort(key=lambda c: (-c[0], c[1]))
    _, _, group, now = candidates[0]
    now = now and not pipeline
    if not group:  # a pipelined share takes a GPU being released first, as whole GPUs do
        group = new_group_name(ssn.nodes, row, releasing=not now)
    return group, now


def _record_failure(ssn: Session, job: JobInfo, task: TaskInfo, placed: int) -> None:
    fe = ssn.evaluator.fit_errors(task)
    job.fit_errors[task.uid] = fe
    detail = fe.describe()
    if job.min_available > 1 and placed < job.min_available:
        message = (
            f"Resources were found for {placed} pods while {job.min_available} are required for gang "
            f"scheduling. Additional pods cannot be scheduled due to: {detail}"
        )
    else:
        message = f"Resources were not found for pod {task.namespace}/{task.name} due to: {detail}"
    job.job_fit_error = message
    ssn.outcomes.set_condition(job, "Unschedulable", "NotEnoughResources", message)
