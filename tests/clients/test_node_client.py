"""The TypeScript / Node client (clients/node, stubs generated from proto/) submits a job to a real
server and watches it until it runs. `make test` builds the client first (`make node-client`); where
Node is not installed the test says so and is skipped."""

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

NODE_CLIENT = Path(__file__).resolve().parents[2] / "clients" / "node"
SCRIPT = NODE_CLIENT / "dist" / "submit-and-watch.js"

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not SCRIPT.exists(),
    reason="the Node client is not built (make node-client; needs node and npm)",
)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ServerHandle]:
    handle = await start_server(
        ServerOptions(listen="127.0.0.1:0", state=str(tmp_path / "m.db"), cycle_period=3600.0)
    )
    try:
        yield handle
    finally:
        await handle.stop()


async def test_node_client_submits_a_job_and_watches_it_run(server: ServerHandle) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.SchedulerStub(channel)
        await stub.RegisterBackend(pb.RegisterBackendRequest(name="rack", kind="fake-agent"))
        node = pb.Node(
            name="n1", allocatable=pb.ResourceList(quantities={"cpu": "4", "memory": "8Gi"})
        )
        await stub.SyncSnapshot(pb.SyncSnapshotRequest(backend="rack", nodes=[node]))

        def run_node() -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["node", str(SCRIPT), "--server", server.address, "--job", "from-node"]
                + ["--user", "ada"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        done = await anyio.to_thread.run_sync(run_node)
        assert done.returncode == 0, done.stderr
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert lines[0] == {"submitted": "from-node", "created": True}
        assert lines[-1]["phase"] == "JOB_PHASE_RUNNING"
        assert lines[-1]["running"] == 2
        job = await stub.GetJob(pb.GetJobRequest(id="from-node"))
        assert [t.node for t in job.tasks] == ["n1", "n1"]  # bound by a real cycle
        assert job.spec.owner == "ada"  # the Node client names its user, as the Python one does
