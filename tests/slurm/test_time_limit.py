"""Time limits on Slurm: the squeue TimeLimit column, the scontrol update / sbatch arguments
(``TimeLimit=``, ``--time``), the rule that a staged job's own shorter ``--time`` is kept, and a
TIMEOUT reported with the TimeLimit reason. Parse-level and against a fake command line (no
Slurm, no root); the last test places jobs on the real private cluster (root)."""

from __future__ import annotations

from typing import Any

import pytest
from test_adapter_paths import FakeCLI, in_run, make_backend, placed, staged

from adapters.slurm.cli import placement_words
from adapters.slurm.enforce import staged_time_limit
from adapters.slurm.native import native_job
from adapters.slurm.parse import (
    JobRecord,
    SlurmJob,
    parse_squeue_format,
    parse_squeue_json,
    slurm_time_limit,
)
from muster.v1 import muster_pb2 as pb

DATA = __import__("pathlib").Path(__file__).parent / "data"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10:00", 600),  # squeue prints MM:SS below an hour
        ("2:00", 120),
        ("1:00:00", 3600),
        ("1-02:04:00", 93840),
        ("365-00:00:00", 365 * 86400),  # a running job whose partition has MaxTime=INFINITE
        ("UNLIMITED", 0),
        ("INFINITE", 0),
        ("NOT_SET", 0),
        ("INVALID", 0),
        ("(null)", 0),
        ("", 0),
    ],
)
def test_squeue_time_limit_column(text: str, seconds: int) -> None:
    assert slurm_time_limit(text) == seconds


def test_format_and_json_polls_agree_on_time_limits() -> None:
    fmt = {
        j.job_id: j.time_limit for j in parse_squeue_format((DATA / "squeue_fmt.txt").read_text())
    }
    js = {
        j.job_id: j.time_limit
        for j in parse_squeue_json((DATA / "squeue_exclusive.json").read_text())
    }
    assert fmt == js
    assert fmt[27] == 365 * 86400
    assert fmt[28] == 0


def test_placement_words_carry_the_time_limit() -> None:
    assert placement_words(7, "batch", ["n1", "n2"], "muster:slurm-7") == [
        "update",
        "JobId=7",
        "Partition=batch",
        "NodeList=n1,n2",
        "StartTime=now",
        "AdminComment=muster:slurm-7",
    ]
    assert placement_words(7, "batch", ["n1"], time_limit=5400)[-1] == "TimeLimit=0-01:30:00"


@pytest.mark.parametrize(
    ("muster", "own", "placed_with"),
    [
        (1800, 0, 1800),  # the job has no --time (UNLIMITED): Muster's limit
        (1800, 3600, 1800),  # Muster's is lower: it lowers the job's
        (1800, 600, 0),  # the user's own --time=10 is shorter: kept, never raised
        (1800, 1800, 0),  # the same: nothing to change
        (0, 600, 0),  # no Muster limit: the job keeps its own
    ],
)
def test_a_staged_jobs_shorter_time_is_never_raised(
    muster: int, own: int, placed_with: int
) -> None:
    assert staged_time_limit(muster, own) == placed_with


def test_native_sbatch_gets_time() -> None:
    binds = [
        pb.BindDecision(
            task_id=f"train/w-{i}",
            job_id="train",
            node=f"n{i}",
            min_member=2,
            command=["python", "train.py"],
            request=pb.ResourceList(quantities={"cpu": "2"}),
            time_limit_seconds=7200,
        )
        for i in range(2)
    ]
    spec = native_job("train", binds)
    argv = spec.sbatch_argv(partition="batch", user="nobody", group="nogroup", workdir="/tmp")
    assert "--time=0-02:00:00" in argv
    assert argv[-1].startswith("--wrap=")
    for b in binds:
        b.ClearField("time_limit_seconds")
    untimed = native_job("train", binds)
    argv = untimed.sbatch_argv(partition="batch", user="nobody", group="nogroup", workdir="/tmp")
    assert not any(a.startswith("--time") for a in argv)


class RecordingCLI(FakeCLI):
    """Records the time limit of every placement, and answers show_job with a record."""

    def __init__(self) -> None:
        super().__init__()
        self.limits: dict[int, int] = {}

    async def place_many(self, placements: Any, partition: str) -> Any:
        for job_id, _nodes, _marker, time_limit in placements:
            self.limits[job_id] = time_limit
        return await super().place_many(placements, partition)

    async def show_job(self, job_id: int) -> JobRecord:  # type: ignore[override]
        return JobRecord(job_id, "TIMEOUT", "TimeLimit", "batch", [], [], "1", 0, 15, 0, "", {})


def timed_bind(job: str, limit: int) -> pb.Decision:
    return pb.Decision(
        id=hash((job, limit)) % 10**9,
        cycle_id=1,
        bind=pb.BindDecision(
            task_id=f"{job}/node-0", job_id=job, node="n1", time_limit_seconds=limit
        ),
    )


class FakeServer:
    async def CreateQueue(self, request: pb.QueueRequest) -> pb.Queue:
        return request.queue

    async def SubmitJobs(self, request: pb.SubmitJobsRequest) -> pb.SubmitJobsResponse:
        return pb.SubmitJobsResponse()


async def test_staged_binds_lower_slurms_limit_only() -> None:
    backend, _, _ = make_backend()
    cli = RecordingCLI()
    backend.cli = backend.enforcer.cli = cli  # type: ignore[assignment]
    backend.client = FakeServer()  # type: ignore[assignment]
    untimed, short = staged(1), staged(2)
    short.time_limit = 600  # sbatch --time=10
    cli.live = [untimed, short]
    await backend.poll_once()
    assert backend.jobs[2].time_limit == 600
    outcomes = await backend.apply_batch([timed_bind("slurm-1", 1800), timed_bind("slurm-2", 1800)])
    assert all(o.applied for o in outcomes)
    assert cli.limits == {1: 1800, 2: 0}


async def test_timeout_is_reported_with_the_time_limit_reason() -> None:
    backend, cli, runtime = make_backend()
    record = RecordingCLI()
    backend.cli = backend.enforcer.cli = record  # type: ignore[assignment]
    job = placed(backend, 5, ["n1"])
    job.ran = True
    ended: SlurmJob = in_run(5, "TIMEOUT", "n1", runs_on="n1")
    ended.time_limit = 120
    record.by_id = {5: ended}
    await backend.poll_once()
    assert ("slurm-5/node-0", pb.TASK_STATUS_FAILED, "TimeLimit: time limit 2m reached") in (
        runtime.statuses
    )


# -- the real private cluster (root) ---------------------------------------------------------------


@pytest.mark.slurm
async def test_real_slurm_shows_musters_time_limit(clean_slurm: list[str]) -> None:
    from adapters.slurm.backend import Settings, SlurmBackend
    from adapters.slurm.cli import SlurmCLI
    from tests.slurm.conftest import job_info, sbatch

    settings = Settings(
        poll_interval=0.2, native_user="nobody", native_group="nogroup", native_workdir="/tmp"
    )
    backend = SlurmBackend(SlurmCLI(), settings, name="slurm-test")
    untimed = sbatch()
    short = sbatch("--time=10")
    await backend.poll_once()
    assert backend.jobs[short].time_limit == 600
    out = await backend.apply_batch(
        [
            pb.Decision(
                id=900_001 + i,
                cycle_id=1,
                bind=pb.BindDecision(
                    task_id=f"slurm-{sid}/node-0",
                    job_id=f"slurm-{sid}",
                    node=node,
                    time_limit_seconds=1800,
                ),
            )
            for i, (sid, node) in enumerate(((untimed, "n3"), (short, "n4")))
        ]
    )
    assert all(o.applied for o in out), out
    # `scontrol show job`: Muster's 30 minutes on the job without --time; the user's 10 kept.
    assert job_info(untimed)["TimeLimit"] == "00:30:00"
    assert job_info(short)["TimeLimit"] == "00:10:00"
    # A job submitted to Muster directly: sbatch --time.
    native = await backend.apply_batch(
        [
            pb.Decision(
                id=900_010,
                cycle_id=2,
                bind=pb.BindDecision(
                    task_id="timed/w-0",
                    job_id="timed",
                    node="n5",
                    min_member=1,
                    command=["sleep", "120"],
                    request=pb.ResourceList(quantities={"cpu": "1"}),
                    time_limit_seconds=7200,
                ),
            )
        ]
    )
    assert native[0].applied, native
    [slurm_id] = [sid for sid, job in backend.jobs.items() if job.muster_id == "timed"]
    assert job_info(slurm_id)["TimeLimit"] == "02:00:00"
