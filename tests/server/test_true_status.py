"""Status that is true at every moment (issue 28): a node's idle devices are net of unhealthy ones
and of GPUs that fractional tasks share (ListNodes), a parent queue's numbers are its subtree's
(ListQueues), and no task of an ended plain gang job stays Pending or is blamed for a failure that
was not its own."""

from __future__ import annotations

from pathlib import Path

import anyio
from server_test_helpers import (
    WAIT,
    gang,
    next_cycle,
    node,
    register,
    rl,
    send_statuses,
    status_deltas,
)

from muster.devices import NVIDIA_GPU
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.config import load_config
from server.model import TaskStatus
from server.scheduler import SchedulerCore
from server.service import commands, ingest, snapshot
from server.service.api import queries
from server.service.app import ServerHandle
from server.service.apply import apply
from server.service.decisions import DecisionLog
from server.service.state import ClusterState

KAI_CONFIG = (Path(__file__).resolve().parents[2] / "examples" / "config-kai.yaml").read_text()


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def gpu_node(name: str, gpus: int, unhealthy: tuple[str, ...] = (), listed: bool = True) -> pb.Node:
    n = node(name, cpu="16", memory="64Gi")
    n.allocatable.quantities[NVIDIA_GPU] = str(gpus)
    if listed:
        for i in range(gpus):
            n.devices.add(id=str(i), type=NVIDIA_GPU, healthy=str(i) not in unhealthy)
    return n


def gpu_request(gpus: str) -> pb.ResourceList:
    request = rl(cpu="1")
    request.quantities[NVIDIA_GPU] = gpus
    return request


def view_of(state: ClusterState, name: str) -> pb.NodeView:
    return next(v for v in queries.list_nodes(state, "").nodes if v.node.name == name)


# -- nodes: idle devices ---------------------------------------------------------------------------


def test_idle_gpus_leave_out_unhealthy_held_and_shared_ones() -> None:
    state = ClusterState(DecisionLog(bind_timeout=30), clock=Clock())
    ingest.register_backend(state, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    node_spec = gpu_node("g0", 4, unhealthy=("3",))
    ingest.sync_snapshot(state, pb.SyncSnapshotRequest(backend="a", nodes=[node_spec]))
    view = view_of(state, "g0")
    assert view.idle.quantities[NVIDIA_GPU] == "3"  # 4 GPUs, one unhealthy
    assert not view.shared_gpus
    assert NVIDIA_GPU not in view.used.quantities

    whole = pb.TaskGroup(role="w", replicas=1, request=gpu_request("1"))
    half = pb.TaskGroup(role="w", replicas=1, request=rl(cpu="1"), gpu_fraction=0.5)
    commands.submit_job(state, pb.JobSpec(id="whole", task_groups=[whole]))
    commands.submit_job(state, pb.JobSpec(id="half", task_groups=[half]))
    capture = snapshot.capture(state)
    result = SchedulerCore(load_config(KAI_CONFIG)).run_cycle(
        capture.materialize(), capture.cycle_id
    )
    apply(state, capture, result)
    held = state.tasks["whole/w-0"].devices
    shared = state.tasks["half/w-0"].gpu_group
    assert len(held) == 1
    assert shared
    assert shared not in held
    assert "3" not in (*held, shared)

    view = view_of(state, "g0")
    # Of four GPUs: one broken, one held whole, one shared: one is idle as a whole GPU.
    assert view.idle.quantities[NVIDIA_GPU] == "1"
    assert dict(view.shared_gpus) == {shared: 0.5}  # half of the shared GPU is free
    assert view.used.quantities[NVIDIA_GPU] == "1500m"  # one whole GPU and half of another
    assert dict(view.device_holders) == {held[0]: "whole/w-0", shared: "half/w-0"}
    # The scheduler agrees: a whole-GPU job fits on the one idle GPU, not on two.
    commands.submit_job(
        state,
        pb.JobSpec(
            id="two", task_groups=[pb.TaskGroup(role="w", replicas=1, request=gpu_request("2"))]
        ),
    )
    capture = snapshot.capture(state)
    result = SchedulerCore(load_config(KAI_CONFIG)).run_cycle(
        capture.materialize(), capture.cycle_id
    )
    assert "two/w-0" not in result.binds


async def test_list_nodes_counts_foreign_shares_and_made_up_gpus(
    stub: pb_grpc.SchedulerStub,
) -> None:
    # Devices listed (one unhealthy) and devices the node only counts (ids 0..3 made up).
    tasks = [
        pb.BackendTask(task_id="pod-whole", node="listed", request=gpu_request("1"), devices=["0"]),
        pb.BackendTask(
            task_id="pod-half", node="listed", request=rl(cpu="1"), gpu_fraction=0.5, gpu_group="1"
        ),
        pb.BackendTask(
            task_id="pod-quarter",
            node="listed",
            request=rl(cpu="1"),
            gpu_fraction=0.25,
            gpu_group="1",
        ),
        pb.BackendTask(
            task_id="pod-counted",
            node="counted",
            request=rl(cpu="1"),
            gpu_fraction=0.5,
            gpu_group="2",
        ),
    ]
    await stub.RegisterBackend(pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    await stub.SyncSnapshot(
        pb.SyncSnapshotRequest(
            backend="a",
            nodes=[gpu_node("listed", 4, unhealthy=("3",)), gpu_node("counted", 4, listed=False)],
            tasks=tasks,
        )
    )
    views = {v.node.name: v for v in (await stub.ListNodes(pb.ListNodesRequest())).nodes}
    listed, counted = views["listed"], views["counted"]
    assert listed.idle.quantities[NVIDIA_GPU] == "1"  # GPU 2: 0 held, 1 shared, 3 unhealthy
    assert dict(listed.shared_gpus) == {"1": 0.25}
    assert listed.used.quantities[NVIDIA_GPU] == "1750m"
    assert listed.device_holders["0"] == "pod-whole"
    assert "1" in listed.device_holders
    assert counted.idle.quantities[NVIDIA_GPU] == "3"
    assert dict(counted.shared_gpus) == {"2": 0.5}


# -- queues: subtree totals ----------------------------------------------------------------------


async def test_a_parent_queue_shows_what_its_subtree_holds(
    server: ServerHandle, stub: pb_grpc.SchedulerStub
) -> None:
    await register(stub, "a", [node(f"n{i}", cpu="16") for i in range(3)])
    await stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="eng")))
    await stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="train", parent="eng")))
    await stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="serve", parent="eng")))
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("big", replicas=3, cpu="10", queue="train")))
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("small", replicas=2, cpu="2", queue="serve")))
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("etc", replicas=1, cpu="1")))
    await stub.SubmitJob(
        pb.SubmitJobRequest(job=gang("huge", replicas=1, cpu="64", queue="train"))
    )  # waits: fits no node
    await next_cycle(server)

    async def queues() -> dict[str, pb.QueueView]:
        return {q.queue.name: q for q in (await stub.ListQueues(pb.ListQueuesRequest())).queues}

    with anyio.fail_after(WAIT):
        while (await queues())["train"].allocated.quantities.get("cpu") != "30":
            await next_cycle(server)
    views = await queues()

    def row(name: str) -> tuple[str, int, int]:
        v = views[name]
        return v.allocated.quantities.get("cpu", "-"), v.pending_jobs, v.running_jobs

    assert row("train") == ("30", 1, 1)
    assert row("serve") == ("4", 0, 1)
    assert row("eng") == ("34", 1, 2)  # its children's sum: it holds no job itself
    assert row("default") == ("1", 0, 1)
    assert row("root") == ("35", 1, 3)  # the whole cluster


# -- plain gang jobs: how their tasks end --------------------------------------------------------


async def test_a_failed_gang_cancels_its_unrun_and_stopped_tasks(
    server: ServerHandle, stub: pb_grpc.SchedulerStub
) -> None:
    # Room for three of four tasks; the gang needs three: three run, one never does.
    await register(stub, "a", [node(f"n{i}") for i in range(3)])
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("g", replicas=4, cpu="4", min_member=3)))
    await next_cycle(server)
    stream = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="a"))
    binds = []
    with anyio.fail_after(WAIT):
        async for d in stream:
            binds.append(d)
            if len(binds) == 3:
                break
    await stub.AckDecisions(
        pb.AckDecisionsRequest(
            backend="a", acks=[pb.DecisionAck(decision_id=d.id, applied=True) for d in binds]
        )
    )
    ran = sorted(d.bind.task_id for d in binds)
    (never,) = {f"g/worker-{i}" for i in range(4)} - set(ran)

    def update(task: str, status: pb.TaskStatus, exit_code: int = 0) -> pb.TaskStatusUpdate:
        return pb.TaskStatusUpdate(task_id=task, status=status, exit_code=exit_code)

    await stub.SendDeltas(status_deltas("a", [update(t, pb.TASK_STATUS_RUNNING) for t in ran]))
    # Two of the three fail: three can no longer succeed.
    await stub.SendDeltas(
        status_deltas(
            "a",
            [
                update(ran[0], pb.TASK_STATUS_FAILED, exit_code=2),
                update(ran[1], pb.TASK_STATUS_FAILED, exit_code=3),
            ],
        )
    )
    job = await stub.GetJob(pb.GetJobRequest(id="g"))
    tasks = {t.id: t for t in job.tasks}
    assert job.status.phase == pb.JOB_PHASE_FAILED
    assert (tasks[never].status, tasks[never].message) == (
        pb.TASK_STATUS_CANCELLED,
        "not run: the job failed",
    )
    assert [(tasks[t].status, tasks[t].exit_code) for t in ran[:2]] == [
        (pb.TASK_STATUS_FAILED, 2),
        (pb.TASK_STATUS_FAILED, 3),
    ]
    assert tasks[ran[2]].status == pb.TASK_STATUS_RELEASING  # stopped by the job's end
    ended = next(c for c in job.status.conditions if c.type == "Ended")
    assert f"task {ran[0]} failed (exit code 2)" in ended.message
    assert f"task {ran[1]} failed (exit code 3)" in ended.message
    assert never not in ended.message
    assert ran[2] not in ended.message
    # Its eviction acknowledged, the stopped task is Cancelled, not Failed.
    with anyio.fail_after(WAIT):
        async for d in stream:
            if d.HasField("evict"):
                assert d.evict.task_id == ran[2]
                assert d.evict.reason == "job-failed"
                break
    stream.cancel()
    await stub.AckDecisions(
        pb.AckDecisionsRequest(backend="a", acks=[pb.DecisionAck(decision_id=d.id, applied=True)])
    )
    job = await stub.GetJob(pb.GetJobRequest(id="g"))
    tasks = {t.id: t for t in job.tasks}
    assert (tasks[ran[2]].status, tasks[ran[2]].message) == (
        pb.TASK_STATUS_CANCELLED,
        "stopped: the job failed",
    )
    assert not [t for t in job.tasks if t.status == pb.TASK_STATUS_PENDING]
    assert (job.status.pending, job.status.failed, job.status.cancelled) == (0, 2, 2)


def test_a_task_of_a_failed_gang_that_loses_its_node_is_not_pending_again() -> None:
    state = ClusterState(DecisionLog(bind_timeout=30), clock=Clock())
    ingest.register_backend(state, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(state, pb.SyncSnapshotRequest(backend="a", nodes=[node("n0", cpu="8")]))
    commands.submit_job(state, gang("g", replicas=2, cpu="4"))
    capture = snapshot.capture(state)
    result = SchedulerCore(load_config(KAI_CONFIG)).run_cycle(
        capture.materialize(), capture.cycle_id
    )
    apply(state, capture, result)
    send_statuses(
        state,
        "a",
        [
            pb.TaskStatusUpdate(task_id=t, status=s, exit_code=c)
            for t, s, c in [
                ("g/worker-0", pb.TASK_STATUS_RUNNING, 0),
                ("g/worker-1", pb.TASK_STATUS_RUNNING, 0),
                ("g/worker-0", pb.TASK_STATUS_FAILED, 1),
            ]
        ],
    )
    assert state.jobs["g"].status.phase == pb.JOB_PHASE_FAILED
    assert state.tasks["g/worker-1"].status == TaskStatus.RELEASING
    ingest.sync_snapshot(state, pb.SyncSnapshotRequest(backend="a", nodes=[]))  # the node is gone
    survivor = state.tasks["g/worker-1"]
    assert (survivor.status, survivor.message) == (TaskStatus.CANCELLED, "stopped: the job failed")
    assert state.tasks["g/worker-0"].status == TaskStatus.FAILED
