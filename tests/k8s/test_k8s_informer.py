"""The informer against the fake API server: resume, 410 -> re-list with diff, bookmarks."""

from __future__ import annotations

import asyncio
import contextlib

from kubernetes_asyncio import client

from adapters.k8s.informer import Informer

from .conftest import eventually
from .fake_apiserver import FakeApiServer, make_node, make_pod


async def _informer(kube: FakeApiServer):
    api = client.ApiClient(client.Configuration(host=kube.url))
    seen: list[tuple[str, str]] = []
    inf = Informer(
        "pods",
        client.CoreV1Api(api).list_pod_for_all_namespaces,
        handler=lambda kind, obj, old: seen.append((kind, obj["metadata"]["name"])),
        watch_timeout=30,
        backoff_initial=0.01,
        backoff_max=0.05,
    )
    task = asyncio.create_task(inf.run())
    await eventually(inf.synced.is_set)
    return api, inf, task, seen


async def _close(api, task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await api.close()


async def test_dropped_watch_resumes_from_last_rv_without_relist() -> None:
    kube = FakeApiServer()
    await kube.start()
    kube.put_object(make_pod("a"))
    api, inf, task, seen = await _informer(kube)
    try:
        await eventually(lambda: len(kube.watchers) == 1)
        kube.drop_watches()
        kube.put_object(make_pod("b"))  # happens while no watch is open
        await eventually(lambda: ("ADDED", "b") in seen)
        assert inf.lists == 1
        assert inf.relists == 0
        assert inf.resumes >= 1
        # Resumed from an RV: the replay does not repeat "a".
        assert seen.count(("ADDED", "a")) == 1
    finally:
        await _close(api, task)
        await kube.stop()


async def test_410_relist_reports_a_deletion_hidden_in_the_gap() -> None:
    kube = FakeApiServer()
    await kube.start()
    kube.put_object(make_pod("keep"))
    kube.put_object(make_pod("doomed"))
    api, inf, task, seen = await _informer(kube)
    try:
        await eventually(lambda: len(kube.watchers) == 1)

        def gap(server: FakeApiServer) -> None:
            server.drop_watches()
            server.delete_object("v1", "Pod", "doomed", "default")
            server.compact()  # the deletion event is gone from the log: only a re-list can see it

        kube.run_on_server(gap)
        await eventually(lambda: ("DELETED", "doomed") in seen)
        assert inf.relists == 1
        assert "default/doomed" not in inf.cache
        assert "default/keep" in inf.cache
        # The re-list did not report the unchanged pod again.
        assert seen.count(("ADDED", "keep")) == 1
    finally:
        await _close(api, task)
        await kube.stop()


async def test_bookmarks_advance_the_resource_version() -> None:
    kube = FakeApiServer(bookmark_interval=0.05)
    await kube.start()
    api, inf, task, seen = await _informer(kube)
    try:
        before = int(inf.resource_version or 0)
        for i in range(3):  # other kinds move the global RV; the pod watch only gets bookmarks
            kube.put_object(make_node(f"n{i}"))
        await eventually(lambda: int(inf.resource_version) >= before + 3)
        assert seen == []
    finally:
        await _close(api, task)
        await kube.stop()


async def test_missing_crd_does_not_block_sync() -> None:
    kube = FakeApiServer()
    await kube.start()
    api = client.ApiClient(client.Configuration(host=kube.url))
    inf = Informer(
        "things",
        client.CustomObjectsApi(api).list_cluster_custom_object,
        "example.com",
        "v1",
        "things",
        handler=lambda *a: None,
        missing_retry=0.05,
    )
    task = asyncio.create_task(inf.run())
    try:
        await eventually(inf.synced.is_set)
        assert not inf.served
        kube.register_crd("example.com", "v1", "things", "Thing", namespaced=False)
        await eventually(lambda: inf.served)
    finally:
        await _close(api, task)
        await kube.stop()
