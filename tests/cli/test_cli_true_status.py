"""`muster nodes` and `muster queues` tell the truth (issue 28): IDLE leaves out unhealthy devices
and GPUs that fractional tasks share (shown apart, with the part of each still free), and a parent
queue's ALLOCATED and job counts are its subtree's. The CLI runs in-process against a real server."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import anyio
import grpc
import pytest

from clients import cli
from muster.devices import NVIDIA_GPU
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service.app import ServerHandle, ServerOptions, start_server

LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ServerHandle]:
    options = ServerOptions(
        listen="127.0.0.1:0", state=str(tmp_path / "muster.db"), cycle_period=3600.0
    )
    handle = await start_server(options)
    try:
        yield handle
    finally:
        await handle.stop()


async def muster(
    server: ServerHandle, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str]:
    """The CLI, in a worker thread (it runs its own event loop) beside the server's; its stdout
    without the server's log lines."""
    capsys.readouterr()
    code = await anyio.to_thread.run_sync(partial(cli.main, ["--server", server.address, *argv]))
    out = capsys.readouterr().out.splitlines(keepends=True)
    return code, "".join(line for line in out if not LOG_LINE.match(line))


def columns(line: str) -> list[str]:
    return re.split(r" {3,}", line.strip())


def rl(**quantities: str) -> pb.ResourceList:
    return pb.ResourceList(quantities={k.replace("_", "."): v for k, v in quantities.items()})


def gpu_node(name: str) -> pb.Node:
    """Four GPUs, GPU 3 unhealthy."""
    n = pb.Node(name=name, allocatable=rl(cpu="16", memory="64Gi"))
    n.allocatable.quantities[NVIDIA_GPU] = "4"
    for i in range(4):
        n.devices.add(id=str(i), type=NVIDIA_GPU, healthy=i != 3)
    return n


async def test_nodes_idle_is_net_of_unhealthy_and_shared_gpus(
    server: ServerHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = rl(cpu="2")
    whole.quantities[NVIDIA_GPU] = "1"
    pods = [
        pb.BackendTask(task_id="pod-whole", node="g0", request=whole, devices=["0"]),
        pb.BackendTask(
            task_id="pod-half", node="g0", request=rl(cpu="1"), gpu_fraction=0.5, gpu_group="1"
        ),
    ]
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.SchedulerStub(channel)
        await stub.RegisterBackend(pb.RegisterBackendRequest(name="a", kind="fake-agent"))
        await stub.SyncSnapshot(
            pb.SyncSnapshotRequest(backend="a", nodes=[gpu_node("g0")], tasks=pods)
        )
    code, out = await muster(server, capsys, "nodes")
    assert code == 0
    header, row = (columns(line) for line in out.splitlines())
    cell = dict(zip(header, row, strict=True))
    # 4 GPUs: 0 held whole, 1 shared (half free), 3 unhealthy: one whole GPU is idle.
    assert cell["IDLE"] == "cpu=13, memory=64Gi, nvidia.com/gpu=1 +1 shared (0.5 free)"
    assert cell["USED"] == "cpu=3, nvidia.com/gpu=1500m"
    assert cell["DEVICES"] == "nvidia.com/gpu 1/4 free (1 shared, 1 unhealthy)"
    code, out = await muster(server, capsys, "nodes", "-o", "json")
    (view,) = json.loads(out)
    assert view["idle"]["quantities"][NVIDIA_GPU] == "1"
    assert view["shared_gpus"] == {"1": 0.5}


async def test_queues_show_subtree_totals(
    server: ServerHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.SchedulerStub(channel)
        await stub.RegisterBackend(pb.RegisterBackendRequest(name="a", kind="fake-agent"))
        nodes = [pb.Node(name=f"n{i}", allocatable=rl(cpu="16")) for i in range(2)]
        await stub.SyncSnapshot(pb.SyncSnapshotRequest(backend="a", nodes=nodes))
        await stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="ml")))
        await stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="ml-train", parent="ml")))
        group = pb.TaskGroup(role="w", replicas=2, request=rl(cpu="15"))
        await stub.SubmitJob(
            pb.SubmitJobRequest(job=pb.JobSpec(id="t", queue="ml-train", task_groups=[group]))
        )
        with anyio.fail_after(20):
            while not any(
                q.allocated.quantities
                for q in (await stub.ListQueues(pb.ListQueuesRequest())).queues
            ):
                await server.loop.next_cycle()
    code, out = await muster(server, capsys, "queues")
    assert code == 0
    lines = [columns(line) for line in out.splitlines()]
    header, rows = lines[0], {row[0]: dict(zip(lines[0], row, strict=True)) for row in lines[1:]}
    assert "ALLOCATED" in header
    # Before issue 28 root's and ml's ALLOCATED were "-" while ml-train held 30 CPUs.
    for name in ("root", "ml", "ml-train"):
        assert (rows[name]["ALLOCATED"], rows[name]["RUNNING"]) == ("cpu=30", "1"), name
    assert rows["default"]["ALLOCATED"] == "-"
