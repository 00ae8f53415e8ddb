"""End to end on an Ascend inventory: a real muster-server (huaweiNPU configured) and a real
muster-agent place examples/jobs-ascend.yaml; each task's ASCEND_VISIBLE_DEVICES holds the chips
the server chose, inside one HCCS ring for 1, 2 and 4 chips, never a broken chip, never one chip
for two tasks at once."""

from __future__ import annotations

from pathlib import Path

from muster_e2e import ROOT, Cluster, until

from clients.client import MusterClient
from clients.jobfile import load_job_file
from muster.v1 import muster_pb2 as pb

EXAMPLES = ROOT / "examples"


async def test_example_ascend_jobs_get_their_chips_in_ascend_visible_devices(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.start_server((EXAMPLES / "config-ascend.yaml").read_text())
    cluster.start_agent("ascend", (EXAMPLES / "inventory-ascend.yaml").read_text(), state_dir=True)
    out = tmp_path / "chips"
    out.mkdir()
    jobs = load_job_file(EXAMPLES / "jobs-ascend.yaml")
    for job in jobs:  # the example's commands, writing to files and sleeping 2 s instead of 20
        for group in job.task_groups:
            group.command[:] = [
                "sh",
                "-c",
                f'echo "$ASCEND_VISIBLE_DEVICES" > {out}/"$(echo $MUSTER_TASK_ID | tr / _)"; sleep 2',
            ]
    async with MusterClient(cluster.address, timeout=10) as client:
        await client.wait_until_serving(timeout=30)
        await until(lambda: _nodes(client, 4), "the agent's four nodes")
        for job in jobs:
            await client.submit_job(job)

        async def all_done() -> bool:
            phases = [(await client.get_job(j.id)).status.phase for j in jobs]
            return all(p == pb.JOB_PHASE_COMPLETED for p in phases)

        await until(all_done, "every Ascend job completed", timeout=90)
        seen: dict[str, list[str]] = {}
        for job in jobs:
            view = await client.get_job(job.id)
            for task in view.tasks:
                chips = (out / task.id.replace("/", "_")).read_text().split()[0].split(",")
                asked = int(job.task_groups[0].request.quantities["huawei.com/Ascend910"])
                assert task.devices == [f"Ascend910-{c}" for c in chips], (
                    task.id
                )  # env == the server's choice
                assert len(chips) == asked
                if asked <= 4:
                    assert len({int(c) // 4 for c in chips}) == 1, (task.id, chips)  # one HCCS ring
                if task.node == "npu-degraded":
                    assert "7" not in chips  # the broken chip
                seen[task.id] = [f"{task.node}:{c}" for c in chips]
        assert sorted(seen) == sorted(
            f"{j.id}/train-{i}" for j in jobs for i in range(j.task_groups[0].replicas)
        )


async def _nodes(client: MusterClient, count: int) -> bool:
    return len(await client.list_nodes()) == count
