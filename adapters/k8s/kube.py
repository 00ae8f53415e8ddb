"""The Kubernetes writes the adapter makes, wrapped where kubernetes_asyncio needs care.

1. ``pods/binding``: the API server answers 201 with a ``Status``, not a ``Binding``, which the
   generated client fails to deserialize *after* the bind succeeded (kubernetes-client/python#547).
   So the call is made with ``_preload_content=False`` and the HTTP status is mapped here.
2. PodGroup ``/status`` patches: a dict body would go out as ``application/json-patch+json`` (the
   first listed type) and be refused; the merge-patch content type is passed explicitly.
3. Evictions: 429 (a PodDisruptionBudget says no) is retried with exponential backoff
   (:func:`adapters.retry.retry`), then given up.
4. Leader election: with ``may_write`` (:meth:`LeaderElector.is_leader
   <adapters.k8s.lease.LeaderElector.is_leader>`), a bind, an eviction or a pod patch is checked
   right before it is sent and raises :class:`NotLeader` once the lease may have lapsed.

Bindings, evictions and events are sent as the client's models (same JSON as the API documents).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from adapters.retry import Backoff, retry

log = structlog.get_logger("muster.k8s")

MERGE_PATCH = "application/merge-patch+json"


class NotLeader(RuntimeError):
    """A write refused because this adapter no longer holds its leader lease."""


@dataclass(frozen=True, slots=True)
class WriteResult:
    ok: bool
    status: int
    message: str = ""


async def make_api_client(
    *, host: str | None = None, kubeconfig: str | None = None, in_cluster: bool = False
) -> client.ApiClient:
    """An ApiClient for a plain URL (tests), a kubeconfig file, or the in-cluster service account."""
    if host:
        cfg = client.Configuration(host=host)
    elif in_cluster:
        config.load_incluster_config()
        cfg = client.Configuration.get_default_copy()
    else:
        cfg = client.Configuration()
        await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, 64)
    return client.ApiClient(cfg)


def _status_message(code: int, body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return f"HTTP {code}: {body[:200].decode(errors='replace')}"
    message = data.get("message") if isinstance(data, dict) else None
    return f"HTTP {code} {data.get('reason', '')}: {message}" if message else f"HTTP {code}"


class KubeWriter:
    def __init__(
        self,
        api: client.ApiClient,
        *,
        scheduler_name: str = "muster",
        may_write: Callable[[], bool] | None = None,
    ) -> None:
        self.api = api
        self.may_write = may_write
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.scheduling = client.SchedulingV1Api(api)
        self.scheduler_name = scheduler_name

    def _fence(self, what: str) -> None:
        # Checked synchronously right before the request leaves: cancellation alone could let a
        # bind that was already scheduled run once more after the renew deadline.
        if self.may_write is not None and not self.may_write():
            raise NotLeader(f"{what}: refused, this adapter no longer holds the leader lease")

    async def _raw(self, coro: Any) -> WriteResult:
        resp = await coro
        try:
            body = await resp.read()
        finally:
            resp.release()
        if 200 <= resp.status < 300:
            return WriteResult(True, resp.status)
        return WriteResult(False, resp.status, _status_message(resp.status, body))

    async def bind(self, namespace: str, name: str, node: str, uid: str = "") -> WriteResult:
        body = client.V1Binding(
            api_version="v1",
            kind="Binding",
            metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        self._fence(f"binding {namespace}/{name}")
        return await self._raw(
            self.core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)
        )

    async def annotate_pod(
        self, namespace: str, name: str, annotations: dict[str, str]
    ) -> WriteResult:
        """Merge ``annotations`` into the pod's (e.g. the chips a device plugin must hand it)."""
        return await self.patch_pod_metadata(namespace, name, {"annotations": annotations})

    async def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> WriteResult:
        """Merge ``labels`` into the pod's (e.g. the shared GPU a fractional pod is bound to)."""
        return await self.patch_pod_metadata(namespace, name, {"labels": labels})

    async def set_active_deadline(self, namespace: str, name: str, seconds: int) -> WriteResult:
        """Set the pod's ``spec.activeDeadlineSeconds`` (a job's time limit: the kubelet ends the
        pod that long after it started, reason DeadlineExceeded). The API server lets it be set
        on a pod that has none, or lowered."""
        return await self._patch_pod(namespace, name, {"spec": {"activeDeadlineSeconds": seconds}})

    async def patch_pod_metadata(
        self, namespace: str, name: str, metadata: dict[str, Any]
    ) -> WriteResult:
        return await self._patch_pod(namespace, name, {"metadata": metadata})

    async def _patch_pod(self, namespace: str, name: str, body: dict[str, Any]) -> WriteResult:
        self._fence(f"patching {namespace}/{name}")
        try:
            await self.core.patch_namespaced_pod(  # type: ignore[call-arg]  # _content_type: see patch_podgroup_status
                name, namespace, body, _content_type=MERGE_PATCH
            )
        except ApiException as exc:
            raw = exc.body.encode() if isinstance(exc.body, str) else exc.body or b""
            return WriteResult(False, exc.status or 0, _status_message(exc.status or 0, raw))
        return WriteResult(True, 200)

    async def evict(
        self,
        namespace: str,
        name: str,
        *,
        attempts: int = 5,
        backoff_initial: float = 0.2,
        backoff_max: float = 5.0,
    ) -> WriteResult:
        """Evict through the Eviction API; 429 (disruption budget) is retried with backoff."""
        body = client.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        )

        async def evict_once() -> WriteResult:
            self._fence(f"evicting {namespace}/{name}")
            return await self._raw(
                self.core.create_namespaced_pod_eviction(
                    name, namespace, body, _preload_content=False
                )
            )

        def refused(attempt: int, delay: float, failure: object) -> None:
            log.info(
                "eviction refused by a disruption budget, retrying",
                pod=f"{namespace}/{name}",
                attempt=attempt,
                delay=round(delay, 3),
            )

        result = await retry(
            evict_once,
            Backoff(initial=backoff_initial, factor=2.0, max=backoff_max, jitter=0),
            attempts=max(1, attempts),
            again=lambda r: r.status == 429,
            on_retry=refused,
        )
        if result.status == 429:
            return WriteResult(False, 429, f"{result.message} (gave up after {attempts} attempts)")
        return result

    async def patch_podgroup_status(
        self, group: str, version: str, namespace: str, name: str, status: dict[str, Any]
    ) -> WriteResult:
        try:
            await self.custom.patch_namespaced_custom_object_status(  # type: ignore[call-arg]  # _content_type: accepted at run time, missing from the package's stubs
                group,
                version,
                namespace,
                "podgroups",
                name,
                {"status": status},
                _content_type=MERGE_PATCH,
            )
        except ApiException as exc:
            return WriteResult(
                False,
                exc.status or 0,
                _status_message(
                    exc.status or 0,
                    (exc.body or "").encode() if isinstance(exc.body, str) else exc.body or b"",
                ),
            )
        return WriteResult(True, 200)

    async def pod_event(
        self, pod: dict[str, Any], *, reason: str, message: str, event_type: str = "Normal"
    ) -> WriteResult:
        """A core/v1 Event on a pod, as kube-scheduler writes ``Scheduled`` / ``FailedScheduling``."""
        m = pod.get("metadata") or {}
        now = datetime.now(UTC).replace(microsecond=0)
        namespace = m.get("namespace", "default")
        body = client.CoreV1Event(
            api_version="v1",
            kind="Event",
            metadata=client.V1ObjectMeta(
                name=f"{m.get('name')}.{uuid.uuid4().hex[:16]}", namespace=namespace
            ),
            involved_object=client.V1ObjectReference(
                api_version="v1",
                kind="Pod",
                name=m.get("name"),
                namespace=namespace,
                uid=m.get("uid", ""),
                resource_version=m.get("resourceVersion", ""),
            ),
            reason=reason,
            message=message[:1024],
            type=event_type,
            source=client.V1EventSource(component=self.scheduler_name),
            reporting_component=self.scheduler_name,
            reporting_instance=self.scheduler_name,
            action="Binding" if reason == "Scheduled" else "Scheduling",
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        return await self._raw(
            self.core.create_namespaced_event(namespace, body, _preload_content=False)
        )
