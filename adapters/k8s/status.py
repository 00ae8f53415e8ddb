"""What Muster decided, written back to Kubernetes: PodGroup status and pod Events.

The controller watches the server's jobs (``WatchJobs``) and, for each Muster job of a PodGroup,
patches the PodGroup's ``/status`` the way Volcano does (phase Pending / Inqueue / Running /
Completed, running / succeeded / failed counts, a Scheduled or Unschedulable condition), only
when it changed. A KAI PodGroup gets the status KAI's scheduler writes instead: pod counts and,
while the gang cannot be placed and none of its pods is allocated, an ``UnschedulableOnNodePool``
entry in ``schedulingConditions`` (KAI sets no phase). Pods of a job the server cannot place get a
``FailedScheduling`` Event, once per distinct message (kube-scheduler style); binds get
``Scheduled``. Events go through a bounded queue and one writer task, so a slow API server never
slows a bind down.
"""

from __future__ import annotations

from datetime import UTC, datetime

import anyio
import grpc
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from adapters.k8s import translate as tr
from adapters.k8s.common import (
    PODGROUP_APIS,
    AdapterStats,
    JobBook,
    Obj,
    ServerLink,
    SubmittedJob,
    WorkQueue,
    server_backoff,
)
from adapters.k8s.informer import Informer
from adapters.k8s.kube import KubeWriter
from muster.conditions import UNSCHEDULABLE
from muster.gang import GangPhase, gang_phase
from muster.v1 import muster_pb2 as pb

log = structlog.get_logger("muster.k8s")

EventItem = tuple[Obj, str, str, str]  # pod, reason, message, type


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StatusController:
    """PodGroup status and pod Events; see the module docstring."""

    def __init__(
        self,
        server: ServerLink,
        writer: KubeWriter,
        book: JobBook,
        stats: AdapterStats,
        *,
        pods: Informer,
        podgroups: dict[str, Informer],
    ) -> None:
        self.server = server
        self.writer = writer
        self.book = book
        self.stats = stats
        self.pods = pods
        self.podgroups = podgroups
        self.job_views: dict[str, pb.Job] = {}  # from WatchJobs
        self.pg_status_written: dict[str, Obj] = {}
        self.event_messages: dict[str, str] = {}  # pod key -> last FailedScheduling message
        self._dirty: WorkQueue[str] = WorkQueue()
        self._events_send: MemoryObjectSendStream[EventItem] | None = None

    # -- what the other controllers call ------------------------------------------------------

    def mark(self, job_id: str) -> None:
        """Job ``job_id`` changed: rewrite its status soon."""
        self._dirty.add(job_id)

    def seen(self, job: pb.Job) -> None:
        """The server's current view of a job (from SubmitJob / GetJob)."""
        self.job_views[job.spec.id] = job

    def forget_pod(self, pod_key: str) -> None:
        self.event_messages.pop(pod_key, None)

    def emit_event(self, pod: Obj, reason: str, message: str, event_type: str) -> None:
        if self._events_send is None:
            return
        try:
            self._events_send.send_nowait((pod, reason, message, event_type))
        except anyio.WouldBlock:
            log.warning("event queue full, dropping event", reason=reason)

    # -- events -------------------------------------------------------------------------------

    def open_events(self) -> MemoryObjectReceiveStream[EventItem]:
        """Start queueing events; the returned stream is for :meth:`write_events`."""
        send, receive = anyio.create_memory_object_stream[EventItem](10_000)
        self._events_send = send
        return receive

    async def write_events(self, receive: MemoryObjectReceiveStream[EventItem]) -> None:
        async with receive:
            async for pod, reason, message, event_type in receive:
                try:
                    result = await self.writer.pod_event(
                        pod, reason=reason, message=message, event_type=event_type
                    )
                except Exception as exc:  # noqa: BLE001 - events are best effort
                    log.info("event not written", reason=reason, error=repr(exc))
                    continue
                if result.ok:
                    self.stats.events += 1
                else:
                    log.info("event refused", reason=reason, error=result.message)

    # -- loops --------------------------------------------------------------------------------

    async def watch_jobs(self) -> None:
        """Follow the server's view of our jobs (``WatchJobs``), reconnecting with backoff."""
        backoff = server_backoff()
        while True:
            try:
                call = self.server.stub.WatchJobs(pb.WatchJobsRequest(send_initial=True))
                async for event in call:
                    backoff.reset()
                    job = event.job
                    if not job.spec.id.startswith("k8s:") or job.spec.id not in self.book.jobs:
                        continue
                    if event.type == pb.JobEvent.TYPE_DELETED:
                        self.job_views.pop(job.spec.id, None)
                    else:
                        self.job_views[job.spec.id] = job
                    self.mark(job.spec.id)
            except grpc.aio.AioRpcError as exc:
                log.info("job watch ended", code=exc.code().name)
            await backoff.sleep()

    async def run(self) -> None:
        """Write the status of every job marked dirty, as they are marked."""
        while True:
            await self._dirty.wait()
            ids = self._dirty.take()
            for job_id in sorted(ids):
                submitted = self.book.jobs.get(job_id)
                if submitted is None:
                    continue
                try:
                    await self._write_status(submitted)
                except Exception:  # status is best effort; the next change retries
                    log.exception("status write failed", job=job_id)

    # -- one job ------------------------------------------------------------------------------

    async def _write_status(self, submitted: SubmittedJob) -> None:
        job = self.job_views.get(submitted.job_id)
        pods = [(k, self.pods.cache.get(k)) for k in submitted.tasks.values()]
        cond = _unschedulable(job)
        message = ""  # why the job cannot be placed ("" while it can)
        # FailedScheduling on pods still pending, once per distinct message (kube-scheduler style).
        if cond is not None:
            message = cond.message or await self._explain(submitted.job_id)
            for pod_key, pod in pods:
                if (
                    pod is not None
                    and not tr.pod_node(pod)
                    and self.event_messages.get(pod_key) != message
                ):
                    self.event_messages[pod_key] = message
                    self.emit_event(pod, "FailedScheduling", message, "Warning")
        if submitted.key[0] != "group":
            return
        _, api_version, gkey = submitted.key
        podgroup = self.podgroups[api_version].cache.get(gkey)
        if podgroup is None:
            return
        live = [p for _, p in pods if p is not None]
        previous = self.pg_status_written.get(gkey)
        if api_version == tr.KAI_PODGROUP:
            status = kai_podgroup_status(podgroup, live, message)
            _number_transitions(previous or podgroup.get("status") or {}, status)
        else:
            status = podgroup_status(podgroup, live, job, cond)
        if previous is not None and _without_times(previous) == _without_times(status):
            return
        if previous is not None:
            _keep_transition_times(previous, status)
        group, version = PODGROUP_APIS[api_version]
        ns, name = gkey.split("/", 1)
        result = await self.writer.patch_podgroup_status(group, version, ns, name, status)
        if result.ok:
            self.pg_status_written[gkey] = status
            self.stats.status_patches += 1
        else:
            log.info("podgroup status refused", podgroup=gkey, error=result.message)

    async def _explain(self, job_id: str) -> str:
        try:
            reply = await self.server.stub.Explain(pb.ExplainRequest(job_id=job_id))
        except grpc.aio.AioRpcError:
            return "waiting for the gang to fit"
        return reply.summary or "waiting for the gang to fit"


def podgroup_status(
    podgroup: Obj, pods: list[Obj], job: pb.Job | None, cond: pb.Condition | None
) -> Obj:
    """Volcano's PodGroup status: Running once minMember pods are allocated (bound)."""
    gang = tr.gang_spec(podgroup)
    running = sum(1 for p in pods if tr.pod_phase(p) == "Running")
    succeeded = sum(1 for p in pods if tr.pod_phase(p) == "Succeeded")
    failed = sum(1 for p in pods if tr.pod_phase(p) == "Failed")
    allocated = sum(1 for p in pods if tr.pod_active_on_node(p))
    # Running needs a pod placed even with no gang minimum (minMember 0).
    minimum = max(1, gang.minimum(len(pods)))
    gang_is = gang_phase(
        minimum, tasks=len(pods), placed=allocated, succeeded=succeeded, failed=failed
    )
    if gang_is == GangPhase.COMPLETED:
        phase = "Completed"
    elif gang_is == GangPhase.RUNNING:
        phase = "Running"
    elif job is not None and job.status.phase in (pb.JOB_PHASE_INQUEUE, pb.JOB_PHASE_RUNNING):
        phase = "Inqueue"
    else:
        phase = "Pending"
    conditions: list[Obj] = []
    if phase in ("Running", "Completed"):
        conditions.append(
            {
                "type": "Scheduled",
                "status": "True",
                "reason": "tasks in gang are ready to be scheduled",
                "message": "",
                "lastTransitionTime": _now(),
            }
        )
    elif cond is not None:
        conditions.append(
            {
                "type": "Unschedulable",
                "status": "True",
                "reason": cond.reason or "NotEnoughResources",
                "message": cond.message,
                "lastTransitionTime": _now(),
            }
        )
    return {
        "phase": phase,
        "running": running,
        "succeeded": succeeded,
        "failed": failed,
        "conditions": conditions,
    }


KAI_NODE_POOL_LABEL = "kai.scheduler/node-pool"  # KAI's default node-pool label key


def kai_podgroup_status(podgroup: Obj, pods: list[Obj], unschedulable: str) -> Obj:
    """KAI's PodGroup status: pod counts by phase, and an ``UnschedulableOnNodePool`` scheduling
    condition (reason ``Unschedulable``) while the gang cannot be placed and none of its pods is
    allocated (KAI leaves the condition alone once a pod is). ``unschedulable``: why, or ""."""
    phases = [tr.pod_phase(p) for p in pods]
    status: Obj = {
        "pending": phases.count("Pending"),
        "running": phases.count("Running"),
        "succeeded": phases.count("Succeeded"),
        "failed": phases.count("Failed"),
    }
    if unschedulable and not any(tr.pod_active_on_node(p) for p in pods):
        node_pool = (tr.meta(podgroup).get("labels") or {}).get(KAI_NODE_POOL_LABEL) or "default"
        status["schedulingConditions"] = [
            {
                "type": "UnschedulableOnNodePool",
                "nodePool": node_pool,
                "reason": "Unschedulable",
                "message": unschedulable,
                "status": "True",
                "transitionID": "1",
                "lastTransitionTime": _now(),
            }
        ]
    return status


def _number_transitions(previous: Obj, status: Obj) -> None:
    """KAI numbers a node pool's scheduling-condition transitions: an unchanged condition keeps its
    id (and time), a changed one takes the next id."""
    before = {c.get("nodePool"): c for c in previous.get("schedulingConditions") or []}
    for c in status.get("schedulingConditions", []):
        old = before.get(c["nodePool"])
        if old is None:
            continue
        if all(old.get(k) == c[k] for k in ("type", "reason", "message", "status")):
            c["transitionID"] = old.get("transitionID", c["transitionID"])
            c["lastTransitionTime"] = old.get("lastTransitionTime", c["lastTransitionTime"])
        else:
            try:
                c["transitionID"] = str(int(old.get("transitionID") or 0) + 1)
            except ValueError:
                c["transitionID"] = "1"


def _unschedulable(job: pb.Job | None) -> pb.Condition | None:
    if job is None:
        return None
    for cond in job.status.conditions:
        if cond.type == UNSCHEDULABLE and cond.status == "True":
            return cond
    return None


def _without_times(status: Obj) -> Obj:
    out = dict(status)
    for key in ("conditions", "schedulingConditions"):
        if key in status:
            out[key] = [
                {k: v for k, v in c.items() if k not in ("lastTransitionTime", "transitionID")}
                for c in status[key]
            ]
    return out


def _keep_transition_times(previous: Obj, status: Obj) -> None:
    before = {
        (c["type"], c["status"]): c.get("lastTransitionTime")
        for c in previous.get("conditions", [])
    }
    for c in status.get("conditions", []):
        if before.get((c["type"], c["status"])):
            c["lastTransitionTime"] = before[(c["type"], c["status"])]
