"""Job control on the Slurm adapter, against a fake Slurm command line and a fake server (no Slurm,
no root): a staged job waiting for its Slurm --dependency is not submitted to Muster until Slurm
clears it; `scontrol hold` / `release` of a staged job Muster has not placed holds / releases the
Muster job; a native array element's bind environment reaches the Slurm job's command."""

from __future__ import annotations

import shlex

from test_adapter_paths import FakeServer, make_backend, staged

from adapters.slurm.native import native_job
from muster.v1 import muster_pb2 as pb


class ControlServer(FakeServer):
    """FakeServer that records HoldJob and ReleaseJob."""

    def __init__(self) -> None:
        super().__init__()
        self.control: list[tuple[str, str]] = []

    def sent(self) -> list[str]:
        """The job ids submitted (a batch's, or one SubmitJob's), in order."""
        return [i for b in self.batches for i in b] + self.singles

    async def HoldJob(self, request: pb.HoldJobRequest) -> pb.JobControlResponse:
        self.control.append(("hold", request.id))
        return pb.JobControlResponse()

    async def ReleaseJob(self, request: pb.ReleaseJobRequest) -> pb.JobControlResponse:
        self.control.append(("release", request.id))
        return pb.JobControlResponse()


async def test_a_job_waiting_for_its_slurm_dependency_is_submitted_once_slurm_clears_it() -> None:
    backend, cli, _ = make_backend()
    server = ControlServer()
    backend.client = server  # type: ignore[assignment]
    waiting, never = staged(1), staged(2)
    waiting.reason, never.reason = "Dependency", "DependencyNeverSatisfied"
    cli.live = [waiting, never, staged(3)]
    await backend.poll_once()
    assert server.sent() == ["slurm-3"]  # Slurm evaluates --dependency; Muster waits for it
    waiting.reason = "PartitionDown"  # the job it waited for ended as asked
    await backend.poll_once()
    assert server.sent() == ["slurm-3", "slurm-1"]
    assert not backend.jobs[2].submitted


async def test_scontrol_hold_and_release_of_a_staged_job_are_mirrored_in_muster() -> None:
    backend, cli, _ = make_backend()
    server = ControlServer()
    backend.client = server  # type: ignore[assignment]
    job = staged(4)
    cli.live = [job]
    await backend.poll_once()
    assert backend.jobs[4].submitted
    job.reason = "JobHeldUser"
    await backend.poll_once()
    await backend.poll_once()  # once per change
    assert server.control == [("hold", "slurm-4")]
    job.reason = "PartitionDown"
    await backend.poll_once()
    assert server.control == [("hold", "slurm-4"), ("release", "slurm-4")]


def test_a_native_array_elements_environment_is_exported_before_its_command() -> None:
    bind = pb.BindDecision(
        task_id="sweep_3/w-0",
        job_id="sweep_3",
        node="n1",
        min_member=1,
        command=["sh", "-c", 'echo "$MUSTER_ARRAY_INDEX"'],
        env={"MUSTER_ARRAY_JOB_ID": "sweep", "MUSTER_ARRAY_INDEX": "3", "BAD NAME": "x"},
    )
    job = native_job("sweep_3", [bind])
    assert job.wrap == (
        "export MUSTER_ARRAY_INDEX=3 MUSTER_ARRAY_JOB_ID=sweep; "
        + shlex.join(["sh", "-c", 'echo "$MUSTER_ARRAY_INDEX"'])
    )
