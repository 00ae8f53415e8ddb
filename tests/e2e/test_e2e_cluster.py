"""End to end: a real muster-server and real muster-agent processes on loopback (issue 2, section 7).

Each test polls with bounded deadlines; none asserts on timing.
"""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import pytest
from muster_e2e import Cluster, pids_alive, until

from clients.client import MusterClient
from clients.jobfile import job_from_dict
from muster.v1 import muster_pb2 as pb
from server.config import DEFAULT_CONFIG_YAML

THREE_NODES = "nodes:\n  - {name: a, count: 3, cpu: 4, memory: 8Gi}\n"
ONE_NODE = "nodes:\n  - {name: b-0, cpu: 4, memory: 8Gi}\n"


def job(job_id: str, replicas: int, cpu: str, script: str, **extra) -> pb.JobSpec:
    return job_from_dict(
        {
            "id": job_id,
            "tasks": [
                {"role": "w", "replicas": replicas, "request": {"cpu": cpu}, "command": script}
            ],
            **extra,
        }
    )


async def nodes_registered(client: MusterClient, count: int) -> bool:
    return len(await client.list_nodes()) == count


async def connect(cluster: Cluster) -> MusterClient:
    client = MusterClient(cluster.address, timeout=10)
    await client.wait_until_serving(timeout=30)
    return client


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_gang_is_all_or_nothing_then_binds_in_one_cycle_and_succeeds(cluster, tmp_path):
    # The gang ends up on two backends (three nodes of rack-a, one of rack-b): allowed explicitly,
    # since by default a gang stays inside one backend (docs/plugins/gang-backend.md).
    cluster.start_server(DEFAULT_CONFIG_YAML + "session: {gangAcrossBackends: true}\n")
    cluster.start_agent("rack-a", THREE_NODES)
    runs = tmp_path / "runs"
    async with await connect(cluster) as client:
        await until(lambda: nodes_registered(client, 3), "3 nodes of rack-a")
        script = f'echo "$MUSTER_TASK_ID $MUSTER_CYCLE_ID $MUSTER_NODE" >> {runs}; sleep 0.5'
        await client.submit_job(job("gang4", 4, "4", script, min_member=4))

        async def unschedulable():
            j = await client.get_job("gang4")
            conds = [
                c for c in j.status.conditions if c.type == "Unschedulable" and c.status == "True"
            ]
            return j if conds else None

        pending = await until(unschedulable, "an Unschedulable condition on gang4")
        cond = next(c for c in pending.status.conditions if c.type == "Unschedulable")
        assert cond.reason or cond.message
        # Not placed at all: no task has a node, nothing was started.
        assert all(not t.node and t.status == pb.TASK_STATUS_PENDING for t in pending.tasks)
        assert len(pending.tasks) == 4
        explanation = await client.explain("gang4")
        assert explanation.summary
        assert not runs.exists()

        cluster.start_agent("rack-b", ONE_NODE)

        async def completed():
            j = await client.get_job("gang4")
            return j if j.status.phase == pb.JOB_PHASE_COMPLETED else None

        done = await until(completed, "gang4 to complete after the fourth node joined", timeout=60)
        assert [t.status for t in done.tasks] == [pb.TASK_STATUS_SUCCEEDED] * 4
        records = [line.split() for line in lines(runs)]
        assert sorted(r[0] for r in records) == [f"gang4/w-{i}" for i in range(4)]  # each ran once
        assert len({r[1] for r in records}) == 1, f"binds came from several cycles: {records}"
        assert sorted(r[2] for r in records) == ["a-0", "a-1", "a-2", "b-0"]


async def test_cancelled_job_tasks_are_killed(cluster, tmp_path):
    cluster.start_server()
    cluster.start_agent("rack-a", THREE_NODES)
    pidfile = tmp_path / "pids"
    async with await connect(cluster) as client:
        await until(lambda: nodes_registered(client, 3), "3 nodes")
        await client.submit_job(job("long", 2, "2", f"echo $$ >> {pidfile}; exec sleep 300"))
        await until(lambda: _async(len(lines(pidfile)) == 2), "both tasks to start")

        async def running():
            return (await client.get_job("long")).status.running == 2

        await until(running, "job long to report 2 running tasks")
        pids = [int(p) for p in lines(pidfile)]
        assert pids_alive(pids) == pids
        cancelled = await client.cancel_job("long")
        assert cancelled.status.phase == pb.JOB_PHASE_CANCELLED
        await until(
            lambda: _async(not pids_alive(pids)), "the cancelled job's processes to be killed"
        )

        async def freed():
            return all(n.task_count == 0 for n in await client.list_nodes())

        await until(freed, "nodes to be free again")
        again = await client.get_job("long")
        assert again.status.phase == pb.JOB_PHASE_CANCELLED


async def test_server_restart_loses_no_job_and_starts_nothing_twice(cluster, tmp_path):
    cluster.start_server()
    cluster.start_agent("rack-a", THREE_NODES)
    starts = tmp_path / "starts"
    async with await connect(cluster) as client:
        await until(lambda: nodes_registered(client, 3), "3 nodes")
        await client.submit_job(job("runner", 1, "1", f"echo $$ >> {starts}; exec sleep 300"))
        await client.submit_job(job("too-big", 1, "64", "true"))
        await until(lambda: _async(len(lines(starts)) == 1), "runner to start")

    assert await cluster.server.stop() == 0, "SIGTERM must shut the server down cleanly (exit 0)"
    cluster.start_server()
    async with await connect(cluster) as client:
        for job_id in ("runner", "too-big"):
            assert (await client.get_job(job_id)).spec.id == job_id
        ids = sorted([j.spec.id async for j in client.list_jobs()])
        assert ids == ["runner", "too-big"]

        async def resynced_running():
            j = await client.get_job("runner")
            return j.status.running == 1 and len(await client.list_nodes()) == 3

        await until(resynced_running, "the agent to re-sync and runner to be Running")
        # Still the one process: the bind was not applied again after the restart.
        assert len(lines(starts)) == 1
        assert pids_alive([int(lines(starts)[0])])
        too_big = await client.get_job("too-big")
        assert too_big.status.phase in (pb.JOB_PHASE_PENDING, pb.JOB_PHASE_INQUEUE)
        await client.cancel_job("runner")


async def test_agent_restart_resyncs_without_running_a_task_twice(cluster, tmp_path):
    cluster.start_server()
    agent = cluster.start_agent("rack-a", THREE_NODES, state_dir=True)
    starts = tmp_path / "starts"
    async with await connect(cluster) as client:
        await until(lambda: nodes_registered(client, 3), "3 nodes")
        script = f'echo "$MUSTER_TASK_ID $$" >> {starts}; sleep 4'
        await client.submit_job(job("steady", 2, "2", script, min_member=2))
        await until(lambda: _async(len(lines(starts)) == 2), "both tasks to start")

        await agent.stop(signal.SIGTERM)  # with --state-dir its tasks keep running
        pids = [int(line.split()[1]) for line in lines(starts)]
        assert pids_alive(pids) == pids
        cluster.start_agent("rack-a", THREE_NODES, state_dir=True)

        async def completed():
            j = await client.get_job("steady")
            return j if j.status.phase == pb.JOB_PHASE_COMPLETED else None

        done = await until(completed, "steady to complete after the agent restart", timeout=60)
        assert done.status.succeeded == 2
        assert sorted(line.split()[0] for line in lines(starts)) == ["steady/w-0", "steady/w-1"]


async def test_bad_input_gets_status_and_field_not_a_crash(cluster):
    cluster.start_server()
    async with await connect(cluster) as client:
        bad = job("bad", 1, "1", "true")
        bad.task_groups[0].request.quantities["cpu"] = "2x"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.submit_job(bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "cpu" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.get_job("nope")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert await client.is_serving()


async def _async(value):  # lets `until` poll a plain predicate
    return value


async def test_task_output_reaches_muster_logs(cluster, tmp_path):
    cluster.start_server()
    cluster.start_agent("rack-a", ONE_NODE)
    async with await connect(cluster) as client:
        await until(lambda: nodes_registered(client, 1), "the agent's node")
        await client.submit_job(
            job("talk", 2, "1", 'echo "out $MUSTER_TASK_ID"; echo "err line" >&2')
        )

        async def both_ended() -> bool:
            logs = await client.task_logs("talk")
            return len(logs) == 2 and all(entry.eof for entry in logs)

        await until(both_ended, "both tasks' output, to the end")
        logs = {entry.task_id: entry.data.decode() for entry in await client.task_logs("talk")}
        assert logs == {f"talk/w-{i}": f"out talk/w-{i}\nerr line\n" for i in range(2)}
