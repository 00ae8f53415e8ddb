"""What backends tell the server: registration, snapshots, deltas, acknowledgements, heartbeats,
the expiry of binds nobody acknowledged, and what a backend's silence changes.

Each function validates its whole request first (``DomainError`` naming the field) and only then
changes the ``ClusterState``, through its transitions; it calls ``state.on_change()`` when a cycle
might now do something new. Every call of a registered backend is contact (``contact``): one
declared silent is back (``server.service.liveness``) before its request is looked at, whether
the request is then accepted or not.
"""

from __future__ import annotations

from typing import Any

import structlog

from muster.devices import shared_gpu
from muster.v1 import muster_pb2 as pb
from server import model
from server.model import OCCUPYING, TaskStatus
from server.service import convert, validate
from server.service.decisions import DECISION_BUFFER
from server.service.errors import already_exists, invalid, not_found, precondition
from server.service.liveness import backend_back, backend_lost, backend_silent
from server.service.logs import MAX_CHUNK
from server.service.records import BackendRecord, ForeignTask, JobRecord, NodeEntry, TaskRecord
from server.service.state import ON_BACKEND, PLACED, ClusterState

# A task on its node (placed, or being released from it).
HELD = frozenset({*PLACED, TaskStatus.RELEASING})

log = structlog.get_logger("muster.ingest")


def register_backend(
    state: ClusterState, req: pb.RegisterBackendRequest
) -> pb.RegisterBackendResponse:
    validate.check_name("name", req.name, "backend name")
    if not req.kind:
        raise invalid("kind: must not be empty (fake-agent | slurm | kubernetes)")
    validate.check_labels("labels", req.labels)
    rec = state.backends.get(req.name)
    if rec is None:
        rec = BackendRecord(req.name, req.kind, dict(req.labels))
        state.backends[req.name] = rec
    else:
        rec.kind, rec.labels = req.kind, dict(req.labels)
    state.changes.backends.add(req.name)
    contact(state, req.name)
    return pb.RegisterBackendResponse(
        name=req.name,
        server_id=state.server_id,
        last_decision_id=rec.last_decision_id,
        heartbeat_seconds=state.liveness.heartbeat_seconds,
    )


def contact(state: ClusterState, backend: str) -> None:
    """``backend`` (registered) was heard from: a backend declared silent is back."""
    _contact, silent_for = state.liveness.heard(backend)
    if silent_for is not None:
        backend_back(state, backend, silent_for)


def heartbeat(state: ClusterState, req: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
    """The backend is alive; ``resync`` asks one that was declared silent for a SyncSnapshot."""
    require_backend(state, req.backend)
    lv = state.liveness
    return pb.HeartbeatResponse(
        resync=lv.contact_of(req.backend).resync, heartbeat_seconds=lv.heartbeat_seconds
    )


def check_liveness(state: ClusterState) -> int:
    """Declare silent the backends not heard from for the grace period, and lost the tasks of
    those silent for the eviction timeout since. Returns how many backends changed standing."""
    lv = state.liveness
    now = lv.clock()
    changed = 0
    for name in list(state.backends):
        c = lv.contact_of(name)
        if c.silent_since is None:
            if now - c.last >= lv.grace:
                c.silent_since = now
                backend_silent(state, name, now - c.last)
                changed += 1
        elif not c.lost and now - c.silent_since >= lv.eviction:
            c.lost = True
            backend_lost(state, name, now - c.last)
            changed += 1
    return changed


def _stale_copy(state: ClusterState, backend: str, rec: TaskRecord, node: str, status: int) -> bool:
    """Whether a report of ``rec`` from ``backend`` is about a copy declared lost there (its
    backend was silent past the eviction timeout) rather than about the task as it is now. Such a
    report changes nothing; a copy still running is stopped (one eviction), a copy that ended is
    forgotten."""
    lv = state.liveness
    lost = lv.lost.get(rec.uid)
    if lost is None or lost[0] != backend or (node and node != lost[1]):
        return False
    where = lost[1]
    if rec.backend == backend and rec.node == where and rec.status in HELD:
        del lv.lost[rec.uid]  # placed on that very node again: its reports are the new copy's
        return False
    running = status in (pb.TASK_STATUS_BOUND, pb.TASK_STATUS_RUNNING)
    if not running:
        del lv.lost[rec.uid]  # the copy ended
    elif not any(
        p.row.kind == "evict" and p.row.backend == backend
        for p in state.decisions.pending_for_task(rec.uid)
    ):
        state.issue(
            backend,
            0,
            rec.uid,
            evict=pb.EvictDecision(task_id=rec.uid, job_id=rec.job_id, node=where, reason="lost"),
        )
        log.info("task.stale_copy", backend=backend, task=rec.uid, node=where, stopping=True)
    return True


def _placed_elsewhere(rec: TaskRecord, backend: str) -> bool:
    """``rec`` is on another backend's node: what ``backend`` says of it is not about it."""
    return bool(rec.backend) and rec.backend != backend and rec.status in HELD


def require_backend(state: ClusterState, name: str, path: str = "backend") -> BackendRecord:
    """The registered backend ``name``, whose call this is: contact (``contact``)."""
    if not name:
        raise invalid(f"{path}: must not be empty")
    rec = state.backends.get(name)
    if rec is None:
        raise precondition(
            f"{path}: backend {name!r} is not registered; call RegisterBackend first"
        )
    contact(state, name)
    return rec


def _check_node_owner(state: ClusterState, path: str, name: str, backend: str) -> None:
    entry = state.nodes.get(name)
    if entry is not None and entry.spec.backend != backend:
        raise already_exists(f"{path}: node {name!r} belongs to backend {entry.spec.backend!r}")


def sync_snapshot(state: ClusterState, req: pb.SyncSnapshotRequest) -> pb.SyncSnapshotResponse:
    """The backend's whole view: its nodes and the tasks on them replace what the server had."""
    backend = req.backend
    require_backend(state, backend)
    # --- validate everything ---
    new_nodes: dict[str, model.NodeSpec] = {}
    for i, node in enumerate(req.nodes):
        path = f"nodes[{i}]"
        allocatable = validate.check_node(path, node)
        if node.name in new_nodes:
            raise invalid(f"{path}.name: duplicate node {node.name!r}")
        if node.backend and node.backend != backend:
            raise invalid(
                f"{path}.backend: {node.backend!r} differs from the request's backend {backend!r}"
            )
        _check_node_owner(state, f"{path}.name", node.name, backend)
        new_nodes[node.name] = convert.node_to_model(node, backend, allocatable)
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
    for name in [
        n for n, e in state.nodes.items() if e.spec.backend == backend and n not in new_nodes
    ]:
        touched |= state.remove_node(name, f"node {name} no longer reported by backend {backend}")
    for node in req.nodes:
        state.nodes[node.name] = NodeEntry(_with_backend(node, backend), new_nodes[node.name])
    for key in [k for k, f in state.foreign.items() if f.backend == backend]:
        del state.foreign[key]
    for task_id, (task, request) in reported.items():
        rec = state.tasks.get(task_id)
        if rec is None or task.foreign_task:
            # Ended work holds no capacity, whoever placed it.
            if task.status not in (pb.TASK_STATUS_SUCCEEDED, pb.TASK_STATUS_FAILED):
                _put_foreign(state, backend, task, request)
            continue
        status = task.status or pb.TASK_STATUS_RUNNING
        if _stale_copy(state, backend, rec, task.node, status) or _placed_elsewhere(rec, backend):
            continue
        touched.add(rec.job_id)
        state.report_task(rec, status, task.node, backend, "", 0)
        gpu_group, devices = shared_gpu(task.gpu_group, task.devices, task.gpu_fraction)
        if devices or gpu_group:  # what the backend says the task holds replaces what was known
            rec.devices, rec.gpu_group = devices, gpu_group
    # Muster tasks the backend should have and does not: lost.
    for rec in state.tasks.values():
        if rec.uid in reported or rec.status not in ON_BACKEND or rec.backend != backend:
            continue
        touched.add(rec.job_id)
        state.task_gone(rec, f"lost: not reported by backend {backend} at sync")
    state.liveness.forget_lost(backend, keep=reported)  # copies it did not report are gone
    state.liveness.contact_of(backend).resync = False
    for job_id in touched:
        state.after_task_change(state.jobs[job_id])
    log.info("backend.synced", backend=backend, nodes=len(new_nodes), tasks=len(reported))
    state.on_change()
    return pb.SyncSnapshotResponse(nodes=len(new_nodes), tasks=len(reported))


def send_deltas(state: ClusterState, req: pb.SendDeltasRequest) -> pb.SendDeltasResponse:
    """Changes since the last snapshot, applied in order (all or none)."""
    backend = req.backend
    require_backend(state, backend)
    # --- validate against a shadow of the node set (deltas apply in order) ---
    present = {n for n, e in state.nodes.items() if e.spec.backend == backend}
    parsed: list[Any] = []
    for i, delta in enumerate(req.deltas):
        path = f"deltas[{i}]"
        kind = delta.WhichOneof("change")
        if kind is None:
            raise invalid(
                f"{path}: empty delta (set one of node_upserted, node_removed, task_status, ...)"
            )
        path = f"{path}.{kind}"
        if kind == "node_upserted":
            node = delta.node_upserted
            allocatable = validate.check_node(path, node)
            _check_node_owner(state, f"{path}.name", node.name, backend)
            present.add(node.name)
            parsed.append(convert.node_to_model(node, backend, allocatable))
        elif kind == "node_removed":
            if delta.node_removed not in present:
                raise not_found(
                    f"{path}: node {delta.node_removed!r} does not exist on backend {backend!r}"
                )
            present.discard(delta.node_removed)
            parsed.append(None)
        elif kind == "task_status":
            upd = delta.task_status
            if not upd.task_id:
                raise invalid(f"{path}.task_id: must not be empty")
            if upd.task_id not in state.tasks:
                raise not_found(f"{path}.task_id: task {upd.task_id!r} does not exist")
            if upd.status not in validate.REPORTABLE_TASK_STATUSES:
                raise invalid(
                    f"{path}.status: a backend reports BOUND, RUNNING, SUCCEEDED or FAILED"
                )
            if upd.node and upd.node not in present:
                raise not_found(
                    f"{path}.node: node {upd.node!r} does not exist on backend {backend!r}"
                )
            if (
                not upd.node
                and state.tasks[upd.task_id].node is None
                and upd.status in (pb.TASK_STATUS_BOUND, pb.TASK_STATUS_RUNNING)
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
        elif kind == "task_log":
            chunk = delta.task_log
            rec = state.tasks.get(chunk.task_id)
            if rec is None:
                raise not_found(f"{path}.task_id: task {chunk.task_id!r} does not exist")
            if rec.backend != backend:
                raise not_found(
                    f"{path}.task_id: task {chunk.task_id!r} does not run on backend {backend!r}"
                )
            if len(chunk.data) > MAX_CHUNK:
                raise invalid(
                    f"{path}.data: {len(chunk.data):,} bytes exceed the limit of {MAX_CHUNK:,} per chunk"
                )
            state.task_logs.prepare(chunk.task_id)  # its index read now: the apply cannot fail
            parsed.append(None)
        else:  # foreign_task_removed: idempotent
            if not delta.foreign_task_removed:
                raise invalid(f"{path}: must not be empty")
            parsed.append(None)
    # --- apply ---
    touched: set[str] = set()
    for delta, extra in zip(req.deltas, parsed, strict=True):
        kind = delta.WhichOneof("change")
        if kind == "node_upserted":
            state.nodes[delta.node_upserted.name] = NodeEntry(
                _with_backend(delta.node_upserted, backend), extra
            )
        elif kind == "node_removed":
            touched |= state.remove_node(
                delta.node_removed, f"node {delta.node_removed} removed by {backend}"
            )
        elif kind == "task_status":
            upd = delta.task_status
            rec = state.tasks[upd.task_id]
            if _stale_copy(state, backend, rec, upd.node, upd.status) or _placed_elsewhere(
                rec, backend
            ):
                continue
            state.report_task(
                rec, upd.status, upd.node or rec.node, backend, upd.message, upd.exit_code
            )
            touched.add(rec.job_id)
        elif kind == "foreign_task_upserted":
            _put_foreign(state, backend, delta.foreign_task_upserted, extra)
        elif kind == "task_log":
            state.task_logs.append(delta.task_log.task_id, delta.task_log.data, delta.task_log.eof)
        else:
            state.foreign.pop(f"{backend}/{delta.foreign_task_removed}", None)
    for job_id in touched:
        state.after_task_change(state.jobs[job_id])
    if any(d.WhichOneof("change") != "task_log" for d in req.deltas):  # output alone wakes no cycle
        state.on_change()
    return pb.SendDeltasResponse(applied=len(req.deltas))


def _put_foreign(
    state: ClusterState, backend: str, task: pb.BackendTask, request: dict[str, float]
) -> None:
    gpu_group, devices = shared_gpu(task.gpu_group, task.devices, task.gpu_fraction)
    state.foreign[f"{backend}/{task.task_id}"] = ForeignTask(
        backend,
        model.TaskSpec(
            uid=f"foreign:{backend}/{task.task_id}",
            name=task.task_id,
            namespace="",
            job="",
            request=request,
            status=TaskStatus.RUNNING,
            node=task.node,
            devices=devices,
            gpu_groups=[gpu_group] if gpu_group else [],
            gpu_fraction=task.gpu_fraction,
        ),
    )


def _with_backend(node: pb.Node, backend: str) -> pb.Node:
    out = pb.Node()
    out.CopyFrom(node)
    out.backend = backend
    return out


# -- acknowledgements and expiry ------------------------------------------------------------------


def check_stream(state: ClusterState, req: pb.StreamDecisionsRequest) -> None:
    """Validate a StreamDecisions / StreamDecisionBatches request."""
    require_backend(state, req.backend)
    validate.check_decision_id("after_decision_id", req.after_decision_id, zero_ok=True)
    if req.max_batch > DECISION_BUFFER:
        raise invalid(f"max_batch: at most {DECISION_BUFFER} (got {req.max_batch})")


def check_acks(state: ClusterState, req: pb.AckDecisionsRequest) -> list[int]:
    """Validate an ack request; returns the ids that are not pending in memory (ask the store)."""
    require_backend(state, req.backend)
    missing = []
    for i, ack in enumerate(req.acks):
        validate.check_decision_id(f"acks[{i}].decision_id", ack.decision_id)
        pending = state.decisions.pending.get(ack.decision_id)
        if pending is None:
            if ack.decision_id not in state.decisions.recent:
                missing.append(ack.decision_id)
        elif pending.row.backend != req.backend:
            raise not_found(
                f"acks[{i}].decision_id: decision {ack.decision_id} was not issued to {req.backend!r}"
            )
    return missing


def ack(
    state: ClusterState, req: pb.AckDecisionsRequest, settled: dict[int, tuple[str, str, bytes]]
) -> pb.AckDecisionsResponse:
    """Apply acks. ``settled``: id -> (backend, state, payload) from the store for non-pending ids."""
    decisions = state.decisions

    def outcome(decision_id: int) -> tuple[str, str, bytes] | None:
        return decisions.recent.get(decision_id) or settled.get(decision_id)

    for i, a in enumerate(req.acks):
        if a.decision_id in decisions.pending:
            continue
        found = outcome(a.decision_id)
        if found is None or found[0] != req.backend:
            raise not_found(
                f"acks[{i}].decision_id: no decision {a.decision_id} for backend {req.backend!r}"
            )
    accepted = 0
    touched: dict[str, JobRecord] = {}
    for a in req.acks:
        pending = decisions.pending.get(a.decision_id)
        if pending is None:
            _backend, outcome_state, payload = outcome(a.decision_id)  # type: ignore[misc]
            if outcome_state == "expired" and a.applied:
                _late_bind(state, pb.Decision.FromString(payload))
            accepted += 1
            continue
        row = pending.row
        decisions.settle(row.id, "applied" if a.applied else "rejected", a.reason)
        rec = state.tasks.get(row.task_id)
        accepted += 1
        if rec is None:
            continue
        node = pending.decision.bind.node if row.kind == "bind" else pending.decision.evict.node
        if row.kind == "bind":
            if rec.status != TaskStatus.BINDING or rec.node != node:
                continue
            if a.applied:
                rec.status = TaskStatus.BOUND
                rec.message = ""
                state.changes.tasks.add(rec.uid)
            else:
                state.to_pending(
                    rec, f"bind rejected by {req.backend}: {a.reason or 'no reason given'}"
                )
        elif rec.status == TaskStatus.RELEASING and rec.node == node:
            state.released(rec)
        elif state.liveness.lost.get(rec.uid) == (req.backend, node) and a.applied:
            del state.liveness.lost[rec.uid]  # a stale copy (_stale_copy) is stopped
        job = state.task_job[rec.uid]
        touched[job.id] = job
    for job in touched.values():  # once per job, however many of its tasks were acked
        state.after_task_change(job)
    if accepted:
        state.on_change()
    return pb.AckDecisionsResponse(accepted=accepted)


def _late_bind(state: ClusterState, decision: pb.Decision) -> None:
    """A backend applied a bind after it expired: keep it if still possible, else undo it."""
    bind = decision.bind
    rec = state.tasks.get(bind.task_id)
    if rec is None:  # its job ended and left memory (server.service.retention): undo the bind
        state.issue(
            decision.backend,
            decision.cycle_id,
            bind.task_id,
            evict=pb.EvictDecision(
                task_id=bind.task_id, job_id=bind.job_id, node=bind.node, reason="bind-expired"
            ),
        )
        log.info(
            "decision.late_ack",
            decision_id=decision.id,
            backend=decision.backend,
            task=bind.task_id,
        )
        return
    if rec.node == bind.node and rec.status in OCCUPYING:
        return  # already re-placed on that very node
    job = state.task_job[rec.uid]
    node = state.nodes.get(bind.node)
    lost = state.liveness.lost.get(rec.uid)
    if (
        rec.status == TaskStatus.PENDING
        and job.active
        and node is not None
        and node.spec.backend == decision.backend
        and (lost is None or lost[0] != decision.backend)  # a copy declared lost: stop it
    ):
        rec.status = TaskStatus.BOUND
        rec.node = bind.node
        rec.backend = decision.backend
        # (a decision issued before gpu_group existed names the shared GPU in devices)
        rec.gpu_group, rec.devices = shared_gpu(bind.gpu_group, bind.devices, bind.gpu_fraction)
        rec.message = "bind acknowledged after its deadline; kept"
        state.changes.tasks.add(rec.uid)
        state.after_task_change(job)
    else:  # placed elsewhere meanwhile (or the job is over, or it was lost): undo the late bind
        if lost is not None and lost[0] == decision.backend:
            del state.liveness.lost[rec.uid]  # this eviction stops that copy
        state.issue(
            decision.backend,
            decision.cycle_id,
            rec.uid,
            evict=pb.EvictDecision(
                task_id=rec.uid, job_id=rec.job_id, node=bind.node, reason="bind-expired"
            ),
        )
    log.info("decision.late_ack", decision_id=decision.id, backend=decision.backend, task=rec.uid)


def expire(state: ClusterState, now: float | None = None) -> int:
    """Expire unacked binds past their deadline: task back to Pending, gang rule applied."""
    now = state.clock() if now is None else now
    expired = state.decisions.expired(now)
    for p in expired:
        state.decisions.settle(p.row.id, "expired", "no ack before the deadline")
        rec = state.tasks.get(p.row.task_id)
        if (
            rec is not None
            # (Unknown: bound to a backend gone silent before it acknowledged)
            and rec.status in (TaskStatus.BINDING, TaskStatus.UNKNOWN)
            and rec.node == p.decision.bind.node
        ):
            state.liveness.held.pop(rec.uid, None)
            state.to_pending(
                rec, f"bind expired: {p.row.backend} did not ack decision {p.row.id} in time"
            )
            state.after_task_change(state.task_job[rec.uid])
    if expired:
        log.info("decisions.expired", count=len(expired))
        state.on_change()
    return len(expired)
