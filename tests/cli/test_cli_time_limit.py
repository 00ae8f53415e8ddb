"""Time limits in job files, `muster submit --time`, `muster queue --default-time / --max-time`, and
the TIME LIMIT / ELAPSED columns of `muster jobs -o wide` and `muster job`."""

from __future__ import annotations

import time

import pytest
from test_cli_commands import api, run  # noqa: F401 - the fixture and the runner

from clients.client import same_job_spec
from clients.jobfile import JobFileError, parse_jobs
from muster.v1 import muster_pb2 as pb

TASKS = "tasks: [{role: w, replicas: 1, request: {cpu: 1}}]"


@pytest.mark.parametrize(
    ("line", "seconds"),
    [
        ("time_limit: 2h", 7200),
        ("time_limit: 90m", 5400),
        ("time_limit: 1h30m", 5400),
        ("timeLimit: 45s", 45),
        ("time_limit: 30", 1800),  # a bare number is minutes, as sbatch --time=30
        ("time_limit: 1:30", 90),  # MM:SS, unquoted: not YAML 1.1's base-60 number 90
        ("time_limit: 1:30:00", 5400),  # HH:MM:SS
        ("time_limit: 2-12", 216000),  # D-HH
        ("time_limit: 1-00:00:30", 86430),  # D-HH:MM:SS
        ("time_limit_seconds: 600", 600),  # the API field itself
    ],
)
def test_job_file_time_limit_forms(line: str, seconds: int) -> None:
    [job] = parse_jobs(f"id: a\n{line}\n{TASKS}\n")
    assert job.time_limit_seconds == seconds


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("time_limit: 2x", "jobs[0].time_limit: '2x' is not a time limit"),
        ("time_limit: 0", "jobs[0].time_limit: 0: a time limit must be positive"),
        ("time_limit: 1:75", "jobs[0].time_limit: '1:75': hours must be 0-23"),
        ("timeLimit: [1]", "jobs[0].timeLimit: [1] is not a time limit"),
        (
            "time_limit: 2h\ntime_limit_seconds: 60",
            "jobs[0].time_limit: give the time limit once",
        ),
    ],
)
def test_job_file_time_limit_errors_name_the_field(line: str, problem: str) -> None:
    with pytest.raises(JobFileError) as err:
        parse_jobs(f"id: a\n{line}\n{TASKS}\n")
    assert any(p.startswith(problem) for p in err.value.problems), err.value.problems


def test_a_retry_finds_the_job_stored_with_the_queues_default() -> None:
    sent = pb.JobSpec(id="a")
    stored = pb.JobSpec(id="a", namespace="default", name="a", queue="default")
    stored.time_limit_seconds = 1800  # written in by the server
    assert same_job_spec(sent, stored)
    sent.time_limit_seconds = 600
    assert not same_job_spec(sent, stored)


def test_submit_time_sets_every_job_and_wins_over_the_file(api, capsys, tmp_path):  # noqa: F811
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "jobs:\n"
        "  - {id: a, time_limit: 5m, tasks: [{role: w, replicas: 1, request: {cpu: 1}}]}\n"
        "  - {id: b, tasks: [{role: w, replicas: 1, request: {cpu: 1}}]}\n"
    )
    code, _, err = run(api, capsys, "submit", "--time", "1:30:00", str(path))
    assert code == 0, err
    assert [(s.id, s.time_limit_seconds) for s in api.submitted] == [("a", 5400), ("b", 5400)]
    code, _, err = run(api, capsys, "submit", "-t", "2x", str(path))
    assert code == 2
    assert err.strip().startswith("error: --time: '2x' is not a time limit")
    assert len(api.submitted) == 2  # nothing more was sent


def test_queue_time_flags(api, capsys):  # noqa: F811
    code, _, err = run(
        api, capsys, "queue", "create", "short", "--default-time", "30m", "--max-time", "4:00:00"
    )
    assert code == 0, err
    q = api.queues["short"]
    assert (q.default_time_limit_seconds, q.max_time_limit_seconds) == (1800, 14400)
    code, _, _ = run(api, capsys, "queue", "update", "short", "--max-time", "UNLIMITED")
    assert code == 0
    q = api.queues["short"]
    assert (q.default_time_limit_seconds, q.max_time_limit_seconds) == (1800, 0)
    code, _, err = run(api, capsys, "queue", "update", "short", "--default-time", "soon")
    assert code == 2
    assert "--default-time: 'soon' is not a time limit" in err


def test_jobs_wide_and_job_show_time_limit_and_elapsed(api, capsys):  # noqa: F811
    api.jobs[0].spec.time_limit_seconds = 7200
    api.jobs[0].status.start_time.FromSeconds(int(time.time()) - 600)
    api.jobs[1].status.start_time.FromSeconds(1_700_000_000)
    api.jobs[1].status.finish_time.FromSeconds(1_700_000_090)
    code, out, _ = run(api, capsys, "jobs", "-o", "wide")
    assert code == 0
    lines = out.splitlines()
    assert "TIME LIMIT" in lines[0]
    assert "ELAPSED" in lines[0]
    first = next(line for line in lines if line.startswith("job-0"))
    assert " 2h " in first
    assert " 10m" in first or " 10m1s" in first
    second = next(line for line in lines if line.startswith("job-1"))
    assert " 1m30s " in second  # finished: start to finish
    code, out, _ = run(api, capsys, "jobs")
    assert "TIME LIMIT" not in out  # the narrow table keeps its columns
    code, out, _ = run(api, capsys, "job", "pending-1")
    assert "Time limit: -   Elapsed: -" in out
