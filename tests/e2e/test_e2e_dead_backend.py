"""Dead and partitioned backends, with a real server and real agents on loopback
(docs/operations.md, "Dead backends"): the server is started with short periods
(``--node-grace-period``, ``--task-eviction-timeout``), an agent is killed (SIGKILL) or paused
(SIGSTOP, a partition: its tasks go on running), and the test watches its nodes go NotReady, its
tasks Unknown, then lost and the gang placed again on the other agent, or adopted when it comes
back in time. Every wait is bounded; the periods are seconds.

Each task writes ``<task> <node> <pid>`` to a file when it starts, so a task started twice, or
started again where it still ran, cannot go unnoticed.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from muster_e2e import Cluster, Proc, pids_alive, until

from clients.client import MusterClient
from clients.jobfile import job_from_dict
from muster.v1 import muster_pb2 as pb

GRACE, EVICTION = 2.0, 3.0
RACK_A = "nodes:\n  - {name: a, count: 2, cpu: 2, memory: 8Gi}\n"
RACK_B = "nodes:\n  - {name: b, count: 2, cpu: 2, memory: 8Gi}\n"


def periods(grace: float = GRACE, eviction: float = EVICTION) -> list[str]:
    return ["--node-grace-period", str(grace), "--task-eviction-timeout", str(eviction)]


def gang(job_id: str, runs: Path) -> pb.JobSpec:
    """Two two-CPU tasks (one per node), all or nothing, that run until stopped."""
    script = f'echo "$MUSTER_TASK_ID $MUSTER_NODE $$" >> {runs}; exec sleep 300'
    return job_from_dict(
        {
            "id": job_id,
            "min_member": 2,
            "tasks": [{"role": "w", "replicas": 2, "request": {"cpu": "2"}, "command": script}],
        }
    )


def started(runs: Path) -> list[tuple[str, str, int]]:
    """(task, node, pid) of every copy started, in order."""
    if not runs.exists():
        return []
    out = []
    for line in runs.read_text().splitlines():
        task, node, pid = line.split()
        out.append((task, node, int(pid)))
    return out


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        for proc in c.agents.values():  # a paused agent cannot stop
            if proc.proc is not None and proc.alive:
                proc.proc.send_signal(signal.SIGCONT)
        await c.stop_all()
        for _task, _node, pid in started(tmp_path / "runs"):  # no sleeper outlives the test
            if pids_alive([pid]):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        print(c.logs())  # shown by pytest only when the test failed


async def connect(cluster: Cluster) -> MusterClient:
    client = MusterClient(cluster.address, timeout=10)
    await client.wait_until_serving(timeout=30)
    return client


async def ready_nodes(client: MusterClient) -> dict[str, bool]:
    return {v.node.name: not v.node.not_ready for v in await client.list_nodes()}


async def task_states(client: MusterClient, job_id: str) -> list[tuple[str, str]]:
    job = await client.get_job(job_id)
    return [(pb.TaskStatus.Name(t.status).removeprefix("TASK_STATUS_"), t.node) for t in job.tasks]


async def run_on_rack_a(cluster: Cluster, client: MusterClient, runs: Path) -> Proc:
    """rack-a alone, the gang running on it; then rack-b joins (empty)."""
    agent = cluster.start_agent("rack-a", RACK_A)
    await until(lambda: all_ready(client, 2), "rack-a's 2 nodes")
    await client.submit_job(gang("g", runs))

    async def running_on_a() -> bool:
        states = await task_states(client, "g")
        return sorted(states) == [("RUNNING", "a-0"), ("RUNNING", "a-1")]

    await until(running_on_a, "the gang running on rack-a")
    await until(lambda: _true(len(started(runs)) == 2), "both tasks to start")
    cluster.start_agent("rack-b", RACK_B)
    await until(lambda: all_ready(client, 4), "rack-b's nodes too")
    return agent


async def all_ready(client: MusterClient, count: int) -> bool:
    nodes = await ready_nodes(client)
    return len(nodes) == count and all(nodes.values())


async def _true(value: bool) -> bool:
    return value


async def wait_silent_then_unknown(client: MusterClient) -> None:
    async def rack_a_not_ready() -> bool:
        views = {v.node.name: v for v in await client.list_nodes()}
        return all(
            views[n].node.not_ready and "backend rack-a silent for" in views[n].not_ready_reason
            for n in ("a-0", "a-1")
        ) and not any(views[n].node.not_ready for n in ("b-0", "b-1"))

    await until(rack_a_not_ready, "rack-a's nodes NotReady", timeout=GRACE + 15)

    async def unknown() -> bool:
        job = await client.get_job("g")
        return (
            [t.status for t in job.tasks] == [pb.TASK_STATUS_UNKNOWN] * 2
            and job.status.running == 0
            and job.status.unknown == 2
        )

    await until(unknown, "the gang's tasks Unknown", timeout=10, interval=0.05)


async def wait_running_on_b(client: MusterClient) -> None:
    async def running_on_b() -> bool:
        return sorted(await task_states(client, "g")) == [("RUNNING", "b-0"), ("RUNNING", "b-1")]

    await until(running_on_b, "the gang placed again, running on rack-b", timeout=EVICTION + 20)


async def test_killed_agent_its_nodes_go_not_ready_and_the_gang_restarts_elsewhere(
    cluster: Cluster, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    cluster.start_server(extra=periods())
    async with await connect(cluster) as client:
        agent = await run_on_rack_a(cluster, client, runs)
        first = started(runs)
        await agent.stop(signal.SIGKILL)
        for _task, _node, pid in first:  # the rack died: its processes with it
            os.killpg(pid, signal.SIGKILL)
        await wait_silent_then_unknown(client)
        await wait_running_on_b(client)
        copies = started(runs)
        assert sorted((t, n) for t, n, _pid in copies[2:]) == [("g/w-0", "b-0"), ("g/w-1", "b-1")]
        assert len(copies) == 4, copies  # once on each rack, nothing more
        job = await client.get_job("g")
        assert job.status.phase == pb.JOB_PHASE_RUNNING
        assert not (await ready_nodes(client))["a-0"]  # until rack-a answers again
    assert cluster.server is not None
    assert cluster.server.json_events("backend.silent")[0]["backend"] == "rack-a"
    assert cluster.server.json_events("backend.tasks_lost")[0]["tasks"] == 2


async def test_paused_agent_resumed_in_time_has_its_tasks_adopted(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A partition shorter than the eviction timeout: Unknown, then Running again where they
    were, the same processes, nothing started twice."""
    runs = tmp_path / "runs"
    cluster.start_server(extra=periods(eviction=60))
    async with await connect(cluster) as client:
        agent = await run_on_rack_a(cluster, client, runs)
        first = started(runs)
        assert agent.proc is not None
        agent.proc.send_signal(signal.SIGSTOP)
        try:
            await wait_silent_then_unknown(client)
        finally:
            agent.proc.send_signal(signal.SIGCONT)

        async def adopted() -> bool:
            states = sorted(await task_states(client, "g"))
            nodes = await ready_nodes(client)
            return states == [("RUNNING", "a-0"), ("RUNNING", "a-1")] and all(nodes.values())

        await until(adopted, "rack-a Ready and its tasks Running again", timeout=20)
        await until(
            lambda: _true(bool(agent.json_events("resync requested by the server"))),
            "the agent to resync",
        )
        await until(
            lambda: _true(bool(cluster.server and cluster.server.json_events("backend.synced"))),
            "the resync",
        )
        assert started(runs) == first  # not started again anywhere
        assert pids_alive([pid for _t, _n, pid in first]) == [pid for _t, _n, pid in first]
        assert sorted(await task_states(client, "g")) == [("RUNNING", "a-0"), ("RUNNING", "a-1")]
    assert cluster.server is not None
    assert cluster.server.json_events("backend.back")[0]["backend"] == "rack-a"
    assert cluster.server.json_events("backend.tasks_lost") == []


async def test_paused_agent_resumed_too_late_has_its_stale_copies_stopped(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A partition longer than the eviction timeout: the gang restarts on rack-b while rack-a's
    copies still run (nobody can stop them across the partition); when rack-a answers again
    those copies are stopped, and the gang stays on rack-b."""
    runs = tmp_path / "runs"
    cluster.start_server(extra=periods())
    async with await connect(cluster) as client:
        agent = await run_on_rack_a(cluster, client, runs)
        first = started(runs)
        assert agent.proc is not None
        agent.proc.send_signal(signal.SIGSTOP)
        try:
            await wait_silent_then_unknown(client)
            await wait_running_on_b(client)
        finally:
            agent.proc.send_signal(signal.SIGCONT)
        old = [pid for _t, _n, pid in first]
        assert pids_alive(old) == old  # the partitioned rack still runs them

        async def stale_stopped() -> bool:
            return pids_alive(old) == [] and all((await ready_nodes(client)).values())

        await until(stale_stopped, "rack-a back, its stale copies stopped", timeout=30)
        copies = started(runs)
        assert len(copies) == 4, copies
        new = [pid for _t, _n, pid in copies[2:]]
        assert pids_alive(new) == new
        assert sorted(await task_states(client, "g")) == [("RUNNING", "b-0"), ("RUNNING", "b-1")]
    assert cluster.server is not None
    stale = cluster.server.json_events("task.stale_copy")
    assert sorted(e["task"] for e in stale) == ["g/w-0", "g/w-1"]
