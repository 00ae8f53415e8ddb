"""docs/cli.md's table "Coming from Slurm, kubectl or vcctl": every Muster command of its right-hand
column runs, exit 0, against a real muster-server and muster-agent on loopback, in the table's
order (hold before release, requeue of a running job ...). JOB, ARRAY and FILE are filled in with
a job in the state the command needs, an array's id and a fresh job file."""

from __future__ import annotations

import re
import shlex
from functools import partial
from pathlib import Path

import anyio
import pytest
import yaml
from muster_e2e import ROOT, Cluster, until

from clients import cli
from clients.client import MusterClient
from muster.v1 import muster_pb2 as pb

SECTION = "## Coming from Slurm, kubectl or vcctl"
ROW = re.compile(r"^\| (?P<theirs>.+?) \| `(?P<ours>muster [^`]+)` \|$")
INVENTORY = {
    "nodes": [{"name": "a", "count": 2, "cpu": 8, "memory": "32Gi", "labels": {"zone": "a"}}]
}


def table_rows() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "cli.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [(m["theirs"], m["ours"]) for line in section.splitlines() if (m := ROW.match(line))]
    assert len(rows) >= 30, "the table lost its rows"  # guards the parsing, not the content
    return rows


def job_file(path: Path, job_id: str, command: str, cpu: str = "1") -> Path:
    task = {
        "role": "w",
        "replicas": 1,
        "request": {"cpu": cpu},
        "command": ["sh", "-c", command],
        "labels": {"app": "web"},  # what `jobs -l app=web` selects by
    }
    job = {"id": job_id, "tasks": [task]}
    path.write_text(yaml.safe_dump(job))
    return path


def job_for(command: str) -> str:
    """Which prepared job a command acts on."""
    verb = command.split()[1]
    if verb in ("hold", "release", "explain"):
        return "waiting"  # pending (it can never fit), so it can be held
    if verb == "requeue":
        return "running"
    if verb == "cancel":
        return "to-cancel"
    return "done"  # ended, with output: logs -f returns at once


async def test_every_muster_command_of_the_equivalents_table_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = table_rows()
    cluster = Cluster(tmp_path)
    cluster.start_server()
    cluster.start_agent("rack-a", yaml.safe_dump(INVENTORY))
    try:
        async with MusterClient(cluster.address, timeout=10) as client:
            await client.wait_until_serving(timeout=30)
            await until(lambda: _nodes(client, 2), "2 nodes")

            async def muster(*argv: str) -> tuple[int, str]:
                capsys.readouterr()
                run = partial(cli.main, ["--server", cluster.address, *argv])
                code = await anyio.to_thread.run_sync(run)
                captured = capsys.readouterr()
                return code, captured.out + captured.err

            prepared = {
                "done": "echo hello from done",
                "running": "sleep 60",
                "waiting": "true",
                "to-cancel": "true",
            }
            for job_id, command in prepared.items():
                cpu = "100" if job_id in ("waiting", "to-cancel") else "1"
                path = job_file(tmp_path / f"{job_id}.yaml", job_id, command, cpu)
                code, out = await muster("submit", str(path))
                assert code == 0, out
            arr = job_file(tmp_path / "arr.yaml", "arr", "true")
            code, out = await muster("submit", "--array", "0-2", str(arr))
            assert code == 0, out
            await until(lambda: _phase(client, "done", pb.JOB_PHASE_COMPLETED), "done completes")
            await until(lambda: _phase(client, "running", pb.JOB_PHASE_RUNNING), "running runs")

            for n, (theirs, ours) in enumerate(rows):
                argv = shlex.split(ours)[1:]
                fresh = job_file(tmp_path / f"row{n}.yaml", f"row-{n}", "true")
                filled = [
                    a.replace("JOB", job_for(ours))
                    .replace("ARRAY", "arr")
                    .replace("FILE", str(fresh))
                    for a in argv
                ]
                code, out = await muster(*filled)
                assert code == 0, f"{theirs} -> muster {' '.join(filled)}: exit {code}\n{out}"
    finally:
        await cluster.stop_all()


async def _nodes(client: MusterClient, want: int) -> bool:
    return len(await client.list_nodes()) == want


async def _phase(client: MusterClient, job_id: str, phase: int) -> bool:
    return (await client.get_job(job_id)).status.phase == phase
