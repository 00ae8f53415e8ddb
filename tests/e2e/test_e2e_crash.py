"""Crashes (SIGKILL) of agents and of the server, with real processes on loopback: no task ever runs
twice at once, no acknowledged job is lost.

Every task takes an exclusive ``flock`` on a file named after its task id for as long as it runs
and writes ``<task> ok <pid>`` when it got the lock, ``<task> DUPLICATE <pid>`` when another copy of
the same task still held it: a second concurrent copy cannot go unnoticed, however short the overlap.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from muster_e2e import Cluster, pids_alive, until

from clients.client import MusterClient
from clients.jobfile import job_from_dict
from muster.v1 import muster_pb2 as pb

THREE_NODES = "nodes:\n  - {name: a, count: 3, cpu: 4, memory: 8Gi}\n"


def guarded(runs: Path, locks: Path, then: str) -> str:
    """A task script that detects a concurrent copy of itself (see the module docstring)."""
    return (
        f'exec 9>>"{locks}/$(echo "$MUSTER_TASK_ID" | tr / _).lock"; '
        f'if flock -n 9; then echo "$MUSTER_TASK_ID ok $$" >> {runs}; '
        f'else echo "$MUSTER_TASK_ID DUPLICATE $$" >> {runs}; fi; {then}'
    )


def job(job_id: str, replicas: int, script: str, **extra: object) -> pb.JobSpec:
    spec = {"id": job_id, "tasks": [{"role": "w", "replicas": replicas, "request": {"cpu": "1"}, "command": script}]}
    return job_from_dict({**spec, **extra})


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def pids(path: Path) -> list[int]:
    return [int(line.split()[2]) for line in lines(path)]


async def _true(value: bool) -> bool:
    return value


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    (tmp_path / "locks").mkdir()
    try:
        yield c
    finally:
        await c.stop_all()
        for pid in pids_alive(pids(tmp_path / "runs")):  # a failed test must not leave sleepers
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        print(c.logs())  # shown by pytest only when the test failed


async def connect(cluster: Cluster) -> MusterClient:
    client = MusterClient(cluster.address, timeout=10)
    await client.wait_until_serving(timeout=30)
    return client


async def test_agent_killed_without_state_dir_never_runs_a_task_twice(cluster: Cluster, tmp_path: Path) -> None:
    runs, locks = tmp_path / "runs", tmp_path / "locks"
    cluster.start_server()
    agent = cluster.start_agent("rack-a", THREE_NODES)
    async with await connect(cluster) as client:
        await until(lambda: _nodes(client, 3), "3 nodes")
        await client.submit_job(job("long", 3, guarded(runs, locks, "exec sleep 300"), min_member=3))
        await until(lambda: _true(len(lines(runs)) == 3), "the 3 tasks to start")
        first = pids(runs)

        await agent.stop(signal.SIGKILL)  # no state dir, no chance to clean up
        assert pids_alive(first) == first, "the tasks outlive a SIGKILLed agent (the case under test)"
        cluster.start_agent("rack-a", THREE_NODES)

        # The restarted agent reports no task; the server binds the gang again. The old copies
        # must be gone before the new ones start.
        await until(lambda: _true(len(lines(runs)) == 6), "the gang to be bound again", timeout=60)
        assert [line.split()[1] for line in lines(runs)] == ["ok"] * 6, lines(runs)
        assert pids_alive(first) == []
        assert sorted(line.split()[0] for line in lines(runs)[3:]) == ["long/w-0", "long/w-1", "long/w-2"]
        await client.cancel_job("long")


async def test_agent_killed_with_state_dir_adopts_instead_of_restarting(cluster: Cluster, tmp_path: Path) -> None:
    runs, locks = tmp_path / "runs", tmp_path / "locks"
    cluster.start_server()
    agent = cluster.start_agent("rack-a", THREE_NODES, state_dir=True)
    async with await connect(cluster) as client:
        await until(lambda: _nodes(client, 3), "3 nodes")
        await client.submit_job(job("steady", 2, guarded(runs, locks, "sleep 4"), min_member=2))
        await until(lambda: _true(len(lines(runs)) == 2), "both tasks to start")
        first = pids(runs)

        await agent.stop(signal.SIGKILL)
        cluster.start_agent("rack-a", THREE_NODES, state_dir=True)

        async def completed() -> pb.Job | None:
            j = await client.get_job("steady")
            return j if j.status.phase == pb.JOB_PHASE_COMPLETED else None

        done = await until(completed, "steady to complete after the agent crash", timeout=60)
        assert done.status.succeeded == 2
        assert pids(runs) == first, "adopted tasks are not started again"


async def test_server_killed_mid_cycles_loses_no_acknowledged_job(cluster: Cluster, tmp_path: Path) -> None:
    runs, locks = tmp_path / "runs", tmp_path / "locks"
    cluster.start_server()
    cluster.start_agent("rack-a", THREE_NODES)
    accepted: list[str] = []
    async with await connect(cluster) as client:
        await until(lambda: _nodes(client, 3), "3 nodes")
        for i in range(30):
            job_id = f"j{i:02d}"
            await client.submit_job(job(job_id, 1, guarded(runs, locks, "sleep 0.3")))
            accepted.append(job_id)  # SubmitJob answered OK: the server owes us this job
        await until(lambda: _true(len(lines(runs)) >= 3), "the first tasks to start")

    assert cluster.server is not None
    await cluster.server.stop(signal.SIGKILL)  # cycles are running: jobs placed, bound, acked
    cluster.start_server()
    async with await connect(cluster) as client:

        async def all_completed() -> bool:
            jobs = [j async for j in client.list_jobs()]
            return len(jobs) == len(accepted) and all(j.status.phase == pb.JOB_PHASE_COMPLETED for j in jobs)

        await until(all_completed, "every accepted job to complete after the server crash", timeout=90)
        ids = sorted([j.spec.id async for j in client.list_jobs()])
    assert ids == accepted
    outcomes = [line.split()[1] for line in lines(runs)]
    assert "DUPLICATE" not in outcomes, lines(runs)
    started = sorted(line.split()[0] for line in lines(runs))
    assert started == sorted(f"{j}/w-0" for j in accepted), "each task ran exactly once"


async def _nodes(client: MusterClient, count: int) -> bool:
    return len(await client.list_nodes()) == count
