"""The server's in-memory cluster state and the task / job lifecycle.

``ClusterState`` holds the records (``server.service.records``) of backends, nodes, queues, jobs, tasks and
foreign work, the decision log and the WatchJobs hub, and owns every lifecycle transition: a task
going back to Pending, being released, evicted or bound, a gang falling below its minimum, a job's
phase following its tasks. Each transition notes what it changed in ``changes`` (a ``ChangeSet``);
``commit()`` turns the change set into one ``WriteBatch`` for the store and publishes the job
events it collected.

Finished jobs do not stay in memory for ever: ``drop_finished`` removes a job (with its tasks) once
it has been Completed, Failed or Cancelled for ``retention`` seconds and nothing of it is still
unwritten or on a node. It stays in the store, and ``jobs.get`` (a ``JobTable``) reads through to
the store, so lookups by id -- GetJob, Explain, CancelJob, a resubmission of the same id -- answer
as before; ``server.service.api.queries.list_jobs`` merges memory and store.

Who changes it: ``server.service.ingest`` (backend RPCs), ``server.service.commands`` (jobs and queues),
``server.service.apply`` (a cycle's result); ``server.service.snapshot`` reads it for a cycle and
``server.service.api.queries`` for the read RPCs. All of them run on the event loop, one call at a time,
so each call is atomic with respect to the others. Every mutating call validates its whole request
first (raising ``server.service.errors.DomainError``) and only then changes state, so a rejected request
changes nothing.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

import structlog

from muster.v1 import muster_pb2 as pb
from server import model
from server.model import ALLOCATED, ENDED, OCCUPYING, PodGroupPhase, TaskStatus
from server.service import convert, validate
from server.service.decisions import DecisionLog, JobWatchHub
from server.service.errors import invalid, not_found
from server.service.logs import TaskLogs
from server.service.records import (
    BackendRecord,
    ConditionRecord,
    DecisionRow,
    ForeignTask,
    JobRecord,
    JobStatusRecord,
    NodeEntry,
    QueueEntry,
    TaskRecord,
    is_terminal_phase,
)
from server.service.store import JobArchive, StoredJob, StoredState, WriteBatch
from server.service.views import job_proto

log = structlog.get_logger("muster.state")

# Placed on a node by Muster and not yet released.
PLACED = frozenset({TaskStatus.BINDING, TaskStatus.BOUND, TaskStatus.RUNNING})
# Statuses a backend may hold a task in (it knows about it).
ON_BACKEND = frozenset({TaskStatus.BOUND, TaskStatus.RUNNING, TaskStatus.RELEASING})
# How long a finished job stays in memory by default (seconds); ``muster-server --job-retention``.
DEFAULT_JOB_RETENTION = 600.0


class JobTable(dict[str, JobRecord]):
    """The jobs in memory, in creation order: the active ones and those finished within the
    retention. ``get`` reads through to the archive (the store) for a job that left memory, so a
    lookup by id sees every job; ``[]``, ``in``, ``len`` and iteration see memory only.

    A record read from the archive is a detached, read-only copy (its job is over): nothing
    indexes it, and changing it changes nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self.archive: JobArchive | None = None

    def get(self, key: str, default: None = None) -> JobRecord | None:  # type: ignore[override]
        rec = super().get(key)
        if rec is None and self.archive is not None and key:
            stored = self.archive.job(key)
            if stored is not None:
                rec = record_from_stored(stored, template=False)
        return rec


@dataclass
class ChangeSet:
    """What changed since the last commit: the rows to write and the job events to publish."""

    jobs: set[str] = field(default_factory=set)
    tasks: set[str] = field(default_factory=set)
    queues: set[str] = field(default_factory=set)
    deleted_queues: set[str] = field(default_factory=set)
    backends: set[str] = field(default_factory=set)
    meta: dict[str, str] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)  # job id -> pb.JobEvent type

    def job_modified(self, job_id: str) -> None:
        self.jobs.add(job_id)
        self.events.setdefault(job_id, pb.JobEvent.TYPE_MODIFIED)

    def clear(self) -> None:
        for s in (self.jobs, self.tasks, self.queues, self.deleted_queues, self.backends):
            s.clear()
        self.meta.clear()
        self.events.clear()


class ClusterState:
    def __init__(
        self,
        decisions: DecisionLog | None = None,
        *,
        clock: Callable[[], float] = time.time,
        retention: float = DEFAULT_JOB_RETENTION,
        archive: JobArchive | None = None,
    ) -> None:
        self.clock = clock
        self.retention = retention  # seconds a finished job stays in memory
        self.decisions = decisions or DecisionLog()
        self.watch = JobWatchHub()
        self.server_id = uuid.uuid4().hex
        self.backends: dict[str, BackendRecord] = {}
        self.nodes: dict[str, NodeEntry] = {}
        self.queues: dict[str, QueueEntry] = {}
        self.jobs = JobTable()  # in creation order
        self.jobs.archive = archive
        # The jobs not known to be over, in creation order: what a cycle and ListQueues need,
        # without walking the finished ones. A job leaves it when a transition or commit() sees it
        # over, so readers still check ``rec.active``.
        self.active_jobs: dict[str, JobRecord] = {}
        # Finished jobs still in memory, in the order they were committed finished (about the
        # order of their finish times): what drop_finished looks at, oldest first.
        self.finished: dict[str, None] = {}
        self.tasks: dict[str, TaskRecord] = {}
        self.task_job: dict[str, JobRecord] = {}
        self.foreign: dict[str, ForeignTask] = {}  # key "<backend>/<task id>"
        self.task_logs = TaskLogs()  # output the backends sent (memory only, bounded)
        self.priority_classes: dict[str, model.PriorityClass] = {}
        self.next_cycle_id = 1
        self.next_creation_index = 1
        # Called on every change that may let a cycle do something new (the loop's wake()).
        self.on_change: Callable[[], None] = lambda: None
        self.changes = ChangeSet()
        self.ensure_default_queues()
        self.changes.meta["server_id"] = self.server_id

    def ensure_default_queues(self) -> None:
        """``root`` and ``default`` exist in every state (a new one, and a leader taking over a
        store no leader has written to yet)."""
        for name, parent in (("root", ""), ("default", "root")):
            if name not in self.queues:
                self.put_queue(validate.normalize_queue(pb.Queue(name=name, parent=parent)))

    # -- restore and commit -------------------------------------------------------------------

    def restore(self, stored: StoredState) -> None:
        """Rebuild from the store (on an empty state, before serving)."""
        meta = stored.meta
        self.changes.meta.clear()
        if "server_id" in meta:
            self.server_id = meta["server_id"]
        else:
            self.changes.meta["server_id"] = self.server_id
        self.next_cycle_id = int(meta.get("next_cycle_id", 1))
        self.next_creation_index = int(meta.get("next_creation_index", 1))
        self.decisions.next_id = max(self.decisions.next_id, int(meta.get("next_decision_id", 1)))
        for name, blob in sorted(stored.queues.items()):
            q = pb.Queue.FromString(blob)
            self.queues[name] = QueueEntry(q, convert.queue_to_model(q))
        for job in stored.jobs:
            rec = record_from_stored(job)
            self.index_job(rec)
            self.next_creation_index = max(self.next_creation_index, job.creation_index + 1)
        ended = sorted(
            (r.status.finish_time, r.creation_index, r.id)
            for r in self.jobs.values()
            if not r.active
        )
        self.finished.update((job_id, None) for _t, _i, job_id in ended)
        for b in stored.backends:
            self.backends[b.name] = b
        self.decisions.restore(stored.pending_decisions, self.clock())

    def reset(self) -> None:
        """Forget everything (back to a new state's empty tables), keeping the hooks and the
        WatchJobs hub: a server that lost its lease reloads from the store with ``restore``."""
        self.decisions.clear()
        for table in (self.backends, self.nodes, self.queues, self.active_jobs, self.finished):
            table.clear()
        dict.clear(self.jobs)
        for index in (self.tasks, self.task_job, self.foreign):
            index.clear()
        self.changes.clear()
        self.next_cycle_id = 1
        self.next_creation_index = 1

    def forget_changes(self) -> None:
        """Drop what is marked to write (a follower's state mirrors the store and writes nothing)."""
        self.changes.clear()
        self.decisions.forget_unwritten()

    def absorb(
        self,
        *,
        meta: Mapping[str, str],
        queues: Mapping[str, bytes | None],
        jobs: Iterable[StoredJob],
        tasks: Iterable[TaskRecord],
        decisions: Iterable[DecisionRow],
        backends: Iterable[BackendRecord],
    ) -> None:
        """A follower applies rows the leader wrote (the store's change feed) to its copy: nothing
        is marked changed (a follower writes nothing) and WatchJobs subscribers see the job events.
        Nodes are not in the store: a follower has none until it leads and backends re-register."""
        if "server_id" in meta:
            self.server_id = meta["server_id"]
        self.next_cycle_id = max(self.next_cycle_id, int(meta.get("next_cycle_id", 1)))
        self.next_creation_index = max(
            self.next_creation_index, int(meta.get("next_creation_index", 1))
        )
        self.decisions.next_id = max(self.decisions.next_id, int(meta.get("next_decision_id", 1)))
        for name, blob in queues.items():
            if blob is None:
                self.queues.pop(name, None)
            else:
                q = pb.Queue.FromString(blob)
                self.queues[name] = QueueEntry(q, convert.queue_to_model(q))
        events: dict[str, int] = {}
        for job in jobs:
            rec = dict.get(self.jobs, job.id)
            if rec is None:
                rec = record_from_stored(job, template=False)
                self.index_job(rec)
                self.next_creation_index = max(self.next_creation_index, job.creation_index + 1)
                events[job.id] = pb.JobEvent.TYPE_ADDED
            else:
                rec.status = job.status
                events.setdefault(job.id, pb.JobEvent.TYPE_MODIFIED)
        for task in tasks:
            job_rec = self.task_job.get(task.uid)
            if job_rec is None:
                continue  # a job this copy dropped (finished past the retention): the store has it
            for i, old in enumerate(job_rec.tasks):
                if old.uid == task.uid:
                    job_rec.tasks[i] = task
                    break
            self.tasks[task.uid] = task
            events.setdefault(job_rec.id, pb.JobEvent.TYPE_MODIFIED)
        for job_id in events:
            rec = dict.get(self.jobs, job_id)
            if rec is None:
                continue
            if rec.active:
                self.active_jobs[job_id] = rec
            else:
                self.active_jobs.pop(job_id, None)
                self.finished[job_id] = None
        self.decisions.absorb(decisions)
        for b in backends:
            self.backends[b.name] = b
        if events and self.watch:
            for job_id, kind in events.items():
                if job_id in self.jobs:
                    self.watch.publish(pb.JobEvent(type=kind, job=job_proto(self.jobs[job_id])))  # type: ignore[arg-type]

    def commit(self) -> WriteBatch:
        """The change set -> a WriteBatch (rows serialized now); publishes pending WatchJobs events."""
        changes = self.changes
        batch = WriteBatch()
        if self.decisions.counter_dirty:
            changes.meta["next_decision_id"] = str(self.decisions.next_id)
            self.decisions.counter_dirty = False
        batch.meta = dict(changes.meta)
        for name in changes.queues:
            if name in self.queues:
                batch.queues[name] = self.queues[name].proto.SerializeToString()
        batch.deleted_queues = set(changes.deleted_queues)
        for job_id in changes.jobs:
            rec = self.jobs[job_id]
            st = rec.status
            batch.jobs[job_id] = (
                job_id,
                rec.creation_index,
                rec.spec_bytes,
                st.to_json(),
                rec.spec.queue,
                rec.spec.namespace,
                st.phase,
                st.finish_time,
                rec.spec.owner,
            )
            if not rec.active:
                self.active_jobs.pop(job_id, None)
                self.finished[job_id] = None
        for uid in changes.tasks:
            batch.tasks[uid] = self.tasks[uid].row()
        for row in self.decisions.drain_rows():
            batch.decisions[row[0]] = row
        held = self.decisions.take_unsent()
        if held:
            batch.after_write.append(lambda: self.decisions.release(held))
        for name in changes.backends:
            b = self.backends[name]
            batch.backends[name] = (b.name, b.kind, json.dumps(b.labels), b.last_decision_id)
        if changes.events and self.watch:
            for job_id, kind in changes.events.items():
                if job_id in self.jobs:
                    self.watch.publish(pb.JobEvent(type=kind, job=job_proto(self.jobs[job_id])))  # type: ignore[arg-type]
        changes.clear()
        return batch

    def commit_and_drop_finished(self) -> WriteBatch:
        """``commit()``, then ``drop_finished`` for the jobs this batch does not touch.

        For ``StoreWriter.flush``: it drains under the writer's lock, when every earlier batch has
        been written, so a job dropped here has its final rows in the store; the jobs in this very
        batch wait for the next call (their rows are not written yet)."""
        batch = self.commit()
        pending = set(batch.jobs)
        for uid in batch.tasks:
            job = self.task_job.get(uid)
            if job is not None:
                pending.add(job.id)
        self.drop_finished(keep=pending)
        return batch

    def drop_finished(self, now: float | None = None, keep: Set[str] = frozenset()) -> list[str]:
        """Remove from memory (not from the store) the jobs finished ``retention`` seconds ago or
        more whose tasks hold no node and have no decision pending, and that have no change still
        to commit (nor are in ``keep``). Returns their ids."""
        if self.archive is None:
            return []  # without a store to answer from, forgetting a job would lose it
        now = self.clock() if now is None else now
        cutoff = now - self.retention
        leaving: list[JobRecord] = []
        busy: set[str] | None = None  # tasks with a decision pending; computed once, if needed
        for job_id in self.finished:
            rec = dict.get(self.jobs, job_id)  # memory only
            if rec is None:
                continue
            if rec.status.finish_time > cutoff:
                break  # the rest finished later
            if busy is None:
                busy = {p.row.task_id for p in self.decisions.pending.values()}
            if job_id in keep or not self._droppable(rec, busy):
                continue  # an unacknowledged eviction or an unwritten change: a later call
            leaving.append(rec)
        dropped: list[str] = []
        for rec in leaving:
            del self.finished[rec.id]
            del self.jobs[rec.id]
            for t in rec.tasks:
                self.tasks.pop(t.uid, None)
                self.task_job.pop(t.uid, None)
            dropped.append(rec.id)
        if dropped:
            log.debug("jobs.left_memory", count=len(dropped), retention=self.retention)
        return dropped

    @property
    def archive(self) -> JobArchive | None:
        return self.jobs.archive

    def _droppable(self, rec: JobRecord, busy: Set[str]) -> bool:
        changes = self.changes
        if rec.id in changes.jobs or rec.id in changes.events:
            return False
        for t in rec.tasks:
            if (
                t.uid in changes.tasks
                or t.uid in busy
                or (t.status not in ENDED and t.status != TaskStatus.PENDING)
            ):
                return False
        return True

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

    def index_job(self, rec: JobRecord) -> None:
        self.jobs[rec.id] = rec
        if rec.active:
            self.active_jobs[rec.id] = rec
        for t in rec.tasks:
            self.tasks[t.uid] = t
            self.task_job[t.uid] = rec

    def put_queue(self, q: pb.Queue) -> None:
        self.queues[q.name] = QueueEntry(q, convert.queue_to_model(q))
        self.changes.queues.add(q.name)
        self.changes.deleted_queues.discard(q.name)

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
        if new == TaskStatus.FAILED and self.restart_leader(job, rec, message, exit_code):
            return
        rec.status = new
        if node:
            rec.node = node
        rec.backend = backend
        if message:
            rec.message = message
        if new in (TaskStatus.SUCCEEDED, TaskStatus.FAILED):
            rec.exit_code = exit_code
        self.changes.tasks.add(rec.uid)
        keep = (
            job.spec.HasField("tyjob")
            and job.spec.tyjob.clean_pod_policy == "None"
            and not job.status.cancelled
        )
        if not job.active and new in PLACED and not keep:
            # Still running for a job that is over (cancelled, failed): stop it.
            self.evict(rec, "cancel" if job.status.cancelled else "job-finished", 0)

    def restart_leader(self, job: JobRecord, rec: TaskRecord, message: str, exit_code: int) -> bool:
        """TY-Arranger: a TYJob's failed Leader starts again (back to Pending) while the job's
        restartLimit allows; True when it was restarted."""
        spec = job.spec
        if not spec.HasField("tyjob") or rec.role != spec.tyjob.leader_role or not job.active:
            return False
        if job.status.leader_restarts >= spec.tyjob.restart_limit:
            return False
        job.status.leader_restarts += 1
        self.changes.job_modified(job.id)
        why = message or f"exit code {exit_code}"
        log.info(
            "tyjob.leader_restart",
            job=job.id,
            restart=job.status.leader_restarts,
            limit=spec.tyjob.restart_limit,
        )
        self.to_pending(
            rec,
            f"Leader failed ({why}); restart {job.status.leader_restarts} of {spec.tyjob.restart_limit}",
        )
        return True

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
        rec.status = TaskStatus.PENDING
        rec.node = None
        rec.devices = []
        rec.message = why
        self.changes.tasks.add(rec.uid)
        job = self.task_job[rec.uid]
        if job.active:
            self.gang_check(job)

    def released(self, rec: TaskRecord) -> None:
        job = self.task_job[rec.uid]
        if job.status.cancelled:
            rec.status = TaskStatus.CANCELLED
            rec.message = "cancelled: stopped"
        elif not job.active:
            rec.status = TaskStatus.FAILED
        else:
            rec.status = TaskStatus.PENDING
            rec.node = None
            rec.devices = []
        self.changes.tasks.add(rec.uid)
        if job.active:
            self.gang_check(job)

    def gang_check(self, job: JobRecord) -> None:
        """All or nothing: if fewer than min_member tasks remain placed, release the rest too."""
        placed = [t for t in job.tasks if t.status in PLACED]
        if not placed:
            return
        succeeded = sum(1 for t in job.tasks if t.status == TaskStatus.SUCCEEDED)
        if len(placed) + succeeded >= job.min_member:
            return
        for t in placed:
            self.evict(t, "gang-broken", 0)
        job.status.sched_phase = PodGroupPhase.INQUEUE
        self.changes.jobs.add(job.id)

    def bind(
        self, job: JobRecord, rec: TaskRecord, node: str, devices: list[str], cycle_id: int
    ) -> None:
        """Pending -> Binding on ``node``, and the bind decision to the node's backend."""
        entry = self.nodes[node]
        rec.status = TaskStatus.BINDING
        rec.node = node
        rec.backend = entry.spec.backend
        rec.devices = list(devices)
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
        """The job's phase from its tasks (terminal phases stay)."""
        st = job.status
        if is_terminal_phase(st.phase):
            return
        n = len(job.tasks)
        counts = Counter(t.status for t in job.tasks)
        succeeded, failed = counts[TaskStatus.SUCCEEDED], counts[TaskStatus.FAILED]
        placed = sum(counts[s] for s in ALLOCATED) + succeeded
        ty = job.spec.tyjob if job.spec.HasField("tyjob") else None
        leader = (
            next((t.status for t in job.tasks if t.role == ty.leader_role), None) if ty else None
        )
        if leader == TaskStatus.SUCCEEDED:  # TY-Arranger: the Leader's success ends the job
            phase = pb.JOB_PHASE_COMPLETED
        elif leader == TaskStatus.FAILED:  # restarts spent (restart_leader)
            phase = pb.JOB_PHASE_FAILED
        elif succeeded + failed == n and succeeded >= job.min_member:
            phase = pb.JOB_PHASE_COMPLETED
        elif n - failed < job.min_member:
            phase = pb.JOB_PHASE_FAILED
        elif placed >= job.min_member:
            phase = pb.JOB_PHASE_RUNNING
        elif st.sched_phase in (PodGroupPhase.INQUEUE, PodGroupPhase.RUNNING):
            phase = pb.JOB_PHASE_INQUEUE
        else:
            phase = pb.JOB_PHASE_PENDING
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
            # A TYJob's cleanPodPolicy None leaves its pods running; Running and All stop them.
            keep = ty is not None and ty.clean_pod_policy == "None"
            if (phase == pb.JOB_PHASE_FAILED or ty is not None) and not keep:
                for t in job.tasks:
                    if t.status in PLACED:
                        self.evict(
                            t, "job-failed" if phase == pb.JOB_PHASE_FAILED else "job-finished", 0
                        )
            self.set_ended(job, ended_summary(job, phase))
            log.info("job.finished", job=job.id, phase=pb.JobPhase.Name(phase))
        self.changes.job_modified(job.id)

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
        mislead)."""
        now = self.clock()
        reason = pb.JobPhase.Name(job.status.phase).removeprefix("JOB_PHASE_").capitalize()
        kept = []
        for c in job.status.conditions:
            if c.type in ("Unschedulable", "Scheduled"):
                c = ConditionRecord(
                    c.type,
                    "False",
                    reason,
                    "",
                    c.cycle_id,
                    now if c.status != "False" else c.transition_time,
                )
            if c.type != "Ended":
                kept.append(c)
        job.status.conditions = [*kept, ConditionRecord("Ended", "True", reason, message, 0, now)]


def queue_allocated(state: ClusterState) -> dict[str, dict[str, float]]:
    """Per queue, the resources (canonical units) its active jobs' placed tasks hold now: ListQueues'
    allocation and the dashboard's history both read it."""
    allocated: dict[str, dict[str, float]] = {n: {} for n in state.queues}
    for rec in state.active_jobs.values():  # finished jobs count nowhere here
        alloc = allocated.get(rec.spec.queue)
        if not rec.active or alloc is None:
            continue
        for t, tmpl in zip(rec.tasks, rec.template.tasks, strict=True):
            if t.status in ALLOCATED:
                for r, v in tmpl.request.items():
                    alloc[r] = alloc.get(r, 0.0) + v
    return allocated


def ended_summary(job: JobRecord, phase: int) -> str:
    """Which tasks of an ended job ended how, in a line: "4/4 tasks succeeded", "task j/w-1 failed
    (exit code 2); 3 succeeded; the gang needs 4", "cancelled: 2 tasks stopped, 3 never placed"."""
    counts = Counter(t.status for t in job.tasks)
    n = len(job.tasks)
    if job.status.cancelled:
        stopped = sum(
            1
            for t in job.tasks
            if t.status == TaskStatus.RELEASING
            or (t.status == TaskStatus.CANCELLED and t.message.startswith("cancelled:"))
        )
        never = sum(
            1
            for t in job.tasks
            if t.status == TaskStatus.CANCELLED and not t.message.startswith("cancelled:")
        )
        parts = [f"{stopped} task{'s' * (stopped != 1)} stopped"] if stopped else []
        parts += [f"{never} never placed"] if never else []
        done = counts[TaskStatus.SUCCEEDED]
        parts += [f"{done} had succeeded"] if done else []
        return "cancelled" + (": " + ", ".join(parts) if parts else "")
    failed = [t for t in job.tasks if t.status == TaskStatus.FAILED]
    if phase == pb.JOB_PHASE_COMPLETED and not failed:
        return f"{counts[TaskStatus.SUCCEEDED]}/{n} tasks succeeded"
    parts = []
    for t in failed[:3]:
        why = t.message or (f"exit code {t.exit_code}" if t.exit_code else "failed")
        parts.append(f"task {t.uid} failed ({why})")
    if len(failed) > 3:
        parts.append(f"{len(failed) - 3} more failed")
    parts.append(f"{counts[TaskStatus.SUCCEEDED]}/{n} succeeded")
    if phase == pb.JOB_PHASE_FAILED and job.spec.HasField("tyjob"):
        parts.append(f"the Leader failed after {job.status.leader_restarts} restarts")
    elif phase == pb.JOB_PHASE_FAILED:
        parts.append(f"the gang needs {job.min_member}")
    return "; ".join(parts)


def record_from_stored(job: StoredJob, *, template: bool = True) -> JobRecord:
    """A job's record as the store has it (spec, status and the stored task rows); ``template``
    False leaves the core's view to be built if ever used (a read-only answer never does)."""
    rec = new_job_record(
        pb.JobSpec.FromString(job.spec), job.creation_index, job.status, template=template
    )
    by_uid = {t.uid: t for t in job.tasks}
    for i, t in enumerate(rec.tasks):
        if t.uid in by_uid:
            rec.tasks[i] = by_uid[t.uid]
    return rec


def new_job_record(
    spec: pb.JobSpec, creation_index: int, status: JobStatusRecord, *, template: bool = True
) -> JobRecord:
    """A job's record from its normalized spec, one pending task per replica; the core's view of
    it (``template``) built now unless asked not to."""
    tasks = []
    for tg in spec.task_groups:
        for i in range(tg.replicas):
            tasks.append(TaskRecord(convert.task_uid(spec.id, tg.role, i), spec.id, tg.role, i))
    rec = JobRecord(
        spec=spec,
        spec_bytes=spec.SerializeToString(deterministic=True),
        creation_index=creation_index,
        tasks=tasks,
        status=status,
        groups={tg.role: tg for tg in spec.task_groups},
    )
    if template:
        rec._template, rec.refusal = convert.checked_job_to_model(spec, creation_index)
    return rec
