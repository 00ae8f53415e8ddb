"""The adapter runtime's heartbeat (docs/operations.md, "Dead backends"): at the interval the
server asks for, a full resync when the server had declared the backend silent, and nothing at
all from a server without Heartbeat."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from muster_fake_server import FakeScheduler, FakeServerHandle, eventually

from adapters.runtime import BackendRuntime
from muster.v1 import muster_pb2 as pb
from server.service import ingest
from server.service.app import ServerHandle, ServerOptions, start_server

GRACE = 2.0


class OneNode:
    async def list_nodes(self) -> list[pb.Node]:
        return [pb.Node(name="n1", allocatable=pb.ResourceList(quantities={"cpu": "4"}))]

    async def list_tasks(self) -> list[pb.BackendTask]:
        return []

    async def apply_bind(self, decision: pb.Decision) -> None:
        return None

    async def apply_evict(self, decision: pb.Decision) -> None:
        return None


def runtime_for(address: str) -> BackendRuntime:
    return BackendRuntime(
        OneNode(), server=address, name="rack", backoff_initial=0.05, backoff_max=0.2
    )


@pytest.fixture
async def server() -> AsyncIterator[ServerHandle]:
    handle = await start_server(
        ServerOptions(
            listen="127.0.0.1:0",
            state=":memory:",
            cycle_worker="thread",
            node_grace_period=GRACE,
            task_eviction_timeout=60,
        )
    )
    try:
        yield handle
    finally:
        await handle.stop()


async def test_heartbeats_at_the_servers_interval_and_resyncs_when_told(
    server: ServerHandle,
) -> None:
    runtime = runtime_for(server.address)
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        with anyio.fail_after(10):
            await runtime.wait_ready()
        assert runtime._heartbeat_seconds == GRACE / 4
        await eventually(lambda: runtime.heartbeats >= 3)
        assert runtime.sessions == 1
        assert runtime.resyncs == 0
        # The server stops hearing from it (as across a partition) and declares it silent.
        state = server.state
        state.liveness.contacts["rack"].last -= 10 * GRACE
        ingest.check_liveness(state)
        assert state.nodes["n1"].proto.not_ready
        # Its next heartbeat brings it back and is answered "resync": a new session, a snapshot.
        await eventually(lambda: runtime.resyncs == 1 and runtime.sessions == 2)
        assert not state.nodes["n1"].proto.not_ready
        assert not state.liveness.contacts["rack"].resync
        beats = runtime.heartbeats
        await eventually(lambda: runtime.heartbeats > beats)
        assert runtime.resyncs == 1
        runtime.stop()


async def test_a_server_without_heartbeat_is_not_asked_again() -> None:
    handle = FakeServerHandle(FakeScheduler())
    await handle.start()
    try:
        runtime = runtime_for(handle.address)
        runtime.heartbeat_interval = 0.05  # the fake's register reply names no interval
        async with anyio.create_task_group() as tg:
            tg.start_soon(runtime.run)
            with anyio.fail_after(10):
                await runtime.wait_ready()
            await anyio.sleep(0.5)
            assert runtime.sessions == 1
            assert runtime.heartbeats == 0
            runtime.stop()
    finally:
        await handle.stop()
