"""End to end: a real server and agent end a `sleep 30` task at its time limit (job file
``time_limit``, ``muster submit --time``); the job fails with reason TimeLimit and the CLI shows the
limit and the elapsed time. Bounded polling only; no verdict on timing."""

from __future__ import annotations

import json
from pathlib import Path

from muster_e2e import Cluster, cli, until

from clients.client import MusterClient
from muster.v1 import muster_pb2 as pb

ONE_NODE = "nodes:\n  - {name: t-0, cpu: 4, memory: 8Gi}\n"


async def test_agent_ends_tasks_at_their_time_limit(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_server()
    cluster.start_agent("rack-t", ONE_NODE)
    by_file = tmp_path / "by-file.yaml"
    # Slurm's MM:SS, unquoted: read as text, not as YAML 1.1's base-60 number.
    by_file.write_text(
        "id: by-file\ntime_limit: 0:02\n"
        "tasks: [{role: w, replicas: 1, request: {cpu: 1}, command: 'sleep 30'}]\n"
    )
    by_flag = tmp_path / "by-flag.yaml"
    by_flag.write_text(
        "id: by-flag\ntime_limit: 1h\n"
        "tasks: [{role: w, replicas: 1, request: {cpu: 1}, command: 'sleep 30'}]\n"
    )
    async with MusterClient(cluster.address, timeout=10) as client:
        await client.wait_until_serving(timeout=30)

        async def one_node() -> bool:
            return len(await client.list_nodes()) == 1

        await until(one_node, "the agent's node")
        done = await cli(cluster.address, "submit", str(by_file))
        assert done.returncode == 0, done.stderr
        done = await cli(cluster.address, "submit", "--time", "3s", str(by_flag))  # flag wins
        assert done.returncode == 0, done.stderr

        async def both_failed() -> list[pb.Job] | None:
            jobs = [await client.get_job(i) for i in ("by-file", "by-flag")]
            ended = all(j.status.phase == pb.JOB_PHASE_FAILED for j in jobs)
            return jobs if ended else None

        jobs = await until(both_failed, "both jobs to fail at their time limits")
    for job, limit, text in zip(jobs, (2, 3), ("2s", "3s"), strict=True):
        assert job.spec.time_limit_seconds == limit
        [task] = job.tasks
        assert task.status == pb.TASK_STATUS_FAILED
        assert task.message == f"TimeLimit: time limit {text} reached"
        [ended] = [c for c in job.status.conditions if c.type == "Ended"]
        assert ended.reason == "TimeLimit"
        assert ended.message.startswith(f"task {task.id} reached its time limit ({text})")
    shown = await cli(cluster.address, "job", "by-file")
    assert "Time limit: 2s" in shown.stdout, shown.stdout
    assert "Elapsed: " in shown.stdout, shown.stdout
    wide = await cli(cluster.address, "jobs", "-o", "wide")
    header = wide.stdout.splitlines()[0]
    assert "TIME LIMIT" in header, wide.stdout
    assert "ELAPSED" in header, wide.stdout
    row = next(line for line in wide.stdout.splitlines() if line.startswith("by-flag"))
    assert " 3s " in row, wide.stdout
    assert "TimeLimit" in row, wide.stdout
    as_json = json.loads((await cli(cluster.address, "job", "by-flag", "-o", "json")).stdout)
    assert as_json["spec"]["time_limit_seconds"] == 3
