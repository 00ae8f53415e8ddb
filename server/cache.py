"""The cluster cache: the server's in-memory state of nodes, queues, jobs, tasks and decisions.

All methods are synchronous and run on the event loop, so each one is atomic with respect to the
others. Every mutating method validates its whole request first (raising ``ApiError``) and only
then changes state, so a rejected request changes nothing. Changes are tracked as dirty records;
``commit()`` turns them into one ``WriteBatch`` for the store and publishes WatchJobs events.

A cycle works on ``capture()`` (cheap, on the loop) -> ``Capture.materialize()`` (deep copy, in a
worker thread) -> ``SchedulerCore.run_cycle`` (worker thread) -> ``apply()`` (on the loop), which
drops whatever changed in between (job cancelled, node removed, task no longer pending).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from muster.v1 import muster_pb2 as pb
from server import model
from server.api import convert, validate
from server.api.errors import already_exists, invalid, not_found, precondition
from server.api.views import (
    decode_page_token,
    encode_page_token,
    is_terminal_phase,
    job_proto,
    node_view,
)
from server.decisions import DecisionLog, JobWatchHub, Subscriber
from server.model import ALLOCATED, OCCUPYING, PodGroupPhase, TaskStatus
from server.store import (
    BackendRecord,
    ConditionRecord,
    JobStatusRecord,
    StoredState,
    TaskRecord,
    WriteBatch,
)

log = structlog.get_logger("muster.cache")

# Placed on a node by Muster and not yet released.
PLACED = frozenset({TaskStatus.BINDING, TaskStatus.BOUND, TaskStatus.RUNNING})
# Statuses a backend may hold a task in (it knows about it).
ON_BACKEND = frozenset({TaskStatus.BOUND, TaskStatus.RUNNING, TaskStatus.RELEASING})


@dataclass(slots=True)
class NodeEntry:
    proto: pb.Node
    spec: model.NodeSpec  # immutable once built: replaced on every change


@dataclass(slots=True)
class QueueEntry:
    proto: pb.Queue
    spec: model.QueueSpec


@dataclass(slots=True)
class ForeignTask:
    backend: str
    spec: model.TaskSpec  # status RUNNING on spec.node


@dataclass(eq=False)
class JobRecord:
    spec: pb.JobSpec  # normalized
    spec_bytes: bytes  # deterministic serialization: identity for idempotent resubmission
    template: model.JobSpec  # never mutated; tasks aligned with ``tasks``
    creation_index: int
    tasks: list[TaskRecord]
    status: JobStatusRecord
    groups: dict[str, pb.TaskGroup] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def min_member(self) -> int:
        return self.spec.min_member or len(self.tasks)

    @property
    def active(self) -> bool:
        return not is_terminal_phase(self.status.phase)


@dataclass
class Capture:
    """What a cycle sees, captured on the event loop; ``materialize`` deep-copies it (in a thread)."""

    cycle_id: int
    nodes: list[model.NodeSpec]
    queues: list[model.QueueSpec]
    jobs: list[tuple[JobRecord, PodGroupPhase, list[tuple[TaskStatus, str | None]]]]
    foreign: list[model.TaskSpec]
    priority_classes: dict[str, model.PriorityClass]

    def materialize(self) -> model.ClusterSnapshot:
        jobs = []
        for rec, phase, states in self.jobs:
            tmpl = rec.template
            tasks = [_copy_task(t, status, node) for t, (status, node) in zip(tmpl.tasks, states, strict=True)]
            jobs.append(
                model.JobSpec(
                    uid=tmpl.uid,
                    name=tmpl.name,
                    namespace=tmpl.namespace,
                    queue=tmpl.queue,
                    tasks=tasks,
                    min_member=tmpl.min_member,
                    min_task_member=dict(tmpl.min_task_member),
                    min_resources=dict(tmpl.min_resources) if tmpl.min_resources else None,
                    priority=tmpl.priority,
                    priority_class=tmpl.priority_class,
                    preemptible=tmpl.preemptible,
                    phase=phase,
                    sub_groups=[model.SubGroupSpec(s.name, s.min_member) for s in tmpl.sub_groups],
                    network_topology=dict(tmpl.network_topology),
                    annotations=dict(tmpl.annotations),
                    creation_index=tmpl.creation_index,
                    created_at=rec.status.submit_time or None,  # sla's waiting time
                )
            )
        return model.ClusterSnapshot(
            nodes=[_copy_node(n) for n in self.nodes],
            queues=[_copy_queue(q) for q in self.queues],
            jobs=jobs,
            foreign_tasks=[_copy_task(t, t.status, t.node) for t in self.foreign],
            priority_classes={k: model.PriorityClass(v.name, v.value, v.preemption_policy, v.global_default)
                              for k, v in self.priority_classes.items()},
        )


def _copy_task(t: model.TaskSpec, status: TaskStatus, node: str | None) -> model.TaskSpec:
    return model.TaskSpec(
        uid=t.uid,
        name=t.name,
        namespace=t.namespace,
        job=t.job,
        request=dict(t.request),
        role=t.role,
        status=status,
        node=node,
        priority=t.priority,
        preemptable=t.preemptable,
        preemption_policy=t.preemption_policy,
        labels=dict(t.labels),
        annotations=dict(t.annotations),
        node_selector=dict(t.node_selector),
        tolerations=[model.Toleration(x.key, x.operator, x.value, x.effect) for x in t.tolerations],
        affinity=_deep(t.affinity) if t.affinity else {},
        sub_group=t.sub_group,
        gpu_groups=list(t.gpu_groups),
        creation_index=t.creation_index,
    )


def _copy_node(n: model.NodeSpec) -> model.NodeSpec:
    return model.NodeSpec(
        name=n.name,
        allocatable=dict(n.allocatable),
        labels=dict(n.labels),
        taints=[model.Taint(t.key, t.value, t.effect) for t in n.taints],
        unschedulable=n.unschedulable,
        ready=n.ready,
        backend=n.backend,
        devices=_deep(n.devices) if n.devices else [],
    )


def _copy_queue(q: model.QueueSpec) -> model.QueueSpec:
    return model.QueueSpec(
        name=q.name,
        parent=q.parent,
        weight=q.weight,
        guarantee=dict(q.guarantee),
        deserved=dict(q.deserved),
        capability=dict(q.capability),
        priority=q.priority,
        reclaimable=q.reclaimable,
        state=q.state,
        annotations=dict(q.annotations),
    )


def _deep(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep(v) for v in value]
    return value


@dataclass
class ApplyStats:
    binds: int = 0
    evictions: int = 0
    dropped_binds: int = 0
    dropped_evictions: int = 0


class ClusterCache:
    def __init__(self, decisions: DecisionLog | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.decisions = decisions or DecisionLog()
        self.watch = JobWatchHub()
        self.server_id = uuid.uuid4().hex
        self.backends: dict[str, BackendRecord] = {}
        self.nodes: dict[str, NodeEntry] = {}
        self.queues: dict[str, QueueEntry] = {}
        self.jobs: dict[str, JobRecord] = {}  # in creation order
        self.tasks: dict[str, TaskRecord] = {}
        self.task_job: dict[str, JobRecord] = {}
        self.foreign: dict[str, ForeignTask] = {}  # key "<backend>/<task id>"
        self.priority_classes: dict[str, model.PriorityClass] = {}
        self.next_cycle_id = 1
        self.next_creation_index = 1
        # Called on every change that may let a cycle do something new (the loop's wake()).
        self.on_change: Callable[[], None] = lambda: None
        self._dirty_jobs: set[str] = set()
        self._dirty_tasks: set[str] = set()
        self._dirty_queues: set[str] = set()
        self._deleted_queues: set[str] = set()
        self._dirty_backends: set[str] = set()
        self._dirty_meta: dict[str, str] = {}
        self._events: dict[str, int] = {}  # job id -> JobEvent type, published by commit()
        for name, parent in (("root", ""), ("default", "root")):
            self._put_queue(validate.normalize_queue(pb.Queue(name=name, parent=parent)))
        self._dirty_meta["server_id"] = self.server_id

    # =============================================================================================
    # Restore and commit
    # =============================================================================================

    def restore(self, state: StoredState) -> None:
        """Rebuild from the store (on an empty cache, before serving)."""
        meta = state.meta
        self._dirty_meta.clear()
        if "server_id" in meta:
            self.server_id = meta["server_id"]
        else:
            self._dirty_meta["server_id"] = self.server_id
        self.next_cycle_id = int(meta.get("next_cycle_id", 1))
        self.next_creation_index = int(meta.get("next_creation_index", 1))
        self.decisions.next_id = max(self.decisions.next_id, int(meta.get("next_decision_id", 1)))
        for name, blob in sorted(state.queues.items()):
            q = pb.Queue.FromString(blob)
            self.queues[name] = QueueEntry(q, convert.queue_to_model(q))
        for stored in state.jobs:
            spec = pb.JobSpec.FromString(stored.spec)
            rec = self._new_job_record(spec, stored.creation_index, stored.status)
            by_uid = {t.uid: t for t in stored.tasks}
            for i, t in enumerate(rec.tasks):
                if t.uid in by_uid:
                    rec.tasks[i] = by_uid[t.uid]
            self._index_job(rec)
            self.next_creation_index = max(self.next_creation_index, stored.creation_index + 1)
        for b in state.backends:
            self.backends[b.name] = b
        self.decisions.restore(state.pending_decisions, self.clock())

    def commit(self) -> WriteBatch:
        """Dirty state -> a WriteBatch (rows serialized now); publishes pending WatchJobs events."""
        batch = WriteBatch()
        if self.decisions.counter_dirty:
            self._dirty_meta["next_decision_id"] = str(self.decisions.next_id)
            self.decisions.counter_dirty = False
        batch.meta = dict(self._dirty_meta)
        self._dirty_meta.clear()
        for name in self._dirty_queues:
            if name in self.queues:
                batch.queues[name] = self.queues[name].proto.SerializeToString()
        batch.deleted_queues = set(self._deleted_queues)
        for job_id in self._dirty_jobs:
            rec = self.jobs[job_id]
            batch.jobs[job_id] = (job_id, rec.creation_index, rec.spec_bytes, rec.status.to_json())
        for uid in self._dirty_tasks:
            batch.tasks[uid] = self.tasks[uid].row()
        for row in self.decisions.drain_rows():
            batch.decisions[row[0]] = row
        for name in self._dirty_backends:
            b = self.backends[name]
            batch.backends[name] = (b.name, b.kind, json.dumps(b.labels), b.last_decision_id)
        self._dirty_queues.clear()
        self._deleted_queues.clear()
        self._dirty_jobs.clear()
        self._dirty_tasks.clear()
        self._dirty_backends.clear()
        if self._events:
            if self.watch:
                for job_id, kind in self._events.items():
                    if job_id in self.jobs:
                        self.watch.publish(pb.JobEvent(type=kind, job=job_proto(self.jobs[job_id])))  # type: ignore[arg-type]
            self._events.clear()
        return batch

    # =============================================================================================
    # Backends
    # =============================================================================================

    def register_backend(self, req: pb.RegisterBackendRequest) -> pb.RegisterBackendResponse:
        validate.check_name("name", req.name, "backend name")
        if not req.kind:
            raise invalid("kind: must not be empty (fake-agent | slurm | kubernetes)")
        validate.check_labels("labels", req.labels)
        rec = self.backends.get(req.name)
        if rec is None:
            rec = BackendRecord(req.name, req.kind, dict(req.labels))
            self.backends[req.name] = rec
        else:
            rec.kind, rec.labels = req.kind, dict(req.labels)
        self._dirty_backends.add(req.name)
        return pb.RegisterBackendResponse(
            name=req.name, server_id=self.server_id, last_decision_id=rec.last_decision_id
        )

    def require_backend(self, name: str, path: str = "backend") -> BackendRecord:
        if not name:
            raise invalid(f"{path}: must not be empty")
        rec = self.backends.get(name)
        if rec is None:
            raise precondition(f"{path}: backend {name!r} is not registered; call RegisterBackend first")
        return rec

    def _check_node_owner(self, path: str, name: str, backend: str) -> None:
        entry = self.nodes.get(name)
        if entry is not None and entry.spec.backend != backend:
            raise already_exists(f"{path}: node {name!r} belongs to backend {entry.spec.backend!r}")

    def sync_snapshot(self, req: pb.SyncSnapshotRequest) -> pb.SyncSnapshotResponse:
        backend = req.backend
        self.require_backend(backend)
        # --- validate everything ---
        new_nodes: dict[str, model.NodeSpec] = {}
        for i, node in enumerate(req.nodes):
            path = f"nodes[{i}]"
            validate.check_node(path, node)
            if node.name in new_nodes:
                raise invalid(f"{path}.name: duplicate node {node.name!r}")
            if node.backend and node.backend != backend:
                raise invalid(f"{path}.backend: {node.backend!r} differs from the request's backend {backend!r}")
            self._check_node_owner(f"{path}.name", node.name, backend)
            new_nodes[node.name] = convert.node_to_model(node, backend)
        reported: dict[str, tuple[pb.BackendTask, dict[str, float]]] = {}
        for i, task in enumerate(req.tasks):
            path = f"tasks[{i}]"
            request = validate.check_backend_task(path, task)
            if task.node not in new_nodes:
                raise invalid(f"{path}.node: {task.node!r} is not among this snapshot's nodes")
            if task.task_id in reported:
                raise invalid(f"{path}.task_id: duplicate task {task.task_id!r}")
            if task.status and task.status not in validate.REPORTABLE_TASK_STATUSES:
                raise invalid(f"{path}.status: a backend reports BOUND, RUNNING, SUCCEEDED or FAILED")
            reported[task.task_id] = (task, request)
        # --- apply ---
        touched: set[str] = set()
        for name in [n for n, e in self.nodes.items() if e.spec.backend == backend and n not in new_nodes]:
            touched |= self._remove_node(name, f"node {name} no longer reported by backend {backend}")
        for node in req.nodes:
            self.nodes[node.name] = NodeEntry(_with_backend(node, backend), new_nodes[node.name])
        for key in [k for k, f in self.foreign.items() if f.backend == backend]:
            del self.foreign[key]
        for task_id, (task, request) in reported.items():
            rec = self.tasks.get(task_id)
            if rec is None or task.foreign_task:
                # Ended work holds no capacity, whoever placed it.
                if task.status not in (pb.TASK_STATUS_SUCCEEDED, pb.TASK_STATUS_FAILED):
                    self._put_foreign(backend, task, request)
                continue
            touched.add(rec.job_id)
            self._backend_reports(rec, task.status or pb.TASK_STATUS_RUNNING, task.node, backend, "", 0)
            if list(task.devices):
                rec.devices = list(task.devices)
        # Muster tasks the backend should have and does not: lost.
        for rec in self.tasks.values():
            if rec.uid in reported or rec.status not in ON_BACKEND or rec.backend != backend:
                continue
            touched.add(rec.job_id)
            self._task_gone(rec, f"lost: not reported by backend {backend} at sync")
        for job_id in touched:
            self._after_task_change(self.jobs[job_id])
        log.info("backend.synced", backend=backend, nodes=len(new_nodes), tasks=len(reported))
        self.on_change()
        return pb.SyncSnapshotResponse(nodes=len(new_nodes), tasks=len(reported))

    def send_deltas(self, req: pb.SendDeltasRequest) -> pb.SendDeltasResponse:
        backend = req.backend
        self.require_backend(backend)
        # --- validate against a shadow of the node set (deltas apply in order) ---
        present = {n for n, e in self.nodes.items() if e.spec.backend == backend}
        parsed: list[Any] = []
        for i, delta in enumerate(req.deltas):
            path = f"deltas[{i}]"
            kind = delta.WhichOneof("change")
            if kind is None:
                raise invalid(f"{path}: empty delta (set one of node_upserted, node_removed, task_status, ...)")
            path = f"{path}.{kind}"
            if kind == "node_upserted":
                node = delta.node_upserted
                validate.check_node(path, node)
                self._check_node_owner(f"{path}.name", node.name, backend)
                present.add(node.name)
                parsed.append(convert.node_to_model(node, backend))
            elif kind == "node_removed":
                if delta.node_removed not in present:
                    raise not_found(f"{path}: node {delta.node_removed!r} does not exist on backend {backend!r}")
                present.discard(delta.node_removed)
                parsed.append(None)
            elif kind == "task_status":
                upd = delta.task_status
                if not upd.task_id:
                    raise invalid(f"{path}.task_id: must not be empty")
                if upd.task_id not in self.tasks:
                    raise not_found(f"{path}.task_id: task {upd.task_id!r} does not exist")
                if upd.status not in validate.REPORTABLE_TASK_STATUSES:
                    raise invalid(f"{path}.status: a backend reports BOUND, RUNNING, SUCCEEDED or FAILED")
                if upd.node and upd.node not in present:
                    raise not_found(f"{path}.node: node {upd.node!r} does not exist on backend {backend!r}")
                if not upd.node and self.tasks[upd.task_id].node is None and upd.status in (
                    pb.TASK_STATUS_BOUND, pb.TASK_STATUS_RUNNING
                ):
                    raise invalid(f"{path}.node: required for a task Muster has not placed")
                parsed.append(None)
            elif kind == "foreign_task_upserted":
                request = validate.check_backend_task(path, delta.foreign_task_upserted)
                if delta.foreign_task_upserted.node not in present:
                    raise not_found(
                        f"{path}.node: node {delta.foreign_task_upserted.node!r} does not exist on backend {backend!r}"
                    )
                parsed.append(request)
            else:  # foreign_task_removed: idempotent
                if not delta.foreign_task_removed:
                    raise invalid(f"{path}: must not be empty")
                parsed.append(None)
        # --- apply ---
        touched: set[str] = set()
        for delta, extra in zip(req.deltas, parsed, strict=True):
            kind = delta.WhichOneof("change")
            if kind == "node_upserted":
                self.nodes[delta.node_upserted.name] = NodeEntry(_with_backend(delta.node_upserted, backend), extra)
            elif kind == "node_removed":
                touched |= self._remove_node(delta.node_removed, f"node {delta.node_removed} removed by {backend}")
            elif kind == "task_status":
                upd = delta.task_status
                rec = self.tasks[upd.task_id]
                self._backend_reports(rec, upd.status, upd.node or rec.node, backend, upd.message, upd.exit_code)
                touched.add(rec.job_id)
            elif kind == "foreign_task_upserted":
                self._put_foreign(backend, delta.foreign_task_upserted, extra)
            else:
                self.foreign.pop(f"{backend}/{delta.foreign_task_removed}", None)
        for job_id in touched:
            self._after_task_change(self.jobs[job_id])
        if req.deltas:
            self.on_change()
        return pb.SendDeltasResponse(applied=len(req.deltas))

    def _put_foreign(self, backend: str, task: pb.BackendTask, request: dict[str, float]) -> None:
        self.foreign[f"{backend}/{task.task_id}"] = ForeignTask(
            backend,
            model.TaskSpec(
                uid=f"foreign:{backend}/{task.task_id}",
                name=task.task_id,
                namespace="",
                job="",
                request=request,
                status=TaskStatus.RUNNING,
                node=task.node,
            ),
        )

    def _backend_reports(
        self, rec: TaskRecord, status: int, node: str | None, backend: str, message: str, exit_code: int
    ) -> None:
        """A backend says where a task is and how it is doing."""
        new = TaskStatus(status)
        job = self.task_job[rec.uid]
        if rec.status == TaskStatus.RELEASING and new not in (TaskStatus.SUCCEEDED, TaskStatus.FAILED):
            return  # an eviction is under way; its ack settles the task
        if rec.status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED) and new not in (TaskStatus.SUCCEEDED, TaskStatus.FAILED):
            return  # an ended task does not come back
        if new == TaskStatus.BOUND and rec.status not in (TaskStatus.BINDING, TaskStatus.PENDING):
            return  # older news than what we know
        rec.status = new
        if node:
            rec.node = node
        rec.backend = backend
        if message:
            rec.message = message
        if new in (TaskStatus.SUCCEEDED, TaskStatus.FAILED):
            rec.exit_code = exit_code
        self._dirty_tasks.add(rec.uid)
        if not job.active and new in PLACED:
            # Still running for a job that is over (cancelled, failed): stop it.
            self._evict(rec, "cancel" if job.status.cancelled else "job-finished", 0)

    def _remove_node(self, name: str, why: str) -> set[str]:
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
            self._task_gone(rec, f"lost: {why}")
        return touched

    def _task_gone(self, rec: TaskRecord, why: str) -> None:
        """The task no longer exists on its node: releasing -> released, otherwise back to Pending."""
        if rec.status == TaskStatus.RELEASING:
            for p in self.decisions.pending_for_task(rec.uid):
                if p.row.kind == "evict":
                    self.decisions.settle(p.row.id, "applied", "task gone")
            self._released(rec)
        else:
            self._to_pending(rec, why)

    # =============================================================================================
    # Decisions: acks and expiry
    # =============================================================================================

    def check_acks(self, req: pb.AckDecisionsRequest) -> list[int]:
        """Validate an ack request; returns the ids that are not pending in memory (ask the store)."""
        self.require_backend(req.backend)
        missing = []
        for i, ack in enumerate(req.acks):
            if ack.decision_id == 0:
                raise invalid(f"acks[{i}].decision_id: must not be 0")
            pending = self.decisions.pending.get(ack.decision_id)
            if pending is None:
                if ack.decision_id not in self.decisions.recent:
                    missing.append(ack.decision_id)
            elif pending.row.backend != req.backend:
                raise not_found(f"acks[{i}].decision_id: decision {ack.decision_id} was not issued to {req.backend!r}")
        return missing

    def ack(
        self, req: pb.AckDecisionsRequest, settled: dict[int, tuple[str, str, bytes]]
    ) -> pb.AckDecisionsResponse:
        """Apply acks. ``settled``: id -> (backend, state, payload) from the store for non-pending ids."""
        def outcome(decision_id: int) -> tuple[str, str, bytes] | None:
            return self.decisions.recent.get(decision_id) or settled.get(decision_id)

        for i, ack in enumerate(req.acks):
            if ack.decision_id in self.decisions.pending:
                continue
            found = outcome(ack.decision_id)
            if found is None or found[0] != req.backend:
                raise not_found(f"acks[{i}].decision_id: no decision {ack.decision_id} for backend {req.backend!r}")
        accepted = 0
        for ack in req.acks:
            pending = self.decisions.pending.get(ack.decision_id)
            if pending is None:
                backend, state, payload = outcome(ack.decision_id)  # type: ignore[misc]
                if state == "expired" and ack.applied:
                    self._late_bind(pb.Decision.FromString(payload))
                accepted += 1
                continue
            row = pending.row
            self.decisions.settle(row.id, "applied" if ack.applied else "rejected", ack.reason)
            rec = self.tasks.get(row.task_id)
            accepted += 1
            if rec is None:
                continue
            node = pending.decision.bind.node if row.kind == "bind" else pending.decision.evict.node
            if row.kind == "bind":
                if rec.status != TaskStatus.BINDING or rec.node != node:
                    continue
                if ack.applied:
                    rec.status = TaskStatus.BOUND
                    rec.message = ""
                    self._dirty_tasks.add(rec.uid)
                else:
                    self._to_pending(rec, f"bind rejected by {req.backend}: {ack.reason or 'no reason given'}")
            elif rec.status == TaskStatus.RELEASING and rec.node == node:
                self._released(rec)
            self._after_task_change(self.task_job[rec.uid])
        if accepted:
            self.on_change()
        return pb.AckDecisionsResponse(accepted=accepted)

    def _late_bind(self, decision: pb.Decision) -> None:
        """A backend applied a bind after it expired: keep it if still possible, else undo it."""
        bind = decision.bind
        rec = self.tasks.get(bind.task_id)
        if rec is None or (rec.node == bind.node and rec.status in OCCUPYING):
            return  # unknown task, or already re-placed on that very node
        job = self.task_job[rec.uid]
        node = self.nodes.get(bind.node)
        if rec.status == TaskStatus.PENDING and job.active and node is not None and node.spec.backend == decision.backend:
            rec.status = TaskStatus.BOUND
            rec.node = bind.node
            rec.backend = decision.backend
            rec.devices = list(bind.devices)
            rec.message = "bind acknowledged after its deadline; kept"
            self._dirty_tasks.add(rec.uid)
            self._after_task_change(job)
        else:  # placed elsewhere meanwhile (or the job is over): undo the late bind
            self._issue(
                decision.backend,
                decision.cycle_id,
                rec.uid,
                evict=pb.EvictDecision(task_id=rec.uid, job_id=rec.job_id, node=bind.node, reason="bind-expired"),
            )
        log.info("decision.late_ack", decision_id=decision.id, backend=decision.backend, task=rec.uid)

    def expire(self, now: float | None = None) -> int:
        """Expire unacked binds past their deadline: task back to Pending, gang rule applied."""
        now = self.clock() if now is None else now
        expired = self.decisions.expired(now)
        for p in expired:
            self.decisions.settle(p.row.id, "expired", "no ack before the deadline")
            rec = self.tasks.get(p.row.task_id)
            if rec is not None and rec.status == TaskStatus.BINDING and rec.node == p.decision.bind.node:
                self._to_pending(rec, f"bind expired: {p.row.backend} did not ack decision {p.row.id} in time")
                self._after_task_change(self.task_job[rec.uid])
        if expired:
            log.info("decisions.expired", count=len(expired))
            self.on_change()
        return len(expired)

    # =============================================================================================
    # Task transitions (no validation: callers checked)
    # =============================================================================================

    def _to_pending(self, rec: TaskRecord, why: str) -> None:
        rec.status = TaskStatus.PENDING
        rec.node = None
        rec.devices = []
        rec.message = why
        self._dirty_tasks.add(rec.uid)
        job = self.task_job[rec.uid]
        if job.active:
            self._gang_check(job)

    def _released(self, rec: TaskRecord) -> None:
        job = self.task_job[rec.uid]
        if job.status.cancelled or not job.active:
            rec.status = TaskStatus.FAILED
            rec.message = "cancelled" if job.status.cancelled else rec.message
        else:
            rec.status = TaskStatus.PENDING
            rec.node = None
            rec.devices = []
        self._dirty_tasks.add(rec.uid)
        if job.active:
            self._gang_check(job)

    def _gang_check(self, job: JobRecord) -> None:
        """All or nothing: if fewer than min_member tasks remain placed, release the rest too."""
        placed = [t for t in job.tasks if t.status in PLACED]
        if not placed:
            return
        succeeded = sum(1 for t in job.tasks if t.status == TaskStatus.SUCCEEDED)
        if len(placed) + succeeded >= job.min_member:
            return
        for t in placed:
            self._evict(t, "gang-broken", 0)
        job.status.sched_phase = PodGroupPhase.INQUEUE
        self._dirty_jobs.add(job.id)

    def _evict(self, rec: TaskRecord, reason: str, cycle_id: int) -> None:
        rec.status = TaskStatus.RELEASING
        rec.message = f"evicting: {reason}"
        self._dirty_tasks.add(rec.uid)
        self._issue(
            rec.backend,
            cycle_id,
            rec.uid,
            evict=pb.EvictDecision(task_id=rec.uid, job_id=rec.job_id, node=rec.node or "", reason=reason),
        )

    def _issue(self, backend: str, cycle_id: int, task_id: str, **action: Any) -> pb.Decision:
        decision = self.decisions.issue(backend, cycle_id, task_id, now=self.clock(), **action)
        if backend in self.backends:
            self.backends[backend].last_decision_id = decision.id
            self._dirty_backends.add(backend)
        return decision

    def _after_task_change(self, job: JobRecord) -> None:
        self._refresh_phase(job)
        self._dirty_jobs.add(job.id)
        self._events.setdefault(job.id, pb.JobEvent.TYPE_MODIFIED)

    def _refresh_phase(self, job: JobRecord) -> None:
        st = job.status
        if is_terminal_phase(st.phase):
            return
        n = len(job.tasks)
        counts = Counter(t.status for t in job.tasks)
        succeeded, failed = counts[TaskStatus.SUCCEEDED], counts[TaskStatus.FAILED]
        placed = sum(counts[s] for s in ALLOCATED) + succeeded
        if succeeded + failed == n and succeeded >= job.min_member:
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
            st.finish_time = now
            st.sched_phase = PodGroupPhase.COMPLETED if phase == pb.JOB_PHASE_COMPLETED else st.sched_phase
            if phase == pb.JOB_PHASE_FAILED:
                for t in job.tasks:
                    if t.status in PLACED:
                        self._evict(t, "job-failed", 0)
            log.info("job.finished", job=job.id, phase=pb.JobPhase.Name(phase))
        self._dirty_jobs.add(job.id)
        self._events.setdefault(job.id, pb.JobEvent.TYPE_MODIFIED)

    # =============================================================================================
    # Jobs
    # =============================================================================================

    def _new_job_record(self, spec: pb.JobSpec, creation_index: int, status: JobStatusRecord) -> JobRecord:
        template = convert.job_to_model(spec, creation_index)
        tasks = []
        for tg in spec.task_groups:
            for i in range(tg.replicas):
                tasks.append(TaskRecord(convert.task_uid(spec.id, tg.role, i), spec.id, tg.role, i))
        return JobRecord(
            spec=spec,
            spec_bytes=spec.SerializeToString(deterministic=True),
            template=template,
            creation_index=creation_index,
            tasks=tasks,
            status=status,
            groups={tg.role: tg for tg in spec.task_groups},
        )

    def _index_job(self, rec: JobRecord) -> None:
        self.jobs[rec.id] = rec
        for t in rec.tasks:
            self.tasks[t.uid] = t
            self.task_job[t.uid] = rec

    def submit_job(self, spec: pb.JobSpec) -> tuple[pb.Job, bool]:
        normalized = validate.normalize_job(spec)
        existing = self.jobs.get(normalized.id)
        if existing is not None:
            if existing.spec_bytes == normalized.SerializeToString(deterministic=True):
                return job_proto(existing), False
            raise already_exists(f"job.id: job {normalized.id!r} already exists with a different spec")
        queue = self.queues.get(normalized.queue)
        if queue is None:
            raise not_found(f"job.queue: queue {normalized.queue!r} does not exist")
        if queue.proto.state in (pb.QUEUE_STATE_CLOSED, pb.QUEUE_STATE_CLOSING):
            raise precondition(f"job.queue: queue {normalized.queue!r} is {pb.QueueState.Name(queue.proto.state)}")
        if self.priority_classes and normalized.priority_class and normalized.priority_class not in self.priority_classes:
            raise invalid(f"job.priority_class: {normalized.priority_class!r} is not a configured priority class")
        now = self.clock()
        rec = self._new_job_record(
            normalized, self.next_creation_index, JobStatusRecord(phase=pb.JOB_PHASE_PENDING, submit_time=now)
        )
        self.next_creation_index += 1
        self._dirty_meta["next_creation_index"] = str(self.next_creation_index)
        self._index_job(rec)
        self._dirty_jobs.add(rec.id)
        self._dirty_tasks.update(t.uid for t in rec.tasks)
        self._events[rec.id] = pb.JobEvent.TYPE_ADDED
        log.info("job.submitted", job=rec.id, queue=rec.spec.queue, tasks=len(rec.tasks), min_member=rec.min_member)
        self.on_change()
        return job_proto(rec), True

    def get_job_record(self, job_id: str, path: str = "id") -> JobRecord:
        if not job_id:
            raise invalid(f"{path}: must not be empty")
        rec = self.jobs.get(job_id)
        if rec is None:
            raise not_found(f"{path}: job {job_id!r} does not exist")
        return rec

    def get_job(self, job_id: str) -> pb.Job:
        return job_proto(self.get_job_record(job_id))

    def cancel_job(self, job_id: str) -> pb.Job:
        rec = self.get_job_record(job_id)
        if rec.status.cancelled:
            return job_proto(rec)
        if not rec.active:
            raise precondition(f"id: job {job_id!r} already ended ({pb.JobPhase.Name(rec.status.phase)})")
        rec.status.cancelled = True
        rec.status.phase = pb.JOB_PHASE_CANCELLED
        rec.status.finish_time = self.clock()
        for t in rec.tasks:
            if t.status in PLACED:
                self._evict(t, "cancel", 0)
            elif t.status == TaskStatus.PENDING:
                t.message = "cancelled"
                self._dirty_tasks.add(t.uid)
        self._dirty_jobs.add(rec.id)
        self._events[rec.id] = pb.JobEvent.TYPE_MODIFIED
        log.info("job.cancelled", job=job_id)
        self.on_change()
        return job_proto(rec)

    def list_jobs(self, req: pb.ListJobsRequest) -> pb.ListJobsResponse:
        if req.page_size < 0:
            raise invalid(f"page_size: {req.page_size} is negative")
        for i, phase in enumerate(req.phases):
            if phase not in pb.JobPhase.values() or phase == pb.JOB_PHASE_UNSPECIFIED:
                raise invalid(f"phases[{i}]: {phase} is not a job phase")
        size = min(req.page_size or 100, 1000)
        filters = (req.queue, req.namespace, sorted(req.phases))
        after = decode_page_token(req.page_token, filters)
        phases = set(req.phases)
        out = pb.ListJobsResponse()
        last = after
        for rec in self.jobs.values():
            if rec.creation_index <= after:
                continue
            if (req.queue and rec.spec.queue != req.queue) or (req.namespace and rec.spec.namespace != req.namespace):
                continue
            if phases and rec.status.phase not in phases:
                continue
            if len(out.jobs) == size:
                out.next_page_token = encode_page_token(last, filters)
                break
            out.jobs.append(job_proto(rec))
            last = rec.creation_index
        return out

    def watch_jobs(self, req: pb.WatchJobsRequest) -> tuple[Subscriber[pb.JobEvent], list[pb.JobEvent]]:
        if req.job_id and req.job_id not in self.jobs:
            raise not_found(f"job_id: job {req.job_id!r} does not exist")

        def accepts(event: pb.JobEvent) -> bool:
            spec = event.job.spec
            return not (
                (req.job_id and spec.id != req.job_id)
                or (req.queue and spec.queue != req.queue)
                or (req.namespace and spec.namespace != req.namespace)
            )

        initial = []
        if req.send_initial:
            for rec in self.jobs.values():
                event = pb.JobEvent(type=pb.JobEvent.TYPE_ADDED, job=job_proto(rec))
                if accepts(event):
                    initial.append(event)
        return self.watch.subscribe(accepts), initial

    def explain(self, job_id: str) -> pb.ExplainResponse:
        rec = self.get_job_record(job_id, "job_id")
        exp = rec.status.explanation
        resp = pb.ExplainResponse(job_id=job_id, phase=rec.status.phase)  # type: ignore[arg-type]
        if exp:
            resp.cycle_id = exp.get("cycle_id", 0)
            resp.gate = exp.get("gate", "")
            resp.summary = exp.get("summary", "")
            resp.node_reasons.update(exp.get("node_reasons", {}))
        else:
            resp.gate = "none"
            resp.summary = f"job is {pb.JobPhase.Name(rec.status.phase).removeprefix('JOB_PHASE_').lower()}" + (
                "; no cycle has considered it yet" if rec.active else ""
            )
        return resp

    # =============================================================================================
    # Queues
    # =============================================================================================

    def _put_queue(self, q: pb.Queue) -> None:
        self.queues[q.name] = QueueEntry(q, convert.queue_to_model(q))
        self._dirty_queues.add(q.name)
        self._deleted_queues.discard(q.name)

    def _check_parent(self, q: pb.Queue) -> None:
        if q.name == "root":
            return
        if q.parent not in self.queues:
            raise not_found(f"queue.parent: queue {q.parent!r} does not exist")
        seen, cur = {q.name}, q.parent
        while cur:
            if cur in seen:
                raise invalid(f"queue.parent: {q.parent!r} would make a cycle in the queue tree")
            seen.add(cur)
            cur = self.queues[cur].proto.parent if cur in self.queues else ""

    def create_queue(self, queue: pb.Queue) -> pb.Queue:
        q = validate.normalize_queue(queue)
        if q.name in self.queues:
            raise already_exists(f"queue.name: queue {q.name!r} already exists")
        self._check_parent(q)
        self._put_queue(q)
        self.on_change()
        return q

    def update_queue(self, queue: pb.Queue) -> pb.Queue:
        q = validate.normalize_queue(queue)
        if q.name not in self.queues:
            raise not_found(f"queue.name: queue {q.name!r} does not exist")
        self._check_parent(q)
        self._put_queue(q)
        self.on_change()
        return q

    def delete_queue(self, name: str) -> None:
        if not name:
            raise invalid("name: must not be empty")
        if name not in self.queues:
            raise not_found(f"name: queue {name!r} does not exist")
        if name in ("root", "default"):
            raise precondition(f"name: queue {name!r} is built in and cannot be deleted")
        children = sorted(n for n, e in self.queues.items() if e.proto.parent == name)
        if children:
            raise precondition(f"name: queue {name!r} still has child queues: {', '.join(children[:5])}")
        jobs = [r.id for r in self.jobs.values() if r.spec.queue == name and r.active]
        if jobs:
            raise precondition(f"name: queue {name!r} still has {len(jobs)} active jobs (e.g. {jobs[0]!r})")
        del self.queues[name]
        self._dirty_queues.discard(name)
        self._deleted_queues.add(name)
        self.on_change()

    def list_queues(self) -> pb.ListQueuesResponse:
        allocated: dict[str, dict[str, float]] = {n: {} for n in self.queues}
        pending = Counter[str]()
        running = Counter[str]()
        for rec in self.jobs.values():
            qname = rec.spec.queue
            if rec.status.phase in (pb.JOB_PHASE_PENDING, pb.JOB_PHASE_INQUEUE):
                pending[qname] += 1
            elif rec.status.phase == pb.JOB_PHASE_RUNNING:
                running[qname] += 1
            if not rec.active or qname not in allocated:
                continue
            alloc = allocated[qname]
            for t, tmpl in zip(rec.tasks, rec.template.tasks, strict=True):
                if t.status in ALLOCATED:
                    for r, v in tmpl.request.items():
                        alloc[r] = alloc.get(r, 0.0) + v
        out = pb.ListQueuesResponse()
        for name, entry in self.queues.items():
            out.queues.add(
                queue=entry.proto,
                allocated=convert.resource_list(allocated[name]),
                pending_jobs=pending[name],
                running_jobs=running[name],
            )
        return out

    # =============================================================================================
    # Nodes
    # =============================================================================================

    def list_nodes(self, backend: str) -> pb.ListNodesResponse:
        if backend and backend not in self.backends:
            raise not_found(f"backend: backend {backend!r} is not registered")
        used: dict[str, dict[str, float]] = {}
        count = Counter[str]()
        for rec in self.jobs.values():
            for t, tmpl in zip(rec.tasks, rec.template.tasks, strict=True):
                if t.status in OCCUPYING and t.node in self.nodes:
                    u = used.setdefault(t.node, {})
                    for r, v in tmpl.request.items():
                        u[r] = u.get(r, 0.0) + v
                    count[t.node] += 1
        for f in self.foreign.values():
            if f.spec.node in self.nodes:
                u = used.setdefault(f.spec.node, {})
                for r, v in f.spec.request.items():
                    u[r] = u.get(r, 0.0) + v
                count[f.spec.node] += 1
        out = pb.ListNodesResponse()
        for name, entry in self.nodes.items():
            if backend and entry.spec.backend != backend:
                continue
            out.nodes.append(node_view(entry.proto, used.get(name, {}), entry.spec.allocatable, count[name]))
        return out

    # =============================================================================================
    # Cycles
    # =============================================================================================

    def job_of_task(self, uid: str) -> str:
        """The id of the job owning task ``uid`` ("" if unknown)."""
        job = self.task_job.get(uid)
        return job.id if job is not None else ""

    def capture(self) -> Capture:
        cycle_id = self.next_cycle_id
        self.next_cycle_id += 1
        self._dirty_meta["next_cycle_id"] = str(self.next_cycle_id)
        jobs = [
            (rec, rec.status.sched_phase, [(t.status, t.node) for t in rec.tasks])
            for rec in self.jobs.values()
            if rec.active
        ]
        return Capture(
            cycle_id=cycle_id,
            nodes=[e.spec for e in self.nodes.values()],
            queues=[e.spec for e in self.queues.values()],
            jobs=jobs,
            foreign=[f.spec for f in self.foreign.values()],
            priority_classes=dict(self.priority_classes),
        )

    def apply(self, capture: Capture, result: model.CycleResult) -> ApplyStats:
        """Apply a cycle's decisions, dropping whatever the world changed since ``capture``."""
        stats = ApplyStats()
        cycle_id = capture.cycle_id
        captured = {rec.id: (rec, states) for rec, _, states in capture.jobs}
        binds_by_job: dict[str, list[tuple[TaskRecord, str]]] = {}
        for uid, node in result.binds.items():
            rec = self.tasks.get(uid)
            job = self.task_job.get(uid)
            if rec is None or job is None:
                stats.dropped_binds += 1
                continue
            binds_by_job.setdefault(job.id, []).append((rec, node))
        touched: set[str] = set()
        bound_jobs: set[str] = set()
        for job_id, binds in binds_by_job.items():
            job = self.jobs[job_id]
            ok = captured.get(job_id, (None,))[0] is job and job.active
            for rec, node in binds if ok else ():
                entry = self.nodes.get(node)
                if (
                    rec.status != TaskStatus.PENDING
                    or entry is None
                    or entry.spec.unschedulable
                    or not entry.spec.ready
                    or entry.spec.backend not in self.backends
                ):
                    ok = False
                    break
            if not ok:  # all or nothing per job: a partial gang would hold resources uselessly
                stats.dropped_binds += len(binds)
                continue
            for rec, node in binds:
                self._bind(job, rec, node, result.bind_devices.get(rec.uid, []), cycle_id)
                stats.binds += 1
            touched.add(job_id)
            bound_jobs.add(job_id)
        for uid, reason in result.evictions.items():
            rec = self.tasks.get(uid)
            job = self.task_job.get(uid)
            then = captured.get(job.id) if job else None
            if rec is None or job is None or then is None or then[0] is not job:
                stats.dropped_evictions += 1
                continue
            pos = next(i for i, t in enumerate(job.tasks) if t is rec)
            status_then, node_then = then[1][pos]
            if rec.status not in PLACED or rec.node != node_then or status_then not in PLACED:
                stats.dropped_evictions += 1
                continue
            self._evict(rec, reason or "preempt", cycle_id)
            stats.evictions += 1
            touched.add(job.id)
        now = self.clock()
        outcomes = dict(result.jobs)
        for job_id in bound_jobs:
            outcomes.setdefault(job_id, model.JobOutcome(PodGroupPhase.RUNNING))
        for job_id, outcome in outcomes.items():
            job = self.jobs.get(job_id)
            if job is None or captured.get(job_id, (None,))[0] is not job or not job.active:
                continue
            self._record_outcome(job, outcome, cycle_id, now, placed=job_id in bound_jobs)
            self._refresh_phase(job)
        for job_id in touched:
            self._after_task_change(self.jobs[job_id])
        return stats

    def _bind(self, job: JobRecord, rec: TaskRecord, node: str, devices: list[str], cycle_id: int) -> None:
        entry = self.nodes[node]
        rec.status = TaskStatus.BINDING
        rec.node = node
        rec.backend = entry.spec.backend
        rec.devices = list(devices)
        rec.message = ""
        self._dirty_tasks.add(rec.uid)
        group = job.groups[rec.role]
        self._issue(
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
            ),
        )

    def _record_outcome(
        self, job: JobRecord, outcome: model.JobOutcome, cycle_id: int, now: float, *, placed: bool
    ) -> None:
        st = job.status
        before = (st.sched_phase, [(c.type, c.status, c.reason, c.message) for c in st.conditions])
        st.sched_phase = outcome.phase
        conditions = list(outcome.conditions)
        if placed and not any(c.type == "Scheduled" for c in conditions):
            conditions.append(model.Condition("Scheduled", "True", "Placed", f"tasks bound in cycle {cycle_id}"))
            if not any(c.type == "Unschedulable" for c in conditions):
                conditions.append(model.Condition("Unschedulable", "False", "Placed", ""))
        for cond in conditions:
            old = next((c for c in st.conditions if c.type == cond.type), None)
            if old is not None and (old.status, old.reason, old.message) == (cond.status, cond.reason, cond.message):
                continue
            new = ConditionRecord(
                cond.type,
                cond.status,
                cond.reason,
                cond.message,
                cycle_id,
                old.transition_time if old is not None and old.status == cond.status else now,
            )
            st.conditions = [c for c in st.conditions if c.type != cond.type] + [new]
        if outcome.explanation is not None:
            exp = outcome.explanation
            st.explanation = {
                "gate": exp.gate,
                "summary": exp.summary,
                "node_reasons": dict(exp.node_reasons),
                "cycle_id": cycle_id,
            }
        elif placed:
            st.explanation = {"gate": "none", "summary": "placed", "node_reasons": {}, "cycle_id": cycle_id}
        after = (st.sched_phase, [(c.type, c.status, c.reason, c.message) for c in st.conditions])
        if after != before:
            self._dirty_jobs.add(job.id)
            self._events.setdefault(job.id, pb.JobEvent.TYPE_MODIFIED)

    # =============================================================================================
    # Misc
    # =============================================================================================

    def set_priority_classes(self, classes: Iterable[model.PriorityClass]) -> None:
        self.priority_classes = {c.name: c for c in classes}

    def set_meta(self, key: str, value: str) -> None:
        self._dirty_meta[key] = value


def _with_backend(node: pb.Node, backend: str) -> pb.Node:
    out = pb.Node()
    out.CopyFrom(node)
    out.backend = backend
    return out

