"""Enforcement: Muster's bind and evict decisions applied to pods.

A bind goes through ``pods/binding`` (a fractional GPU bind first labels the pod with its shared
GPU, ``runai-gpu-group``, as KAI's binder does; a bind with a time limit first sets the pod's
``activeDeadlineSeconds`` to it, unless the pod's own is already lower) after checking what the
API server would refuse anyway (the pod and node exist, the node is Ready and not cordoned) and
what would bind twice (the pod is already assigned: fine when it is where the decision says, a
rejection otherwise). An evict goes
through the Eviction API (a disruption budget's 429 is retried with backoff in
:meth:`KubeWriter.evict <adapters.k8s.kube.KubeWriter.evict>`); a pod already gone is evicted.
A burst's decisions are applied concurrently (a gang's binds are independent API calls).
"""

from __future__ import annotations

import anyio
import structlog

from adapters.k8s import translate as tr
from adapters.k8s.common import AdapterStats, JobBook, Obj
from adapters.k8s.informer import Informer
from adapters.k8s.kube import KubeWriter
from adapters.k8s.snapshot import ClusterReporter
from adapters.k8s.status import StatusController
from adapters.runtime import APPLIED, Outcome
from muster.devices import shared_gpu
from muster.v1 import muster_pb2 as pb

log = structlog.get_logger("muster.k8s")


class Enforcer:
    """Applies bind and evict decisions; see the module docstring."""

    def __init__(
        self,
        writer: KubeWriter,
        book: JobBook,
        stats: AdapterStats,
        *,
        nodes: Informer,
        pods: Informer,
        reporter: ClusterReporter,
        status: StatusController,
        bind_concurrency: int = 64,
        evict_attempts: int = 5,
        evict_backoff: float = 0.2,
    ) -> None:
        self.writer = writer
        self.book = book
        self.stats = stats
        self.nodes = nodes
        self.pods = pods
        self.reporter = reporter
        self.status = status
        self.bind_limit = anyio.Semaphore(bind_concurrency)
        self.evict_attempts = evict_attempts
        self.evict_backoff = evict_backoff
        self.bound_by_us: dict[str, str] = {}  # pod key -> node, until the informer sees it

    def forget(self, pod_key: str) -> None:
        """The informer has seen the pod bound (or deleted): it no longer needs remembering."""
        self.bound_by_us.pop(pod_key, None)

    async def apply_batch(self, decisions: list[pb.Decision]) -> list[Outcome]:
        """Apply a burst concurrently (a gang's binds are independent API calls)."""
        outcomes: list[Outcome] = [Outcome.reject("not applied")] * len(decisions)

        async def one(i: int, decision: pb.Decision) -> None:
            async with self.bind_limit:
                try:
                    if decision.WhichOneof("action") == "bind":
                        outcomes[i] = await self.bind(decision)
                    elif decision.WhichOneof("action") == "evict":
                        outcomes[i] = await self.evict(decision)
                    else:
                        outcomes[i] = Outcome.reject("unknown decision action")
                except Exception as exc:  # one failure rejects one decision
                    log.exception("applying decision failed", decision=decision.id)
                    outcomes[i] = Outcome.reject(f"adapter error: {exc}")

        async with anyio.create_task_group() as tg:
            for i, decision in enumerate(decisions):
                tg.start_soon(one, i, decision)
        return outcomes

    def _pod_for(self, task_id: str) -> tuple[str, Obj | None]:
        key = self.book.task_pod.get(task_id, "")
        return key, self.pods.cache.get(key) if key else None

    async def bind(self, decision: pb.Decision) -> Outcome:
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
            if tr.pod_node(
                pod
            ):  # tell the server where the pod really is (e.g. after an expired bind)
                self.reporter.report_pod(b.task_id, pod, deleted=False, force=True)
            return self._reject_bind(f"pod {key} is already assigned to node {current}")
        ns, name = key.split("/", 1)
        # (a decision issued before gpu_group existed names the shared GPU in devices)
        gpu_group, devices = shared_gpu(b.gpu_group, b.devices, b.gpu_fraction)
        chips = tr.pod_device_annotations(devices, dict(b.request.quantities))
        if chips:  # the device plugin reads them when the kubelet admits the pod: write them first
            annotated = await self.writer.annotate_pod(ns, name, chips)
            if not annotated.ok:
                return self._reject_bind(f"annotating {key} with its devices: {annotated.message}")
        if (
            b.gpu_fraction and gpu_group
        ):  # KAI GPU sharing: record the shared GPU, as KAI's binder does
            labelled = await self.writer.label_pod(ns, name, {tr.GPU_GROUP_LABEL: gpu_group})
            if not labelled.ok:
                return self._reject_bind(f"labelling {key} with its shared GPU: {labelled.message}")
        deadline = tr.pod_active_deadline(pod)
        if b.time_limit_seconds and not 0 < deadline <= b.time_limit_seconds:
            # The job's time limit (e.g. its queue's default): the kubelet enforces it.
            limited = await self.writer.set_active_deadline(ns, name, b.time_limit_seconds)
            if not limited.ok:
                return self._reject_bind(
                    f"setting {key}'s activeDeadlineSeconds: {limited.message}"
                )
        result = await self.writer.bind(ns, name, b.node, uid=tr.meta(pod).get("uid", ""))
        if result.ok:
            self.stats.binds += 1
            self.bound_by_us[key] = b.node
            self.status.emit_event(
                pod, "Scheduled", f"Successfully assigned {key} to {b.node}", "Normal"
            )
            return APPLIED
        if result.status == 409 and f'assigned to node "{b.node}"' in result.message:
            return APPLIED  # bound by an earlier incarnation of this adapter
        return self._reject_bind(f"binding {key} to {b.node}: {result.message}")

    def _reject_bind(self, reason: str) -> Outcome:
        self.stats.bind_rejects += 1
        log.info("bind rejected", reason=reason)
        return Outcome.reject(reason)

    async def evict(self, decision: pb.Decision) -> Outcome:
        e = decision.evict
        key, pod = self._pod_for(e.task_id)
        if not key:
            return Outcome.reject(f"task {e.task_id} is not known to this adapter")
        if pod is None:
            return APPLIED  # already gone: the resources are free
        ns, name = key.split("/", 1)
        result = await self.writer.evict(
            ns, name, attempts=self.evict_attempts, backoff_initial=self.evict_backoff
        )
        if result.ok or result.status == 404:
            self.stats.evictions += 1
            return APPLIED
        self.stats.evict_rejects += 1
        return Outcome.reject(f"evicting {key}: {result.message}")
