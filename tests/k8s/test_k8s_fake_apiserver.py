"""The fake API server refuses what a real one refuses (else tests pass and production fails)."""

from __future__ import annotations

import json

import aiohttp
import pytest

from .fake_apiserver import FakeApiServer, make_pod, make_volcano_podgroup

PG = "/apis/scheduling.volcano.sh/v1beta1/namespaces/default/podgroups/pg"


@pytest.fixture
async def kube():
    server = FakeApiServer()
    await server.start()
    yield server
    await server.stop()


async def _req(kube: FakeApiServer, method: str, path: str, body=None, ctype="application/json"):
    async with aiohttp.ClientSession() as s:
        data = None if body is None else json.dumps(body)
        async with s.request(
            method, kube.url + path, data=data, headers={"Content-Type": ctype}
        ) as r:
            return r.status, r.headers.get("Content-Type"), await r.json()


async def test_status_bodies_and_content_type(kube: FakeApiServer) -> None:
    status, ctype, body = await _req(kube, "GET", "/api/v1/namespaces/default/pods/nope")
    assert status == 404
    assert ctype == "application/json"
    assert body["kind"] == "Status"
    assert body["reason"] == "NotFound"
    assert body["code"] == 404


async def test_patch_content_types(kube: FakeApiServer) -> None:
    kube.put_object(make_volcano_podgroup("pg"))
    smp = await _req(
        kube, "PATCH", PG, {"spec": {"minMember": 2}}, "application/strategic-merge-patch+json"
    )
    assert smp[0] == 415  # no strategic merge patch for custom resources
    jp = await _req(kube, "PATCH", PG, {"spec": {"minMember": 2}}, "application/json-patch+json")
    assert jp[0] == 400  # json-patch needs an array
    ok = await _req(
        kube,
        "PATCH",
        PG,
        [{"op": "replace", "path": "/spec/minMember", "value": 2}],
        "application/json-patch+json",
    )
    assert ok[0] == 200
    assert ok[2]["spec"]["minMember"] == 2


async def test_status_subresource_isolation(kube: FakeApiServer) -> None:
    kube.put_object(make_volcano_podgroup("pg"))
    main = await _req(
        kube,
        "PATCH",
        PG,
        {"status": {"phase": "Running"}, "spec": {"queue": "q"}},
        "application/merge-patch+json",
    )
    assert main[2]["status"]["phase"] == "Pending"
    assert main[2]["spec"]["queue"] == "q"
    sub = await _req(
        kube,
        "PATCH",
        PG + "/status",
        {"status": {"phase": "Running"}, "spec": {"queue": "z"}},
        "application/merge-patch+json",
    )
    assert sub[2]["status"]["phase"] == "Running"
    assert sub[2]["spec"]["queue"] == "q"


async def test_stale_resource_version_update_conflicts(kube: FakeApiServer) -> None:
    pod = kube.put_object(make_pod("p"))
    kube.put_object(make_pod("p", labels={"x": "y"}))  # moves the RV on
    status, _, body = await _req(kube, "PUT", "/api/v1/namespaces/default/pods/p", pod)
    assert status == 409
    assert body["reason"] == "Conflict"


async def test_binding_twice_conflicts_and_reply_is_a_status(kube: FakeApiServer) -> None:
    kube.put_object(make_pod("p"))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p"},
        "target": {"kind": "Node", "name": "n"},
    }
    first = await _req(kube, "POST", "/api/v1/namespaces/default/pods/p/binding", binding)
    assert first[0] == 201
    assert first[2]["kind"] == "Status"
    assert first[2]["status"] == "Success"
    second = await _req(kube, "POST", "/api/v1/namespaces/default/pods/p/binding", binding)
    assert second[0] == 409
    assert 'already assigned to node "n"' in second[2]["message"]
    no_target = await _req(
        kube, "POST", "/api/v1/namespaces/default/pods/p/binding", {"metadata": {"name": "p"}}
    )
    assert no_target[0] == 422


async def test_watch_from_compacted_rv_answers_410_in_the_stream(kube: FakeApiServer) -> None:
    kube.put_object(make_pod("p"))
    kube.put_object(make_pod("q"))
    kube.compact()
    async with (
        aiohttp.ClientSession() as s,
        s.get(kube.url + "/api/v1/pods?watch=true&resourceVersion=1") as r,
    ):
        assert r.status == 200
        line = json.loads(await r.content.readline())
    assert line["type"] == "ERROR"
    assert line["object"]["code"] == 410
    assert line["object"]["reason"] == "Expired"


async def test_field_selector_transition_sends_deleted_on_bind(kube: FakeApiServer) -> None:
    kube.put_object(make_pod("p"))
    async with aiohttp.ClientSession() as s:
        url = kube.url + "/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3D"
        async with s.get(url) as r:
            added = json.loads(await r.content.readline())
            pod = kube.get_object("v1", "Pod", "p", "default")
            pod["spec"]["nodeName"] = "n"
            kube.put_object(pod)
            left = json.loads(await r.content.readline())
    assert added["type"] == "ADDED"
    assert left["type"] == "DELETED"
