"""Message builders and waits shared by the server tests (imported as ``helpers``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import anyio
import grpc

from muster.v1 import muster_pb2 as pb
from server.service import ingest
from server.service.app import ServerHandle
from server.service.state import ClusterState

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


def status_deltas(backend: str, updates: Iterable[pb.TaskStatusUpdate]) -> pb.SendDeltasRequest:
    """A backend's SendDeltas reporting ``updates``, one task status each, in order (for a stub's
    ``SendDeltas``; ``send_statuses`` sends it to a state)."""
    return pb.SendDeltasRequest(backend=backend, deltas=[pb.Delta(task_status=u) for u in updates])


def send_statuses(
    state: ClusterState, backend: str, updates: Iterable[pb.TaskStatusUpdate]
) -> pb.SendDeltasResponse:
    """``backend`` reports these task statuses to ``state`` (``ingest.send_deltas``)."""
    return ingest.send_deltas(state, status_deltas(backend, updates))


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
