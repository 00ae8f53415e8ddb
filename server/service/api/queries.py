"""The read RPCs: jobs (get, list, watch, explain), queues and nodes, answered from the state.

Jobs that finished more than the retention ago are no longer in memory (``server.service.
retention.drop_finished``): lookups by id read through to the store (``state.jobs.get``), and
ListJobs merges the jobs in memory with those only the store has. Nothing here changes the state;
bad arguments raise ``DomainError`` naming the field.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass

from muster.jsonmap import short_enum_name
from muster.phases import WAITING_PHASES
from muster.v1 import muster_pb2 as pb
from server.model import OCCUPYING, BeyondWindow
from server.service import convert
from server.service.control import CONTROL_GATES
from server.service.decisions import Subscriber
from server.service.errors import invalid, not_found
from server.service.records import JobRecord
from server.service.state import ClusterState, queue_allocated
from server.service.tables import record_from_stored
from server.service.views import (
    current_estimate,
    decode_page_token,
    encode_page_token,
    job_proto,
    node_view,
    page_size,
    set_estimate,
)


@dataclass(frozen=True, slots=True)
class ReadScope:
    """The jobs a caller may read under an auth policy: those of ``queues``, and their own."""

    queues: frozenset[str]
    user: str

    def allows(self, queue: str, owner: str) -> bool:
        return queue in self.queues or (bool(owner) and owner == self.user)


def get_job(state: ClusterState, job_id: str) -> pb.Job:
    return job_proto(state.job_or_error(job_id))


def list_jobs(
    state: ClusterState, req: pb.ListJobsRequest, scope: ReadScope | None = None
) -> pb.ListJobsResponse:
    size = page_size(req.page_size)
    for i, phase in enumerate(req.phases):
        if phase not in pb.JobPhase.values() or phase == pb.JOB_PHASE_UNSPECIFIED:
            raise invalid(f"phases[{i}]: {phase} is not a job phase")
    filters = (req.queue, req.namespace, sorted(req.phases), req.owner)
    after = decode_page_token(req.page_token, filters)
    phases = set(req.phases)
    memory: list[JobRecord] = []
    for rec in state.jobs.created_after(after):  # creation order; memory only
        if (
            (req.queue and rec.queue != req.queue)
            or (req.namespace and rec.namespace != req.namespace)
            or (req.owner and rec.owner != req.owner)
        ):
            continue
        if phases and rec.status.phase not in phases:
            continue
        if scope is not None and not scope.allows(rec.queue, rec.owner):
            continue
        memory.append(rec)
        if len(memory) > size:
            break
    # Only archived jobs created before the last memory candidate can make this page.
    upper = memory[-1].creation_index if len(memory) > size else None
    merged = sorted(
        [*memory, *_archived(state, after, upper, req, size + 1, scope)],
        key=lambda r: r.creation_index,
    )
    out = pb.ListJobsResponse()
    for rec in merged[:size]:
        out.jobs.append(job_proto(rec))
    if len(merged) > size:
        out.next_page_token = encode_page_token(merged[size - 1].creation_index, filters)
    return out


def _archived(
    state: ClusterState,
    after: int,
    upper: int | None,
    req: pb.ListJobsRequest,
    want: int,
    scope: ReadScope | None = None,
) -> list[JobRecord]:
    """Up to ``want`` jobs matching the request that only the store has, created after ``after``
    (and before ``upper``), in creation order.

    A job still in memory is skipped here (memory has its newer state and filtered it already); a
    job that left memory is over, so the store's phase, queue and namespace are its final ones.
    """
    archive = state.archive
    if archive is None:
        return []
    page = archive.jobs_page(
        after,
        req.queue,
        req.namespace,
        req.phases,
        want,
        before_index=upper,
        skip=state.jobs,
        owner=req.owner,
        readable=None if scope is None else (scope.queues, scope.user),
    )
    return [record_from_stored(stored, template=False) for stored in page]


def watch_jobs(
    state: ClusterState, req: pb.WatchJobsRequest, scope: ReadScope | None = None
) -> tuple[Subscriber[pb.JobEvent], Iterable[pb.JobEvent]]:
    """A subscription to job events matching the request, and the initial events to send first."""
    watched = state.jobs.get(req.job_id) if req.job_id else None
    if req.job_id and watched is None:
        raise not_found(f"job_id: job {req.job_id!r} does not exist")

    def accepts(event: pb.JobEvent) -> bool:
        spec = event.job.spec
        return not (
            (req.job_id and spec.id != req.job_id)
            or (req.queue and spec.queue != req.queue)
            or (req.namespace and spec.namespace != req.namespace)
            or (scope is not None and not scope.allows(spec.queue, spec.owner))
        )

    initial: Iterable[pb.JobEvent] = ()
    if req.send_initial and watched is not None:
        initial = [
            pb.JobEvent(
                type=pb.JobEvent.TYPE_ADDED, job=job_proto(watched), revision=state.watch.revision
            )
        ]
    elif req.send_initial:
        initial = _initial_events(state, accepts)
    return state.watch.subscribe(accepts), initial


async def watch_stream(
    initial: Iterable[pb.JobEvent], sub: Subscriber[pb.JobEvent]
) -> AsyncIterator[pb.JobEvent]:
    """WatchJobs' events: the initial ones, then the subscription's, less those the initial
    events made stale (an initial event is read as it is sent: the subscription's queued events of
    its job up to its revision are older)."""
    sent: dict[str, int] = {}
    for event in initial:
        sent[event.job.spec.id] = event.revision
        yield event
    last = max(sent.values(), default=0)
    async for event in sub.receive:
        if sent:
            if event.revision <= sent.get(event.job.spec.id, 0):
                continue
            if event.revision > last:  # past every event queued before the initial ones
                sent.clear()
        yield event


# Jobs read at a time for WatchJobs' initial events: the stream sends them between reads.
INITIAL_CHUNK = 256


def _initial_events(
    state: ClusterState, accepts: Callable[[pb.JobEvent], bool]
) -> Iterator[pb.JobEvent]:
    """The jobs in memory (every active one and those finished within the retention; older
    finished jobs are in ListJobs) as ADDED events, made a chunk at a time as the stream sends
    them: memory stays bounded with a million jobs, and the table may change between chunks (each
    chunk starts after the last job sent, by creation index). An event is read when it is sent, so
    it may be newer than events of its job the subscription queued meanwhile: each carries the
    revision it was read at, and the stream drops the queued ones up to it
    (``server.service.rpc``)."""
    after = 0
    while True:
        chunk = list(itertools.islice(state.jobs.created_after(after), INITIAL_CHUNK))
        if not chunk:
            return
        for rec in chunk:
            event = pb.JobEvent(
                type=pb.JobEvent.TYPE_ADDED, job=job_proto(rec), revision=state.watch.revision
            )
            if accepts(event):
                yield event
        after = chunk[-1].creation_index


def explain(state: ClusterState, job_id: str) -> pb.ExplainResponse:
    rec = state.job_or_error(job_id, "job_id")
    exp = rec.status.explanation
    resp = pb.ExplainResponse(job_id=job_id, phase=rec.status.phase)  # type: ignore[arg-type]
    past = _past_window(state, rec)
    if past is not None:
        cycle_id, window = past
        resp.cycle_id = cycle_id
        resp.gate = "queue"
        resp.summary = (
            f"queue {rec.spec.queue}: not considered in cycle {cycle_id}, which opened the first "
            f"{window.lookback} waiting jobs of the queue (maxQueueLookback); {window.jobs} "
            "jobs wait past them"
        )
        if exp:
            resp.summary += f"; cycle {exp.get('cycle_id', 0)} found: {exp.get('summary', '')}"
    elif exp:
        resp.cycle_id = exp.get("cycle_id", 0)
        resp.gate = exp.get("gate", "")
        resp.summary = exp.get("summary", "")
        resp.node_reasons.update(exp.get("node_reasons", {}))
    else:
        resp.gate = "none"
        resp.summary = (
            f"job is {short_enum_name(pb.JobPhase.DESCRIPTOR, rec.status.phase).lower()}"
            + ("; no cycle has considered it yet" if rec.active else "")
        )
    if (estimate := current_estimate(rec)) is not None:
        set_estimate(resp, estimate)
    return resp


def _past_window(state: ClusterState, rec: JobRecord) -> tuple[int, BeyondWindow] | None:
    """The last cycle and its window of the job's queue, when that cycle did not open the job
    (it waited past the first ``maxQueueLookback`` jobs of its queue)."""
    cycle_id, windows = state.last_window
    window = windows.get(rec.spec.queue)
    if window is None or rec.status.phase not in WAITING_PHASES or rec.status.hold:
        return None
    exp = rec.status.explanation or {}
    if exp.get("gate") in CONTROL_GATES:  # job control keeps it out of cycles: that says why
        return None
    return (cycle_id, window) if exp.get("cycle_id", 0) < cycle_id else None


def list_queues(state: ClusterState) -> pb.ListQueuesResponse:
    """Every queue with the totals of its subtree: what the active jobs of the queue and of every
    queue below it hold (``allocated``) and how many of them wait or run. A parent queue's
    capability and deserved bound its subtree, so its numbers are its subtree's (``root``'s: the
    whole cluster's); a leaf's are its own."""
    own = queue_allocated(state)
    pending = Counter[str]()
    running = Counter[str]()
    for rec in state.active_jobs.values():  # finished jobs count nowhere here
        qname = rec.queue
        if rec.status.phase in WAITING_PHASES:
            pending[qname] += 1
        elif rec.status.phase == pb.JOB_PHASE_RUNNING:
            running[qname] += 1
    allocated: dict[str, dict[str, float]] = {name: {} for name in state.queues}
    pending_total = Counter[str]()
    running_total = Counter[str]()
    for name in state.queues:
        for q in _self_and_ancestors(state, name):
            total = allocated[q]
            for r, v in own.get(name, {}).items():
                total[r] = total.get(r, 0.0) + v
            pending_total[q] += pending[name]
            running_total[q] += running[name]
    out = pb.ListQueuesResponse()
    for name, entry in state.queues.items():
        out.queues.add(
            queue=entry.proto,
            allocated=convert.resource_list(allocated[name]),
            pending_jobs=pending_total[name],
            running_jobs=running_total[name],
        )
    return out


def _self_and_ancestors(state: ClusterState, name: str) -> list[str]:
    """``name`` and the queues above it up to ``root`` (a queue without a parent is under
    ``root``), each once."""
    chain = [name]
    cur = name
    while cur != "root":
        entry = state.queues.get(cur)
        parent = (entry.proto.parent if entry is not None else "") or "root"
        if parent in chain or parent not in state.queues:
            break
        chain.append(parent)
        cur = parent
    return chain


def list_nodes(state: ClusterState, backend: str) -> pb.ListNodesResponse:
    if backend and backend not in state.backends:
        raise not_found(f"backend: backend {backend!r} is not registered")
    used: dict[str, dict[str, float]] = {}
    holders: dict[str, dict[str, str]] = {}  # whole devices and shared GPUs -> a task on them
    whole: dict[str, set[str]] = {}  # devices held whole
    shares: dict[str, dict[str, float]] = {}  # shared GPU -> the part of it its tasks take
    count = Counter[str]()

    def occupy(
        node: str,
        task: str,
        request: dict[str, float],
        devices: list[str],
        gpu_groups: list[str],
        fraction: float,
    ) -> None:
        u = used.setdefault(node, {})
        for r, v in request.items():
            u[r] = u.get(r, 0.0) + v
        count[node] += 1
        for d in devices:
            holders.setdefault(node, {})[d] = task
            whole.setdefault(node, set()).add(d)
        for g in gpu_groups:  # a shared GPU is held (by its group): named by one of its tasks
            holders.setdefault(node, {})[g] = task
            taken = shares.setdefault(node, {})
            taken[g] = taken.get(g, 0.0) + fraction

    for rec in state.jobs.values():
        if rec.all_pending() or not any(t.status in OCCUPYING for t in rec.tasks):
            continue  # (no template built for a job that holds nothing)
        for t, tmpl in zip(rec.tasks, rec.template.tasks, strict=True):
            if t.status in OCCUPYING and t.node in state.nodes:
                groups = [t.gpu_group] if t.gpu_group else []
                occupy(t.node, t.uid, tmpl.request, t.devices, groups, tmpl.gpu_fraction)
    for f in state.foreign.values():
        spec = f.spec
        if spec.node is not None and spec.node in state.nodes:
            occupy(
                spec.node, spec.name, spec.request, spec.devices, spec.gpu_groups, spec.gpu_fraction
            )
    out = pb.ListNodesResponse()
    liveness = state.liveness
    for name, entry in state.nodes.items():
        if backend and entry.spec.backend != backend:
            continue
        view = node_view(
            entry.proto,
            used.get(name, {}),
            entry.spec.allocatable,
            count[name],
            whole.get(name, set()),
            shares.get(name, {}),
        )
        view.device_holders.update(holders.get(name, {}))
        view.not_ready_reason = liveness.reason(entry)
        if contact := convert.timestamp(liveness.last_contact_wall(entry.spec.backend)):
            view.backend_last_contact.CopyFrom(contact)
        out.nodes.append(view)
    return out


def tasks_named(rec: JobRecord, task_id: str) -> list[str]:
    """The ids of the job's tasks a logs request names: ``task_id`` (NOT_FOUND, listing some of
    the job's tasks, when the job has none of that id), or every one when it is empty."""
    tasks = [t.uid for t in rec.tasks]
    if not task_id:
        return tasks
    if task_id not in tasks:
        raise not_found(
            f"task_id: job {rec.id!r} has no task {task_id!r} "
            f"(tasks: {', '.join(tasks[:5])}{' ...' if len(tasks) > 5 else ''})"
        )
    return [task_id]


# Task output in one GetTaskLogs answer, at most: a job with many tasks gets each one's tail.
LOG_REPLY_BYTES = 16 * 1024 * 1024


def get_task_logs(state: ClusterState, req: pb.GetTaskLogsRequest) -> pb.GetTaskLogsResponse:
    """The output the backends sent of a job's tasks (or of one of them), in task order: what is
    kept of each (``--task-log-limit`` per task), within ``LOG_REPLY_BYTES`` in all."""
    rec = state.job_or_error(req.job_id, "job_id")
    tasks = tasks_named(rec, req.task_id)
    out = pb.GetTaskLogsResponse()
    logs = state.task_logs
    states = logs.states(rec.id, tasks)
    # Each task's tail, all of it kept when the answer stays within LOG_REPLY_BYTES.
    share = max(1, LOG_REPLY_BYTES // max(1, len(states)))
    for uid in tasks:
        st = states.get(uid)
        if st is None:
            out.logs.add(task_id=uid)
            continue
        start, data = logs.read(uid, max(st.dropped, st.written - share), st.written)
        out.logs.add(
            task_id=uid,
            data=data,
            truncated=start > 0,
            eof=st.eof,
            dropped_bytes=start,
            size=st.written,
        )
    return out
