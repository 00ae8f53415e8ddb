"""End to end with a real agent: `muster logs -f` prints a task's output while it runs and exits
when it ends; the output is still there after a server restart; `muster history` accounts the
job. Bounded polls; nothing asserts on timing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
from muster_e2e import Cluster, until

from clients.client import MusterClient
from clients.jobfile import job_from_dict
from muster.v1 import muster_pb2 as pb

ONE_NODE = "nodes:\n  - {name: b-0, cpu: 4, memory: 8Gi}\n"
ROOT = Path(__file__).resolve().parents[2]


async def muster(cluster: Cluster, *argv: str) -> tuple[int, str, str]:
    proc = await anyio.run_process(
        [sys.executable, "-m", "clients.cli", "--server", cluster.address, *argv],
        check=False,
        cwd=ROOT,
    )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


async def test_logs_follow_streams_a_running_task_until_it_ends(cluster: Cluster) -> None:
    cluster.start_server()
    cluster.start_agent("rack-b", ONE_NODE)
    # The task waits for the test to have seen its first line (a file it creates): the line
    # must reach `muster logs -f` while the task still runs.
    gate = cluster.workdir / "seen"
    script = f"echo first; while [ ! -e {gate} ]; do sleep 0.1; done; echo second; echo err >&2"
    spec = job_from_dict(
        {
            "id": "talk",
            "tasks": [{"role": "w", "replicas": 1, "request": {"cpu": "1"}, "command": script}],
        }
    )
    async with MusterClient(cluster.address, timeout=10) as client:
        await client.wait_until_serving(timeout=30)
        await until(lambda: _nodes(client), "the agent's node")
        await client.submit_job(spec)
        async with await anyio.open_process(
            [sys.executable, "-m", "clients.cli", "--server", cluster.address]
            + ["logs", "-f", "talk/w-0"],
            cwd=ROOT,
        ) as proc:
            assert proc.stdout is not None
            received = b""
            with anyio.fail_after(60):
                while b"first\n" not in received:
                    received += await proc.stdout.receive()
            job = await client.get_job("talk")
            assert job.tasks[0].status == pb.TASK_STATUS_RUNNING  # still running
            gate.touch()
            with anyio.fail_after(60):
                async for chunk in proc.stdout:
                    received += chunk
                assert await proc.wait() == 0
        assert received == b"first\nsecond\nerr\n"
        job = await client.get_job("talk")
        assert job.status.phase == pb.JOB_PHASE_COMPLETED

    # The output is in the store: a restarted server still has it.
    assert cluster.server is not None
    await cluster.server.stop()
    cluster.start_server()
    async with MusterClient(cluster.address, timeout=10) as client:
        await client.wait_until_serving(timeout=30)
        [entry] = await client.task_logs("talk")
        assert entry.data == b"first\nsecond\nerr\n"
        assert entry.eof
    code, out, err = await muster(cluster, "history", "-o", "json")
    assert code == 0, err
    [row] = json.loads(out)
    assert row["job_id"] == "talk"
    assert row["phase"] == "Completed"
    assert row["exit_codes"] == {"0": 1}
    assert row["used"]["cpu"] > 0
    assert row["requested"]["cpu"] >= row["used"]["cpu"] * 0.5


async def _nodes(client: MusterClient) -> bool:
    return len(await client.list_nodes()) == 1
