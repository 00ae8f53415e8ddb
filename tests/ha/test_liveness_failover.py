"""Backend liveness across a change of leader (docs/ha.md, docs/operations.md "Dead backends"):
liveness is derived, never stored, so a new leader starts every backend's clock when it takes
over. Two real replicas on one PostgreSQL, short periods, and a backend on the shared adapter
runtime: after the handover its tasks never turn Unknown or lost, its heartbeats reach the new
leader and its node stays Ready."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio
import pytest

from adapters.runtime import BackendRuntime
from clients.client import MusterClient
from muster.v1 import muster_pb2 as pb
from server.service.app import ServerHandle, ServerOptions, start_server

GRACE, EVICTION = 2.5, 1.5
# The backend comes back this long (at most) after its server stops: well within the grace, but
# after the new leader's first liveness check.
RECONNECT = 1.0


class RunningBackend:
    """One node; every bind runs at once (reported Running) until evicted."""

    def __init__(self) -> None:
        self.runtime: BackendRuntime | None = None
        self.running: dict[str, str] = {}  # task -> node

    async def list_nodes(self) -> list[pb.Node]:
        quantities = {"cpu": "4", "memory": "8Gi"}
        return [pb.Node(name="n1", allocatable=pb.ResourceList(quantities=quantities))]

    async def list_tasks(self) -> list[pb.BackendTask]:
        return [
            pb.BackendTask(task_id=t, node=n, status=pb.TASK_STATUS_RUNNING)
            for t, n in self.running.items()
        ]

    async def apply_bind(self, decision: pb.Decision) -> None:
        self.running[decision.bind.task_id] = decision.bind.node
        assert self.runtime is not None
        self.runtime.report_task_status(
            decision.bind.task_id, pb.TASK_STATUS_RUNNING, node=decision.bind.node
        )

    async def apply_evict(self, decision: pb.Decision) -> None:
        self.running.pop(decision.evict.task_id, None)


def options(pg_dsn: str) -> ServerOptions:
    return ServerOptions(
        listen="127.0.0.1:0",
        state=pg_dsn,
        lease_duration=1.0,
        lease_renew=0.2,
        cycle_period=0.2,
        cycle_worker="thread",
        node_grace_period=GRACE,
        task_eviction_timeout=EVICTION,
    )


@pytest.fixture
async def replicas(pg_dsn: str) -> AsyncIterator[tuple[ServerHandle, ServerHandle]]:
    first = await start_server(options(pg_dsn))
    with anyio.fail_after(20):
        while not (first.server.replica and first.server.replica.leading):
            await anyio.sleep(0.05)
    second = await start_server(options(pg_dsn))
    try:
        yield first, second
    finally:
        for handle in (second, first):
            if not handle._task.done():
                await handle.stop()


async def task_status(client: MusterClient) -> int:
    job = await client.get_job("j")
    return job.tasks[0].status


async def test_a_new_leader_does_not_declare_a_live_backend_dead(
    replicas: tuple[ServerHandle, ServerHandle],
) -> None:
    first, second = replicas
    backend = RunningBackend()
    runtime = BackendRuntime(
        backend,
        server=[first.address, second.address],
        name="rack",
        backoff_initial=RECONNECT,
        backoff_max=RECONNECT,
        batch_linger=0.01,
    )
    backend.runtime = runtime
    async with (
        MusterClient(f"{first.address},{second.address}", timeout=5) as client,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(runtime.run)
        with anyio.fail_after(20):
            await runtime.wait_ready()
        await client.submit_job(
            pb.JobSpec(
                id="j",
                task_groups=[
                    pb.TaskGroup(
                        role="w", replicas=1, request=pb.ResourceList(quantities={"cpu": "1"})
                    )
                ],
            )
        )
        with anyio.fail_after(20):
            while await task_status(client) != pb.TASK_STATUS_RUNNING:
                await anyio.sleep(0.05)

        # The follower has run longer than the grace: a new leader counting from its own start,
        # rather than from its takeover, would find the backend silent at once.
        await anyio.sleep(GRACE + 0.5)
        handover = time.monotonic()
        await first.stop()  # hands the lease over: the second replica leads
        assert second.server.replica is not None
        with anyio.fail_after(20):
            while not second.server.replica.leading or runtime.address != second.address:
                await anyio.sleep(0.05)
        beats = runtime.heartbeats
        assert second.state.liveness.started >= handover  # its clocks start at the takeover
        # Twice the grace and the eviction timeout under the new leader: never Unknown, never
        # lost, the node Ready, the heartbeats answered there.
        seen: set[int] = set()
        end = time.monotonic() + 2 * (GRACE + EVICTION)
        while time.monotonic() < end:
            seen.add(await task_status(client))
            await anyio.sleep(0.05)
        assert seen == {pb.TASK_STATUS_RUNNING}
        (view,) = await client.list_nodes()
        assert not view.node.not_ready
        assert view.not_ready_reason == ""
        assert runtime.heartbeats > beats
        assert second.state.liveness.contacts["rack"].silent_since is None
        runtime.stop()
