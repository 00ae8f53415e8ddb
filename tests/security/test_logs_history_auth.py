"""WatchTaskLogs and ListJobHistory under an auth policy: verb `read`, limited like the other job
reads to the queues a rule lets the caller read plus the caller's own jobs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from clients.client import MusterClient
from clients.jobfile import job_from_dict
from muster.v1 import muster_pb2 as pb
from server.service.app import ServerHandle, ServerOptions, start_server

POLICY = """
tokens:
  - {token: alice-token-1, user: alice, groups: [ml]}
  - {token: ops-token-123, user: ops, groups: [admins]}
rules:
  - {subjects: ["group:ml"], verbs: [read, submit, cancel], queues: [ml]}
  - {subjects: ["group:admins"], verbs: ["*"]}
"""


def job(job_id: str, queue: str) -> pb.JobSpec:
    return job_from_dict(
        {
            "id": job_id,
            "queue": queue,
            "tasks": [{"role": "w", "replicas": 1, "request": {"cpu": "1"}}],
        }
    )


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ServerHandle]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    handle = await start_server(
        ServerOptions(
            listen="127.0.0.1:0",
            state=str(tmp_path / "muster.db"),
            cycle_period=3600.0,
            auth_policy=str(policy),
        )
    )
    try:
        yield handle
    finally:
        await handle.stop()


async def test_follow_and_history_are_reads_of_the_callers_jobs(server: ServerHandle) -> None:
    async with (
        MusterClient(server.address, timeout=5, token="alice-token-1") as alice,
        MusterClient(server.address, timeout=5, token="ops-token-123") as ops,
    ):
        await ops.create_queue(pb.Queue(name="ml"))
        await alice.submit_job(job("a1", "ml"))
        await ops.submit_job(job("o1", "default"))
        await alice.cancel_job("a1")
        await ops.cancel_job("o1")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _event in alice.follow_task_logs("o1"):
                pass
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "queue 'default'" in (info.value.details() or "")
        # Her own job's follow is allowed: its tasks never ran, so it ends (after the grace).
        events = [e async for e in alice.follow_task_logs("a1")]
        assert [(e.task_id, e.eof) for e in events] == [("a1/w-0", True)]

        async def history(client: MusterClient) -> list[str]:
            return [e.job_id async for e in client.list_job_history()]

        assert await history(alice) == ["a1"]
        assert sorted(await history(ops)) == ["a1", "o1"]
