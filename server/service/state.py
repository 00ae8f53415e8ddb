"""The server's in-memory cluster state and the task / job lifecycle.

``ClusterState`` is the state's tables (``server.service.tables.StateTables``: the records of
backends, nodes, queues, jobs, tasks and foreign work, the decision log and the WatchJobs hub, and
their rows in and out of the store) and owns every lifecycle transition: a task going back to
Pending, being released, evicted or bound, a gang falling below its minimum, a job's phase
following its tasks. What depends on the kind of job (a TYJob's Leader restarts, its
cleanPodPolicy, what ends it) is asked of the job's ``server.service.lifecycle.JobLifecycle``. Each
transition notes what it changed in ``changes`` (a ``ChangeSet``); ``commit()`` turns the change
set into one ``WriteBatch`` for the store and publishes the job events it collected.

Three groups of transitions are functions taking the state, in modules of their own: backends going
silent, lost and back (``server.service.liveness``), the time-limit safety net
(``server.service.timelimits``) and finished jobs leaving memory (``server.service.retention``; the
store answers for them after). The state keeps their settings: ``liveness``, ``time_limit_grace``,
``retention``.

Who changes it: ``server.service.ingest`` (backend RPCs), ``server.service.commands`` (jobs and queues),
``server.service.apply`` (a cycle's result); ``server.service.snapshot`` reads it for a cycle and
``server.service.api.queries`` for the read RPCs. All of them run on the event loop, one call at a time,
so each call is atomic with respect to the others. Every mutating call validates its whole request
first (raising ``server.service.errors.DomainError``) and only then changes state, so a rejected request
changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog

from muster import conditions
from muster.devices import NVIDIA_GPU, UNIT
from muster.gang import gang_whole
from muster.jsonmap import short_enum_name
from muster.timelimit import TIME_LIMIT_REASON, time_limit_message
from muster.v1 import muster_pb2 as pb
from server import model
from server.model import ALLOCATED_OR_UNKNOWN, OCCUPYING, PodGroupPhase, TaskStatus
from server.service import convert, validate
from server.service.decisions import DecisionLog
from server.service.errors import invalid, not_found
from server.service.lifecycle import JobLifecycle, ended_reason, lifecycle_of
from server.service.liveness import Liveness
from server.service.logs import TaskLogs
from server.service.records import (
    ConditionRecord,
    JobRecord,
    QueueEntry,
    TaskRecord,
    is_terminal_phase,
)
from server.service.store import JobArchive, TaskLogStore, WriteBatch
from server.service.tables import StateTables

log = structlog.get_logger("muster.state")

# Placed on a node by Muster and not yet released (Unknown: its backend went silent).
PLACED = frozenset({TaskStatus.BINDING, TaskStatus.BOUND, TaskStatus.RUNNING, TaskStatus.UNKNOWN})
# Statuses a backend may hold a task in (it knows about it).
ON_BACKEND = frozenset(
    {TaskStatus.BOUND, TaskStatus.RUNNING, TaskStatus.RELEASING, TaskStatus.UNKNOWN}
)
# Seconds a task may run past its time limit before the server stops it (its backend should).
# This and the next are ClusterState's defaults: the modules that use them import this one.
TIME_LIMIT_GRACE = 30.0
# How long a finished job stays in memory by default (seconds); ``muster-server --job-retention``.
DEFAULT_JOB_RETENTION = 600.0


class ClusterState(StateTables):
    """The cluster state and its transitions (the module's docstring)."""

    # Seconds a task may run past its time limit before ``timelimits.enforce_time_limits`` stops it.
    time_limit_grace: float = TIME_LIMIT_GRACE

    def __init__(
        self,
        decisions: DecisionLog | None = None,
        *,
        clock: Callable[[], float] = time.time,
        retention: float = DEFAULT_JOB_RETENTION,
        archive: JobArchive | None = None,
        liveness: Liveness | None = None,
    ) -> None:
        super().__init__(decisions, clock=clock, archive=archive)
        self.retention = retention  # seconds a finished job stays in memory (service.retention)
        # When each backend was last heard from (memory only: derived, never stored).
        self.liveness = liveness if liveness is not None else Liveness()
        # Output the backends sent: bounded per task, in the store (``--task-log-limit``).
        self.task_logs = TaskLogs(store=archive if isinstance(archive, TaskLogStore) else None)
        self.priority_classes: dict[str, model.PriorityClass] = {}
        # The last cycle, and per queue what waited past its window (``maxQueueLookback``): those
        # jobs got no outcome in it (memory only: the next cycle says it again).
        self.last_window: tuple[int, dict[str, model.BeyondWindow]] = (0, {})
        # Called on every change that may let a cycle do something new (the loop's wake()).
        self.on_change: Callable[[], None] = lambda: None
        self.ensure_default_queues()
        self.changes.meta["server_id"] = self.server_id

    def ensure_default_queues(self) -> None:
        """``root`` and ``default`` exist in every state (a new one, and a leader taking over a
        store no leader has written to yet)."""
        for name, parent in (("root", ""), ("default", "root")):
            if name not in self.queues:
                self.put_queue(validate.normalize_queue(pb.Queue(name=name, parent=parent)))

    def reset(self) -> None:
        super().reset()
        self.liveness.restart()
        self.task_logs.clear()

    # -- flushing (the rows in and out: server.service.tables; retention: server.service.retention)

    def commit(self) -> WriteBatch:
        """``StateTables.commit`` after bringing the usage of the jobs whose tasks changed up to
        now (``account_usage``), with the task output received since the last one (``TaskLogs.
        drain``). Who follows a changed task's output is woken (its end is in its status)."""
        changes = self.changes
        if changes.tasks:
            now = self.clock()
            jobs = {job.id: job for uid in changes.tasks if (job := self.task_job.get(uid))}
            for job in jobs.values():
                if account_usage(job, now):
                    changes.jobs.add(job.id)
            self.task_logs.notify(changes.tasks)
        batch = super().commit()
        self.task_logs.drain(batch)
        return batch

    def set_meta(self, key: str, value: str) -> None:
        self.changes.meta[key] = value

    def set_priority_classes(self, classes: Iterable[model.PriorityClass]) -> None:
        self.priority_classes = {c.name: c for c in classes}

    # -- lookups ------------------------------------------------------------------------------

    def job_of_task(self, uid: str) -> str:
        """The id of the job owning task ``uid`` ("" if unknown)."""
        job = self.task_job.get(uid)
        return job.id if job is not None else ""

    def jobs_placed_by(self, binds: Mapping[str, str]) -> list[str]:
        """The jobs with a task still placed where ``binds`` (task -> node) put it."""
        placed: dict[str, None] = {}
        for uid, node in binds.items():
            job = self.task_job.get(uid)
            if job is None or job.id in placed:
                continue
            task = self.tasks.get(uid)
            if task is not None and task.node == node and task.status in PLACED:
                placed[job.id] = None
        return list(placed)

    def job_or_error(self, job_id: str, path: str = "id") -> JobRecord:
        if not job_id:
            raise invalid(f"{path}: must not be empty")
        rec = self.jobs.get(job_id)
        if rec is None:
            raise not_found(f"{path}: job {job_id!r} does not exist")
        return rec

    # -- building -----------------------------------------------------------------------------

    def put_queue(self, q: validate.ValidQueue) -> None:
        """Add or replace a queue that passed validation (its quantities parsed there, once)."""
        self.queues[q.spec.name] = QueueEntry(q.spec, convert.valid_queue_to_model(q))
        self.changes.queues.add(q.spec.name)
        self.changes.deleted_queues.discard(q.spec.name)

    def remove_queue(self, name: str) -> None:
        del self.queues[name]
        self.changes.queues.discard(name)
        self.changes.deleted_queues.add(name)

    # -- task transitions (no validation: callers checked) --------------------------------------

    def report_task(
        self,
        rec: TaskRecord,
        status: int,
        node: str | None,
        backend: str,
        message: str,
        exit_code: int,
    ) -> None:
        """A backend says where a task is and how it is doing."""
        new = TaskStatus(status)
        job = self.task_job[rec.uid]
        if rec.status == TaskStatus.RELEASING and new not in (
            TaskStatus.SUCCEEDED,
            TaskStatus.FAILED,
        ):
            return  # an eviction is under way; its ack settles the task
        if rec.status == TaskStatus.CANCELLED or (
            rec.status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED)
            and new not in (TaskStatus.SUCCEEDED, TaskStatus.FAILED)
        ):
            return  # an ended task does not come back
        if new == TaskStatus.BOUND and rec.status not in (TaskStatus.BINDING, TaskStatus.PENDING):
            return  # older news than what we know
        if new == TaskStatus.FAILED and job.active:
            again = lifecycle_of(job).restart(job, rec, message, exit_code)
            if again is not None:  # its kind starts it again (a TYJob's Leader)
                self.changes.job_modified(job.id)
                self.to_pending(rec, again)
                return
        if new == TaskStatus.RUNNING and rec.status not in (TaskStatus.RUNNING, TaskStatus.UNKNOWN):
            rec.started = self.clock()  # its time limit's safety net counts from here
        rec.status = new
        if node:
            rec.node = node
        rec.backend = backend
        if message:
            rec.message = message
        if new in (TaskStatus.SUCCEEDED, TaskStatus.FAILED):
            rec.exit_code = exit_code
        self.changes.tasks.add(rec.uid)
        keep = lifecycle_of(job).keeps_pods(job) and not job.status.cancelled
        if not job.active and new in PLACED and not keep:
            # Still running for a job that is over (cancelled, failed): stop it.
            self.evict(rec, "cancel" if job.status.cancelled else "job-finished", 0)

    def remove_node(self, name: str, why: str) -> set[str]:
        """Drop a node; its tasks are lost. Returns the ids of jobs whose tasks changed."""
        self.nodes.pop(name, None)
        for key in [k for k, f in self.foreign.items() if f.spec.node == name]:
            del self.foreign[key]
        touched: set[str] = set()
        for rec in self.tasks.values():
            if rec.node != name or rec.status not in OCCUPYING:
                continue
            touched.add(rec.job_id)
            if rec.status == TaskStatus.BINDING:
                for p in self.decisions.pending_for_task(rec.uid):
                    if p.row.kind == "bind":
                        self.decisions.settle(p.row.id, "expired", why)
            self.task_gone(rec, f"lost: {why}")
        return touched

    def task_gone(self, rec: TaskRecord, why: str) -> None:
        """The task no longer exists on its node: releasing -> released, otherwise back to Pending."""
        if rec.status == TaskStatus.RELEASING:
            for p in self.decisions.pending_for_task(rec.uid):
                if p.row.kind == "evict":
                    self.decisions.settle(p.row.id, "applied", "task gone")
            self.released(rec)
        else:
            self.to_pending(rec, why)

    def to_pending(self, rec: TaskRecord, why: str) -> None:
        """Back to Pending, off its node; a task of an ended job takes what its kind says
        (``JobLifecycle.unrun``) instead."""
        job = self.task_job[rec.uid]
        ended = None
        if not job.active and not job.status.cancelled:
            ended = lifecycle_of(job).unrun(job, rec, why)
        rec.status, rec.message = ended or (TaskStatus.PENDING, why)
        rec.node = None
        rec.devices, rec.gpu_group = [], ""
        self.changes.tasks.add(rec.uid)
        if job.active:
            self.gang_check(job)

    def released(self, rec: TaskRecord) -> None:
        job = self.task_job[rec.uid]
        if job.status.cancelled:
            rec.status = TaskStatus.CANCELLED
            rec.message = "cancelled: stopped"
        elif rec.message == f"evicting: {TIME_LIMIT_REASON}":  # stopped by service.timelimits
            rec.status = TaskStatus.FAILED
            rec.message = (
                time_limit_message(job.spec.time_limit_seconds) + " (stopped by the server)"
            )
        elif not job.active:
            rec.status, rec.message = lifecycle_of(job).stopped(job, rec)
        else:
            rec.status = TaskStatus.PENDING
            rec.node = None
            rec.devices, rec.gpu_group = [], ""
        self.changes.tasks.add(rec.uid)
        if job.active:
            self.gang_check(job)

    def gang_check(self, job: JobRecord) -> None:
        """All or nothing: if fewer than min_member tasks remain placed, release the rest too."""
        placed = [t for t in job.tasks if t.status in PLACED]
        if not placed:
            return
        succeeded = sum(1 for t in job.tasks if t.status == TaskStatus.SUCCEEDED)
        if gang_whole(job.min_member, len(placed), succeeded):
            return
        for t in placed:
            self.evict(t, "gang-broken", 0)
        job.status.sched_phase = PodGroupPhase.INQUEUE
        self.changes.jobs.add(job.id)

    def bind(
        self,
        job: JobRecord,
        rec: TaskRecord,
        node: str,
        devices: list[str],
        cycle_id: int,
        gpu_group: str = "",
    ) -> None:
        """Pending -> Binding on ``node`` (holding ``devices``; a fractional task sharing the GPU
        ``gpu_group``), and the bind decision to the node's backend."""
        entry = self.nodes[node]
        rec.status = TaskStatus.BINDING
        rec.node = node
        rec.backend = entry.spec.backend
        rec.devices = list(devices)
        rec.gpu_group = gpu_group
        rec.message = ""
        self.changes.tasks.add(rec.uid)
        group = job.groups[rec.role]
        self.issue(
            entry.spec.backend,
            cycle_id,
            rec.uid,
            bind=pb.BindDecision(
                task_id=rec.uid,
                job_id=job.id,
                node=node,
                devices=devices,
                request=group.request,
                command=group.command,
                duration_seconds=group.duration_seconds,
                annotations=group.annotations,
                gpu_fraction=group.gpu_fraction,
                min_member=job.min_member,
                gpu_group=gpu_group,
                env=job.task_env,
                time_limit_seconds=job.spec.time_limit_seconds,
            ),
        )

    def evict(self, rec: TaskRecord, reason: str, cycle_id: int) -> None:
        rec.status = TaskStatus.RELEASING
        rec.message = f"evicting: {reason}"
        self.changes.tasks.add(rec.uid)
        self.issue(
            rec.backend,
            cycle_id,
            rec.uid,
            evict=pb.EvictDecision(
                task_id=rec.uid, job_id=rec.job_id, node=rec.node or "", reason=reason
            ),
        )

    def issue(self, backend: str, cycle_id: int, task_id: str, **action: Any) -> pb.Decision:
        decision = self.decisions.issue(backend, cycle_id, task_id, now=self.clock(), **action)
        if backend in self.backends:
            self.backends[backend].last_decision_id = decision.id
            self.changes.backends.add(backend)
        return decision

    # -- job phase ------------------------------------------------------------------------------

    def after_task_change(self, job: JobRecord) -> None:
        self.refresh_phase(job)
        self.changes.job_modified(job.id)

    def refresh_phase(self, job: JobRecord) -> None:
        """The job's phase from its tasks, by its kind's rule (terminal phases stay)."""
        st = job.status
        if is_terminal_phase(st.phase):
            return
        rules = lifecycle_of(job)
        phase = rules.phase(job)
        if phase == st.phase:
            return
        now = self.clock()
        st.phase = phase
        if phase == pb.JOB_PHASE_RUNNING and not st.start_time:
            st.start_time = now
        if is_terminal_phase(phase):
            self.active_jobs.pop(job.id, None)
            st.finish_time = now
            st.sched_phase = (
                PodGroupPhase.COMPLETED if phase == pb.JOB_PHASE_COMPLETED else st.sched_phase
            )
            self.end_tasks(job, rules)
            self.set_ended(job, rules.summary(job, phase))
            log.info("job.finished", job=job.id, phase=pb.JobPhase.Name(phase))
        self.changes.job_modified(job.id)

    def end_tasks(self, job: JobRecord, rules: JobLifecycle) -> None:
        """The job just ended: its placed tasks are stopped unless its kind keeps them (a TYJob's
        cleanPodPolicy None), and those that never ran take their kind's final status."""
        reason = "job-failed" if job.status.phase == pb.JOB_PHASE_FAILED else "job-finished"
        keep = rules.keeps_pods(job)
        for t in job.tasks:
            if t.status in PLACED and not keep:
                self.evict(t, reason, 0)
            elif t.status == TaskStatus.PENDING and (ended := rules.unrun(job, t, "")):
                t.status, t.message = ended
                self.changes.tasks.add(t.uid)

    def quarantine(self, job: JobRecord, reason: str, message: str, cycle_id: int = 0) -> None:
        """Leave ``job`` out of every cycle from now on (until it is cancelled): its Quarantined
        condition says why. For a job whose stored spec today's validation refuses (reason
        InvalidSpec); a cycle that fails with a job reports it in its result (``server.service.apply``)."""
        st = job.status
        st.quarantined = True
        st.conditions = [c for c in st.conditions if c.type != model.QUARANTINED] + [
            ConditionRecord(model.QUARANTINED, "True", reason, message, cycle_id, self.clock())
        ]
        st.explanation = {
            "gate": "quarantined",
            "summary": message,
            "node_reasons": {},
            "cycle_id": cycle_id,
        }
        self.changes.job_modified(job.id)
        log.error("job.quarantined", job=job.id, reason=reason, message=message)

    def set_ended(self, job: JobRecord, message: str) -> None:
        """A job that ended says so: an ``Ended`` condition (reason: the phase, message: which tasks
        ended how), and its scheduling conditions turn False (their old "unschedulable" text would
        mislead), as do the conditions that said why it waited (held, a dependency, its array's
        limit: they no longer hold once it ended)."""
        now = self.clock()
        reason = ended_reason(job, short_enum_name(pb.JobPhase.DESCRIPTOR, job.status.phase))
        kept = []
        for c in job.status.conditions:
            if c.type in _ENDS_WITH_THE_JOB:
                c = ConditionRecord(
                    c.type,
                    "False",
                    reason,
                    "",
                    c.cycle_id,
                    now if c.status != "False" else c.transition_time,
                )
            if c.type != conditions.ENDED:
                kept.append(c)
        ended = ConditionRecord(conditions.ENDED, "True", reason, message, 0, now)
        job.status.conditions = [*kept, ended]


# The conditions that stop holding when a job ends: scheduling and waiting ones.
_ENDS_WITH_THE_JOB = frozenset(
    {
        conditions.UNSCHEDULABLE,
        conditions.SCHEDULED,
        conditions.UNSATISFIABLE,
        conditions.HELD,
        conditions.DEPENDENCY,
        conditions.ARRAY_TASK_LIMIT,
    }
)


def account_usage(job: JobRecord, now: float) -> bool:
    """Bring the job's usage up to ``now``: what its tasks held since the last call counts for
    the time between, and what they hold now is noted (a task holds its request from its bind
    being acknowledged until it ended or its release was acknowledged: ``ON_BACKEND``; a GPU share,
    ``gpu_fraction``, counts as that share of nvidia.com/gpu). False when nothing changed."""
    st = job.status
    holding: dict[str, float] = {}
    for t, tmpl in zip(job.tasks, job.template.tasks, strict=True):
        if t.status in ON_BACKEND:
            for r, v in tmpl.request.items():
                holding[r] = holding.get(r, 0.0) + v
            if tmpl.gpu_fraction:
                holding[NVIDIA_GPU] = holding.get(NVIDIA_GPU, 0.0) + tmpl.gpu_fraction * UNIT
    if not holding and not st.holding:
        return False
    if st.used_at:
        span = max(0.0, now - st.used_at)
        for r, v in st.holding.items():
            st.used[r] = st.used.get(r, 0.0) + v * span
    st.holding = holding
    st.used_at = now
    return True


def queue_allocated(state: ClusterState) -> dict[str, dict[str, float]]:
    """Per queue, the resources (canonical units) its active jobs' placed tasks hold now: ListQueues'
    allocation and the dashboard's history both read it."""
    allocated: dict[str, dict[str, float]] = {n: {} for n in state.queues}
    for rec in state.jobs_that_may_hold():  # finished jobs count nowhere here
        # (a waiting job's spec, tasks and template need not be built)
        if rec.all_pending() or not any(t.status in ALLOCATED_OR_UNKNOWN for t in rec.tasks):
            continue
        alloc = allocated.get(rec.queue)
        if not rec.active or alloc is None:
            continue
        for t, tmpl in zip(rec.tasks, rec.template.tasks, strict=True):
            if t.status in ALLOCATED_OR_UNKNOWN:
                for r, v in tmpl.request.items():
                    alloc[r] = alloc.get(r, 0.0) + v
    return allocated
