"""Explain: the gate and the per-reason node counts on constructed clusters (core and RPC)."""

from __future__ import annotations

import grpc
import pytest

from muster.quantity import parse_resources
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.model import (
    ClusterSnapshot,
    JobSpec,
    NodeSpec,
    PodGroupPhase,
    QueueSpec,
    Taint,
    TaskSpec,
    TaskStatus,
)
from server.scheduler import SchedulerCore
from server.service.app import ServerHandle

from .conftest import next_cycle, register

CPU_NODE = {"cpu": "8", "memory": "32Gi", "pods": "110"}
GPU_NODE = {**CPU_NODE, "nvidia.com/gpu": "4"}


def job(
    uid: str,
    n: int,
    request: dict[str, str],
    queue: str = "default",
    phase: PodGroupPhase = PodGroupPhase.INQUEUE,
    **kw: object,
) -> JobSpec:
    tasks = [
        TaskSpec(
            uid=f"{uid}-{i}",
            name=f"{uid}-{i}",
            namespace="ns",
            job=uid,
            request=parse_resources(request),
            creation_index=i,
        )
        for i in range(n)
    ]
    return JobSpec(uid=uid, name=uid, namespace="ns", queue=queue, tasks=tasks, phase=phase, **kw)  # type: ignore[arg-type]


def cpu_nodes(n: int) -> list[NodeSpec]:
    return [NodeSpec(f"c{i}", parse_resources(CPU_NODE)) for i in range(n)]


def reserved_gpu_nodes(n: int) -> list[NodeSpec]:
    return [
        NodeSpec(
            f"g{i}", parse_resources(GPU_NODE), taints=[Taint("gpu", "reserved", "NoSchedule")]
        )
        for i in range(n)
    ]


def gpu_nodes_busy(n: int) -> list[NodeSpec]:
    return [NodeSpec(f"b{i}", parse_resources(GPU_NODE)) for i in range(n)]


def gpu_holders(n: int) -> list[JobSpec]:
    """Running jobs holding every GPU of the busy GPU nodes."""
    out = []
    for i in range(n):
        holder = job(
            f"hold{i}", 1, {"cpu": "1", "nvidia.com/gpu": "4"}, phase=PodGroupPhase.RUNNING
        )
        holder.tasks[0].status, holder.tasks[0].node = TaskStatus.RUNNING, f"b{i}"
        out.append(holder)
    return out


def outcome(nodes: list[NodeSpec], queues: list[QueueSpec], jobs: list[JobSpec], uid: str):
    result = SchedulerCore().run_cycle(ClusterSnapshot(nodes=nodes, queues=queues, jobs=jobs), 1)
    return result.jobs[uid]


def unschedulable_message(out) -> str:
    [cond] = [c for c in out.conditions if c.type == "Unschedulable"]
    assert cond.status == "True"
    return cond.message


def test_placement_counts_nodes_per_reason_most_common_first() -> None:
    out = outcome(
        cpu_nodes(1200) + reserved_gpu_nodes(800),
        [QueueSpec("default")],
        [job("train", 1, {"cpu": "1", "nvidia.com/gpu": "1"})],
        "train",
    )
    exp = out.explanation
    # The GPU nodes are reserved by a taint the job does not tolerate: it can never run here, which
    # is said apart from "waiting for room", with the per-reason node counts kept.
    assert exp is not None
    assert exp.gate == "unsatisfiable"
    assert exp.node_reasons == {
        "Insufficient nvidia.com/gpu": 1200,
        "node(s) had untolerated taint {gpu: reserved}": 800,
    }
    assert exp.summary == (
        "task train-0 can never run on this cluster: it asks nvidia.com/gpu 1 (largest eligible node: 0); "
        "the nodes big enough are excluded by its node selector, affinity or tolerations "
        "(0/2,000 nodes are unavailable: 1,200 Insufficient nvidia.com/gpu, "
        "800 node(s) had untolerated taint {gpu: reserved})"
    )
    assert exp.summary in unschedulable_message(out)
    # Untainted GPU nodes, all busy: the same job waits for room (the placement gate).
    busy = outcome(
        cpu_nodes(3) + gpu_nodes_busy(2),
        [QueueSpec("default")],
        [job("train", 1, {"cpu": "1", "nvidia.com/gpu": "1"}), *gpu_holders(2)],
        "train",
    )
    assert busy.explanation is not None
    assert busy.explanation.gate == "placement"


def test_closed_queue_is_the_gate() -> None:
    out = outcome(
        cpu_nodes(3),
        [QueueSpec("default"), QueueSpec("frozen", state="Closed")],
        [job("j", 1, {"cpu": "1"}, queue="frozen")],
        "j",
    )
    assert out.explanation is not None
    assert out.explanation.gate == "queue"
    assert "frozen" in out.explanation.summary
    assert "Closed" in out.explanation.summary
    assert out.explanation.summary in unschedulable_message(out)


def test_queue_capability_is_the_gate() -> None:
    small = QueueSpec("small", capability=parse_resources({"cpu": "2"}))
    holder = job("hold", 1, {"cpu": "1"}, queue="small", phase=PodGroupPhase.RUNNING)
    holder.tasks[0].status, holder.tasks[0].node = TaskStatus.RUNNING, "c0"
    out = outcome(
        cpu_nodes(3),
        [QueueSpec("default"), small],
        [holder, job("j", 1, {"cpu": "2"}, queue="small")],
        "j",
    )
    # The queue could hold it once "hold" ends: it waits for its queue.
    assert out.explanation is not None
    assert out.explanation.gate == "queue"
    assert "small" in out.explanation.summary
    assert "capability" in out.explanation.summary
    assert out.explanation.node_reasons == {}
    assert out.explanation.summary in unschedulable_message(out)
    assert not any(c.type == "Unsatisfiable" for c in out.conditions)


def test_a_request_beyond_the_queue_capability_is_unsatisfiable() -> None:
    # (This job was once explained as waiting for its queue: it never fits the queue at all.)
    small = QueueSpec("small", capability=parse_resources({"cpu": "1"}))
    out = outcome(
        cpu_nodes(3), [QueueSpec("default"), small], [job("j", 1, {"cpu": "2"}, queue="small")], "j"
    )
    assert out.explanation is not None
    assert out.explanation.gate == "unsatisfiable"
    assert out.explanation.summary == "job j requests cpu 2 > queue small capability cpu 1"
    assert out.explanation.node_reasons == {}
    assert out.explanation.summary in unschedulable_message(out)
    [never] = [c for c in out.conditions if c.type == "Unsatisfiable"]
    assert (never.status, never.reason, never.message) == (
        "True",
        "ExceedsQueueCapability",
        out.explanation.summary,
    )


def test_enqueue_denied_is_the_gate() -> None:
    pending = job(
        "big",
        2,
        {"cpu": "1"},
        phase=PodGroupPhase.PENDING,
        min_resources=parse_resources({"cpu": "100"}),
    )
    out = outcome(cpu_nodes(3), [QueueSpec("default")], [pending], "big")
    assert out.phase == PodGroupPhase.PENDING
    assert out.explanation is not None
    assert out.explanation.gate == "enqueue"
    assert "cpu" in out.explanation.summary
    assert out.explanation.summary in unschedulable_message(out)


def test_a_placed_job_has_no_gate() -> None:
    out = outcome(cpu_nodes(3), [QueueSpec("default")], [job("ok", 2, {"cpu": "1"})], "ok")
    assert out.explanation is not None
    assert out.explanation.gate == "none"
    assert not any(c.type == "Unschedulable" and c.status == "True" for c in out.conditions)


async def test_explain_rpc_and_condition_agree(
    traced: ServerHandle, stub: pb_grpc.SchedulerStub
) -> None:
    nodes = [
        pb.Node(name=f"n{i}", allocatable=pb.ResourceList(quantities={"cpu": "4", "memory": "8Gi"}))
        for i in range(3)
    ]
    nodes.append(
        pb.Node(
            name="gpu0",
            allocatable=pb.ResourceList(
                quantities={"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"}
            ),
            taints=[pb.Taint(key="gpu", value="reserved", effect="NoSchedule")],
        )
    )
    await register(stub, nodes=nodes)
    spec = pb.JobSpec(
        id="wants-gpu",
        task_groups=[
            pb.TaskGroup(
                role="worker",
                replicas=1,
                request=pb.ResourceList(quantities={"cpu": "1", "nvidia.com/gpu": "1"}),
            )
        ],
    )
    await stub.SubmitJob(pb.SubmitJobRequest(job=spec))
    await next_cycle(traced)
    exp = await stub.Explain(pb.ExplainRequest(job_id="wants-gpu"))
    assert exp.gate == "unsatisfiable"
    assert exp.cycle_id > 0
    assert dict(exp.node_reasons) == {
        "Insufficient nvidia.com/gpu": 3,
        "node(s) had untolerated taint {gpu: reserved}": 1,
    }
    assert exp.summary.startswith(
        "task wants-gpu-worker-0 can never run on this cluster: it asks nvidia.com/gpu 1"
    )
    assert "(0/4 nodes are unavailable: 3 Insufficient nvidia.com/gpu, 1 node(s)" in exp.summary
    job = await stub.GetJob(pb.GetJobRequest(id="wants-gpu"))
    [cond] = [c for c in job.status.conditions if c.type == "Unschedulable"]
    assert exp.summary in cond.message
    [never] = [c for c in job.status.conditions if c.type == "Unsatisfiable"]
    assert never.status == "True"
    assert never.message == exp.summary

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Explain(pb.ExplainRequest(job_id="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "job_id" in (err.value.details() or "")


def test_cli_renders_the_verdict(capsys) -> None:
    from clients.render import Output, render_explanation

    out = Output("text")
    render_explanation(
        out,
        pb.ExplainResponse(
            job_id="j",
            cycle_id=9,
            gate="placement",
            summary="0/2,000 nodes are unavailable: 1,200 Insufficient nvidia.com/gpu, 800 node(s) had taint.",
            node_reasons={"Insufficient nvidia.com/gpu": 1200, "node(s) had taint": 800},
        ),
    )
    render_explanation(
        out, pb.ExplainResponse(job_id="k", cycle_id=10, gate="none", summary="placed")
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(
        "Why pending (cycle 9, gate placement): 0/2,000 nodes are unavailable"
    )
    assert lines[1].split() == ["1,200", "node(s):", "Insufficient", "nvidia.com/gpu"]
    assert lines[2].split()[0] == "800"
    assert lines[3] == "Verdict (cycle 10): placed"
