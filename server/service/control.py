"""Job control, Slurm's way: holds, requeues, job arrays and dependencies (docs/jobs.md, "Holds,
arrays and dependencies").

* ``hold`` / ``release`` (HoldJob, ReleaseJob; ``scontrol hold`` / ``release``): a held job is
  left out of every cycle until it is released. A hold is the owner's (``user``) or another
  caller's with the cancel right (``admin``); only such a caller releases an admin hold. A job
  submitted with ``hold`` carries its owner's hold.
* ``requeue`` (RequeueJob; ``scontrol requeue``): the job's placed tasks are evicted through the
  normal eviction decisions, every task goes back to Pending, the job to Pending, its
  ``requeue_count`` goes up (optionally held: ``scontrol requeuehold``).
* Arrays: ``commands`` creates one job per index, ``<id>_<index>``; an array's id names its
  elements here (``jobs_named``: hold, release, requeue and cancel act on each).
* ``CycleGates``: asked by ``server.service.snapshot.capture`` for every active job, it says which
  ones a cycle leaves out -- held, waiting for a dependency (or one that can never be met), an array
  element beyond its array's ``%N`` -- and sets the condition that says why (``Held``,
  ``Dependency`` with reason ``Dependency`` or ``DependencyNeverSatisfied``, ``ArrayTaskLimit``)
  and the explanation Explain answers. The scheduling core never sees those jobs.

A dependency, once met, is not looked at again (as in Slurm, a requeue of the job it named does
not make this one wait again); one that can never be met stays so, and the job stays pending with
``DependencyNeverSatisfied`` until it is cancelled (Slurm's default, ``kill_invalid_depend`` off).
"""

from __future__ import annotations

from functools import lru_cache

import structlog

from muster.conditions import ARRAY_TASK_LIMIT, DEPENDENCY, HELD, REQUEUED, SCHEDULED
from muster.jobcontrol import (
    DEFAULT_DEPENDENCY_TYPE,
    ArraySpecError,
    Outcome,
    Verdict,
    dependency_verdict,
    parse_array,
)
from muster.jsonmap import short_enum_name
from muster.phases import WAITING_PHASES
from muster.v1 import muster_pb2 as pb
from server.model import EXITED, OCCUPYING, PodGroupPhase, TaskStatus
from server.service.errors import DomainError, denied, invalid, not_found, precondition
from server.service.records import JobRecord
from server.service.state import PLACED, ClusterState
from server.service.views import job_proto

log = structlog.get_logger("muster.control")

USER_HOLD, ADMIN_HOLD = "user", "admin"
# Condition reasons other than the condition's type: Slurm's.
NEVER_SATISFIED = "DependencyNeverSatisfied"
ARRAY_LIMIT_REASON = "JobArrayTaskLimit"
# The explanation's gate for a job a cycle left out.
GATE_HELD, GATE_DEPENDENCY, GATE_ARRAY = "held", "dependency", "array-limit"
CONTROL_GATES = frozenset({GATE_HELD, GATE_DEPENDENCY, GATE_ARRAY})


# -- names -------------------------------------------------------------------------------------


def known(state: ClusterState, job_id: str) -> bool:
    """Whether ``job_id`` names a job or an array the server knows."""
    return job_id in state.arrays or state.jobs.get(job_id) is not None


def jobs_named(state: ClusterState, job_id: str, path: str = "id") -> tuple[list[JobRecord], bool]:
    """The job ``job_id`` ([it], False), else the elements of the array of that id in memory, in
    index order (True); NOT_FOUND naming ``path`` when neither exists."""
    if not job_id:
        raise invalid(f"{path}: must not be empty")
    rec = state.jobs.get(job_id)
    if rec is not None:
        return [rec], False
    elements = state.arrays.get(job_id)
    if elements:
        return sorted(elements.values(), key=lambda r: r.spec.array_index), True
    raise not_found(f"{path}: job {job_id!r} does not exist")


def queue_and_owners(state: ClusterState, job_id: str) -> tuple[str, set[str]]:
    """The queue of the job (or array) ``job_id`` and who owns it, for authorization ("" and none
    when it does not exist: the handler answers NOT_FOUND)."""
    try:
        recs, _ = jobs_named(state, job_id)
    except DomainError:  # not found, empty: authorization decides on nothing
        return "", set()
    return recs[0].spec.queue, {r.spec.owner for r in recs}


def _phase(rec: JobRecord) -> str:
    return short_enum_name(pb.JobPhase.DESCRIPTOR, rec.status.phase)


def _views(recs: list[JobRecord], is_array: bool) -> list[pb.Job]:
    return [job_proto(r, with_tasks=not is_array) for r in recs]


# -- conditions -------------------------------------------------------------------------------


def set_condition(
    state: ClusterState,
    rec: JobRecord,
    kind: str,
    status: str,
    reason: str,
    message: str,
    cycle_id: int = 0,
) -> bool:
    """Set ``rec``'s condition ``kind`` (its transition time moves only when its status does);
    True when it changed (the job is then marked modified)."""
    st = rec.status
    if status == "False" and all(c.type != kind for c in st.conditions):
        return False  # nothing to turn off
    if not st.put_condition(kind, status, reason, message, cycle_id, state.clock()):
        return False
    state.changes.job_modified(rec.id)
    return True


def _explain(state: ClusterState, rec: JobRecord, gate: str, summary: str, cycle_id: int) -> None:
    exp = rec.status.explanation
    if exp is not None and exp.get("gate") == gate and exp.get("summary") == summary:
        return
    rec.status.explanation = {
        "gate": gate,
        "summary": summary,
        "node_reasons": {},
        "cycle_id": cycle_id,
    }
    state.changes.job_modified(rec.id)


def submitted(state: ClusterState, rec: JobRecord) -> None:
    """A new job's conditions: held (submitted so), waiting for its dependencies."""
    if rec.status.hold:
        _held(state, rec)
    if rec.spec.depends_on:
        first = rec.spec.depends_on[0]
        message = f"waits for {first.type}:{first.job}" + (
            f" and {len(rec.spec.depends_on) - 1} more" if len(rec.spec.depends_on) > 1 else ""
        )
        set_condition(state, rec, DEPENDENCY, "True", DEPENDENCY, message)


# -- hold and release ---------------------------------------------------------------------------


def _held(state: ClusterState, rec: JobRecord) -> None:
    st = rec.status
    by = st.held_by or "its owner"
    if st.hold == ADMIN_HOLD:
        message = f"held by {by} (admin hold): not scheduled until an administrator releases it"
    else:
        message = f"held by {by} (user hold): not scheduled until released (muster release)"
    set_condition(state, rec, HELD, "True", HELD, message)
    _explain(state, rec, GATE_HELD, message, 0)


def hold(state: ClusterState, job_id: str, by: str, *, admin: bool) -> list[pb.Job]:
    """HoldJob: the job, or every pending element of the array, is held (``admin``: an admin hold,
    which replaces a user hold; a user hold leaves an admin hold as it is)."""
    recs, is_array = jobs_named(state, job_id)
    targets = [r for r in recs if r.active and r.status.phase in WAITING_PHASES]
    if not targets:
        raise precondition(_not_waiting(recs, job_id, is_array, "held"))
    kind = ADMIN_HOLD if admin else USER_HOLD
    for rec in targets:
        st = rec.status
        if st.hold == ADMIN_HOLD and kind == USER_HOLD:
            continue
        if (st.hold, st.held_by) == (kind, by):
            continue
        st.hold, st.held_by = kind, by
        # Admitted again from the start when released (a held job is in no cycle meanwhile).
        st.sched_phase = PodGroupPhase.PENDING
        state.refresh_phase(rec)
        _held(state, rec)
        state.changes.job_modified(rec.id)
        log.info("job.held", job=rec.id, hold=kind, by=by)
    state.on_change()
    return _views(targets, is_array)


def _not_waiting(recs: list[JobRecord], job_id: str, is_array: bool, what: str) -> str:
    if is_array:
        return f"id: no element of array {job_id!r} is pending (only a pending job can be {what})"
    rec = recs[0]
    if not rec.active:
        return f"id: job {job_id!r} already ended ({_phase(rec)})"
    return (
        f"id: job {job_id!r} is {_phase(rec)}: only a pending job can be {what} "
        "(requeue it with hold to stop it and hold it)"
    )


def release(state: ClusterState, job_id: str, by: str, *, admin: bool) -> list[pb.Job]:
    """ReleaseJob: the job, or every held element of the array, is released; an admin hold only
    by an admin (``admin``). All or nothing."""
    recs, is_array = jobs_named(state, job_id)
    targets = [r for r in recs if r.active and r.status.hold]
    if not targets:
        what = f"no element of array {job_id!r}" if is_array else f"job {job_id!r}"
        raise precondition(f"id: {what} is held")
    if not admin:
        for rec in targets:
            if rec.status.hold == ADMIN_HOLD:
                raise denied(
                    f"id: job {rec.id!r} is held by {rec.status.held_by or 'an administrator'} "
                    "(admin hold): only an administrator (the cancel right in its queue) releases it"
                )
    for rec in targets:
        rec.status.hold, rec.status.held_by = "", ""
        set_condition(state, rec, HELD, "False", "Released", f"released by {by or 'its owner'}")
        _explain(state, rec, "none", "released: the next cycle considers it", 0)
        state.changes.job_modified(rec.id)
        log.info("job.released", job=rec.id, by=by)
    state.on_change()
    return _views(targets, is_array)


# -- requeue ------------------------------------------------------------------------------------


def _started(rec: JobRecord) -> bool:
    """Whether a task of the job holds a node or has run (what requeue undoes, what counts
    against an array's running limit)."""
    return any(t.status in OCCUPYING or t.status in EXITED for t in rec.tasks)


def requeue(
    state: ClusterState, job_id: str, by: str, *, admin: bool, hold_it: bool = False
) -> list[pb.Job]:
    """RequeueJob: the job (every started element of the array) goes back to Pending: its placed
    tasks are evicted (reason ``requeue``), its ended ones are Pending again, ``requeue_count``
    counts it; ``hold_it`` holds it too."""
    recs, is_array = jobs_named(state, job_id)
    targets = [r for r in recs if r.active and _started(r)]
    if not targets:
        if is_array:
            raise precondition(
                f"id: no element of array {job_id!r} has started: nothing to requeue"
            )
        rec = recs[0]
        if not rec.active:
            raise precondition(f"id: job {job_id!r} already ended ({_phase(rec)})")
        raise precondition(
            f"id: job {job_id!r} is {_phase(rec)}: it has not started, nothing to requeue"
        )
    for rec in targets:
        _requeue(state, rec, by)
        if hold_it:
            st = rec.status
            if st.hold != ADMIN_HOLD:
                st.hold, st.held_by = ADMIN_HOLD if admin else USER_HOLD, by
            _held(state, rec)
    state.on_change()
    return _views(targets, is_array)


def _requeue(state: ClusterState, rec: JobRecord, by: str) -> None:
    st = rec.status
    for t in rec.tasks:
        if t.status in PLACED:
            state.evict(t, "requeue", 0)  # Pending again once its eviction is acknowledged
        elif t.status in EXITED:
            t.status, t.message, t.exit_code = TaskStatus.PENDING, "requeued", 0
            t.node, t.devices, t.gpu_group = None, [], ""
            state.changes.tasks.add(t.uid)
    st.requeue_count += 1
    st.sched_phase = PodGroupPhase.PENDING
    st.start_time = 0.0
    st.leader_restarts = 0  # a fresh start (a TYJob's Leader has its restarts again)
    state.refresh_phase(rec)
    times = "once" if st.requeue_count == 1 else f"{st.requeue_count} times"
    set_condition(
        state,
        rec,
        REQUEUED,
        "True",
        REQUEUED,
        f"requeued by {by or 'its owner'} ({times}): its tasks were stopped; it waits to be placed again",
    )
    set_condition(state, rec, SCHEDULED, "False", REQUEUED, "")
    _explain(state, rec, "none", "requeued: the next cycle considers it", 0)
    state.changes.job_modified(rec.id)
    log.info("job.requeued", job=rec.id, by=by, count=st.requeue_count)


# -- what a cycle leaves out -----------------------------------------------------------------------


@lru_cache(maxsize=1024)
def array_limit(spec: str) -> int:
    """The ``%N`` of an array spec (0: none; a spec stored by a version that read it otherwise: none)."""
    try:
        return parse_array(spec).max_running
    except ArraySpecError:
        return 0


def outcome(rec: JobRecord) -> Outcome:
    phase = rec.status.phase
    if phase == pb.JOB_PHASE_COMPLETED:
        return Outcome.COMPLETED
    if phase == pb.JOB_PHASE_FAILED:
        return Outcome.FAILED
    if phase == pb.JOB_PHASE_CANCELLED:
        return Outcome.CANCELLED
    return Outcome.STARTED if rec.status.start_time else Outcome.PENDING


class CycleGates:
    """One cycle's answers: which active jobs it leaves out (``excludes``), each one's condition
    and explanation set to say why. Array elements are asked in creation (= index) order: an
    array's first ``N - running`` pending elements go into the cycle, the others wait."""

    def __init__(self, state: ClusterState, cycle_id: int) -> None:
        self.state = state
        self.cycle_id = cycle_id
        self._slots: dict[str, int] = {}  # array id -> elements this cycle may still take
        self._outcomes: dict[str, list[tuple[str, Outcome]]] = {}

    def excludes(self, rec: JobRecord) -> bool:
        if rec.status.hold:
            return True
        if not rec.controlled:
            return False
        if (
            rec.spec.depends_on
            and rec.status.dependency != Verdict.MET
            and not self._dependencies(rec)
        ):
            return True
        if rec.spec.array_job_id and rec.spec.array:
            return self._array_full(rec)
        return False

    # dependencies
    def _named(self, job_id: str) -> list[tuple[str, Outcome]]:
        found = self._outcomes.get(job_id)
        if found is None:
            rec = self.state.jobs.get(job_id)  # (a job that left memory: read from the store)
            if rec is not None:
                found = [(rec.id, outcome(rec))]
            else:
                elements = self.state.arrays.get(job_id, {})
                found = [(e.id, outcome(e)) for e in elements.values()] or [(job_id, Outcome.GONE)]
            self._outcomes[job_id] = found
        return found

    def _dependencies(self, rec: JobRecord) -> bool:
        """Whether ``rec``'s dependencies are met now (recorded: never asked again); when not, its
        Dependency condition says which one it waits for, or which can never be met."""
        st = rec.status
        if st.dependency == Verdict.NEVER:
            return False
        waiting = ""
        for dep in rec.spec.depends_on:
            kind = dep.type or DEFAULT_DEPENDENCY_TYPE
            named = self._named(dep.job)
            verdict = dependency_verdict(kind, [o for _, o in named])
            if verdict == Verdict.NEVER:
                st.dependency = Verdict.NEVER
                culprits = ", ".join(f"{i} {o}" for i, o in named if o != Outcome.PENDING)
                message = (
                    f"{kind}:{dep.job} can never be satisfied ({culprits}); the job stays "
                    "pending until it is cancelled"
                )
                self._gated(rec, DEPENDENCY, NEVER_SATISFIED, message, GATE_DEPENDENCY)
                log.info(
                    "job.dependency_never_satisfied", job=rec.id, dependency=f"{kind}:{dep.job}"
                )
                return False
            if verdict == Verdict.WAIT and not waiting:
                states = ", ".join(f"{i} {o}" for i, o in named[:3])
                more = f" and {len(named) - 3} more" if len(named) > 3 else ""
                waiting = f"waits for {kind}:{dep.job} ({states}{more})"
        if waiting:
            self._gated(rec, DEPENDENCY, DEPENDENCY, waiting, GATE_DEPENDENCY)
            return False
        st.dependency = Verdict.MET
        set_condition(self.state, rec, DEPENDENCY, "False", "Satisfied", "", self.cycle_id)
        self.state.changes.job_modified(rec.id)
        return True

    # arrays
    def _array_full(self, rec: JobRecord) -> bool:
        limit = array_limit(rec.spec.array)
        if not limit or _started(rec):
            return False  # no limit, or already running: it stays in the cycle
        array = rec.spec.array_job_id
        slots = self._slots.get(array)
        if slots is None:
            elements = self.state.arrays.get(array, {}).values()
            slots = limit - sum(1 for e in elements if e.active and _started(e))
        if slots > 0:
            self._slots[array] = slots - 1
            set_condition(self.state, rec, ARRAY_TASK_LIMIT, "False", "Admitted", "", self.cycle_id)
            return False
        self._slots[array] = 0
        exp = rec.status.explanation
        if (
            exp is not None
            and exp.get("gate") == GATE_ARRAY
            and any(
                c.type == ARRAY_TASK_LIMIT and c.status == "True" for c in rec.status.conditions
            )
        ):
            return True  # said so already (the limit is the spec's: the message is the same)
        message = (
            f"array {array} runs at most {limit} elements at once (%{limit}); this element waits "
            "for a running one to end"
        )
        self._gated(rec, ARRAY_TASK_LIMIT, ARRAY_LIMIT_REASON, message, GATE_ARRAY)
        return True

    def _gated(self, rec: JobRecord, kind: str, reason: str, message: str, gate: str) -> None:
        set_condition(self.state, rec, kind, "True", reason, message, self.cycle_id)
        _explain(self.state, rec, gate, message, self.cycle_id)
