"""Message builders and waits shared by the server tests (imported as ``helpers``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import grpc

from muster.v1 import muster_pb2 as pb
from server.service.app import ServerHandle

WAIT = 20.0  # safety bound for event waits; never part of a verdict


def rl(**quantities: str) -> pb.ResourceList:
    return pb.ResourceList(quantities={k.replace("_", "."): v for k, v in quantities.items()})


def node(name: str, cpu: str = "4", memory: str = "16Gi", **kw: object) -> pb.Node:
    return pb.Node(name=name, allocatable=rl(cpu=cpu, memory=memory), **kw)


def gang(
    job_id: str, replicas: int = 4, cpu: str = "4", min_member: int = 0, **kw: object
) -> pb.JobSpec:
    return pb.JobSpec(
        id=job_id,
        min_member=min_member,
        task_groups=[pb.TaskGroup(role="worker", replicas=replicas, request=rl(cpu=cpu))],
        **kw,
    )


async def register(stub, backend: str = "agent-a", nodes: list[pb.Node] | None = None) -> None:
    await stub.RegisterBackend(pb.RegisterBackendRequest(name=backend, kind="fake-agent"))
    await stub.SyncSnapshot(pb.SyncSnapshotRequest(backend=backend, nodes=nodes or []))


async def next_cycle(server: ServerHandle) -> None:
    """Wait for a cycle that started after this call (wakes the loop)."""
    with anyio.fail_after(WAIT):
        await server.loop.next_cycle()


async def rpc_error(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc
    raise AssertionError("the call succeeded; expected an error status")


async def wait_for(predicate: Callable[[], Awaitable[bool]], what: str) -> None:
    with anyio.fail_after(WAIT):
        while not await predicate():
            await anyio.sleep(0.02)


async def read_decisions(stream, count: int) -> list[pb.Decision]:
    out: list[pb.Decision] = []
    with anyio.fail_after(WAIT):
        async for decision in stream:
            out.append(decision)
            if len(out) == count:
                break
    return out
