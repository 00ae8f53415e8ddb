"""Shape classes: a job shape that found no room in a cycle is not tried again for a later job of
the same shape and queue until something frees room (issue 29: queue depth does not cost).

A cycle's cost used to grow with the queue: every waiting job was tried, and in a full cluster a
job behind ten thousand others of its shape fails for the reason they all did. A job's *class* is
what its attempt reads: its queue, the one shape (static key: node selector, tolerations,
affinity; the request; the GPU fraction) and role of its pending tasks, how many of them, and the
gang's counts (minimum, tasks ready, pipelined, pending best-effort, all). Once a job of a class
fails (its statement discarded), later jobs of the class are skipped and given the same finding,
naming the job that failed first ("same shape as job X: ...").

Why that is exact: the tasks of a class are identical, and every check an attempt asks reads one
node's row (resources, task count: the ``shape`` and ``static`` predicates) or the queue's
allocation (``allocatable``), so the attempt places a prefix of the tasks and succeeds exactly when
the nodes hold enough copies of the task in all, whatever the order: a function of the state that
placements only lower. Until resources come back it fails again. They come back when a task is
evicted, un-pipelined, moved or turned from allocated to pipelined, and when a statement is rolled
back past a failure remembered since its mark (a rollback to a mark restores the state of that
mark, which no failure remembered before it can be easier than): ``Statement`` calls ``freed`` then,
and every class is tried again.

Gang-backend with several backends (a ``DomainPredicate``: the gang's first task picks the backend
of the best node among those with room for the gang, the rest follow it there) adds the backend
to the class: the one ``select`` picks for the job's first task now. Within that backend the
argument above holds (every check reads one node's row), so a class that failed in a backend
fails there again until resources come back; a later job of the class that picks another backend
is tried.

Kept conservative: the cache is off for the session when an active point may read more than the
class -- another ``task``-scope predicate (pod affinity, tdm, network topology), a ``shape``
predicate with a ``now`` form (device topology), a device chooser, or a
``job_ready`` / ``job_pipelined`` / ``allocatable`` plugin other than those listed below -- and for
a job with a network topology, role or sub-group minimums, fit errors from an earlier attempt, or
pending tasks of several shapes or roles.

Session parameter ``shapeClasses`` (bool, default true) turns it off.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from server.model import TaskStatus
from server.session.evaluator import DomainPredicate
from server.session.extension_points import Verdict
from server.session.info import FitErrors, JobInfo, TaskInfo

if TYPE_CHECKING:  # the session holds the classes and is handed to them: annotation only
    from server.session.session import Session

# The plugins whose answers read nothing of a job or task beyond its class (gang: the job's counts;
# proportion and capacity: the queue's allocation and the request).
CLASS_READERS: dict[str, frozenset[str]] = {
    "job_ready": frozenset({"gang"}),
    "job_pipelined": frozenset({"gang"}),
    "allocatable": frozenset({"proportion", "capacity"}),
    "device_choice": frozenset(),
}
SESSION_PARAMETER = "shapeClasses"
# A class's backend not asked yet (see ``ShapeClasses.key``).
_NOT_ASKED = object()
_PENDING, _PIPELINED = TaskStatus.PENDING, TaskStatus.PIPELINED


@dataclass(frozen=True, slots=True)
class ShapeFailure:
    """What the first failing job of a class left behind, as given to the jobs skipped after it."""

    leader: str
    tried: tuple[TaskStatus, ...]  # statuses its discarded placements left (``last_tx_status``)
    fit_errors: tuple[FitErrors, ...]  # its tasks' fit errors, each naming the leader
    found: tuple[FitErrors, ...]  # fit errors found only to explain it (the queue refused first)
    queue: Verdict | None  # the refusal of its queue, naming the leader; None: none


@dataclass(slots=True)
class Attempt:
    """A job's state before its attempt: what the attempt changed is what it found."""

    key: Hashable
    tried: dict[str, TaskStatus | None]
    found: frozenset[str]
    queue: Verdict


class ShapeClasses:
    """The failed classes of one session. Plain data: it holds no session."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.failures: dict[Hashable, ShapeFailure] = {}
        self.remembered = 0  # failures remembered so far (statements compare it at rollback)
        self._usable: bool | None = None
        # The gang-backend domains a class is kept per (None: one class for the cluster), and
        # the classes (without their backend) that failed in some backend.
        self._domain: DomainPredicate | None = None
        self._failed_in_some: set[Hashable] = set()

    # -- invalidation ---------------------------------------------------------------------------
    def freed(self) -> None:
        """Resources may have come back: every class is worth trying again."""
        self.failures.clear()
        self._failed_in_some.clear()

    # -- classes --------------------------------------------------------------------------------
    def usable(self, ssn: Session) -> bool:
        """Do the session's active points read nothing beyond a job's class? (Once per session.)"""
        if self._usable is None:
            evaluator = ssn.evaluator
            task_predicates = evaluator.predicates["task"]
            only = task_predicates[0] if len(task_predicates) == 1 else None
            self._domain = only if isinstance(only, DomainPredicate) and only.now is None else None
            self._usable = (
                self.enabled
                and (not task_predicates or self._domain is not None)
                and all(p.now is None for p in evaluator.predicates["shape"])
                and all(
                    name in allowed
                    for point, allowed in CLASS_READERS.items()
                    for row in ssn.chain(point)
                    for name, _ in row
                )
            )
        return self._usable

    def key(self, ssn: Session, job: JobInfo) -> Hashable | None:
        """The job's class, or None when the job is not one a class stands for."""
        if not self.usable(ssn):
            return None
        if job.fit_errors or job.job_fit_error or job.spec.network_topology:
            return None
        if job.subgroup_min_member or any(n > 0 for n in job.task_min_available.values()):
            return None
        shape: Any = None
        role = ""
        count = 0
        for task in job.index[_PENDING].values():
            if task.best_effort:
                continue
            if shape is None:
                shape, role = task.shape_key, task.role
            elif task.shape_key != shape or task.role != role:
                return None
            count += 1
        if shape is None:
            return None
        key = (
            job.queue,
            shape,
            role,
            count,
            job.pending_best_effort,
            job.ready_count,
            len(job.index.get(_PIPELINED, ())),  # (no __missing__ call: most have none)
            job.min_available,
            len(job.tasks),
        )
        if self._domain is None:
            return key
        # Per backend: asked only when a job of the class failed somewhere (a select per job
        # costs more than it saves where jobs fit); else told when one fails (``failed``).
        if key not in self._failed_in_some:
            return (*key, _NOT_ASKED)
        return (*key, self._backend_of(ssn, job))

    def _backend_of(self, ssn: Session, job: JobInfo) -> int | None:
        """The backend the job's first task would go to now (None: no node for it)."""
        assert self._domain is not None
        first = next(t for t in job.index[_PENDING].values() if not t.best_effort)
        picked = ssn.evaluator.select(first)
        return None if picked is None else int(self._domain.domain_of[picked[0]])

    def failure(self, key: Hashable | None) -> ShapeFailure | None:
        return None if key is None else self.failures.get(key)

    # -- remembering a failure ------------------------------------------------------------------
    def before(self, ssn: Session, key: Hashable, job: JobInfo) -> Attempt:
        """The job's state before it is tried (its class ``key``)."""
        found = ssn.outcomes.found(job)
        return Attempt(
            key,
            {t.uid: t.last_tx_status for t in _candidates(job)},
            frozenset(found.fit_errors),
            found.queue,
        )

    def failed(self, ssn: Session, job: JobInfo, attempt: Attempt) -> None:
        """The job of ``attempt`` found no room: its class fails until resources come back."""
        leader = job.uid
        tasks = [job.tasks[uid] for uid in attempt.tried if uid in job.tasks]
        tried = tuple(
            t.last_tx_status
            for t in tasks
            if t.last_tx_status is not None and t.last_tx_status != attempt.tried[t.uid]
        )
        found = ssn.outcomes.found(job)
        queue = found.queue
        key = attempt.key
        if isinstance(key, tuple) and key and key[-1] is _NOT_ASKED:
            # The attempt was discarded: the session is as it was before it, so the backend its
            # first task would go to now is the one it went to.
            self._failed_in_some.add(key[:-1])
            key = (*key[:-1], self._backend_of(ssn, job))
        self.failures[key] = ShapeFailure(
            leader,
            tried,
            tuple(_naming(leader, fe) for fe in job.fit_errors.values()),
            tuple(
                _naming(leader, fe)
                for uid, fe in found.fit_errors.items()
                if uid not in attempt.found
            ),
            None
            if queue is attempt.queue or not queue.reason
            else Verdict(int(queue), f"same shape as job {leader}: {queue.reason}", queue.plugin),
        )
        self.remembered += 1

    # -- skipping -------------------------------------------------------------------------------
    def skip(self, ssn: Session, job: JobInfo, failure: ShapeFailure) -> None:
        """``job`` is not tried: it gets what the class's first failing job found. Its first tasks
        are those that fit before the first one did not (as the leader's were)."""
        tasks = list(_candidates(job))
        placed = len(failure.tried)
        for task, status in zip(tasks, failure.tried, strict=False):
            task.last_tx_status = status
        rest = tasks[placed:] or tasks
        for task, fe in zip(rest, failure.fit_errors, strict=False):
            job.fit_errors[task.uid] = fe
        outcomes = ssn.outcomes
        for task, fe in zip(rest, failure.found, strict=False):
            outcomes.fit_errors_found(job, task, fe, keep_first=True)
        if failure.queue is not None:
            outcomes.queue_refused(job, failure.queue)


def _candidates(job: JobInfo) -> list[TaskInfo]:
    """The tasks an attempt of the job tries: its pending tasks with a request."""
    return [t for t in job.index[_PENDING].values() if not t.best_effort]


def _naming(leader: str, fe: FitErrors) -> FitErrors:
    """``fe`` as found for another job of the class: the same counts, saying whose they are."""
    return FitErrors(
        fe.total_nodes, dict(fe.reasons), f"same shape as job {leader}: {fe.describe()}"
    )
