"""Time limits on Kubernetes: a pod's activeDeadlineSeconds is its job's time limit; a bind with a
time limit (e.g. the queue's default) sets it on the pod; a pod the kubelet ended at its deadline
(reason DeadlineExceeded) is reported Failed with the TimeLimit reason."""

from __future__ import annotations

import grpc
import pytest

from adapters.k8s import translate as tr
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

from .conftest import Env, RealMusterHandle, eventually, open_env
from .fake_apiserver import make_node, make_pod


def pod_with_deadline(name: str, seconds: object) -> dict:
    pod = make_pod(name)
    pod["spec"]["activeDeadlineSeconds"] = seconds
    return pod


def test_a_pods_active_deadline_is_its_jobs_time_limit() -> None:
    assert tr.pod_active_deadline(pod_with_deadline("a", 120)) == 120
    assert tr.pod_active_deadline(make_pod("none")) == 0
    for bad in (0, -5, "60", True, 1.5):
        assert tr.pod_active_deadline(pod_with_deadline("bad", bad)) == 0
    # A gang's limit: the smallest deadline among its pods.
    pods = [pod_with_deadline("a", 600), make_pod("b"), pod_with_deadline("c", 300)]
    assert tr.pods_time_limit(pods) == 300
    assert tr.pods_time_limit([make_pod("b")]) == 0
    assert tr.pods_time_limit([pod_with_deadline("huge", 2**40)]) == 2**31 - 1


@pytest.mark.parametrize(
    ("phase", "reason", "deadline", "message"),
    [
        ("Failed", "DeadlineExceeded", 120, "TimeLimit: time limit 2m reached"),
        ("Failed", "DeadlineExceeded", None, "TimeLimit: active deadline exceeded"),
        ("Failed", "Evicted", 120, ""),
        ("Running", "DeadlineExceeded", 120, ""),
        ("Succeeded", None, 120, ""),
    ],
)
def test_deadline_exceeded_maps_to_the_time_limit_reason(phase, reason, deadline, message) -> None:
    pod = pod_with_deadline("p", deadline) if deadline else make_pod("p")
    pod["status"] = {"phase": phase, **({"reason": reason} if reason else {})}
    assert tr.pod_failure_message(pod) == message


@pytest.fixture
async def real_env(tmp_path):
    async with open_env(RealMusterHandle(str(tmp_path / "muster.db"))) as env:  # type: ignore[arg-type]
        yield env


async def test_time_limits_through_the_adapter_and_the_real_server(real_env: Env) -> None:
    env = real_env
    async with grpc.aio.insecure_channel(env.muster.address) as channel:
        stub = pb_grpc.SchedulerStub(channel)
        # The default queue gets a default time limit of 10 minutes (Slurm's DefaultTime).
        queues = await stub.ListQueues(pb.ListQueuesRequest())
        default = next(q.queue for q in queues.queues if q.queue.name == "default")
        default.default_time_limit_seconds = 600
        await stub.UpdateQueue(pb.QueueRequest(queue=default))
        env.kube.put_object(make_node("n0", cpu="4"))
        env.kube.put_object(pod_with_deadline("own", 120))  # its own deadline: 2 minutes
        env.kube.put_object(make_pod("plain"))  # none: the queue's default
        env.kube.put_object(pod_with_deadline("longer", 3600))  # above the default: kept
        await env.start_adapter()
        names = ("own", "plain", "longer")
        await eventually(lambda: all(env.pod(n)["spec"].get("nodeName") for n in names))
        jobs = {n: await stub.GetJob(pb.GetJobRequest(id=f"k8s:default:pod:{n}")) for n in names}
        assert {n: j.spec.time_limit_seconds for n, j in jobs.items()} == {
            "own": 120,
            "plain": 600,
            "longer": 3600,
        }
        # The bind set the queue's default on the pod that had none; the others are unchanged.
        assert {n: env.pod(n)["spec"].get("activeDeadlineSeconds") for n in names} == {
            "own": 120,
            "plain": 600,
            "longer": 3600,
        }
        # The kubelet ends "own" at its deadline.
        pod = env.pod("own")
        pod["status"] = {"phase": "Failed", "reason": "DeadlineExceeded"}
        env.kube.put_object(pod)

        state = env.muster.handle.state  # type: ignore[attr-defined]
        await eventually(
            lambda: state.jobs["k8s:default:pod:own"].status.phase == pb.JOB_PHASE_FAILED
        )
        job = await stub.GetJob(pb.GetJobRequest(id="k8s:default:pod:own"))
        [task] = job.tasks
        assert (task.status, task.message) == (
            pb.TASK_STATUS_FAILED,
            "TimeLimit: time limit 2m reached",
        )
        [ended] = [c for c in job.status.conditions if c.type == "Ended"]
        assert ended.reason == "TimeLimit"
