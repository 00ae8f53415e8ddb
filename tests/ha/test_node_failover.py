"""The Node client (clients/node) with an address list: a dead address, then a follower that names
the leader (a real server, not in the list); the job is submitted there and watched until it runs.
Skipped where the Node client is not built (make node-client)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import grpc
import pytest

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service.app import ServerHandle, ServerOptions, start_server

from .fakes import Replica, Store, closed_port_address

NODE_CLIENT = Path(__file__).resolve().parents[2] / "clients" / "node"
SCRIPT = NODE_CLIENT / "dist" / "submit-and-watch.js"

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not SCRIPT.exists(),
    reason="the Node client is not built (make node-client; needs node and npm)",
)


@pytest.fixture
async def leader(tmp_path: Path) -> AsyncIterator[ServerHandle]:
    handle = await start_server(
        ServerOptions(listen="127.0.0.1:0", state=str(tmp_path / "m.db"), cycle_period=3600.0)
    )
    try:
        yield handle
    finally:
        await handle.stop()


async def test_node_client_follows_the_leader_hint_past_a_dead_address(
    leader: ServerHandle,
) -> None:
    follower = await Replica(Store(leader=leader.address), "follower").start()
    sock, dead = closed_port_address()
    try:
        async with grpc.aio.insecure_channel(leader.address) as channel:
            stub = pb_grpc.SchedulerStub(channel)
            await stub.RegisterBackend(pb.RegisterBackendRequest(name="rack", kind="fake-agent"))
            node = pb.Node(
                name="n1", allocatable=pb.ResourceList(quantities={"cpu": "4", "memory": "8Gi"})
            )
            await stub.SyncSnapshot(pb.SyncSnapshotRequest(backend="rack", nodes=[node]))

            def run_node() -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    ["node", str(SCRIPT), "--server", f"{dead}, {follower.address}"]
                    + ["--job", "via-hint"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )

            done = await anyio.to_thread.run_sync(run_node)
            assert done.returncode == 0, done.stderr
            lines = [json.loads(line) for line in done.stdout.splitlines()]
            assert lines[0] == {"submitted": "via-hint", "created": True}
            assert lines[-1]["phase"] == "JOB_PHASE_RUNNING"
            assert follower.calls == ["SubmitJob"]  # refused there, with the hint
            job = await stub.GetJob(pb.GetJobRequest(id="via-hint"))
            assert job.spec.id == "via-hint"
    finally:
        sock.close()
        await follower.stop()
