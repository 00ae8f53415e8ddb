"""Native jobs (submitted to Muster directly): binds -> the one Slurm job that runs them."""

from __future__ import annotations

import pytest

from adapters.slurm.native import NATIVE_MARKER, OUTPUT_ANNOTATION, native_job, parse_comment
from adapters.slurm.translate import Untranslatable
from muster.v1 import muster_pb2 as pb


def bind(
    task: str,
    node: str,
    *,
    min_member: int = 1,
    command: tuple[str, ...] = ("python", "train.py", "--lr", "0.1 x"),
    **request: str,
) -> pb.BindDecision:
    return pb.BindDecision(
        task_id=task,
        job_id=task.split("/")[0],
        node=node,
        min_member=min_member,
        command=list(command),
        request=pb.ResourceList(quantities=request),
    )


def test_gang_binds_become_one_pinned_slurm_job() -> None:
    binds = [
        bind(
            "train/worker-1",
            "n7",
            min_member=2,
            cpu="1500m",
            memory="3Gi",
            **{"nvidia.com/gpu": "2"},
        ),
        bind(
            "train/worker-0",
            "n3",
            min_member=2,
            cpu="2",
            memory="1Gi",
            **{"slurm.schedmd.com/nic": "1"},
        ),
    ]
    job = native_job("train", binds)
    # Task i on node i, in task order; every node asked for the largest request (Slurm asks per node).
    assert job.tasks == ("train/worker-0", "train/worker-1")
    assert job.nodes == ("n3", "n7")
    argv = job.sbatch_argv(partition="batch", user="nobody", group="nogroup", workdir="/tmp")
    assert argv[:2] == ["sbatch", "--parsable"]
    for expected in (
        "--partition=batch",
        "--nodelist=n3,n7",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=2",
        "--mem=3072M",
        "--gres=gpu:2,nic:1",
        "--uid=nobody",
        "--gid=nogroup",
        "--chdir=/tmp",
        "--job-name=train",
        "--wrap=python train.py --lr '0.1 x'",
    ):
        assert expected in argv, expected
    assert parse_comment(job.comment) == (
        "train",
        ["train/worker-0", "train/worker-1"],
        ["n3", "n7"],
    )


def test_defaults_duration_and_annotations() -> None:
    b = bind("sim/t-0", "n1", command=())
    b.duration_seconds = 2.5
    b.annotations[OUTPUT_ANNOTATION] = "/var/log/sim-%j.out"
    argv = native_job("sim", [b]).sbatch_argv(partition="p", user="u", group="g", workdir="/home/u")
    assert "--wrap=sleep 2.5" in argv
    assert "--output=/var/log/sim-%j.out" in argv
    assert "--chdir=/home/u" in argv
    assert "--cpus-per-task=1" in argv
    assert not any(a.startswith(("--mem", "--gres")) for a in argv)
    assert "--wrap=true" in native_job("x", [bind("x/t-0", "n1", command=())]).sbatch_argv(
        partition="p", user="u", group="g", workdir=""
    )


@pytest.mark.parametrize(
    ("binds", "reason"),
    [
        (
            [bind("g/t-0", "n1", min_member=3), bind("g/t-1", "n2", min_member=3)],
            "gang incomplete: 2 of 3",
        ),
        ([bind("g/t-0", "n1"), bind("g/t-1", "n1")], "two tasks of job g bound to n1"),
        ([bind("g/t-0", "n1"), bind("g/t-1", "n2", command=("other",))], "run different commands"),
        (
            [bind("g/t-0", "n1", **{"example.com/fpga": "1"})],
            "no resource for request.example.com/fpga",
        ),
        ([bind("g/t-0", "n1", cpu="lots")], "task g/t-0: request.cpu"),
    ],
)
def test_what_one_slurm_job_cannot_run_is_refused_with_the_reason(
    binds: list[pb.BindDecision], reason: str
) -> None:
    with pytest.raises(Untranslatable, match=reason):
        native_job("g", binds)


def test_comment_parsing_refuses_what_is_not_a_native_marker() -> None:
    assert parse_comment("muster:slurm-12") is None
    assert parse_comment(NATIVE_MARKER + "job") is None
    assert parse_comment(NATIVE_MARKER + "job|t0@") is None
    assert parse_comment(NATIVE_MARKER + "job|a/b@c@n1,t1@n2") == (
        "job",
        ["a/b@c", "t1"],
        ["n1", "n2"],
    )
