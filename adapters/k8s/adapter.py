"""The Kubernetes backend: informers in, Muster jobs / snapshot / deltas out, decisions enforced.

Built on :class:`adapters.runtime.BackendRuntime` (register, snapshot, deltas, decision stream,
acks, reconnect). :class:`K8sBackend` only wires the Kubernetes-specific parts together:

* informers (:mod:`adapters.k8s.informer`) for Nodes, Pods, Volcano and coscheduling PodGroups,
  Volcano Queues, PriorityClasses, and with ``kai=True`` KAI Scheduler's PodGroups
  (``scheduling.run.ai/v2alpha2``) and Queues (``scheduling.run.ai/v2``);
* :mod:`adapters.k8s.snapshot`: nodes and pods as the server sees them (snapshot, then deltas);
  bound pods of other schedulers (and Muster pods it cannot map) are foreign tasks;
* :mod:`adapters.k8s.jobs`: pods with ``spec.schedulerName == <scheduler name>`` and their
  PodGroups become Muster jobs;
* :mod:`adapters.k8s.queues`: Volcano (and KAI) Queues become Muster queues;
* :mod:`adapters.k8s.enforce`: binds through ``pods/binding``, evictions through the Eviction API;
* :mod:`adapters.k8s.status`: PodGroup status through ``/status`` merge-patch, ``Scheduled`` /
  ``FailedScheduling`` Events on pods.

Shared between them: the pod <-> task book, counters and the adapter's own server channel
(:mod:`adapters.k8s.common`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import structlog
from kubernetes_asyncio import client

from adapters.k8s import translate as tr
from adapters.k8s.common import PODGROUP_APIS, AdapterStats, JobBook, Obj, ServerLink, SubmittedJob
from adapters.k8s.enforce import Enforcer
from adapters.k8s.informer import Handler, Informer
from adapters.k8s.jobs import JobController
from adapters.k8s.kube import KubeWriter
from adapters.k8s.queues import QueueController
from adapters.k8s.snapshot import ClusterReporter
from adapters.k8s.status import StatusController
from adapters.runtime import BackendRuntime, DecisionLedger, Outcome
from muster.transport import ClientTls
from muster.v1 import muster_pb2 as pb

log = structlog.get_logger("muster.k8s")


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
        tls: ClientTls | None = None,
        token: str | None = None,
        kai: bool = False,
        may_write: Callable[[], bool] | None = None,
    ) -> None:
        self.server = server
        self.scheduler_name = scheduler_name
        self.name = name
        # may_write: the leader elector's fence (adapters.k8s.lease), checked before every bind
        self.writer = KubeWriter(api, scheduler_name=scheduler_name, may_write=may_write)
        self.stats = AdapterStats()
        self.book = JobBook()
        self.link = ServerLink(server, tls, token)
        self.runtime = BackendRuntime(
            self,
            server=server,
            name=name,
            kind="kubernetes",
            ledger=ledger,
            tls=tls,
            token=token,
            **(runtime_options or {}),
        )

        core, custom, sched = self.writer.core, self.writer.custom, self.writer.scheduling
        self.nodes = Informer(
            "nodes", core.list_node, handler=self._on_node, watch_timeout=watch_timeout
        )
        self.pods = Informer(
            "pods",
            core.list_pod_for_all_namespaces,
            handler=self._on_pod,
            watch_timeout=watch_timeout,
        )
        self.podgroups = {
            api_version: Informer(
                f"podgroups.{group}",
                custom.list_custom_object_for_all_namespaces,
                group,
                version,
                "podgroups",
                handler=self._on_podgroup(api_version),
                watch_timeout=watch_timeout,
            )
            for api_version, (group, version) in PODGROUP_APIS.items()
            if kai
            or api_version != tr.KAI_PODGROUP  # KAI's needs RBAC on scheduling.run.ai: opt in
        }
        self.queues = Informer(
            "queues",
            custom.list_cluster_custom_object,
            "scheduling.volcano.sh",
            "v1beta1",
            "queues",
            handler=self._on_queue,
            watch_timeout=watch_timeout,
        )
        self.kai_queues: Informer | None = None
        if kai:
            self.kai_queues = Informer(
                "queues.scheduling.run.ai",
                custom.list_cluster_custom_object,
                *tr.KAI_QUEUE_API,
                "queues",
                handler=self._on_queue,
                watch_timeout=watch_timeout,
            )
        self.priority_classes = Informer(
            "priorityclasses",
            sched.list_priority_class,
            handler=_read_at_submission,
            watch_timeout=watch_timeout,
        )
        self.informers = [
            self.nodes,
            self.pods,
            *self.podgroups.values(),
            self.queues,
            *([self.kai_queues] if self.kai_queues is not None else []),
            self.priority_classes,
        ]

        self.reporter = ClusterReporter(self.runtime, self.book, nodes=self.nodes, pods=self.pods)
        self.status_controller = StatusController(
            self.link, self.writer, self.book, self.stats, pods=self.pods, podgroups=self.podgroups
        )
        self.job_controller = JobController(
            self.link,
            self.book,
            self.stats,
            pods=self.pods,
            podgroups=self.podgroups,
            priority_classes=self.priority_classes,
            reporter=self.reporter,
            status=self.status_controller,
            scheduler_name=scheduler_name,
            backend_name=name,
        )
        self.queue_controller = QueueController(
            self.link, queues=self.queues, kai_queues=self.kai_queues
        )
        self.enforcer = Enforcer(
            self.writer,
            self.book,
            self.stats,
            nodes=self.nodes,
            pods=self.pods,
            reporter=self.reporter,
            status=self.status_controller,
            bind_concurrency=bind_concurrency,
            evict_attempts=evict_attempts,
            evict_backoff=evict_backoff,
        )
        self._server_id_seen = ""
        self._stop = anyio.Event()
        self.ready = anyio.Event()

    @property
    def jobs(self) -> dict[str, SubmittedJob]:
        """The Muster jobs submitted for pods, by job id."""
        return self.book.jobs

    @property
    def pod_task(self) -> dict[str, str]:
        """Pod key -> Muster task id, for the pods mapped so far."""
        return self.book.pod_task

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        self._stop.set()
        self.runtime.stop()

    async def run(self) -> None:
        self.link.open()
        events = self.status_controller.open_events()
        try:
            async with anyio.create_task_group() as tg:
                for informer in self.informers:
                    tg.start_soon(informer.run)
                with anyio.fail_after(120):  # a cluster that never lists is a configuration error
                    for informer in self.informers:
                        await informer.synced.wait()
                log.info("informers synced", nodes=len(self.nodes.cache), pods=len(self.pods.cache))
                tg.start_soon(self.status_controller.write_events, events)
                tg.start_soon(self.queue_controller.run)
                tg.start_soon(self.job_controller.run)
                tg.start_soon(self.status_controller.watch_jobs)
                tg.start_soon(self.status_controller.run)
                tg.start_soon(self._run_runtime, tg.cancel_scope)
                await self._stop.wait()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.link.close()

    async def _run_runtime(self, scope: anyio.CancelScope) -> None:
        await self.runtime.run()
        scope.cancel()  # the runtime gave up or was stopped: the adapter ends with it

    # ------------------------------------------------------------------ Backend protocol

    async def list_nodes(self) -> Sequence[pb.Node]:
        return self.reporter.list_nodes()

    async def list_tasks(self) -> Sequence[pb.BackendTask]:
        # A new server identity (first connection, or a server that lost its state) means our
        # job mapping may be unknown to it: push queues and jobs before the snapshot names tasks.
        if self.runtime.server_id != self._server_id_seen:
            await self.queue_controller.sync_all()
            await self.job_controller.resubmit_all()
            self._server_id_seen = self.runtime.server_id
            self.queue_controller.enabled = self.job_controller.enabled = bool(self._server_id_seen)
        tasks = self.reporter.list_tasks()
        self.ready.set()
        return tasks

    async def apply_bind(self, decision: pb.Decision) -> Outcome:
        return await self.enforcer.bind(decision)

    async def apply_evict(self, decision: pb.Decision) -> Outcome:
        return await self.enforcer.evict(decision)

    async def apply_batch(self, decisions: list[pb.Decision]) -> list[Outcome]:
        return await self.enforcer.apply_batch(decisions)

    # ------------------------------------------------------------------ informer handlers

    def _on_node(self, kind: str, node: Obj, old: Obj | None) -> None:
        self.reporter.on_node(kind, node, old)

    def _on_pod(self, kind: str, pod: Obj, old: Obj | None) -> None:
        key = tr.key_of(pod)
        deleted = kind == "DELETED"
        if deleted or tr.pod_node(pod):
            self.enforcer.forget(key)
        if deleted:
            self.status_controller.forget_pod(key)
        task_id = self.job_controller.on_pod(kind, pod, old)
        if task_id is not None:
            self.reporter.report_pod(task_id, pod, deleted=deleted)
            self.status_controller.mark(task_id.rsplit("/", 1)[0])
            return
        # Not ours, or ours but not (yet) mapped to a task: a bound pod only holds capacity.
        self.reporter.on_unmapped_pod(kind, pod)

    def _on_podgroup(self, api_version: str) -> Handler:
        def handle(kind: str, podgroup: Obj, old: Obj | None) -> None:
            self.job_controller.on_podgroup(api_version, podgroup)

        return handle

    def _on_queue(self, kind: str, queue: Obj, old: Obj | None) -> None:
        self.queue_controller.on_queue(kind, queue, old)


def _read_at_submission(kind: str, obj: Obj, old: Obj | None) -> None:
    """PriorityClasses need no handler: the job controller reads them from the cache."""
