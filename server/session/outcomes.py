"""Job outcomes: what a cycle found about each job, and its report (Volcano's
``framework/job_updater.go``).

While the actions run, the session, the actions and the plugins hand ``Outcomes`` what says why a
job waits: the enqueue vote's answer, a refusal of the job's queues (``allocatable``,
``job_over_capacity``), fit errors found only to explain, and the conditions (Unschedulable,
Scheduled ...) they set. ``report`` turns them, with the session's final state, into the cycle's job
outcomes: the phase, the conditions, and the explanation ``muster explain`` shows (``explain``).

A job that can never run as the cluster and its queues stand (a task no node could hold even
empty, a node selector no node matches, more than its queue's capability at once: the
``job_satisfiable`` verdict) is Unsatisfiable: its own condition, with a reason code naming the
cause, beside Unschedulable. It is found again every cycle (a new node or a queue update ends it).
A cycle reports only the conditions that hold; the server turns those that stopped holding False
(``server.service.apply``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from muster.quantity import MIN_RESOURCE, from_canonical
from server.model import (
    ALLOCATED,
    Condition,
    CycleResult,
    Explanation,
    JobOutcome,
    PodGroupPhase,
    TaskStatus,
)
from server.session.extension_points import ALLOWED, Verdict
from server.session.info import FitErrors, JobInfo, TaskInfo, job_phase_after, rows_fit

if TYPE_CHECKING:  # the session holds the outcomes and is handed to the report: annotation only
    from server.session.session import Session


@dataclass(slots=True)
class JobFindings:
    """What this cycle found about one job."""

    # The job's conditions, type -> (reason, message), in the order last set.
    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)
    enqueue: Verdict = ALLOWED  # the enqueue vote's last answer
    queue: Verdict = ALLOWED  # the last refusal of the job's queues
    # Per task: why it fits no node, found only to explain (the queue stopped it first).
    fit_errors: dict[str, FitErrors] = field(default_factory=dict)
    # Why it can never run as things stand, found explaining it: the Unsatisfiable reason code.
    unsatisfiable: str = ""


_NONE_FOUND = JobFindings()  # what reading a job nothing was found about gives (never written)

# The condition of a job that can never run as things stand, and its reason codes: the cause.
UNSATISFIABLE = "Unsatisfiable"
EXCEEDS_QUEUE = "ExceedsQueueCapability"  # more at once than a queue limit lets it hold
NO_MATCHING_NODE = "NoMatchingNode"  # no node passes its selector, affinity and tolerations
EXCEEDS_EVERY_NODE = "RequestExceedsEveryNode"  # no node it may use is big enough, even empty


class Outcomes:
    """The findings of one cycle, per job. Plain data: it holds no session, so it forms no
    reference cycle with the one that holds it."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobFindings] = {}
        self.ever_fits: dict[Any, bool] = {}  # shape key -> can_ever_fit

    def found(self, job: JobInfo) -> JobFindings:
        """What was found about ``job`` (read only)."""
        return self._jobs.get(job.uid, _NONE_FOUND)

    def _of(self, job: JobInfo) -> JobFindings:
        found = self._jobs.get(job.uid)
        if found is None:
            found = self._jobs[job.uid] = JobFindings()
        return found

    def set_condition(self, job: JobInfo, type_: str, reason: str, message: str) -> None:
        """The job's condition of ``type_`` (one per type: the last set wins, and goes last)."""
        conditions = self._of(job).conditions
        conditions.pop(type_, None)
        conditions[type_] = (reason, message)

    def enqueue_answered(self, job: JobInfo, verdict: Verdict) -> None:
        if not verdict or job.uid in self._jobs:  # an admission leaves no finding to make
            self._of(job).enqueue = verdict

    def queue_refused(self, job: JobInfo, verdict: Verdict) -> None:
        self._of(job).queue = verdict

    def fit_errors_found(
        self, job: JobInfo, task: TaskInfo, errors: FitErrors, keep_first: bool = False
    ) -> None:
        """Why ``task`` fits no node, found only to explain the job (``keep_first``: unless found
        already)."""
        found = self._of(job).fit_errors
        if keep_first:
            found.setdefault(task.uid, errors)
        else:
            found[task.uid] = errors

    def unsatisfiable_found(self, job: JobInfo, reason: str) -> None:
        """``job`` can never run as the cluster and its queues stand (``reason``: the cause's code)."""
        self._of(job).unsatisfiable = reason

    def fit_error(self, job: JobInfo) -> str:
        """Volcano's ``JobInfo.FitError`` of ``job``, with the fit errors found only to explain."""
        return job.fit_error(self.found(job).fit_errors)


# -- the report -----------------------------------------------------------------------------------
def report(ssn: Session) -> CycleResult:
    """The session's result with every job's outcome and every task's status (once the plugins
    have reported: ``Session.close``)."""
    result = ssn.result
    for job in ssn.orphan_jobs:
        result.jobs[job.uid] = JobOutcome(
            job.phase, [], Explanation("queue", f"queue {job.queue!r} does not exist")
        )
    for job in ssn.orphan_jobs:
        _report_tasks(result, job.tasks.values())
    for job in ssn.jobs.values():
        invalid = ssn.invalid_jobs.get(job.uid)
        if invalid is not None:
            result.jobs[job.uid] = JobOutcome(
                job.phase,
                [Condition("Unschedulable", "True", invalid.reason, invalid.message)],
                Explanation("gang", invalid.message),
                job.schedule_state,
                job.stage,
            )
            _report_tasks(result, job.tasks.values())
            continue
        found = ssn.outcomes.found(job).conditions
        unschedulable = "Unschedulable" in found
        phase = job_phase_after(job, unschedulable)
        conditions = [Condition(t, "True", r, m) for t, (r, m) in found.items()]
        explanation = explain(ssn, job, phase)
        never = ssn.outcomes.found(job).unsatisfiable
        if explanation.gate != "none":  # the verdict of `muster explain` is in the condition too
            for c in conditions:
                if c.type == "Unschedulable" and explanation.summary not in c.message:
                    head = c.message.rstrip(". ")
                    c.message = f"{head}. {explanation.summary}" if head else explanation.summary
        if never:  # it can never run as things stand: said apart from waiting
            conditions.append(Condition(UNSATISFIABLE, "True", never, explanation.summary))
        result.jobs[job.uid] = JobOutcome(
            phase,
            conditions,
            explanation,
            job.schedule_state,
            job.stage,
            result.estimates.get(job.uid),  # (the reserve action's, when configured)
        )
        _report_tasks(result, job.tasks.values(), result.pipelined)
    return result


# Bound once: an enum class attribute costs ~0.2 us per lookup, and these are asked per task.
_PIPELINED, _PENDING = TaskStatus.PIPELINED, TaskStatus.PENDING


def _report_tasks(
    result: CycleResult, tasks: Iterable[TaskInfo], pipelined: dict[str, str] | None = None
) -> None:
    """Each task's status, node and device ids in the cycle's result, and (into ``pipelined``,
    when given) where a pipelined one waits. Once per task of the cycle: the loop written out."""
    task_status = result.task_status
    for task in tasks:
        node, status = task.node, task.status
        if node is None:
            # A pending task's nominated node, reported as given (it holds nothing).
            task_status[task.uid] = (status, task.spec.node if status == _PENDING else None)
            continue
        if pipelined is not None and status == _PIPELINED and node:
            pipelined[task.uid] = node
        task_status[task.uid] = (status, node)
        if task.devices:
            result.task_devices[task.uid] = list(task.devices)
        if task.gpu_groups:
            result.task_gpu_groups[task.uid] = list(task.gpu_groups)


# -- explanations ---------------------------------------------------------------------------------
def can_ever_fit(ssn: Session, task: TaskInfo) -> bool:
    """Would the task fit some node of this cluster if that node were empty? Cached per shape
    (static key and request): asked for every pending task of every waiting job at close."""
    known = ssn.outcomes.ever_fits.get(task.shape_key)
    if known is None:
        fits = rows_fit(ssn.nodes.allocatable, (task.resreq - MIN_RESOURCE).tolist())
        known = ssn.outcomes.ever_fits[task.shape_key] = bool(
            (ssn.evaluator.static_mask(task) & fits).any()
        )
    return known


def never_fits_reason(ssn: Session, task: TaskInfo) -> str:
    """Why a task fits no node even empty (like sbatch's "Requested node configuration is not
    available"): the resources no eligible node has enough of, with the largest there is."""
    return _never_fits(ssn, task)[1]


def _never_fits(ssn: Session, task: TaskInfo) -> tuple[str, str]:
    """(reason code, message): why a task fits no node even empty."""
    nodes, space = ssn.nodes, ssn.space
    eligible = ssn.evaluator.static_mask(task) if len(nodes) else np.zeros(0, dtype=bool)
    if not eligible.any():
        if not len(nodes):
            return NO_MATCHING_NODE, f"task {task.name}: the cluster has no nodes"
        missing = [
            f"{key}={value}"
            for key, value in sorted(task.spec.node_selector.items())
            if not any(spec.labels.get(key) == value for spec in nodes.specs)
        ]
        if missing:
            return NO_MATCHING_NODE, (
                f"task {task.name} can never run on this cluster: no node has label "
                + ", ".join(missing)
            )
        return NO_MATCHING_NODE, (
            f"task {task.name} can never run on this cluster: no node passes its node selector, "
            "affinity and tolerations"
        )
    largest = nodes.allocatable[eligible].max(axis=0)
    excluded = bool(
        ((nodes.allocatable >= task.resreq - MIN_RESOURCE).all(axis=1) & ~eligible).any()
    )
    short = [
        f"{space.dims[d]} {from_canonical(space.dims[d], task.resreq[d])} "
        f"(largest eligible node: {from_canonical(space.dims[d], largest[d])})"
        for d in range(space.size)
        if task.resreq[d] > largest[d] + MIN_RESOURCE
    ]
    head = f"task {task.name} can never run on this cluster"
    if not short:  # no single resource is short, but no node has them all at once
        return EXCEEDS_EVERY_NODE, f"{head}: no node has all of its request at once"
    tail = (
        "; the nodes big enough are excluded by its node selector, affinity or tolerations"
        if excluded
        else ""
    )
    return EXCEEDS_EVERY_NODE, f"{head}: it asks " + ", ".join(short) + tail


def explain(ssn: Session, job: JobInfo, phase: PodGroupPhase) -> Explanation:
    """Why the job is (not) placed: the first gate that holds it back. What can never change comes
    before what may: a job its queues or the nodes can never hold is said to be so (and found
    Unsatisfiable, with the cause's code) before the enqueue vote, the gang or the placement
    holding it now."""
    queue = ssn.queues.get(job.queue)
    pending = job.index[TaskStatus.PENDING]
    if not pending or job.is_ready():
        return Explanation("none", "placed" if not pending else "gang is ready")
    if queue is None:
        return Explanation("queue", f"queue {job.queue!r} does not exist")
    if not queue.is_open():
        return Explanation("queue", f"queue {queue.name} is {queue.state}")
    found = ssn.outcomes.found(job)
    beyond = ssn.job_satisfiable(job)
    if not beyond:
        ssn.outcomes.unsatisfiable_found(job, EXCEEDS_QUEUE)
        return Explanation("unsatisfiable", beyond.reason)
    never = next((t for t in pending.values() if not can_ever_fit(ssn, t)), None)
    if never is not None:
        fe = job.fit_errors.get(never.uid) or found.fit_errors.get(never.uid)
        reasons = dict(fe.reasons) if fe is not None else {}
        detail = f" ({fe.describe().rstrip('.')})" if fe is not None and fe.reasons else ""
        code, why = _never_fits(ssn, never)
        ssn.outcomes.unsatisfiable_found(job, code)
        return Explanation("unsatisfiable", why + detail, reasons)
    return _waits(ssn, job, phase, found, pending)


def _waits(
    ssn: Session,
    job: JobInfo,
    phase: PodGroupPhase,
    found: JobFindings,
    pending: dict[str, TaskInfo],
) -> Explanation:
    """Why a job that could run waits: the enqueue vote, the gang, the nodes or its queue."""
    if phase == PodGroupPhase.PENDING and found.enqueue.reason:
        return Explanation("enqueue", found.enqueue.reason)
    # Tasks that are placed, or were placed before the gang was discarded this cycle.
    fitting = job.ready_task_num() + sum(
        1 for t in pending.values() if t.last_tx_status in ALLOCATED
    )
    for errors in (job.fit_errors, found.fit_errors):
        for uid in job.tasks:
            fe = errors.get(uid)
            if fe is None:
                continue
            if fitting >= job.min_available:  # enough fit; a role's minimum is what fails
                return Explanation(
                    "gang",
                    f"{fitting} tasks fit, but not the gang's role minimums "
                    f"({_role_minimums(job)}); the rest: {fe.describe()}",
                    dict(fe.reasons),
                )
            if fitting:  # part of the gang fits: the gang rule, not the nodes, holds it back
                return Explanation(
                    "gang",
                    f"{fitting} of the gang's {job.min_available} tasks fit; the rest: {fe.describe()}",
                    dict(fe.reasons),
                )
            return Explanation("placement", fe.describe(), dict(fe.reasons))
    if job.job_fit_error:
        return Explanation("gang", job.job_fit_error)
    if found.queue.reason:
        return Explanation("queue", found.queue.reason)
    return Explanation("gang", ssn.outcomes.fit_error(job))


def _role_minimums(job: JobInfo) -> str:
    return (
        ", ".join(f"{role}: {n}" for role, n in sorted(job.task_min_available.items()) if n > 0)
        or "none"
    )
