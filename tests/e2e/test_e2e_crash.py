"""Crashes (SIGKILL) of agents and of the server, with real processes on loopback: no task ever runs
twice at once, no acknowledged job is lost.

Every task takes an exclusive ``flock`` on a file named after its task id for as long as it runs
and writes ``<task> ok <pid>`` when it got the lock, ``<task> DUPLICATE <pid>`` when another copy of
the same task still held it: a second concurrent copy cannot go unnoticed, however short the overlap.
"""

from __future__ import annotations

import contextlib
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
    spec = {
        "id": job_id,
        "tasks": [{"role": "w", "replicas": replicas, "request": {"cpu": "1"}, "command": script}],
    }
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
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        print(c.logs())  # shown by pytest only when the test failed


async def connect(cluster: Cluster) -> MusterClient:
    client = MusterClient(cluster.address, timeout=10)
    await client.wait_until_serving(timeout=30)
    return client


async def test_agent_killed_without_state_dir_never_runs_a_task_twice(
    cluster: Cluster, tmp_path: Path
) -> None:
    runs, locks = tmp_path / "runs", tmp_path / "locks"
    cluster.start_server()
    agent = cluster.start_agent("rack-a", THREE_NODES)
    async with await connect(cluster) as client:
        await until(lambda: _nodes(client, 3), "3 nodes")
        await client.submit_job(
            job("long", 3, guarded(runs, locks, "exec sleep 300"), min_member=3)
        )
        await until(lambda: _true(len(lines(runs)) == 3), "the 3 tasks to start")
        first = pids(runs)

        await agent.stop(signal.SIGKILL)  # no state dir, no chance to clean up
        assert pids_alive(first) == first, (
            "the tasks outlive a SIGKILLed agent (the case under test)"
        )
        cluster.start_agent("rack-a", THREE_NODES)

        # The restarted agent reports no task; the server binds the gang again. The old copies
        # must be gone before the new ones start.
        await until(lambda: _true(len(lines(runs)) == 6), "the gang to be bound again", timeout=60)
        assert [line.split()[1] for line in lines(runs)] == ["ok"] * 6, lines(runs)
        assert pids_alive(first) == []
        assert sorted(line.split()[0] for line in lines(runs)[3:]) == [
            "long/w-0",
            "long/w-1",
            "long/w-2",
        ]
        await client.cancel_job("long")


async def test_agent_killed_with_state_dir_adopts_instead_of_restarting(
    cluster: Cluster, tmp_path: Path
) -> None:
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


async def test_server_killed_mid_cycles_loses_no_acknowledged_job(
    cluster: Cluster, tmp_path: Path
) -> None:
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
        ids = await all_completed(client, accepted, "the server crash", 90)
    assert ids == accepted
    outcomes = [line.split()[1] for line in lines(runs)]
    assert "DUPLICATE" not in outcomes, lines(runs)
    started = sorted(line.split()[0] for line in lines(runs))
    assert started == sorted(f"{j}/w-0" for j in accepted), "each task ran exactly once"


async def all_completed(
    client: MusterClient, accepted: list[str], after: str, timeout: float
) -> list[str]:
    """Wait until every accepted job completed; returns the ids the server lists."""

    async def done() -> bool:
        jobs = [j async for j in client.list_jobs()]
        return len(jobs) == len(accepted) and all(
            j.status.phase == pb.JOB_PHASE_COMPLETED for j in jobs
        )

    await until(done, f"every accepted job to complete after {after}", timeout=timeout)
    return sorted([j.spec.id async for j in client.list_jobs()])


async def _nodes(client: MusterClient, count: int) -> bool:
    return len(await client.list_nodes()) == count


def guarded_slot(runs: Path, locks: Path, slots: int, then: str) -> str:
    """``guarded``, plus: the task takes one of its node's ``slots`` CPU slots (a lock file per slot
    and node) and writes ``<task> OVERCOMMIT <pid>`` when every slot is taken: more tasks on a node
    at once than it has CPUs cannot go unnoticed either."""
    slot = (
        "got=''; "
        + "; ".join(
            f'if [ -z "$got" ]; then exec {3 + k}>>"{locks}/$MUSTER_NODE.slot{k}"; '
            f"flock -n {3 + k} && got={k}; fi"
            for k in range(slots)
        )
        + f'; [ -n "$got" ] || echo "$MUSTER_TASK_ID OVERCOMMIT $$" >> {runs}; '
    )
    return guarded(runs, locks, slot + then)


async def test_server_and_agent_killed_under_load_run_nothing_twice_and_overcommit_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    """kill -9 of the agent (no state dir) and of the server, one after the other, while jobs run:
    no task id runs twice at once, no node runs more tasks than its CPUs, every accepted job
    completes."""
    runs, locks = tmp_path / "runs", tmp_path / "locks"
    two_cpu_nodes = "nodes:\n  - {name: a, count: 3, cpu: 2, memory: 8Gi}\n"
    cluster.start_server()
    agent = cluster.start_agent("rack-a", two_cpu_nodes)
    accepted: list[str] = []
    async with await connect(cluster) as client:
        await until(lambda: _nodes(client, 3), "3 nodes")
        for i in range(24):
            job_id = f"k{i:02d}"
            await client.submit_job(job(job_id, 1, guarded_slot(runs, locks, 2, "sleep 0.5")))
            accepted.append(job_id)
        await until(lambda: _true(len(lines(runs)) >= 4), "the first tasks to start")
    await agent.stop(signal.SIGKILL)  # its tasks live on as orphans until the next agent kills them
    assert cluster.server is not None
    await cluster.server.stop(signal.SIGKILL)
    cluster.start_server()
    cluster.start_agent("rack-a", two_cpu_nodes)
    async with await connect(cluster) as client:
        ids = await all_completed(client, accepted, "both crashes", 120)
    assert ids == accepted
    outcomes = [line.split()[1] for line in lines(runs)]
    assert "DUPLICATE" not in outcomes, lines(runs)
    assert "OVERCOMMIT" not in outcomes, lines(runs)
    assert {line.split()[0] for line in lines(runs)} == {f"{j}/w-0" for j in accepted}
