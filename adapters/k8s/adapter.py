"""The Kubernetes backend: informers in, Muster jobs / snapshot / deltas out, decisions enforced.

Built on :class:`adapters.runtime.BackendRuntime` (register, snapshot, deltas, decision stream,
acks, reconnect). This module adds what is Kubernetes-specific:

* informers for Nodes, Pods, Volcano and coscheduling PodGroups, Volcano Queues, PriorityClasses;
* a job controller: pods with ``spec.schedulerName == <scheduler name>`` become Muster jobs
  (a PodGroup's pods -> one job ``k8s:<ns>:<podgroup>``, one TaskGroup per role; a pod without a
  group -> a job of one ``k8s:<ns>:pod:<name>``); gang pods wait until their PodGroup is seen and
  has ``minMember`` pods. Task ids are the server's (``<job id>/<role>-<index>``); the pod behind
  each index is stored in the TaskGroup annotation ``muster.dev/pods`` so that an adapter restart
  recovers the mapping from the server (GetJob) rather than guessing;
* enforcement: binds through ``pods/binding``, evictions through the Eviction API, PodGroup status
  through ``/status`` merge-patch, ``Scheduled`` / ``FailedScheduling`` Events on pods;
* bound pods of other schedulers (and Muster pods it cannot map) are foreign tasks.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import grpc
import structlog
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from kubernetes_asyncio import client

from adapters.k8s import translate as tr
from adapters.k8s.informer import Informer
from adapters.k8s.kube import KubeWriter
from adapters.runtime import APPLIED, BackendRuntime, DecisionLedger, Outcome
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

log = structlog.get_logger("muster.k8s")

Obj = dict[str, Any]
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
# BOUND too: if a bind decision expired on the server while the pod was in fact bound, this
# tells the server where the pod really is (it ignores BOUND for tasks it already knows placed).
REPORTED_STATUSES = (pb.TASK_STATUS_BOUND, pb.TASK_STATUS_RUNNING, pb.TASK_STATUS_SUCCEEDED, pb.TASK_STATUS_FAILED)
_ITEM_ERRORS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)
PODGROUP_APIS = {
    tr.VOLCANO_PODGROUP: ("scheduling.volcano.sh", "v1beta1"),
    tr.COSCHEDULING_PODGROUP: ("scheduling.x-k8s.io", "v1alpha1"),
}

# A job key: ("group", podgroup apiVersion, "ns/name") or ("pod", "", "ns/name").
JobKey = tuple[str, str, str]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class SubmittedJob:
    job_id: str
    key: JobKey
    tasks: dict[str, str] = field(default_factory=dict)  # task id -> pod key


@dataclass(slots=True)
class AdapterStats:
    binds: int = 0
    bind_rejects: int = 0
    evictions: int = 0
    evict_rejects: int = 0
    submits: int = 0
    status_patches: int = 0
    events: int = 0


class K8sBackend:
    """Implements the runtime's ``Backend`` protocol and runs the Kubernetes-side controllers."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        server: str,
        scheduler_name: str = "muster",
        name: str = "kubernetes",
        ledger: DecisionLedger | None = None,
        bind_concurrency: int = 64,
        evict_attempts: int = 5,
        evict_backoff: float = 0.2,
        watch_timeout: int = 300,
        runtime_options: dict[str, Any] | None = None,
    ) -> None:
        self.server = server
        self.scheduler_name = scheduler_name
        self.name = name
        self.writer = KubeWriter(api, scheduler_name=scheduler_name)
        self.bind_limit = anyio.Semaphore(bind_concurrency)
        self.evict_attempts = evict_attempts
        self.evict_backoff = evict_backoff
        self.stats = AdapterStats()
        self.runtime = BackendRuntime(
            self, server=server, name=name, kind="kubernetes", ledger=ledger, **(runtime_options or {})
        )
        core, custom, sched = self.writer.core, self.writer.custom, self.writer.scheduling
        opts = {"watch_timeout": watch_timeout}
        self.nodes = Informer("nodes", core.list_node, handler=self._on_node, **opts)
        self.pods = Informer("pods", core.list_pod_for_all_namespaces, handler=self._on_pod, **opts)
        self.podgroups = {
            api_version: Informer(
                f"podgroups.{group}", custom.list_custom_object_for_all_namespaces, group, version, "podgroups",
                handler=self._podgroup_handler(api_version), **opts,
            )
            for api_version, (group, version) in PODGROUP_APIS.items()
        }
        self.queues = Informer("queues", custom.list_cluster_custom_object, "scheduling.volcano.sh", "v1beta1",
                               "queues", handler=self._on_queue, **opts)
        self.priority_classes = Informer("priorityclasses", sched.list_priority_class, handler=self._on_priority_class,
                                         **opts)
        self.informers = [self.nodes, self.pods, *self.podgroups.values(), self.queues, self.priority_classes]

        self.jobs: dict[str, SubmittedJob] = {}
        self.task_pod: dict[str, str] = {}  # task id -> pod key
        self.pod_task: dict[str, str] = {}  # pod key -> task id
        self.group_members: dict[tuple[str, str], set[str]] = {}  # (apiVersion, "ns/pg") -> pod keys
        self.submit_errors: dict[str, str] = {}  # job id -> why the server refused it
        self.job_views: dict[str, pb.Job] = {}  # from WatchJobs
        self.reported: dict[str, int] = {}  # task id -> last status reported
        self.sent_nodes: dict[str, bytes] = {}
        self.sent_foreign: dict[str, bytes] = {}
        self.pg_status_written: dict[str, Obj] = {}
        self.event_messages: dict[str, str] = {}  # pod key -> last FailedScheduling message
        self.bound_by_us: dict[str, str] = {}  # pod key -> node, until the informer sees it
        self._server_id_seen = ""
        self._streaming = False  # deltas flow once the first snapshot has been taken
        self._dirty_jobs: set[JobKey] = set()
        self._dirty_queues: set[str] = set()
        self._dirty_status: set[str] = set()
        self._wake_jobs = anyio.Event()
        self._job_lock = anyio.Lock()  # one reconciliation pass at a time
        self._wake_queues = anyio.Event()
        self._wake_status = anyio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.SchedulerStub | None = None
        self._events_send: ObjectSendStream[tuple[Obj, str, str, str]] | None = None
        self._stop = anyio.Event()
        self.ready = anyio.Event()

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        self._stop.set()
        self.runtime.stop()

    async def run(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.server)
        self._stub = pb_grpc.SchedulerStub(self._channel)
        send, receive = anyio.create_memory_object_stream[tuple[Obj, str, str, str]](10_000)
        self._events_send = send
        try:
            async with anyio.create_task_group() as tg:
                for informer in self.informers:
                    tg.start_soon(informer.run)
                with anyio.fail_after(120):  # a cluster that never lists is a configuration error
                    for informer in self.informers:
                        await informer.synced.wait()
                log.info("informers synced", nodes=len(self.nodes.cache), pods=len(self.pods.cache))
                tg.start_soon(self._event_writer, receive)
                tg.start_soon(self._queue_loop)
                tg.start_soon(self._job_loop)
                tg.start_soon(self._watch_jobs)
                tg.start_soon(self._status_loop)
                tg.start_soon(self._run_runtime, tg.cancel_scope)
                await self._stop.wait()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._channel.close(grace=None)

    async def _run_runtime(self, scope: anyio.CancelScope) -> None:
        await self.runtime.run()
        scope.cancel()  # the runtime gave up or was stopped: the adapter ends with it

    @property
    def stub(self) -> pb_grpc.SchedulerStub:
        assert self._stub is not None, "run() first"
        return self._stub

    # ------------------------------------------------------------------ Backend protocol

    async def list_nodes(self) -> Sequence[pb.Node]:
        nodes = [tr.node_to_pb(n) for n in self.nodes.cache.values()]
        self.sent_nodes = {n.name: n.SerializeToString(deterministic=True) for n in nodes}
        self._streaming = True
        return nodes

    async def list_tasks(self) -> Sequence[pb.BackendTask]:
        # A new server identity (first connection, or a server that lost its state) means our
        # job mapping may be unknown to it: push queues and jobs before the snapshot names tasks.
        if self.runtime.server_id != self._server_id_seen:
            await self._sync_all_queues()
            await self._resubmit_all()
            self._server_id_seen = self.runtime.server_id
        tasks: list[pb.BackendTask] = []
        self.sent_foreign = {}
        for key, pod in self.pods.cache.items():
            node = tr.pod_node(pod)
            if not node:
                continue
            task_id = self.pod_task.get(key)
            if task_id is not None:
                status = tr.pod_task_status(pod)
                tasks.append(pb.BackendTask(task_id=task_id, node=node, status=status,
                                            request=pb.ResourceList(quantities=tr.pod_request(pod))))
                self.reported[task_id] = status
            elif tr.pod_active_on_node(pod):
                task = tr.foreign_task(pod)
                self.sent_foreign[key] = task.SerializeToString(deterministic=True)
                tasks.append(task)
        self.ready.set()
        return tasks

    async def apply_bind(self, decision: pb.Decision) -> Outcome:
        return await self._bind(decision)

    async def apply_evict(self, decision: pb.Decision) -> Outcome:
        return await self._evict(decision)

    async def apply_batch(self, decisions: list[pb.Decision]) -> list[Outcome]:
        """Apply a burst concurrently (a gang's binds are independent API calls)."""
        outcomes: list[Outcome] = [Outcome.reject("not applied")] * len(decisions)

        async def one(i: int, decision: pb.Decision) -> None:
            async with self.bind_limit:
                try:
                    if decision.WhichOneof("action") == "bind":
                        outcomes[i] = await self._bind(decision)
                    elif decision.WhichOneof("action") == "evict":
                        outcomes[i] = await self._evict(decision)
                    else:
                        outcomes[i] = Outcome.reject("unknown decision action")
                except Exception as exc:  # noqa: BLE001 - one failure rejects one decision
                    log.exception("applying decision failed", decision=decision.id)
                    outcomes[i] = Outcome.reject(f"adapter error: {exc}")

        async with anyio.create_task_group() as tg:
            for i, decision in enumerate(decisions):
                tg.start_soon(one, i, decision)
        return outcomes

    # ------------------------------------------------------------------ enforcement

    def _pod_for(self, task_id: str) -> tuple[str, Obj | None]:
        key = self.task_pod.get(task_id, "")
        return key, self.pods.cache.get(key) if key else None

    async def _bind(self, decision: pb.Decision) -> Outcome:
        b = decision.bind
        key, pod = self._pod_for(b.task_id)
        if not key:
            return self._reject_bind(f"task {b.task_id} is not known to this adapter")
        if pod is None:
            return self._reject_bind(f"pod {key} no longer exists")
        node = self.nodes.cache.get(b.node)
        if node is None:
            return self._reject_bind(f"node {b.node} does not exist")
        if not tr.node_ready(node):
            return self._reject_bind(f"node {b.node} is NotReady")
        if (node.get("spec") or {}).get("unschedulable"):
            return self._reject_bind(f"node {b.node} is cordoned (unschedulable)")
        current = tr.pod_node(pod) or self.bound_by_us.get(key, "")
        if current == b.node:
            return APPLIED  # a resent decision after an adapter restart: already done, never bind twice
        if current:
            if tr.pod_node(pod):  # tell the server where the pod really is (e.g. after an expired bind)
                self._report_pod(b.task_id, pod, deleted=False, force=True)
            return self._reject_bind(f"pod {key} is already assigned to node {current}")
        ns, name = key.split("/", 1)
        result = await self.writer.bind(ns, name, b.node, uid=tr.meta(pod).get("uid", ""))
        if result.ok:
            self.stats.binds += 1
            self.bound_by_us[key] = b.node
            self._emit_event(pod, "Scheduled", f"Successfully assigned {key} to {b.node}", "Normal")
            return APPLIED
        if result.status == 409 and f'assigned to node "{b.node}"' in result.message:
            return APPLIED  # bound by an earlier incarnation of this adapter
        return self._reject_bind(f"binding {key} to {b.node}: {result.message}")

    def _reject_bind(self, reason: str) -> Outcome:
        self.stats.bind_rejects += 1
        log.info("bind rejected", reason=reason)
        return Outcome.reject(reason)

    async def _evict(self, decision: pb.Decision) -> Outcome:
        e = decision.evict
        key, pod = self._pod_for(e.task_id)
        if not key:
            return Outcome.reject(f"task {e.task_id} is not known to this adapter")
        if pod is None:
            return APPLIED  # already gone: the resources are free
        ns, name = key.split("/", 1)
        result = await self.writer.evict(ns, name, attempts=self.evict_attempts, backoff_initial=self.evict_backoff)
        if result.ok or result.status == 404:
            self.stats.evictions += 1
            return APPLIED
        self.stats.evict_rejects += 1
        return Outcome.reject(f"evicting {key}: {result.message}")

    def _emit_event(self, pod: Obj, reason: str, message: str, event_type: str) -> None:
        if self._events_send is None:
            return
        try:
            self._events_send.send_nowait((pod, reason, message, event_type))
        except anyio.WouldBlock:
            log.warning("event queue full, dropping event", reason=reason)

    async def _event_writer(self, receive: ObjectReceiveStream[tuple[Obj, str, str, str]]) -> None:
        async with receive:
            async for pod, reason, message, event_type in receive:
                try:
                    result = await self.writer.pod_event(pod, reason=reason, message=message, event_type=event_type)
                except Exception as exc:  # noqa: BLE001 - events are best effort
                    log.info("event not written", reason=reason, error=repr(exc))
                    continue
                if result.ok:
                    self.stats.events += 1
                else:
                    log.info("event refused", reason=reason, error=result.message)

    # ------------------------------------------------------------------ informer handlers

    def _on_node(self, kind: str, node: Obj, old: Obj | None) -> None:
        if not self._streaming:
            return
        name = tr.meta(node)["name"]
        if kind == "DELETED":
            if self.sent_nodes.pop(name, None) is not None:
                self.runtime.remove_node(name)
            return
        message = tr.node_to_pb(node)
        data = message.SerializeToString(deterministic=True)
        if self.sent_nodes.get(name) != data:  # kubelet heartbeats change the RV, not the node
            self.sent_nodes[name] = data
            self.runtime.upsert_node(message)

    def _is_own(self, pod: Obj) -> bool:
        return (pod.get("spec") or {}).get("schedulerName") == self.scheduler_name

    def _on_pod(self, kind: str, pod: Obj, old: Obj | None) -> None:
        key = tr.key_of(pod)
        group = tr.pod_group_ref(pod)
        old_group = tr.pod_group_ref(old) if old else None
        if old_group and old_group != group:
            self.group_members.get(old_group, set()).discard(key)
        if kind == "DELETED":
            self.bound_by_us.pop(key, None)
            self.event_messages.pop(key, None)
        if tr.pod_node(pod):
            self.bound_by_us.pop(key, None)
        if self._is_own(pod):
            if group:
                members = self.group_members.setdefault(group, set())
                if kind == "DELETED":
                    members.discard(key)
                else:
                    members.add(key)
                self._mark_job(("group", group[0], group[1]))
            else:
                self._mark_job(("pod", "", key))
            task_id = self.pod_task.get(key)
            if task_id is not None:
                self._report_pod(task_id, pod, deleted=kind == "DELETED")
                self._mark_status(task_id.rsplit("/", 1)[0])
                return
            # Ours but not (yet) mapped to a task: if bound, it holds capacity like a foreign pod.
        # Not ours, or ours but unmapped: a bound pod only holds capacity.
        if not self._streaming:
            return
        if kind != "DELETED" and tr.pod_active_on_node(pod):
            task = tr.foreign_task(pod)
            data = task.SerializeToString(deterministic=True)
            if self.sent_foreign.get(key) != data:
                self.sent_foreign[key] = data
                self.runtime.upsert_foreign_task(task)
        elif self.sent_foreign.pop(key, None) is not None:
            self.runtime.remove_foreign_task(tr.foreign_task_id(pod))

    def _report_pod(self, task_id: str, pod: Obj, *, deleted: bool, force: bool = False) -> None:
        if not self._streaming:
            return
        status = tr.pod_task_status(pod)
        message = ""
        if deleted and status not in (pb.TASK_STATUS_SUCCEEDED, pb.TASK_STATUS_FAILED):
            if not tr.pod_node(pod):
                return  # a pending pod went away: the job controller cancels or shrinks the job
            status, message = pb.TASK_STATUS_FAILED, "pod deleted"
        if status not in REPORTED_STATUSES or (self.reported.get(task_id) == status and not force):
            return
        self.reported[task_id] = status
        self.runtime.report_task_status(task_id, status, node=tr.pod_node(pod), message=message,
                                        exit_code=tr.pod_exit_code(pod))

    def _podgroup_handler(self, api_version: str):  # noqa: ANN202 - a closure per PodGroup API
        def handle(kind: str, podgroup: Obj, old: Obj | None) -> None:
            self._mark_job(("group", api_version, tr.key_of(podgroup)))
        return handle

    def _on_queue(self, kind: str, queue: Obj, old: Obj | None) -> None:
        self._dirty_queues.add(tr.meta(queue)["name"])
        self._wake_queues.set()

    def _on_priority_class(self, kind: str, pc: Obj, old: Obj | None) -> None:
        pass  # read from the cache at submission time

    def _mark_job(self, key: JobKey) -> None:
        self._dirty_jobs.add(key)
        self._wake_jobs.set()

    def _mark_status(self, job_id: str) -> None:
        self._dirty_status.add(job_id)
        self._wake_status.set()

    # ------------------------------------------------------------------ queues

    async def _queue_loop(self) -> None:
        while True:
            await self._wake_queues.wait()
            self._wake_queues = anyio.Event()
            if self._server_id_seen:
                try:
                    await self._sync_queues(set(self._dirty_queues))
                except grpc.aio.AioRpcError as exc:
                    log.info("queue sync failed, retrying", code=exc.code().name)
                    await anyio.sleep(1.0)
                    self._wake_queues.set()

    async def _sync_all_queues(self) -> None:
        await self._sync_queues({tr.meta(q)["name"] for q in self.queues.cache.values()})

    async def _sync_queues(self, names: set[str]) -> None:
        for name in sorted(names, key=lambda n: (n != "root", n)):
            self._dirty_queues.discard(name)
            obj = self.queues.cache.get(name)
            try:
                if obj is None:
                    await self.stub.DeleteQueue(pb.DeleteQueueRequest(name=name))
                    continue
                queue = tr.queue_to_pb(obj)
                try:
                    await self.stub.CreateQueue(pb.QueueRequest(queue=queue))
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                        raise
                    await self.stub.UpdateQueue(pb.QueueRequest(queue=queue))
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _ITEM_ERRORS:
                    log.warning("queue refused by the server", queue=name, code=exc.code().name, details=exc.details())
                else:
                    self._dirty_queues.add(name)  # server away: retried on the next sync
                    raise

    # ------------------------------------------------------------------ jobs

    async def _job_loop(self) -> None:
        attempt = 0
        while True:
            await self._wake_jobs.wait()
            self._wake_jobs = anyio.Event()
            if not self._server_id_seen:
                continue  # the first session's list_tasks submits everything
            keys, self._dirty_jobs = self._dirty_jobs, set()
            try:
                async with self._job_lock:
                    for key in sorted(keys):
                        await self._reconcile(key)
                attempt = 0
            except Exception as exc:  # noqa: BLE001 - server away (or a bug): retry, never die
                self._dirty_jobs |= keys
                attempt += 1
                delay = min(5.0, 0.2 * 2 ** attempt) * random.uniform(0.5, 1)
                if isinstance(exc, grpc.aio.AioRpcError):
                    log.info("job sync failed, retrying", code=exc.code().name, delay=round(delay, 2))
                else:
                    log.exception("job sync failed, retrying", delay=round(delay, 2))
                await anyio.sleep(delay)
                self._wake_jobs.set()

    async def _resubmit_all(self) -> None:
        async with self._job_lock:
            await self._resubmit_all_locked()

    async def _resubmit_all_locked(self) -> None:
        self.jobs.clear()
        self.task_pod.clear()
        self.pod_task.clear()
        self.reported.clear()
        keys: set[JobKey] = set(self._dirty_jobs)
        for key, pod in self.pods.cache.items():
            if not self._is_own(pod):
                continue
            group = tr.pod_group_ref(pod)
            keys.add(("group", group[0], group[1]) if group else ("pod", "", key))
        self._dirty_jobs.clear()
        for key in sorted(keys):
            await self._reconcile(key)

    async def _reconcile(self, key: JobKey) -> None:
        if key[0] == "group":
            await self._reconcile_group(key)
        else:
            await self._reconcile_single(key)

    def _live_own_pods(self, keys: set[str] | list[str]) -> list[Obj]:
        pods = []
        for k in keys:
            pod = self.pods.cache.get(k)
            if pod is not None and self._is_own(pod) and not tr.meta(pod).get("deletionTimestamp"):
                pods.append(pod)
        return pods

    async def _reconcile_group(self, key: JobKey) -> None:
        _, api_version, gkey = key
        ns, name = gkey.split("/", 1)
        job_id = tr.job_id_for_group(ns, name)
        podgroup = self.podgroups[api_version].cache.get(gkey)
        members = self._live_own_pods(self.group_members.get((api_version, gkey), set()))
        submitted = self.jobs.get(job_id)
        if podgroup is None:
            if submitted is not None:
                await self._cancel(job_id, "podgroup deleted")
            return  # gang pods wait for their PodGroup: no partial placement
        gang = tr.gang_spec(podgroup)
        if submitted is None:
            if not members:
                return
            anyone_bound = any(tr.pod_node(p) for p in members)
            if len(members) < max(1, gang.min_member) and not anyone_bound:
                return  # Volcano: a gang is not schedulable until minMember pods exist
            queue = gang.queue or self._pod_queue(members[0])
            priority = self._priority(gang.priority_class, members)
            spec = self._job_spec(job_id, ns, name, members, queue, priority, gang)
            await self._submit(key, spec)
            self._mark_status(job_id)
            return
        # Pods that joined after the gang was submitted run as jobs of one (Volcano's elastic
        # pods beyond minMember are scheduled individually too).
        for pod in members:
            pod_key = tr.key_of(pod)
            if pod_key not in self.pod_task and not tr.pod_terminal(pod):
                extra_id = f"{job_id}:x:{tr.meta(pod)['name']}"
                spec = self._job_spec(extra_id, ns, tr.meta(pod)["name"], [pod], gang.queue or self._pod_queue(pod),
                                      self._priority(gang.priority_class, [pod]), None)
                await self._submit(("pod", "", pod_key), spec)
        if not members and all(self.pods.cache.get(k) is None for k in submitted.tasks.values()):
            await self._cancel(job_id, "every pod of the podgroup was deleted")
        self._mark_status(job_id)

    async def _reconcile_single(self, key: JobKey) -> None:
        pod_key = key[2]
        ns, name = pod_key.split("/", 1)
        job_id = tr.job_id_for_pod(ns, name)
        pod = self.pods.cache.get(pod_key)
        submitted = self.jobs.get(job_id)
        if pod is None or not self._is_own(pod) or tr.meta(pod).get("deletionTimestamp"):
            if submitted is not None and not (pod is not None and tr.pod_node(pod)):
                await self._cancel(job_id, "pod deleted")
            return
        if submitted is None and pod_key not in self.pod_task:
            if tr.pod_terminal(pod):
                return
            spec = self._job_spec(job_id, ns, name, [pod], self._pod_queue(pod), self._priority("", [pod]), None)
            await self._submit(key, spec)
        self._mark_status(job_id)

    def _pod_queue(self, pod: Obj) -> str:
        return (tr.meta(pod).get("annotations") or {}).get(VOLCANO_QUEUE_ANNOTATION) or "default"

    def _priority(self, priority_class: str, pods: list[Obj]) -> int:
        if priority_class:
            pc = self.priority_classes.cache.get(priority_class)
            if pc is not None:
                return tr.priority_value(pc)
        for pod in pods:
            spec = pod.get("spec") or {}
            if spec.get("priority") is not None:
                return int(spec["priority"])
            pc = self.priority_classes.cache.get(spec.get("priorityClassName") or "")
            if pc is not None:
                return tr.priority_value(pc)
        return 0

    def _job_spec(self, job_id: str, ns: str, name: str, pods: list[Obj], queue: str, priority: int,
                  gang: tr.GangSpec | None) -> pb.JobSpec:
        by_role: dict[str, list[Obj]] = {}
        for pod in pods:
            by_role.setdefault(tr.pod_role(pod), []).append(pod)
        groups = [tr.task_group(role, by_role[role]) for role in sorted(by_role)]
        total = len(pods)
        spec = pb.JobSpec(id=job_id, namespace=ns, name=name, queue=queue, priority=priority, task_groups=groups,
                          min_member=total, annotations={"muster.dev/backend": self.name})
        if gang is not None:
            spec.min_member = min(total, max(1, gang.min_member))
            for role, count in gang.min_task_member.items():
                if role in by_role:
                    spec.min_task_member[role] = min(count, len(by_role[role]))
            if gang.min_resources:
                spec.min_resources.CopyFrom(pb.ResourceList(quantities=gang.min_resources))
        return spec

    async def _submit(self, key: JobKey, spec: pb.JobSpec) -> None:
        try:
            reply = await self.stub.SubmitJob(pb.SubmitJobRequest(job=spec))
            job = reply.job
            self.stats.submits += 1
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.ALREADY_EXISTS:
                # Submitted earlier with other pods (an adapter restart after pods changed): adopt
                # the server's job and its task <-> pod mapping.
                job = await self.stub.GetJob(pb.GetJobRequest(id=spec.id))
            elif exc.code() in _ITEM_ERRORS:
                message = f"muster refused job {spec.id}: {exc.details()}"
                if self.submit_errors.get(spec.id) != message:
                    self.submit_errors[spec.id] = message
                    log.warning("job refused", job=spec.id, code=exc.code().name, details=exc.details())
                    for pod in self._live_own_pods([f"{spec.namespace}/{n}" for tg in spec.task_groups
                                                    for n in tg.annotations[tr.PODS_ANNOTATION].split(",")]):
                        self._emit_event(pod, "FailedScheduling", message, "Warning")
                return
            else:
                raise
        self.submit_errors.pop(spec.id, None)
        self._adopt(key, job)

    def _adopt(self, key: JobKey, job: pb.Job) -> None:
        names = {tg.role: tg.annotations.get(tr.PODS_ANNOTATION, "").split(",") for tg in job.spec.task_groups}
        submitted = self.jobs.setdefault(job.spec.id, SubmittedJob(job.spec.id, key))
        for task in job.tasks:
            pods = names.get(task.role) or []
            if task.index < len(pods) and pods[task.index]:
                pod_key = f"{job.spec.namespace}/{pods[task.index]}"
                submitted.tasks[task.id] = pod_key
                self.task_pod[task.id] = pod_key
                self.pod_task[pod_key] = task.id
        self.job_views[job.spec.id] = job
        # Report what happened to the pods meanwhile (e.g. Running) once the mapping exists.
        for task_id, pod_key in submitted.tasks.items():
            pod = self.pods.cache.get(pod_key)
            if pod is not None and task_id not in self.reported and tr.pod_node(pod):
                if self.sent_foreign.pop(pod_key, None) is not None:
                    self.runtime.remove_foreign_task(tr.foreign_task_id(pod))
                self._report_pod(task_id, pod, deleted=False)

    async def _cancel(self, job_id: str, why: str) -> None:
        submitted = self.jobs.pop(job_id, None)
        if submitted is not None:
            for task_id, pod_key in submitted.tasks.items():
                self.task_pod.pop(task_id, None)
                if self.pod_task.get(pod_key) == task_id:
                    self.pod_task.pop(pod_key, None)
        try:
            await self.stub.CancelJob(pb.CancelJobRequest(id=job_id))
            log.info("job cancelled", job=job_id, why=why)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in _ITEM_ERRORS:
                raise

    # ------------------------------------------------------------------ status and events

    async def _watch_jobs(self) -> None:
        attempt = 0
        while True:
            try:
                call = self.stub.WatchJobs(pb.WatchJobsRequest(send_initial=True))
                async for event in call:
                    attempt = 0
                    job = event.job
                    if not job.spec.id.startswith("k8s:") or job.spec.id not in self.jobs:
                        continue
                    if event.type == pb.JobEvent.TYPE_DELETED:
                        self.job_views.pop(job.spec.id, None)
                    else:
                        self.job_views[job.spec.id] = job
                    self._mark_status(job.spec.id)
            except grpc.aio.AioRpcError as exc:
                log.info("job watch ended", code=exc.code().name)
            attempt += 1
            await anyio.sleep(min(5.0, 0.2 * 2 ** attempt) * random.uniform(0.5, 1))

    async def _status_loop(self) -> None:
        while True:
            await self._wake_status.wait()
            self._wake_status = anyio.Event()
            ids, self._dirty_status = self._dirty_status, set()
            for job_id in sorted(ids):
                submitted = self.jobs.get(job_id)
                if submitted is None:
                    continue
                try:
                    await self._write_status(submitted)
                except Exception:  # noqa: BLE001 - status is best effort; the next change retries
                    log.exception("status write failed", job=job_id)

    def _unschedulable(self, job: pb.Job | None) -> pb.Condition | None:
        if job is None:
            return None
        for cond in job.status.conditions:
            if cond.type == "Unschedulable" and cond.status == "True":
                return cond
        return None

    async def _write_status(self, submitted: SubmittedJob) -> None:
        job = self.job_views.get(submitted.job_id)
        pods = [(k, self.pods.cache.get(k)) for k in submitted.tasks.values()]
        cond = self._unschedulable(job)
        # FailedScheduling on pods still pending, once per distinct message (kube-scheduler style).
        if cond is not None:
            message = cond.message or await self._explain(submitted.job_id)
            for pod_key, pod in pods:
                if pod is not None and not tr.pod_node(pod) and self.event_messages.get(pod_key) != message:
                    self.event_messages[pod_key] = message
                    self._emit_event(pod, "FailedScheduling", message, "Warning")
        if submitted.key[0] != "group":
            return
        _, api_version, gkey = submitted.key
        podgroup = self.podgroups[api_version].cache.get(gkey)
        if podgroup is None:
            return
        status = self._podgroup_status(podgroup, [p for _, p in pods if p is not None], job, cond)
        previous = self.pg_status_written.get(gkey)
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
            reply = await self.stub.Explain(pb.ExplainRequest(job_id=job_id))
        except grpc.aio.AioRpcError:
            return "waiting for the gang to fit"
        return reply.summary or "waiting for the gang to fit"

    def _podgroup_status(self, podgroup: Obj, pods: list[Obj], job: pb.Job | None,
                         cond: pb.Condition | None) -> Obj:
        """Volcano's PodGroup status: Running once minMember pods are allocated (bound)."""
        gang = tr.gang_spec(podgroup)
        running = sum(1 for p in pods if tr.pod_phase(p) == "Running")
        succeeded = sum(1 for p in pods if tr.pod_phase(p) == "Succeeded")
        failed = sum(1 for p in pods if tr.pod_phase(p) == "Failed")
        allocated = sum(1 for p in pods if tr.pod_active_on_node(p))
        min_member = max(1, gang.min_member)
        if pods and running + succeeded + failed == len(pods) and succeeded >= min_member and running == 0:
            phase = "Completed"
        elif allocated + succeeded >= min_member:
            phase = "Running"
        elif job is not None and job.status.phase in (pb.JOB_PHASE_INQUEUE, pb.JOB_PHASE_RUNNING):
            phase = "Inqueue"
        else:
            phase = "Pending"
        conditions: list[Obj] = []
        if phase in ("Running", "Completed"):
            conditions.append({"type": "Scheduled", "status": "True", "reason": "tasks in gang are ready to be scheduled",
                               "message": "", "lastTransitionTime": _now()})
        elif cond is not None:
            conditions.append({"type": "Unschedulable", "status": "True", "reason": cond.reason or "NotEnoughResources",
                               "message": cond.message, "lastTransitionTime": _now()})
        return {"phase": phase, "running": running, "succeeded": succeeded, "failed": failed, "conditions": conditions}


def _without_times(status: Obj) -> Obj:
    return {**status, "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                                     for c in status.get("conditions", [])]}


def _keep_transition_times(previous: Obj, status: Obj) -> None:
    before = {(c["type"], c["status"]): c.get("lastTransitionTime") for c in previous.get("conditions", [])}
    for c in status.get("conditions", []):
        if before.get((c["type"], c["status"])):
            c["lastTransitionTime"] = before[(c["type"], c["status"])]


