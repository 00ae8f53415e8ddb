"""Kubernetes objects -> Muster messages (pure functions)."""

from __future__ import annotations

from adapters.k8s import translate as tr
from muster.v1 import muster_pb2 as pb

from .fake_apiserver import make_node, make_pod


def test_pod_request_takes_max_of_init_containers_plus_overhead() -> None:
    pod = make_pod("p", cpu="500m", memory="1Gi")
    pod["spec"]["containers"].append(
        {
            "name": "side",
            "resources": {"requests": {"cpu": "250m"}, "limits": {"nvidia.com/gpu": "2"}},
        }
    )
    pod["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"cpu": "2", "memory": "512Mi"}}}
    ]
    pod["spec"]["overhead"] = {"cpu": "100m"}
    assert tr.pod_request(pod) == {
        "cpu": "2100m",
        "memory": "1Gi",
        "nvidia.com/gpu": "2",
        "pods": "1",
    }


def test_node_translation_ready_taints_and_cordon() -> None:
    node = make_node(
        "n",
        cpu="8",
        gpus=4,
        ready=False,
        unschedulable=True,
        taints=[
            {"key": "gpu", "value": "a100", "effect": "NoSchedule"},
            {"key": "odd", "effect": "Bogus"},
        ],
    )
    out = tr.node_to_pb(node)
    assert out.not_ready
    assert out.unschedulable
    assert out.allocatable.quantities["nvidia.com/gpu"] == "4"
    assert [(t.key, t.value, t.effect) for t in out.taints] == [("gpu", "a100", "NoSchedule")]
    node["status"]["conditions"] = []
    assert tr.node_to_pb(node).not_ready  # no Ready condition yet: not ready


def test_group_membership_volcano_annotation_and_coscheduling_label() -> None:
    assert tr.pod_group_ref(make_pod("a", group="g")) == (tr.VOLCANO_PODGROUP, "default/g")
    assert tr.pod_group_ref(make_pod("b", namespace="ml", coscheduling_group="c")) == (
        tr.COSCHEDULING_PODGROUP,
        "ml/c",
    )
    assert tr.pod_group_ref(make_pod("c")) is None


def test_task_group_records_pods_in_index_order_and_role() -> None:
    pods = [make_pod(n, task_spec="worker", cpu="2") for n in ("w-b", "w-a")]
    pods[0]["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    pods[1]["spec"]["nodeSelector"] = {"zone": "a"}
    assert tr.pod_role(pods[0]) == "worker"
    group = tr.task_group("worker", pods)
    assert group.replicas == 2
    assert group.annotations[tr.PODS_ANNOTATION] == "w-a,w-b"
    assert group.node_selector == {"zone": "a"}  # the template is the first pod by name
    assert group.request.quantities["cpu"] == "2"


def test_volcano_queue_translation() -> None:
    q = tr.queue_to_pb(
        {
            "metadata": {"name": "q"},
            "spec": {
                "weight": 2,
                "capability": {"cpu": "10", "memory": "-1"},
                "guarantee": {"resource": {"cpu": "1"}},
                "parent": "org",
            },
            "status": {"state": "Closed"},
        }
    )
    assert q.weight == 2
    assert q.parent == "org"
    assert q.state == pb.QUEUE_STATE_CLOSED
    assert dict(q.capability.quantities) == {"cpu": "10", "memory": "-1"}
    assert dict(q.guarantee.quantities) == {"cpu": "1"}
    assert not q.HasField("reclaimable")


def test_gang_spec_and_job_ids_avoid_slashes() -> None:
    pg = {
        "spec": {
            "minMember": 3,
            "minTaskMember": {"worker": 2},
            "minResources": {"cpu": "6", "bad": "x"},
            "queue": "q",
            "priorityClassName": "high",
        }
    }
    gang = tr.gang_spec(pg)
    assert (
        gang.min_member,
        gang.min_task_member,
        gang.min_resources,
        gang.queue,
        gang.priority_class,
    ) == (3, {"worker": 2}, {"cpu": "6"}, "q", "high")
    assert "/" not in tr.job_id_for_group("ns", "pg")
    assert "/" not in tr.job_id_for_pod("ns", "p")
    assert tr.job_id_for_group("ns", "pod") != tr.job_id_for_pod("ns", "pod")
