"""The shared GPU of a KAI fractional pod (``gpu_group``): reported from the pod's
``runai-gpu-group`` label, and written there from a bind's ``gpu_group`` -- or, from a server
before that field, from the one entry of the bind's ``devices``."""

from __future__ import annotations

import pytest

from adapters.k8s import translate as tr
from muster.v1 import muster_pb2 as pb

from .conftest import Env, eventually
from .fake_apiserver import make_kai_pod, make_node


def test_a_bound_fractional_pod_reports_its_shared_gpu_as_gpu_group() -> None:
    pod = make_kai_pod("half", annotations={"gpu-fraction": "0.5"})
    pod["metadata"].setdefault("labels", {})[tr.GPU_GROUP_LABEL] = "GPU-3f"
    assert tr.gpu_share(pod) == {"gpu_fraction": 0.5, "gpu_group": "GPU-3f"}
    task = pb.BackendTask(task_id="t", **tr.gpu_share(pod))  # type: ignore[arg-type]
    assert (task.gpu_group, list(task.devices)) == ("GPU-3f", [])
    assert tr.gpu_share(make_kai_pod("whole")) == {}


@pytest.mark.parametrize("old", [False, True], ids=["gpu_group", "devices-before-gpu_group"])
async def test_a_fractional_bind_labels_the_pod_with_its_shared_gpu(env: Env, old: bool) -> None:
    env.kube.put_object(make_node("n0", cpu="8", gpus=1))
    env.kube.put_object(make_kai_pod("half", annotations={"gpu-fraction": "0.5"}))
    servicer = env.muster.servicer
    decide = servicer._decide

    def with_shared_gpu(decision: pb.Decision) -> None:
        # The mini server knows nothing of GPU sharing: name the GPU as a real server would.
        decision.bind.gpu_fraction = 0.5
        if old:
            decision.bind.devices.append("0")
        else:
            decision.bind.gpu_group = "0"
        decide(decision)

    servicer._decide = with_shared_gpu  # type: ignore[method-assign]
    await env.start_adapter(kai=True)
    await eventually(lambda: env.pod("half")["spec"].get("nodeName") == "n0")
    assert env.pod("half")["metadata"]["labels"][tr.GPU_GROUP_LABEL] == "0"
    assert not any(
        k.startswith("huawei.com/") for k in env.pod("half")["metadata"].get("annotations") or {}
    )
