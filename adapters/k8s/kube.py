"""The Kubernetes writes the adapter makes, wrapped where kubernetes_asyncio needs care.

1. ``pods/binding``: the API server answers 201 with a ``Status``, not a ``Binding``, which the
   generated client fails to deserialize *after* the bind succeeded (kubernetes-client/python#547).
   So the call is made with ``_preload_content=False`` and the HTTP status is mapped here.
2. PodGroup ``/status`` patches: a dict body would go out as ``application/json-patch+json`` (the
   first listed type) and be refused; the merge-patch content type is passed explicitly.
3. Evictions: 429 (a PodDisruptionBudget says no) is retried with exponential backoff, then given up.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import structlog
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

log = structlog.get_logger("muster.k8s")

MERGE_PATCH = "application/merge-patch+json"


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
    def __init__(self, api: client.ApiClient, *, scheduler_name: str = "muster") -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.scheduling = client.SchedulingV1Api(api)
        self.scheduler_name = scheduler_name

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
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, **({"uid": uid} if uid else {})},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        return await self._raw(
            self.core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)
        )

    async def evict(
        self, namespace: str, name: str, *, attempts: int = 5, backoff_initial: float = 0.2, backoff_max: float = 5.0
    ) -> WriteResult:
        """Evict through the Eviction API; 429 (disruption budget) is retried with backoff."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        delay = backoff_initial
        result = WriteResult(False, 0, "not attempted")
        for attempt in range(1, attempts + 1):
            result = await self._raw(
                self.core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False)
            )
            if result.status != 429:
                return result
            log.info("eviction refused by a disruption budget, retrying", pod=f"{namespace}/{name}",
                     attempt=attempt, delay=delay)
            if attempt < attempts:
                await anyio.sleep(delay)
                delay = min(backoff_max, delay * 2)
        return WriteResult(False, 429, f"{result.message} (gave up after {attempts} attempts)")

    async def patch_podgroup_status(
        self, group: str, version: str, namespace: str, name: str, status: dict[str, Any]
    ) -> WriteResult:
        try:
            await self.custom.patch_namespaced_custom_object_status(
                group, version, namespace, "podgroups", name, {"status": status}, _content_type=MERGE_PATCH
            )
        except ApiException as exc:
            return WriteResult(False, exc.status or 0, _status_message(exc.status or 0, (exc.body or "").encode()
                                                                      if isinstance(exc.body, str) else exc.body or b""))
        return WriteResult(True, 200)

    async def pod_event(self, pod: dict[str, Any], *, reason: str, message: str, event_type: str = "Normal") -> WriteResult:
        """A core/v1 Event on a pod, as kube-scheduler writes ``Scheduled`` / ``FailedScheduling``."""
        m = pod.get("metadata") or {}
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{m.get('name')}.{uuid.uuid4().hex[:16]}", "namespace": m.get("namespace", "default")},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": m.get("name"),
                               "namespace": m.get("namespace", "default"), "uid": m.get("uid", ""),
                               "resourceVersion": m.get("resourceVersion", "")},
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": self.scheduler_name},
            "reportingComponent": self.scheduler_name,
            "reportingInstance": self.scheduler_name,
            "action": "Binding" if reason == "Scheduled" else "Scheduling",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        return await self._raw(
            self.core.create_namespaced_event(m.get("namespace", "default"), body, _preload_content=False)
        )
