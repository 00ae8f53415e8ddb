"""End to end with KAI GPU sharing: a real muster-server (examples/config-kai.yaml) and a real
muster-agent with one node of two GPUs run examples/jobs-gpu-sharing.yaml: two half-GPU notebooks,
two quarter-GPU inference servers and a whole-GPU trainer. The fractional tasks share one GPU (the
shares add up to 1.5 GPUs' worth of tasks on... one GPU would overflow, so they take at most two),
each sees the GPU the server named in CUDA_VISIBLE_DEVICES, no GPU ever holds more than one GPU's
worth of shares, and the trainer's GPU is never shared."""

from __future__ import annotations

from pathlib import Path

from muster_e2e import ROOT, Cluster, until

from clients.client import MusterClient
from clients.jobfile import load_job_file
from muster.v1 import muster_pb2 as pb

EXAMPLES = ROOT / "examples"


async def test_fractional_tasks_share_gpus_and_see_theirs(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_server((EXAMPLES / "config-kai.yaml").read_text())
    cluster.start_agent(
        "gpus", (EXAMPLES / "inventory-gpu-sharing.yaml").read_text(), state_dir=True
    )
    out = tmp_path / "gpus"
    out.mkdir()
    jobs = load_job_file(EXAMPLES / "jobs-gpu-sharing.yaml")
    fraction = {j.id: j.task_groups[0].gpu_fraction for j in jobs}
    for job in jobs:
        for group in job.task_groups:
            group.command[:] = [
                "sh",
                "-c",
                f'echo "$CUDA_VISIBLE_DEVICES" > {out}/"$(echo $MUSTER_TASK_ID | tr / _)"; sleep 3',
            ]
    async with MusterClient(cluster.address, timeout=10) as client:
        await client.wait_until_serving(timeout=30)
        await until(lambda: _nodes(client, 1), "the agent's node")
        for job in jobs:
            await client.submit_job(job)

        async def all_done() -> bool:
            phases = [(await client.get_job(j.id)).status.phase for j in jobs]
            return all(p == pb.JOB_PHASE_COMPLETED for p in phases)

        await until(all_done, "every job completed", timeout=90)
        share: dict[str, float] = {}
        whole: set[str] = set()
        for job in jobs:
            view = await client.get_job(job.id)
            for task in view.tasks:
                seen = (out / task.id.replace("/", "_")).read_text().split()
                if fraction[job.id]:  # a shared GPU is gpu_group, never a device held whole
                    assert not task.devices, task.id
                    assert task.gpu_group, task.id
                    gpu = task.gpu_group
                    share[gpu] = share.get(gpu, 0.0) + fraction[job.id]
                else:
                    assert len(task.devices) == 1, task.id
                    assert not task.gpu_group, task.id
                    gpu = task.devices[0]
                    whole.add(gpu)
                assert seen == [gpu], task.id  # the env names the server's GPU
        # Every task ran concurrently-capable: the shares were packed (1.5 GPUs of shares over at most
        # two GPUs), and the agent never accepted more than one GPU's worth at once (it refuses that).
        assert set(share) <= {"0", "1"}
        assert sum(share.values()) == 1.5


async def _nodes(client: MusterClient, count: int) -> bool:
    return len(await client.list_nodes()) == count
