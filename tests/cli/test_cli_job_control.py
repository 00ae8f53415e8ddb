"""`muster hold / release / requeue`, `submit --hold / --array / --dependency`, job files' `hold`,
`array` and `depends_on`, against a real in-process server (the CLI runs in a worker thread, on its
own event loop, as from a shell)."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from clients import cli
from clients.client import MusterClient
from clients.jobfile import JobFileError, parse_jobs
from server.service.app import ServerHandle, ServerOptions, start_server

JOB = "{id: %s, tasks: [{role: w, replicas: 1, request: {cpu: 1}}]}\n"


def test_job_files_take_hold_array_and_slurm_style_dependencies() -> None:
    [a, b, c] = parse_jobs(
        "- {id: a, hold: true, array: '0-9%2', tasks: [{role: w, request: {cpu: 1}}]}\n"
        "- {id: b, array: 7, depends_on: 'afterok:a:x,afterany:y', tasks: [{role: w, request: {cpu: 1}}]}\n"
        "- id: c\n"
        "  dependsOn: [afternotok:a, {job: b, type: after}, {job: z}]\n"
        "  tasks: [{role: w, request: {cpu: 1}}]\n"
    )
    assert a.hold
    assert a.array == "0-9%2"
    assert b.array == "7"
    assert [(d.type, d.job) for d in b.depends_on] == [
        ("afterok", "a"),
        ("afterok", "x"),
        ("afterany", "y"),
    ]
    assert [(d.type, d.job) for d in c.depends_on] == [
        ("afternotok", "a"),
        ("after", "b"),
        ("", "z"),  # the server defaults it (afterany)
    ]


def test_job_file_job_control_problems_name_the_field() -> None:
    with pytest.raises(JobFileError) as err:
        parse_jobs(
            "- {id: a, array: '5-1', tasks: [{role: w, request: {cpu: 1}}]}\n"
            "- {id: b, depends_on: 'afterok:a?afterok:c', tasks: [{role: w, request: {cpu: 1}}]}\n"
            "- {id: c, depends_on: [{job: a, type: before}, 3], tasks: [{role: w, request: {cpu: 1}}]}\n"
        )
    assert err.value.problems == [
        "jobs[0].array: '5-1': '5-1': the range ends before it starts",
        "jobs[1].depends_on: 'afterok:a?afterok:c': '?' (any one of the dependencies) is not "
        "supported: every dependency must be met (separate them with ',')",
        "jobs[2].depends_on[0].type: 'before' is not one of afterok, afterany, afternotok, after",
        "jobs[2].depends_on[1]: expected 'afterok:JOB', or a mapping {job: JOB, type: afterok}",
    ]


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[ServerHandle]:
    handle = await start_server(
        ServerOptions(listen="127.0.0.1:0", state=str(tmp_path / "m.db"), cycle_period=3600.0)
    )
    try:
        yield handle
    finally:
        await handle.stop()


async def muster(
    live: ServerHandle, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    code = await anyio.to_thread.run_sync(cli.main, ["--server", live.address, *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_hold_release_requeue_arrays_and_dependencies_from_the_command_line(
    live: ServerHandle, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sweep, after = tmp_path / "sweep.yaml", tmp_path / "after.yaml"
    sweep.write_text(JOB % "sweep")
    after.write_text(JOB % "post")

    code, _, err = await muster(live, capsys, "submit", "--array", "5-1", str(sweep))
    assert code == 2
    assert err == "error: --array: '5-1': '5-1': the range ends before it starts\n"
    code, _, err = await muster(live, capsys, "submit", "-d", "afterok:a?b", str(sweep))
    assert code == 2
    assert err.startswith("error: --dependency: 'afterok:a?b': '?'")

    code, out, _ = await muster(live, capsys, "submit", "--hold", "--array", "0-3%2", str(sweep))
    assert code == 0
    assert re.split(" {3,}", out.splitlines()[1]) == [
        "sweep",
        "default",
        "1",
        "submitted: array of 4 (sweep_0 .. sweep_3)",
    ]
    code, out, _ = await muster(
        live, capsys, "submit", "-d", "afterok:sweep", str(after), "-o", "json"
    )
    assert code == 0
    assert json.loads(out) == [{"id": "post", "created": True, "phase": "Pending"}]

    code, out, _ = await muster(live, capsys, "jobs", "--array", "sweep", "-o", "json")
    assert [j["spec"]["id"] for j in json.loads(out)] == [f"sweep_{i}" for i in range(4)]
    code, out, _ = await muster(live, capsys, "jobs", "--no-headers")
    reasons = {line.split()[0]: line.split()[-1] for line in out.splitlines()}
    assert reasons == {**{f"sweep_{i}": "Held" for i in range(4)}, "post": "Dependency"}
    code, out, _ = await muster(live, capsys, "job", "sweep_1")
    assert "Held: user hold by " in out
    assert "Array: sweep index 1 of 0-3%2" in out
    code, out, _ = await muster(live, capsys, "job", "post")
    assert "Depends on: afterok:sweep" in out
    assert "Condition: Dependency=True Dependency: waits for afterok:sweep" in out

    # completion offers the held jobs and the array's id to release
    async with MusterClient(live.address) as client:
        offered = await cli._job_ids(client, argparse.Namespace(command="release"))
        assert sorted(offered) == ["sweep", *(f"sweep_{i}" for i in range(4))]
        arrays = await cli._job_ids(client, argparse.Namespace(command="jobs"))
    assert arrays == ["sweep"]  # `jobs --array <TAB>`

    code, out, _ = await muster(live, capsys, "release", "sweep", "nope")
    assert code == 1
    assert out.splitlines() == [
        "sweep: released (4 array elements)",
        "nope: error: NOT_FOUND: id: job 'nope' does not exist",
    ]
    code, out, _ = await muster(live, capsys, "hold", "sweep_3")
    assert code == 0
    assert out.startswith("sweep_3: held, Pending (user hold by ")
    code, out, _ = await muster(live, capsys, "requeue", "post")
    assert code == 1
    assert out == (
        "post: error: FAILED_PRECONDITION: id: job 'post' is Pending: it has not started, "
        "nothing to requeue\n"
    )
    code, out, _ = await muster(live, capsys, "cancel", "sweep")
    assert code == 0
    assert out == "sweep: Cancelled (4 array elements)\n"


def test_the_new_commands_parse_with_their_flags() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["requeue", "--hold", "a", "b"])
    assert args.func is cli.cmd_requeue
    assert args.hold
    assert args.ids == ["a", "b"]
    args = parser.parse_args(["submit", "--hold", "--array", "0-9%3", "-d", "afterok:x", "f.yaml"])
    assert (args.hold, args.array, args.dependency) == (True, "0-9%3", "afterok:x")
    for command in ("hold", "release", "requeue", "cancel"):
        ids = next(
            a
            for a in parser._subparsers._group_actions[0].choices[command]._actions  # type: ignore[union-attr]
            if a.dest == "ids"
        )
        assert ids.completer is cli.JOB_IDS  # type: ignore[attr-defined]
