"""KAI Scheduler's objects through the adapter: PodGroups (``scheduling.run.ai/v2alpha2``), Queues
(``scheduling.run.ai/v2``) and KAI's pod conventions (queue label, ``gpu-fraction``, ``gpu-memory``,
sub-groups, topology). Translation units first, then the adapter on the fake API server."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from adapters.k8s import translate as tr
from adapters.k8s.queues import QueueController
from adapters.k8s.status import kai_podgroup_status
from muster.v1 import muster_pb2 as pb

from .conftest import Env, RealMusterHandle, eventually, open_env
from .fake_apiserver import (
    make_kai_pod,
    make_kai_podgroup,
    make_kai_queue,
    make_node,
    make_pod,
    make_volcano_podgroup,
)

KAI = "scheduling.run.ai/v2alpha2"


def _kai_pg(env: Env, name: str, ns: str = "default") -> dict:
    return env.kube.get_object(KAI, "PodGroup", name, ns) or {}


# ------------------------------------------------------------------------------------------
# Translation
# ------------------------------------------------------------------------------------------


def test_pod_names_its_kai_podgroup_and_queue() -> None:
    pod = make_kai_pod("p", namespace="ml", group="pg", queue="team")
    assert tr.pod_group_ref(pod) == (tr.KAI_PODGROUP, "ml/pg")
    assert tr.pod_queue_label(pod) == "team"
    legacy = make_pod("old", labels={"runai/queue": "legacy"})
    assert tr.pod_queue_label(legacy) == "legacy"
    assert tr.pod_group_ref(legacy) is None
    # Volcano's annotation and KAI's can coexist on different pods; each names its own kind.
    assert tr.pod_group_ref(make_pod("v", group="pg")) == (tr.VOLCANO_PODGROUP, "default/pg")


def test_kai_queue_quota_limit_weight_and_unlimited() -> None:
    q = tr.kai_queue_to_pb(
        make_kai_queue(
            "research",
            parent="dept",
            priority=7,
            resources={
                "gpu": {"quota": 2.5, "limit": -1, "overQuotaWeight": 3},
                "cpu": {"quota": 1500, "limit": 8000, "overQuotaWeight": 9},  # millicores
                "memory": {"quota": -1, "limit": 2048},  # megabytes (10^6 bytes)
            },
        )
    )
    assert (q.name, q.parent, q.priority, q.weight) == ("research", "dept", 7, 3)  # the GPU weight
    assert dict(q.guarantee.quantities) == {
        "nvidia.com/gpu": "2.5",
        "cpu": "1500m",
    }  # -1: no guarantee
    assert dict(q.deserved.quantities) == {"nvidia.com/gpu": "2.5", "cpu": "1500m", "memory": "-1"}
    assert dict(q.capability.quantities) == {
        "nvidia.com/gpu": "-1",
        "cpu": "8000m",
        "memory": "2048M",
    }
    assert q.state == pb.QUEUE_STATE_OPEN
    assert not q.HasField("reclaimable")


def test_kai_queue_defaults_and_odd_values() -> None:
    q = tr.kai_queue_to_pb({"metadata": {"name": "bare"}, "spec": {}})
    assert (q.parent, q.priority, q.weight) == ("", 100, 1)  # KAI's default queue priority is 100
    assert not q.guarantee.quantities
    assert not q.deserved.quantities
    assert not q.capability.quantities
    q = tr.kai_queue_to_pb(
        make_kai_queue(
            "z",
            resources={
                "gpu": {"quota": 0, "limit": 0, "overQuotaWeight": 0.4},
                "cpu": {"quota": -3, "limit": "x"},
            },
        )
    )
    assert q.weight == 1  # a weight below 1 cannot be carried: at least 1
    assert dict(q.guarantee.quantities) == {"nvidia.com/gpu": "0"}  # KAI's 0 is a quota of 0, kept
    assert dict(q.capability.quantities) == {
        "nvidia.com/gpu": "0"
    }  # malformed / negative: left out
    assert (
        tr.kai_queue_to_pb(make_kai_queue("w", resources={"gpu": {"overQuotaWeight": 2.6}})).weight
        == 3
    )


def test_fractional_pod_becomes_a_gpu_fraction_task_group() -> None:
    pods = [make_kai_pod(f"f{i}", annotations={"gpu-fraction": "0.25"}) for i in range(2)]
    group = tr.task_group("task", pods)
    assert group.gpu_fraction == pytest.approx(0.25)
    assert group.replicas == 2
    assert "nvidia.com/gpu" not in group.request.quantities
    assert tr.task_group("task", [make_kai_pod("whole")]).gpu_fraction == 0
    assert tr.pod_gpu_problem(pods[0]) == ""


@pytest.mark.parametrize(
    ("annotations", "gpus", "expect"),
    [
        ({"gpu-memory": "4000"}, 0, "gpu-memory"),
        ({"gpu-fraction": "0.5", "gpu-memory": "4000"}, 0, "gpu-memory"),
        ({"gpu-fraction": "1.5"}, 0, "not a share of one GPU"),
        ({"gpu-fraction": "half"}, 0, "not a share of one GPU"),
        ({"gpu-fraction": "0"}, 0, "not a share of one GPU"),
        ({"gpu-fraction": "0.5"}, 1, "whole nvidia.com/gpu"),
        ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}, 0, "several GPUs"),
    ],
)
def test_gpu_requests_muster_cannot_honour_are_refused(
    annotations: dict[str, str], gpus: int, expect: str
) -> None:
    pod = make_kai_pod("p", annotations=annotations)
    if gpus:
        pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": str(gpus)}
    assert expect in tr.pod_gpu_problem(pod)
    assert tr.pod_gpu_fraction(pod) in (0.0, 0.5)


def test_kai_gang_spec_sub_groups_preemptibility_topology() -> None:
    pg = make_kai_podgroup(
        "pg",
        min_member=4,
        queue="team",
        priority_class="train",
        preemptibility="non-preemptible",
        sub_groups=[
            {"name": "decode"},
            {"name": "prefill", "parent": "decode", "minMember": 2},
            {"name": "leader", "minMember": 0},
        ],
        topology={"topology": "cluster", "preferredTopologyLevel": "rack"},
    )
    gang = tr.gang_spec(pg)
    assert (gang.min_member, gang.queue, gang.priority_class, gang.preemptible) == (
        4,
        "team",
        "train",
        False,
    )
    # Only leaves are pod sets (a parent's minimum means nothing to KAI); a leaf needs at least one pod.
    assert gang.sub_groups == {"prefill": 2, "leader": 1}
    assert gang.all_sub_groups == {"decode", "prefill", "leader"}
    assert gang.problem == ""  # a preferred topology level is only a preference

    pg["spec"]["topologyConstraint"]["requiredTopologyLevel"] = "rack"
    assert "topology constraint" in tr.gang_spec(pg).problem
    pg["spec"]["topologyConstraint"] = {
        "requiredTopologyLevel": "rack"
    }  # no Topology named: KAI ignores it
    assert tr.gang_spec(pg).problem == ""
    pg["spec"]["subGroups"][0]["topologyConstraint"] = {
        "topology": "cluster",
        "requiredTopologyLevel": "zone",
    }
    assert "sub-group decode" in tr.gang_spec(pg).problem
    pg["spec"]["subGroups"] = [{"name": "a", "parent": "ghost"}]
    assert "'ghost'" in tr.gang_spec(pg).problem
    assert tr.gang_spec(make_kai_podgroup("x", preemptibility="sometimes")).problem
    # Volcano objects never read KAI's fields.
    assert tr.gang_spec(make_volcano_podgroup("v")).sub_groups == {}


def test_pod_topology_annotations() -> None:
    pod = make_kai_pod(
        "p",
        annotations={
            "kai.scheduler/topology": "cluster",
            "kai.scheduler/topology-required-placement": "zone",
        },
    )
    assert "not supported" in tr.pod_topology(pod).problem("pod default/p")
    pod["metadata"]["annotations"].pop("kai.scheduler/topology-required-placement")
    pod["metadata"]["annotations"]["kai.scheduler/topology-preferred-placement"] = "rack"
    assert tr.pod_topology(pod).problem("pod default/p") == ""


def test_kai_status_shape() -> None:
    pg = make_kai_podgroup("pg", min_member=2)
    pending = [make_kai_pod(f"p{i}", group="pg") for i in range(2)]
    status = kai_podgroup_status(pg, pending, "0/1 nodes are available")
    assert status["pending"] == 2
    assert status["running"] == 0
    [cond] = status["schedulingConditions"]
    assert (
        cond["type"],
        cond["nodePool"],
        cond["reason"],
        cond["status"],
        cond["transitionID"],
    ) == ("UnschedulableOnNodePool", "default", "Unschedulable", "True", "1")
    assert "phase" not in status  # KAI's scheduler sets no phase
    bound = [make_kai_pod("b", group="pg", node="n0", phase="Running"), pending[0]]
    assert "schedulingConditions" not in kai_podgroup_status(pg, bound, "still waiting")


def test_queue_controller_creates_parents_first_and_prefers_volcano() -> None:
    kai = SimpleNamespace(
        cache={
            "a-team": make_kai_queue("a-team", parent="z-dept"),
            "z-dept": make_kai_queue("z-dept"),
            "shared": make_kai_queue("shared", priority=5),
        }
    )
    volcano = SimpleNamespace(
        cache={"shared": {"metadata": {"name": "shared"}, "spec": {"weight": 4}}}
    )
    qc = QueueController(None, queues=volcano, kai_queues=kai)  # type: ignore[arg-type]
    assert sorted(["a-team", "z-dept"], key=lambda n: (qc._depth(n), n)) == ["z-dept", "a-team"]
    shared = qc.desired("shared")
    assert shared is not None
    assert shared.weight == 4
    assert shared.priority == 0
    assert qc.desired("gone") is None


# ------------------------------------------------------------------------------------------
# The adapter on the fake API server
# ------------------------------------------------------------------------------------------


async def test_kai_podgroup_of_two_binds_only_together(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="4"))
    env.kube.put_object(make_kai_queue("dept"))
    env.kube.put_object(
        make_kai_queue(
            "team", parent="dept", resources={"gpu": {"quota": 1, "limit": 2, "overQuotaWeight": 2}}
        )
    )
    env.kube.put_object(
        make_kai_podgroup("pg", min_member=2, queue="team", preemptibility="non-preemptible")
    )
    for i in range(2):
        env.kube.put_object(make_kai_pod(f"w{i}", group="pg", cpu="3"))
    backend = await env.start_adapter(kai=True)

    # One 4-CPU node holds one 3-CPU pod: the gang of two waits, nothing is bound.
    await eventually(lambda: all(env.events("FailedScheduling", f"w{i}") for i in range(2)))
    await eventually(lambda: bool(_kai_pg(env, "pg").get("status", {}).get("schedulingConditions")))
    cond = _kai_pg(env, "pg")["status"]["schedulingConditions"][0]
    assert (cond["type"], cond["reason"]) == ("UnschedulableOnNodePool", "Unschedulable")
    assert (
        "PATCH",
        "/apis/scheduling.run.ai/v2alpha2/namespaces/default/podgroups/pg/status",
    ) in env.kube.requests
    assert env.bind_posts() == 0

    job = env.muster.servicer.jobs["k8s:default:pg"]
    assert (job.spec.queue, job.spec.min_member, job.spec.preemptible) == ("team", 2, False)
    team = env.muster.servicer.queues["team"]
    assert (team.parent, team.weight, dict(team.capability.quantities)) == (
        "dept",
        2,
        {"nvidia.com/gpu": "2"},
    )

    env.kube.put_object(make_node("n1", cpu="4"))
    await eventually(lambda: all(env.pod(f"w{i}")["spec"].get("nodeName") for i in range(2)))
    assert {env.pod(f"w{i}")["spec"]["nodeName"] for i in range(2)} == {"n0", "n1"}
    # The fake API server sets nodeName inside the binding POST; the adapter counts the bind once
    # the POST returns, so the count can trail the pods by a moment.
    await eventually(lambda: backend.stats.binds == 2)
    assert env.bind_posts() == 2
    for i in range(2):
        pod = env.pod(f"w{i}")
        pod["status"]["phase"] = "Running"
        env.kube.put_object(pod)
    await eventually(lambda: _kai_pg(env, "pg").get("status", {}).get("running") == 2)
    assert _kai_pg(env, "pg")["status"]["pending"] == 0

    # A KAI Queue deleted in the cluster goes away on the server too.
    env.kube.delete_object("scheduling.run.ai/v2", "Queue", "team")
    await eventually(lambda: "team" not in env.muster.servicer.queues)


LLM_PODS = ("llm-p0", "llm-d0", "llm-d1")


def _put_llm_podgroup(env: Env, min_member: int) -> None:
    """A 16-CPU node and the KAI PodGroup ``llm``: sub-groups prefill (one pod) and decode (two)."""
    env.kube.put_object(make_node("n0", cpu="16"))
    env.kube.put_object(
        make_kai_podgroup(
            "llm",
            min_member=min_member,
            sub_groups=[{"name": "prefill", "minMember": 1}, {"name": "decode", "minMember": 2}],
        )
    )


async def test_kai_sub_groups_wait_for_their_minimum_and_reach_the_job(env: Env) -> None:
    _put_llm_podgroup(env, min_member=3)
    env.kube.put_object(make_kai_pod("llm-p0", group="llm", sub_group="prefill"))
    env.kube.put_object(make_kai_pod("llm-d0", group="llm", sub_group="decode"))
    env.kube.put_object(make_kai_pod("llm-d1", group="llm", sub_group="decode", cpu="2"))
    await env.start_adapter(kai=True)
    await eventually(lambda: all(env.pod(n)["spec"].get("nodeName") for n in LLM_PODS))
    spec = env.muster.servicer.jobs["k8s:default:llm"].spec
    assert [(s.name, s.min_member) for s in spec.sub_groups] == [("decode", 2), ("prefill", 1)]
    assert [(g.role, g.sub_group, g.replicas) for g in spec.task_groups] == [
        ("decode", "decode", 2),
        ("prefill", "prefill", 1),
    ]


async def test_kai_sub_group_short_of_its_minimum_is_not_submitted(env: Env) -> None:
    _put_llm_podgroup(env, min_member=2)
    env.kube.put_object(make_kai_pod("llm-d0", group="llm", sub_group="decode"))
    env.kube.put_object(make_kai_pod("llm-d1", group="llm", sub_group="decode"))
    await env.start_adapter(kai=True)
    await eventually(
        lambda: env.muster.servicer.snapshots >= 1
    )  # every pod was considered before it
    # minMember (2) is met, but the prefill sub-group has none of its one pod: no partial gang.
    assert "k8s:default:llm" not in env.muster.servicer.jobs
    assert env.bind_posts() == 0
    env.kube.put_object(make_kai_pod("llm-p0", group="llm", sub_group="prefill"))
    await eventually(lambda: all(env.pod(n)["spec"].get("nodeName") for n in LLM_PODS))


async def test_fractional_pod_is_bound_and_gpu_memory_is_refused(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="8", gpus=1))
    env.kube.put_object(make_kai_queue("infer"))
    env.kube.put_object(make_kai_pod("half", queue="infer", annotations={"gpu-fraction": "0.5"}))
    env.kube.put_object(make_kai_pod("by-memory", annotations={"gpu-memory": "4000"}))
    env.kube.put_object(
        make_kai_pod(
            "pinned",
            annotations={
                "kai.scheduler/topology": "cluster",
                "kai.scheduler/topology-required-placement": "rack",
            },
        )
    )
    await env.start_adapter(kai=True)
    await eventually(lambda: env.pod("half")["spec"].get("nodeName") == "n0")
    job = env.muster.servicer.jobs["k8s:default:pod:half"]
    assert job.spec.queue == "infer"
    assert job.spec.task_groups[0].gpu_fraction == pytest.approx(0.5)

    # GPU memory is not something Muster schedules: refused with a reason, never bound.
    await eventually(lambda: bool(env.events("FailedScheduling", "by-memory")))
    assert "gpu-memory" in env.events("FailedScheduling", "by-memory")[0]["message"]
    await eventually(lambda: bool(env.events("FailedScheduling", "pinned")))
    assert "topology" in env.events("FailedScheduling", "pinned")[0]["message"]
    assert "k8s:default:pod:by-memory" not in env.muster.servicer.jobs
    assert "k8s:default:pod:pinned" not in env.muster.servicer.jobs
    assert not env.pod("by-memory")["spec"].get("nodeName")
    assert not env.pod("pinned")["spec"].get("nodeName")
    assert len(env.events("FailedScheduling", "by-memory")) == 1  # once per distinct message

    # The user switches to a fraction: the pod is scheduled.
    pod = env.pod("by-memory")
    pod["metadata"]["annotations"] = {"gpu-fraction": "0.25"}
    env.kube.put_object(pod)
    await eventually(lambda: env.pod("by-memory")["spec"].get("nodeName") == "n0")


async def test_kai_pods_wait_with_a_reason_when_kai_is_not_enabled(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="8"))
    env.kube.put_object(make_kai_podgroup("pg", min_member=1))
    env.kube.put_object(make_kai_pod("k0", group="pg"))
    backend = await env.start_adapter()
    assert tr.KAI_PODGROUP not in backend.podgroups
    assert backend.kai_queues is None
    await eventually(lambda: bool(env.events("FailedScheduling", "k0")))
    assert "--kai" in env.events("FailedScheduling", "k0")[0]["message"]
    assert not any(p.startswith("/apis/scheduling.run.ai/") for _, p in env.kube.requests)
    assert env.bind_posts() == 0


async def test_fractional_pods_share_one_gpu_with_the_real_server(tmp_path: Path) -> None:
    config = str(Path(__file__).resolve().parents[2] / "examples" / "config-kai.yaml")
    async with open_env(RealMusterHandle(str(tmp_path / "muster.db"), config_path=config)) as env:  # type: ignore[arg-type]
        env.kube.put_object(make_node("n0", cpu="8", gpus=1))
        for i in range(2):
            env.kube.put_object(make_kai_pod(f"half{i}", annotations={"gpu-fraction": "0.5"}))
        await env.start_adapter(kai=True)
        await eventually(
            lambda: all(env.pod(f"half{i}")["spec"].get("nodeName") == "n0" for i in range(2))
        )
        # Both halves sit on the one GPU, and each pod says which, as KAI's binder labels it.
        groups = {
            env.pod(f"half{i}")["metadata"]["labels"].get("runai-gpu-group") for i in range(2)
        }
        assert len(groups) == 1
        assert None not in groups
        assert "" not in groups
        # The GPU is now full: a third share waits.
        env.kube.put_object(make_kai_pod("third", annotations={"gpu-fraction": "0.3"}))
        await eventually(lambda: bool(env.events("FailedScheduling", "third")))
        assert not env.pod("third")["spec"].get("nodeName")
