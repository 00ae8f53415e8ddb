"""ListJobHistory: finished jobs with their accounting, like Slurm's ``sacct`` (``muster history``).

Finished jobs are read from the store's archive (``JobHistoryArchive.finished_jobs``: filtered
and paged there, by finish time then submission order), so a job that left memory long ago is
found as well as one that just ended; a job still in memory is answered from memory, which may be
newer (its tasks' releases still counting). A job that ended since the last write reaches the
store with the next one (milliseconds): until then it is not listed. Without a store (a state
built without one) the finished jobs in memory are listed.

Per job: its times, elapsed (start to finish), its tasks by how they ended, the exit codes, and
two kinds of quantity-seconds per resource, in the resource's base unit (cpu: core-seconds,
nvidia.com/gpu: GPU-seconds, memory: byte-seconds):

* requested: every task's request x the job's elapsed time;
* used: every task's request (its allocation) x the time it held its node, from its bind being
  acknowledged until it ended or its release was acknowledged (``state.account_usage``).

A fractional GPU share (``gpu_fraction``) counts as that share of ``nvidia.com/gpu`` in both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from google.protobuf.timestamp_pb2 import Timestamp

from muster.conditions import ENDED
from muster.devices import NVIDIA_GPU
from muster.phases import TERMINAL_PHASES
from muster.quantity import PODS, QuantityError, is_bytes_resource, parse_resources
from muster.v1 import muster_pb2 as pb
from server.model import EXITED, TaskStatus
from server.service.api.queries import ReadScope
from server.service.convert import timestamp
from server.service.errors import invalid
from server.service.records import JobRecord, JobStatusRecord
from server.service.state import ClusterState
from server.service.store import FinishedJob, HistoryQuery, JobHistoryArchive, StoredJob
from server.service.views import decode_position, encode_position, number, page_size, whole_number


def list_job_history(
    state: ClusterState, req: pb.ListJobHistoryRequest, scope: ReadScope | None = None
) -> pb.ListJobHistoryResponse:
    size = page_size(req.page_size)
    for i, phase in enumerate(req.phases):
        if phase not in TERMINAL_PHASES:
            raise invalid(
                f"phases[{i}]: {phase} is not a phase a job ends in (Completed, Failed, Cancelled)"
            )
    since = _seconds(req, "finished_after")
    until = _seconds(req, "finished_before")
    if since is not None and until is not None and until <= since:
        raise invalid("finished_before: must be later than finished_after")
    phases = tuple(sorted(set(req.phases) or TERMINAL_PHASES))
    filters = (req.queue, req.namespace, req.owner, phases, since, until)
    query = HistoryQuery(
        phases=phases,
        finished_after=since,
        finished_before=until,
        queue=req.queue,
        namespace=req.namespace,
        owner=req.owner,
        readable=None if scope is None else (tuple(sorted(scope.queues)), scope.user),
        after=_decode_token(req.page_token, filters),
        limit=size + 1,
    )
    now = state.clock()
    out = pb.ListJobHistoryResponse()
    archive = state.archive
    rows = (
        archive.finished_jobs(query)
        if isinstance(archive, JobHistoryArchive)
        else _in_memory(state, query, scope)
    )
    for found in rows[:size]:
        rec = dict.get(state.jobs, found.job.id)  # memory only: newer than the store
        if rec is not None and rec.active:
            continue  # back in play since (requeued)
        out.jobs.append(_from_record(rec, now) if rec is not None else _from_stored(found, now))
    if len(rows) > size:
        last = rows[size - 1]
        position = {"t": last.finish_time, "i": last.job.creation_index}
        out.next_page_token = encode_position(position, filters)
    return out


def _in_memory(
    state: ClusterState, query: HistoryQuery, scope: ReadScope | None
) -> list[FinishedJob]:
    """The history from the finished jobs in memory (a state without a store)."""
    found = []
    for rec in state.jobs.values():
        st = rec.status
        if rec.active or st.phase not in query.phases:
            continue
        spec = rec.spec
        key = (st.finish_time, rec.creation_index)
        if (
            (query.finished_after is not None and st.finish_time < query.finished_after)
            or (query.finished_before is not None and st.finish_time >= query.finished_before)
            or (query.queue and spec.queue != query.queue)
            or (query.namespace and spec.namespace != query.namespace)
            or (query.owner and spec.owner != query.owner)
            or (scope is not None and not scope.allows(spec.queue, spec.owner))
            or (query.after is not None and key <= query.after)
        ):
            continue
        stored = StoredJob(rec.id, rec.creation_index, rec.spec_bytes, st, [])
        found.append(FinishedJob(stored, st.finish_time, {}, {}))
    found.sort(key=lambda f: (f.finish_time, f.job.creation_index))
    return found[: query.limit]


def _from_record(rec: JobRecord, now: float) -> pb.JobAccounting:
    statuses = Counter(int(t.status) for t in rec.tasks)
    codes = Counter(t.exit_code for t in rec.tasks if t.status in EXITED)
    return _accounting(rec.spec, rec.status, statuses, codes, now)


def _from_stored(found: FinishedJob, now: float) -> pb.JobAccounting:
    spec = pb.JobSpec.FromString(found.job.spec)
    return _accounting(spec, found.job.status, found.statuses, found.exit_codes, now)


def _accounting(
    spec: pb.JobSpec,
    st: JobStatusRecord,
    statuses: Mapping[int, int],
    codes: Mapping[int, int],
    now: float,
) -> pb.JobAccounting:
    elapsed = max(0.0, st.finish_time - st.start_time) if st.start_time else 0.0
    requested: dict[str, float] = {}
    tasks = 0
    for group in spec.task_groups:
        tasks += group.replicas
        try:
            request = parse_resources(dict(group.request.quantities))
        except QuantityError:
            request = {}  # stored by a version that took it; nothing to count
        if group.gpu_fraction:
            request[NVIDIA_GPU] = request.get(NVIDIA_GPU, 0.0) + group.gpu_fraction * 1000
        for name, value in request.items():
            requested[name] = requested.get(name, 0.0) + value * group.replicas * elapsed
    used = dict(st.used)
    if st.holding and st.used_at:  # tasks still releasing: count them up to now
        span = max(0.0, now - st.used_at)
        for name, value in st.holding.items():
            used[name] = used.get(name, 0.0) + value * span
    out = pb.JobAccounting(
        job_id=spec.id,
        name=spec.name,
        namespace=spec.namespace,
        queue=spec.queue,
        owner=spec.owner,
        phase=st.phase,  # type: ignore[arg-type]  # proto enums are ints
        elapsed_seconds=elapsed,
        tasks=tasks,
        succeeded=statuses.get(int(TaskStatus.SUCCEEDED), 0),
        failed=statuses.get(int(TaskStatus.FAILED), 0),
        cancelled=statuses.get(int(TaskStatus.CANCELLED), 0),
        requested={n: _base(n, v) for n, v in sorted(requested.items())},
        used={n: _base(n, v) for n, v in sorted(used.items()) if v},
        exit_codes=dict(codes),
        reason=next((c.message for c in st.conditions if c.type == ENDED), ""),
        requeue_count=st.requeue_count,
    )
    for name in ("submit_time", "start_time", "finish_time"):
        if ts := timestamp(getattr(st, name)):
            getattr(out, name).CopyFrom(ts)
    return out


def _base(name: str, canonical: float) -> float:
    """A canonical quantity(-second) in the resource's base unit (cpu: cores, not millicores)."""
    return canonical if name == PODS or is_bytes_resource(name) else canonical / 1000


def _seconds(req: pb.ListJobHistoryRequest, field: str) -> float | None:
    if not req.HasField(field):
        return None
    ts: Timestamp = getattr(req, field)
    return ts.seconds + ts.nanos / 1e9


def _decode_token(token: str, filters: tuple[object, ...]) -> tuple[float, int] | None:
    """The (finish time, creation index) to continue after; None: no token, from the start."""
    if not token:
        return None
    return decode_position(
        token,
        filters,
        "ListJobHistory",
        lambda raw: (number(raw["t"]), whole_number(raw["i"])),
    )
