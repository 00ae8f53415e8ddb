"""Gang scheduling of Volcano PodGroups through the adapter (fake API server + small Muster)."""

from __future__ import annotations

from .conftest import Env, eventually
from .fake_apiserver import make_node, make_pod, make_volcano_podgroup


async def test_podgroup_of_four_binds_only_when_all_fit_then_status_running(env: Env) -> None:
    for i in range(3):
        env.kube.put_object(make_node(f"n{i}", cpu="4"))
    env.kube.put_object(make_volcano_podgroup("pg", min_member=4))
    for i in range(4):
        env.kube.put_object(make_pod(f"w{i}", cpu="3", group="pg", task_spec="worker"))
    backend = await env.start_adapter()

    # Three 4-CPU nodes hold only three 3-CPU pods: nothing may be bound, and users are told why.
    await eventually(
        lambda: all(
            any("0/3 nodes" in e["message"] for e in env.events("FailedScheduling", f"w{i}"))
            for i in range(4)
        )
    )
    await eventually(
        lambda: (
            (
                env.kube.get_object("scheduling.volcano.sh/v1beta1", "PodGroup", "pg", "default")
                or {}
            )
            .get("status", {})
            .get("conditions", [{}])[0]
            .get("type")
            == "Unschedulable"
        )
    )
    assert env.bind_posts() == 0
    assert all(not env.pod(f"w{i}")["spec"].get("nodeName") for i in range(4))
    assert "gang" in env.events("FailedScheduling", "w0")[0]["message"]

    env.kube.put_object(make_node("n3", cpu="4"))
    await eventually(lambda: all(env.pod(f"w{i}")["spec"].get("nodeName") for i in range(4)))
    nodes = {env.pod(f"w{i}")["spec"]["nodeName"] for i in range(4)}
    assert nodes == {"n0", "n1", "n2", "n3"}
    assert env.bind_posts() == 4
    await eventually(
        lambda: (
            env.kube.get_object("scheduling.volcano.sh/v1beta1", "PodGroup", "pg", "default")[
                "status"
            ]["phase"]
            == "Running"
        )
    )
    status = env.kube.get_object("scheduling.volcano.sh/v1beta1", "PodGroup", "pg", "default")[
        "status"
    ]
    assert status["conditions"][0]["type"] == "Scheduled"
    # The status went through the /status subresource with a merge patch.
    assert (
        "PATCH",
        "/apis/scheduling.volcano.sh/v1beta1/namespaces/default/podgroups/pg/status",
    ) in env.kube.requests
    await eventually(lambda: len(env.events("Scheduled")) == 4)
    assert backend.stats.binds == 4

    # The kubelet starts the pods: counts follow, and Muster hears Running.
    for i in range(4):
        pod = env.pod(f"w{i}")
        pod["status"]["phase"] = "Running"
        env.kube.put_object(pod)
    await eventually(
        lambda: (
            env.kube.get_object("scheduling.volcano.sh/v1beta1", "PodGroup", "pg", "default")[
                "status"
            ]["running"]
            == 4
        )
    )
    job = env.muster.servicer.jobs["k8s:default:pg"]
    await eventually(lambda: all(t.status == 6 for t in job.tasks))


async def test_gang_pods_wait_for_their_podgroup(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="8"))
    for i in range(2):
        env.kube.put_object(make_pod(f"p{i}", cpu="1", group="late"))
    await env.start_adapter()
    # No PodGroup yet: no job, no binding (no partial placement of a gang).
    await eventually(lambda: env.muster.servicer.snapshots >= 1)
    assert "k8s:default:late" not in env.muster.servicer.jobs
    assert env.bind_posts() == 0
    env.kube.put_object(make_volcano_podgroup("late", min_member=2))
    await eventually(
        lambda: all(env.pod(f"p{i}")["spec"].get("nodeName") == "n0" for i in range(2))
    )


async def test_other_schedulers_pods_consume_capacity(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="4"))
    env.kube.put_object(
        make_pod("theirs", cpu="3", scheduler="default-scheduler", node="n0", phase="Running")
    )
    env.kube.put_object(make_pod("mine", cpu="2"))
    await env.start_adapter()
    await eventually(
        lambda: any("0/1 nodes" in e["message"] for e in env.events("FailedScheduling", "mine"))
    )
    assert not env.pod("mine")["spec"].get("nodeName")
    assert any(t.foreign_task for t in env.muster.servicer.foreign.values())

    env.kube.delete_object("v1", "Pod", "theirs", "default")
    await eventually(lambda: env.pod("mine")["spec"].get("nodeName") == "n0")


async def test_not_ready_node_gets_no_new_binds(env: Env) -> None:
    env.kube.put_object(make_node("bad", cpu="16", ready=False))
    env.kube.put_object(make_node("good", cpu="2"))
    await env.start_adapter()
    for i in range(2):
        env.kube.put_object(make_pod(f"p{i}", cpu="2"))
    await eventually(
        lambda: sum(1 for i in range(2) if env.pod(f"p{i}")["spec"].get("nodeName")) == 1
    )
    await eventually(lambda: len(env.events("FailedScheduling")) >= 1)
    assert {env.pod(f"p{i}")["spec"].get("nodeName") for i in range(2)} == {"good", None}

    # The kubelet comes back: the waiting pod goes there.
    env.kube.put_object(make_node("bad", cpu="16", ready=True))
    await eventually(
        lambda: {env.pod(f"p{i}")["spec"].get("nodeName") for i in range(2)} == {"good", "bad"}
    )


async def test_coscheduling_podgroup_and_singleton_pods(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="4"))
    env.kube.put_object(
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "cg", "namespace": "ml"},
            "spec": {"minMember": 2},
        }
    )
    for i in range(2):
        env.kube.put_object(make_pod(f"c{i}", namespace="ml", cpu="1", coscheduling_group="cg"))
    env.kube.put_object(make_pod("alone", cpu="1"))
    env.kube.put_object(make_pod("not-mine", cpu="1", scheduler="default-scheduler"))
    await env.start_adapter()
    await eventually(
        lambda: (
            all(env.pod(f"c{i}", "ml")["spec"].get("nodeName") for i in range(2))
            and env.pod("alone")["spec"].get("nodeName")
        )
    )
    jobs = env.muster.servicer.jobs
    assert set(jobs) == {"k8s:ml:cg", "k8s:default:pod:alone"}
    assert jobs["k8s:ml:cg"].spec.min_member == 2
    assert not env.pod("not-mine")["spec"].get(
        "nodeName"
    )  # another scheduler's pending pod is left alone
    await eventually(
        lambda: (
            (env.kube.get_object("scheduling.x-k8s.io/v1alpha1", "PodGroup", "cg", "ml") or {})
            .get("status", {})
            .get("phase")
            == "Running"
        )
    )


async def test_roles_and_min_task_member_map_onto_the_job(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="16"))
    env.kube.put_object(
        make_volcano_podgroup("mpi", min_member=3, min_task_member={"master": 1, "worker": 2})
    )
    env.kube.put_object(make_pod("mpi-master-0", cpu="1", group="mpi", task_spec="master"))
    for i in range(2):
        env.kube.put_object(make_pod(f"mpi-worker-{i}", cpu="2", group="mpi", task_spec="worker"))
    backend = await env.start_adapter()
    await eventually(lambda: "k8s:default:mpi" in env.muster.servicer.jobs)
    spec = env.muster.servicer.jobs["k8s:default:mpi"].spec
    assert [(g.role, g.replicas, g.request.quantities["cpu"]) for g in spec.task_groups] == [
        ("master", 1, "1"),
        ("worker", 2, "2"),
    ]
    assert dict(spec.min_task_member) == {"master": 1, "worker": 2}
    await eventually(lambda: len(backend.pod_task) == 3)
    assert backend.pod_task["default/mpi-worker-1"] == "k8s:default:mpi/worker-1"
    await eventually(lambda: env.pod("mpi-worker-1")["spec"].get("nodeName") == "n0")


async def test_podgroup_deleted_cancels_the_job(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="1"))
    env.kube.put_object(make_volcano_podgroup("big", min_member=2))
    for i in range(2):
        env.kube.put_object(make_pod(f"b{i}", cpu="1", group="big"))
    await env.start_adapter()
    await eventually(lambda: "k8s:default:big" in env.muster.servicer.jobs)
    env.kube.delete_object("scheduling.volcano.sh/v1beta1", "PodGroup", "big", "default")
    await eventually(
        lambda: env.muster.servicer.jobs["k8s:default:big"].phase == 6
    )  # JOB_PHASE_CANCELLED
