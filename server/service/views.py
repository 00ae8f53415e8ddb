"""Server state -> API messages (Job, NodeView, QueueView, page tokens)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, TypeVar

from muster.devices import NVIDIA_GPU, UNIT, Device, devices_by_resource
from muster.phases import WAITING_PHASES
from muster.v1 import muster_pb2 as pb
from server import model
from server.model import TaskStatus, ty_schedule_state, ty_stage
from server.service.convert import resource_list, timestamp, tyjob_to_model
from server.service.errors import invalid
from server.service.records import JobRecord, is_terminal_phase

PENDING_STATUSES = frozenset({TaskStatus.PENDING, TaskStatus.ALLOCATED, TaskStatus.PIPELINED})
TY_PLACED = frozenset(
    {
        TaskStatus.BINDING,
        TaskStatus.BOUND,
        TaskStatus.RUNNING,
        TaskStatus.SUCCEEDED,
        TaskStatus.UNKNOWN,
    }
)


def job_proto(rec: JobRecord, *, with_tasks: bool = True) -> pb.Job:
    status = rec.status
    counts = {
        "pending": 0,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 0,
        "unknown": 0,
    }
    for t in rec.task_views():
        if t.status in PENDING_STATUSES:
            counts["pending"] += 1
        elif t.status == TaskStatus.SUCCEEDED:
            counts["succeeded"] += 1
        elif t.status == TaskStatus.FAILED:
            counts["failed"] += 1
        elif t.status == TaskStatus.CANCELLED:
            counts["cancelled"] += 1
        elif t.status == TaskStatus.UNKNOWN:  # its backend is silent: not known to run
            counts["unknown"] += 1
        else:  # placed: binding, bound, running, releasing
            counts["running"] += 1
    js = pb.JobStatus(phase=status.phase, **counts)  # type: ignore[arg-type]  # proto enums are ints
    if status.hold or status.requeue_count:  # job control (server.service.control)
        js.hold, js.held_by, js.requeue_count = status.hold, status.held_by, status.requeue_count
    for cond in status.conditions:
        c = js.conditions.add(
            type=cond.type,
            status=cond.status,
            reason=cond.reason,
            message=cond.message,
            cycle_id=cond.cycle_id,
        )
        if ts := timestamp(cond.transition_time):
            c.last_transition_time.CopyFrom(ts)
    for name in ("submit_time", "start_time", "finish_time"):
        if ts := timestamp(getattr(status, name)):
            getattr(js, name).CopyFrom(ts)
    if (estimate := current_estimate(rec)) is not None:
        set_estimate(js, estimate)
    spec = rec.peek_spec()
    if spec.HasField("tyjob"):
        _ty_status(rec, spec.tyjob, js)
    job = pb.Job(spec=spec, status=js)
    if with_tasks:
        for t in rec.task_views():
            job.tasks.add(
                id=t.uid,
                job_id=t.job_id,
                role=t.role,
                index=t.index,
                status=int(t.status),
                node=t.node or "",
                devices=t.devices,
                backend=t.backend,
                message=t.message,
                exit_code=t.exit_code,
                gpu_group=t.gpu_group,
            )
    return job


def current_estimate(rec: JobRecord) -> model.JobEstimate | None:
    """The last cycle's start estimate of a job that still waits for it (not held, not placed)."""
    st = rec.status
    if st.estimate is None or st.hold or st.quarantined or st.phase not in WAITING_PHASES:
        return None
    return st.estimate


def set_estimate(message: pb.JobStatus | pb.ExplainResponse, estimate: model.JobEstimate) -> None:
    """A start estimate into a JobStatus or ExplainResponse (the same four fields)."""
    if estimate.start is not None and (ts := timestamp(estimate.start)):
        message.estimated_start.CopyFrom(ts)
    message.estimated_nodes.extend(estimate.nodes)
    message.reserved = estimate.reserved
    message.estimate_note = estimate.note


def _ty_status(rec: JobRecord, tyjob: pb.TYJob, js: pb.JobStatus) -> None:
    """A TYJob's stage and schedule state (docs/jobs.md), from its tasks and the last cycle."""
    ty = tyjob_to_model(tyjob, rec.status.leader_restarts)
    js.leader_restarts = rec.status.leader_restarts
    tasks = rec.task_views()
    leader = next((t.status for t in tasks if t.role == ty.leader_role), None)
    workers = [t.status for t in tasks if t.role != ty.leader_role]
    # Placement is known here; whether the job can ever be scheduled is the last cycle's verdict.
    state = ty_schedule_state(
        ty,
        leader in TY_PLACED,
        sum(1 for s in workers if s in TY_PLACED),
        len(workers),
        rec.status.schedule_state == "ScheduledFailed",
    )
    js.schedule_state = state
    if is_terminal_phase(rec.status.phase):
        js.stage = "Succeeded" if rec.status.phase == pb.JOB_PHASE_COMPLETED else "Failed"
        return
    js.stage = ty_stage(ty, leader, sum(1 for s in workers if s == TaskStatus.RUNNING), state)


def node_view(
    node: pb.Node,
    used: dict[str, float],
    allocatable: dict[str, float],
    task_count: int,
    held: Collection[str] = (),
    shares: Mapping[str, float] | None = None,
) -> pb.NodeView:
    """A node and what is in use on it. ``used``: what its tasks request (canonical units; whole
    devices, not GPU shares); ``held``: the device ids tasks hold whole; ``shares``: per shared GPU
    (KAI GPU sharing), the part of it its fractional tasks take (0 to 1).

    ``idle`` is what a new task could take now, as the scheduler counts it: allocatable - used,
    and of a device resource no more than its whole devices that are healthy and that no task
    holds or shares (an unhealthy device nobody holds and a shared GPU count as used, as in the
    core's ``NodeTable``). A shared GPU's free part is in ``shared_gpus``, its shares in ``used``."""
    shares = shares or {}
    # The devices the scheduler's ledger has (server.session.devices), so both count the same.
    devices = devices_by_resource(
        (Device(d.id, d.type, d.group, d.healthy) for d in node.devices), allocatable
    )
    known = {d.id for devs in devices.values() for d in devs}
    idle: dict[str, float] = {}
    for r, total in allocatable.items():
        free = total - used.get(r, 0.0)
        devs = devices.get(r)
        if devs is not None:
            shared = sum(1 for d in devs if d.id in shares)
            if r == NVIDIA_GPU:  # a share of a GPU the node does not list still takes a GPU
                shared += sum(1 for g in shares if g not in known)
            broken = sum(
                1 for d in devs if not d.healthy and d.id not in held and d.id not in shares
            )
            whole = sum(1 for d in devs if d.healthy and d.id not in held and d.id not in shares)
            free = min(free - (shared + broken) * UNIT, whole * UNIT)
        idle[r] = max(0.0, free)
    in_use = dict(used)
    if shares:
        in_use[NVIDIA_GPU] = in_use.get(NVIDIA_GPU, 0.0) + sum(shares.values()) * UNIT
    return pb.NodeView(
        node=node,
        used=resource_list({r: v for r, v in in_use.items() if v > 0}),
        idle=resource_list(idle),
        task_count=task_count,
        shared_gpus={g: round(max(0.0, 1.0 - taken), 6) for g, taken in shares.items()},
    )


# --- pages (ListJobs, ListJobHistory) ------------------------------------------------------------

# The jobs in a page when the request asks no size, and the most in one.
DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE = 100, 1000

Position = TypeVar("Position")


def page_size(requested: int) -> int:
    """A request's ``page_size`` (0: the default), at most MAX_PAGE_SIZE; INVALID_ARGUMENT when it
    is negative."""
    if requested < 0:
        raise invalid(f"page_size: {requested} is negative")
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def _filter_digest(parts: Iterable[object]) -> str:
    return hashlib.sha256(json.dumps(list(parts), default=str).encode()).hexdigest()[:12]


def encode_position(position: Mapping[str, object], filters: Iterable[object]) -> str:
    """A page token: where the next page starts, and a digest of the filters it is for (a token
    is good only for the request that asks the same)."""
    raw = json.dumps({**position, "f": _filter_digest(filters)}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_position(
    token: str, filters: Iterable[object], rpc: str, read: Callable[[Any], Position]
) -> Position:
    """The position in a page token ``rpc`` issued: ``read`` takes it out of the token's JSON
    object, raising KeyError, TypeError or ValueError when it is not there. INVALID_ARGUMENT for
    a token ``rpc`` did not issue (forged) or issued for other filters (reused)."""
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        position, digest = read(raw), raw["f"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise invalid(f"page_token: {token!r} is not a token returned by {rpc}") from None
    if digest != _filter_digest(filters):
        raise invalid(
            "page_token: was issued for different filters; repeat the request without a token"
        )
    return position


def whole_number(value: object) -> int:
    """A token's integer; TypeError for anything else (JSON's true and 1.0 too)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not a whole number")
    return value


def number(value: object) -> float:
    """A token's number; TypeError for anything else (JSON's true too)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not a number")
    return float(value)


def encode_page_token(after_index: int, filters: Iterable[object]) -> str:
    """ListJobs' token: the creation index to continue after."""
    return encode_position({"after": after_index}, filters)


def decode_page_token(token: str, filters: Iterable[object]) -> int:
    """ListJobs' token -> the creation index to continue after (-1: no token, from the start)."""
    if not token:
        return -1
    return decode_position(token, filters, "ListJobs", lambda raw: whole_number(raw["after"]))
