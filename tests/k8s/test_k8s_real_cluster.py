"""Opt-in: the same informer and binding code against a real cluster (run with KUBECONFIG set).

Re-validates the fake API server's fidelity wherever a cluster exists. Creates one pod with a
scheduler name nobody serves in the namespace ``$MUSTER_TEST_NAMESPACE`` (default "default"),
binds it through the adapter's writer, checks the 409 on a second bind, and deletes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid

import pytest
from kubernetes_asyncio import client

from adapters.k8s import translate as tr
from adapters.k8s.informer import Informer
from adapters.k8s.kube import KubeWriter, make_api_client

from .conftest import eventually
from .fake_apiserver import make_pod

pytestmark = [
    pytest.mark.real_k8s,
    pytest.mark.skipif(
        not os.environ.get("KUBECONFIG"), reason="needs KUBECONFIG (a real cluster)"
    ),
]


async def test_real_cluster_list_watch_bind_and_conflict() -> None:
    api = await make_api_client(kubeconfig=os.environ["KUBECONFIG"])
    namespace = os.environ.get("MUSTER_TEST_NAMESPACE", "default")
    name = f"muster-real-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    nodes = Informer("nodes", core.list_node, handler=lambda *a: None)
    task = asyncio.create_task(nodes.run())
    try:
        await eventually(nodes.synced.is_set, timeout=30)
        ready = [n for n in nodes.cache.values() if tr.node_ready(n)]
        assert ready, "the cluster has no Ready node"
        pod = make_pod(
            name, namespace=namespace, cpu="10m", memory="16Mi", scheduler="muster-real-test"
        )
        pod["metadata"].pop("annotations")
        await core.create_namespaced_pod(namespace, pod)
        writer = KubeWriter(api)
        node = tr.meta(ready[0])["name"]
        assert (await writer.bind(namespace, name, node)).ok
        again = await writer.bind(namespace, name, node)
        assert again.status == 409
        assert "already assigned" in again.message
    finally:
        task.cancel()
        with contextlib.suppress(client.ApiException):
            await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        await api.close()
