"""The cluster state's tables and their rows in and out of the store.

``StateTables`` holds the records (``server.service.records``) of backends, nodes, queues, jobs,
tasks and foreign work with the decision log and the WatchJobs hub, and moves them to and from the
store: ``restore`` rebuilds them from it, ``commit`` turns what changed (``changes``, a
``ChangeSet``) into one ``WriteBatch`` and publishes the job events it collected, ``absorb`` is a
follower applying the rows its leader wrote (the store's change feed), ``reset`` and
``forget_changes`` empty them for a reload. The lifecycle transitions that change the records are
``server.service.state.ClusterState``'s, built on these tables.
"""

from __future__ import annotations

import bisect
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from muster.gang import gang_minimum
from muster.v1 import muster_pb2 as pb
from server.service import convert
from server.service.decisions import DecisionLog, JobWatchHub
from server.service.records import (
    BackendRecord,
    DecisionRow,
    ForeignTask,
    JobRecord,
    JobStatusRecord,
    NodeEntry,
    QueueEntry,
    TaskRecord,
    fresh_tasks,
)
from server.service.store import JobArchive, StoredJob, StoredState, WriteBatch
from server.service.views import job_proto
from server.service.waiting import WaitingIndex

_V = TypeVar("_V")


class TaskIndex(dict[str, _V]):
    """Tasks (or their jobs) by task uid. A job's tasks are indexed when they are built
    (``JobRecord._tasks``): asked for a task of a job whose tasks are not built, the index
    builds them, which indexes them, and answers."""

    def __init__(self, jobs: dict[str, JobRecord]) -> None:
        super().__init__()
        self._jobs = jobs

    def _built(self, uid: str) -> bool:
        """Build the tasks of the job ``uid`` names (``<job id>/<role>-<index>``), if not yet;
        whether ``uid`` is indexed then."""
        rec = dict.get(self._jobs, uid.rpartition("/")[0])
        if rec is None or rec.tasks_built:
            return False
        rec.tasks  # noqa: B018 - builds and indexes them
        return dict.__contains__(self, uid)

    def __missing__(self, uid: str) -> _V:
        if self._built(uid):
            return dict.__getitem__(self, uid)
        raise KeyError(uid)

    def get(self, uid: str, default: _V | None = None) -> _V | None:  # type: ignore[override]
        found = dict.get(self, uid)
        if found is None and self._built(uid):
            found = dict.get(self, uid)
        return found if found is not None else default

    def __contains__(self, uid: object) -> bool:
        return dict.__contains__(self, uid) or (isinstance(uid, str) and self._built(uid))


class JobTable(dict[str, JobRecord]):
    """The jobs in memory, in creation order: the active ones and those finished within the
    retention. ``get`` reads through to the archive (the store) for a job that left memory, so a
    lookup by id sees every job; ``[]``, ``in``, ``len`` and iteration see memory only.

    A record read from the archive is a detached, read-only copy (its job is over): nothing
    indexes it, and changing it changes nothing.

    ``created_after`` starts at a creation index in O(log n) (a page of ListJobs, a chunk of
    WatchJobs' initial events), from a sorted index kept beside the dict: set an item, delete
    one and ``clear`` keep it (the dict's other mutators are not used on the table).
    """

    def __init__(self) -> None:
        super().__init__()
        self.archive: JobArchive | None = None
        self._order: list[tuple[int, str]] = []  # (creation index, id), ascending

    def __setitem__(self, key: str, rec: JobRecord) -> None:
        old = super().get(key)
        if old is not None:
            self._unindex(old.creation_index, key)
        entry = (rec.creation_index, key)
        if not self._order or self._order[-1] < entry:
            self._order.append(entry)  # the usual case: a new job is the newest
        else:
            bisect.insort(self._order, entry)
        super().__setitem__(key, rec)

    def __delitem__(self, key: str) -> None:
        self._unindex(self[key].creation_index, key)
        super().__delitem__(key)

    def clear(self) -> None:
        self._order.clear()
        super().clear()

    def _unindex(self, creation_index: int, key: str) -> None:
        i = bisect.bisect_left(self._order, (creation_index, key))
        del self._order[i]

    def created_after(self, creation_index: int) -> Iterator[JobRecord]:
        """The jobs in memory created after ``creation_index``, in creation order (the table must
        not change while this is iterated)."""
        order = self._order
        for i in range(bisect.bisect_right(order, (creation_index, "\U0010ffff")), len(order)):
            yield self[order[i][1]]

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


class StateTables:
    """The records, indexed, and their rows in and out (the module's docstring)."""

    def __init__(
        self,
        decisions: DecisionLog | None = None,
        *,
        clock: Callable[[], float] = time.time,
        archive: JobArchive | None = None,
    ) -> None:
        self.clock = clock
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
        # order of their finish times): what retention.drop_finished looks at, oldest first.
        self.finished: dict[str, None] = {}
        # By uid; a task of a job whose tasks are not built yet is found by building them.
        self.tasks: TaskIndex[TaskRecord] = TaskIndex(self.jobs)
        self.task_job: TaskIndex[JobRecord] = TaskIndex(self.jobs)
        self._index_tasks_hook = self._index_tasks  # (one bound method for every record)
        # Job arrays: array id -> its elements in memory, by id, in creation (= index) order.
        self.arrays: dict[str, dict[str, JobRecord]] = {}
        self.foreign: dict[str, ForeignTask] = {}  # key "<backend>/<task id>"
        self.next_cycle_id = 1
        self.next_creation_index = 1
        self.changes = ChangeSet()
        # The waiting jobs of each queue in queue order, kept between cycles (the queue window).
        self.waiting = WaitingIndex()
        self.waiting.on_filed = self.compact_job

    @property
    def archive(self) -> JobArchive | None:
        return self.jobs.archive

    def index_job(self, rec: JobRecord) -> None:
        self.jobs[rec.id] = rec
        self.waiting.touch(rec.id)
        if rec.active:
            self.active_jobs[rec.id] = rec
        if rec.array_job_id:
            self.arrays.setdefault(rec.array_job_id, {})[rec.id] = rec
        if rec.tasks_built:
            self._index_tasks(rec)
        else:  # indexed when first built
            rec.on_tasks_built = self._index_tasks_hook

    def compact_job(self, rec: JobRecord) -> None:
        """A job the waiting index filed (it waits whole, nothing decided about it but its
        place) holds only what a restart would give it: its spec serialized, no template, and no
        task objects while they are as submitted. Built again when used (a cycle that opens it,
        a view): a million jobs submitted to a running server weigh what they weigh after a
        restart."""
        tasks = rec.built_tasks()
        if tasks and all(_as_submitted(t) for t in tasks):
            for t in tasks:
                dict.pop(self.tasks, t.uid, None)
                dict.pop(self.task_job, t.uid, None)
            rec.release_tasks(self._index_tasks_hook)
        rec.release_views()

    def _index_tasks(self, rec: JobRecord) -> None:
        for t in rec.built_tasks():
            self.tasks[t.uid] = t
            self.task_job[t.uid] = rec

    def restore(self, stored: StoredState) -> None:
        """Rebuild from the store (on an empty state, before serving). Consumes ``stored.jobs``:
        each stored job is let go once its record is built, so a restart of a million jobs does
        not hold both forms of every job at its peak."""
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
        jobs = stored.jobs
        jobs.reverse()  # (taken from the end, in the stored order)
        while jobs:
            job = jobs.pop()
            # The core's view of each job is built when first used (a cycle's window, usage): a
            # restart of a million waiting jobs builds the few a cycle opens, not a million.
            rec = record_from_stored(job, template=False)
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
        self.waiting.touch_all()

    def reset(self) -> None:
        """Forget everything (back to a new state's empty tables), keeping the hooks and the
        WatchJobs hub: a server that lost its lease reloads from the store with ``restore``."""
        self.decisions.clear()
        for table in (self.backends, self.nodes, self.queues, self.active_jobs, self.finished):
            table.clear()
        self.jobs.clear()
        for index in (self.tasks, self.task_job, self.foreign, self.arrays):
            index.clear()
        self.changes.clear()
        self.waiting.clear()
        self.next_cycle_id = 1
        self.next_creation_index = 1

    def touch_changed_jobs(self) -> None:
        """Tell the waiting index which jobs changed (a job, or one of its tasks) since the last
        commit: everything that changes a job is in the change set, as the store must write it."""
        waiting, task_job = self.waiting, self.task_job
        for job_id in self.changes.jobs:
            waiting.touch(job_id)
        for uid in self.changes.tasks:
            job = task_job.get(uid)
            if job is not None:
                waiting.touch(job.id)

    def jobs_that_may_hold(self) -> Iterable[JobRecord]:
        """The active jobs that may hold something (a task not Pending): with the queue window's
        index filed, the jobs it did not file (a million waiting jobs are not walked); else every
        active job. For the passes over holding jobs (time limits each second, allocations)."""
        self.touch_changed_jobs()
        ids = self.waiting.unfiled()
        if ids is None:
            return list(self.active_jobs.values())
        found = (dict.get(self.jobs, job_id) for job_id in ids)
        return [rec for rec in found if rec is not None and rec.active]

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
            task.read_legacy_shared_gpu(job_rec.groups[task.role].gpu_fraction)
            for i, old in enumerate(job_rec.tasks):
                if old.uid == task.uid:
                    job_rec.tasks[i] = task
                    break
            self.tasks[task.uid] = task
            events.setdefault(job_rec.id, pb.JobEvent.TYPE_MODIFIED)
        for job_id in events:
            self.waiting.touch(job_id)
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
        self.touch_changed_jobs()
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
                rec.queue,
                rec.namespace,
                st.phase,
                st.finish_time,
                rec.owner,
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


def record_from_stored(job: StoredJob, *, template: bool = True) -> JobRecord:
    """A job's record as the store has it (spec, status and the stored task rows); ``template``
    False leaves the core's view to be built if ever used (a read-only answer never does), and
    its spec parsed again when used. Tasks stored as they were submitted (every one Pending, no
    row or an untouched one) are not built (``JobRecord._tasks``)."""
    spec = pb.JobSpec.FromString(job.spec)
    tasks: list[TaskRecord] | None = None
    if any(not _as_submitted(t) for t in job.tasks):
        by_uid = {t.uid: t for t in job.tasks}
        fraction = {tg.role: tg.gpu_fraction for tg in spec.task_groups}
        tasks = [by_uid.get(t.uid, t) for t in fresh_tasks(spec)]
        for t in tasks:
            t.read_legacy_shared_gpu(fraction[t.role])  # (nothing to read in a fresh one)
    rec = new_job_record(
        spec,
        job.creation_index,
        job.status,
        template=template,
        spec_bytes=job.spec,  # (what was stored is the spec's deterministic serialization)
        tasks=tasks,
    )
    if not template:
        rec.release_views()  # its spec parsed again when used (see JobRecord._spec)
    return rec


def _as_submitted(task: TaskRecord) -> bool:
    """A stored task row that says nothing a fresh Pending task would not."""
    return task == TaskRecord(task.uid, task.job_id, task.role, task.index)


def new_job_record(
    spec: pb.JobSpec,
    creation_index: int,
    status: JobStatusRecord,
    *,
    template: bool = True,
    spec_bytes: bytes | None = None,
    tasks: list[TaskRecord] | None = None,
) -> JobRecord:
    """A job's record from its normalized spec: ``tasks`` (one per replica in order), else each
    Pending as submitted, built when first asked; the core's view of it (``template``) built now
    unless asked not to."""
    task_count = sum(tg.replicas for tg in spec.task_groups)
    rec = JobRecord(
        id=spec.id,
        _spec=spec,
        spec_bytes=spec_bytes
        if spec_bytes is not None
        else spec.SerializeToString(deterministic=True),
        creation_index=creation_index,
        status=status,
        task_count=task_count,
        queue=sys.intern(spec.queue),
        namespace=sys.intern(spec.namespace),
        owner=sys.intern(spec.owner),
        min_member=gang_minimum(spec.min_member, task_count),
        array_job_id=spec.array_job_id,
        controlled=bool(spec.depends_on) or bool(spec.array_job_id),
        _tasks=tasks,
    )
    if template:
        rec._template, rec.refusal = convert.checked_job_to_model(spec, creation_index)
    return rec
