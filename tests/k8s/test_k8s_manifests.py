"""deploy/kubernetes: manifests parse, the ConfigMap is a valid scheduler config, and the RBAC
rules grant every API request the adapter makes in a scenario (and nothing broad), its leader
election's Lease requests included."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import yaml

from adapters.k8s.kube import make_api_client
from adapters.k8s.lease import LeaderElector
from adapters.k8s.main import parse_args
from muster.v1 import muster_pb2 as pb
from server.config import load_config

from .conftest import Env, eventually
from .fake_apiserver import (
    FakeApiServer,
    make_kai_pod,
    make_kai_podgroup,
    make_kai_queue,
    make_node,
    make_pod,
    make_volcano_podgroup,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def _docs() -> list[dict]:
    return [
        d
        for f in sorted(DEPLOY.glob("*.yaml"))
        if f.name != "kustomization.yaml"
        for d in yaml.safe_load_all(f.read_text())
        if d
    ]


def test_manifests_parse_and_config_map_is_a_valid_scheduler_config() -> None:
    kinds = sorted(d["kind"] for d in _docs())
    for kind in (
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
        "ConfigMap",
    ):
        assert kind in kinds
    config_map = next(d for d in _docs() if d["kind"] == "ConfigMap")
    load_config(config_map["data"]["scheduler.yaml"])
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(
        f.name for f in DEPLOY.glob("*.yaml") if f.name != "kustomization.yaml"
    )


def _rules() -> list[dict]:
    role = next(d for d in _docs() if d["kind"] == "ClusterRole")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"]
        assert "*" not in rule["resources"]
        assert "*" not in rule["apiGroups"]
    return role["rules"]


def _needed(method: str, path: str) -> list[tuple[str, str, str]]:
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    if rest and rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    if method == "GET":
        verbs = ["get"] if len(rest) > 1 else ["list", "watch"]
    else:
        verbs = [{"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]]
    return [(group, resource, v) for v in verbs]


def _made(env: Env) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every API request the adapter made."""
    return {
        n for m, p in env.kube.requests if p.startswith(("/api/", "/apis/")) for n in _needed(m, p)
    }


def _assert_granted(made: set[tuple[str, str, str]]) -> None:
    rules = _rules()
    for group, resource, verb in made:
        assert any(
            group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
            for r in rules
        ), f"RBAC does not grant {verb} {resource} in group {group!r}"


async def test_rbac_grants_every_request_the_adapter_makes(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="2"))
    env.kube.put_object(make_volcano_podgroup("pg", min_member=2))
    env.kube.put_object(
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "cg", "namespace": "default"},
            "spec": {"minMember": 1},
        }
    )
    for i in range(2):
        env.kube.put_object(make_pod(f"w{i}", cpu="1", group="pg"))
    env.kube.put_object(
        make_pod("c0", cpu="1", coscheduling_group="cg")
    )  # does not fit: FailedScheduling
    await env.start_adapter()
    await eventually(lambda: all(env.pod(f"w{i}")["spec"].get("nodeName") for i in range(2)))
    await eventually(lambda: env.events("FailedScheduling", "c0") != [])
    await env.muster.servicer.CancelJob(pb.CancelJobRequest(id="k8s:default:pg"), None)
    await eventually(lambda: env.kube.get_object("v1", "Pod", "w0", "default") is None)

    made = _made(env)
    assert ("", "pods/binding", "create") in made
    assert ("", "pods/eviction", "create") in made
    assert ("scheduling.volcano.sh", "podgroups/status", "patch") in made
    _assert_granted(made)


async def test_rbac_grants_what_the_adapter_asks_for_kai_resources(env: Env) -> None:
    """With --kai the adapter also lists and watches KAI's PodGroups and Queues and patches a KAI
    PodGroup's status: the shipped ClusterRole must allow it."""
    env.kube.put_object(make_node("n0", cpu="1"))
    env.kube.put_object(make_kai_queue("team"))
    env.kube.put_object(make_kai_podgroup("kg", min_member=2, queue="team"))
    for i in range(2):
        env.kube.put_object(
            make_kai_pod(f"k{i}", cpu="1", group="kg", queue="team")
        )  # one fits: unschedulable
    await env.start_adapter(kai=True)
    await eventually(
        lambda: (
            env.events("FailedScheduling", "k0") != [] or env.events("FailedScheduling", "k1") != []
        )
    )
    made = _made(env)
    assert ("scheduling.run.ai", "queues", "list") in made
    assert ("scheduling.run.ai", "podgroups/status", "patch") in made
    _assert_granted(made)


async def test_role_grants_the_lease_requests_of_the_manifests_adapter() -> None:
    """The adapter as deploy/kubernetes runs it (its own flags) acquires, renews and releases its
    Lease; the namespaced Role allows each request, names included, and nothing else is needed."""
    adapter = next(
        d
        for d in _docs()
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "muster-k8s-adapter"
    )
    [container] = adapter["spec"]["template"]["spec"]["containers"]
    args = parse_args(container["args"])
    assert args.leader_elect
    config = dataclasses.replace(
        args.lease, lease_duration=1.0, renew_deadline=0.6, retry_period=0.1
    )
    kube = FakeApiServer()
    await kube.start()
    api = await make_api_client(host=kube.url)
    try:
        elector = LeaderElector(api, config)

        async def lead() -> None:
            await asyncio.sleep(0.8)  # two renews

        await asyncio.wait_for(elector.run(lead), 10)  # returns, and releases
    finally:
        await api.close()
        await kube.stop()
    [role] = [d for d in _docs() if d["kind"] == "Role"]
    [binding] = [d for d in _docs() if d["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert (
        binding["subjects"][0]["name"] == adapter["spec"]["template"]["spec"]["serviceAccountName"]
    )
    made = set()
    for method, path in kube.requests:
        parts = path.strip("/").split("/")
        assert parts[:5] == [
            "apis",
            "coordination.k8s.io",
            "v1",
            "namespaces",
            role["metadata"]["namespace"],
        ]
        assert parts[5] == "leases"
        name = parts[6] if len(parts) > 6 else None
        verb = {"GET": "get", "POST": "create", "PUT": "update"}[method]
        made.add(verb)
        assert any(
            "coordination.k8s.io" in r["apiGroups"]
            and "leases" in r["resources"]
            and verb in r["verbs"]
            and (name is None or "resourceNames" not in r or name in r["resourceNames"])
            for r in role["rules"]
        ), f"the Role does not grant {verb} on lease {name}"
    assert made == {"get", "create", "update"}
