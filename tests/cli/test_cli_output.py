"""`muster` output for scripts: plain columns off a terminal (no box characters, no trailing
padding), --no-headers, -o custom-columns / jsonpath, -o wide columns, --sort then --limit, -l label
selectors, shell completion, and the small error messages (submit of a missing file, logs of a job
that has not started, enum names in errors).

Most tests run the CLI in-process with capsys (stdout is not a terminal there); the last one runs
the real `muster` command as a subprocess, its stdout a pipe, against a real in-process server.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import argcomplete
import pytest
from cli_helpers import run, serving

from clients import cli
from clients.commands import UsageError, parse_selector, selector_matches
from clients.render import FormatError, JsonPath, OutputFormat, Template
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service.app import ServerHandle, ServerOptions, start_server

BOX = set("┃│━─╇┼┏┓┗┛╭╮╰╯═║")


def job(i: int, **labels: str) -> pb.Job:
    j = pb.Job(
        spec=pb.JobSpec(
            id=f"job-{i}",
            queue="default",
            namespace="default",
            task_groups=[pb.TaskGroup(role="w", replicas=1, labels=labels)],
        ),
        status=pb.JobStatus(phase=pb.JOB_PHASE_RUNNING, running=1),
    )
    j.status.submit_time.FromSeconds(1_700_000_000 + 60 * i)  # job-4 is the newest
    return j


class Fake(pb_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self.list_requests: list[pb.ListJobsRequest] = []
        self.jobs = [job(i, team="vision" if i % 2 else "nlp") for i in range(5)]
        self.jobs[0].status.conditions.add(
            type="Unschedulable",
            status="True",
            reason="NotEnoughResources",
            message="0/3 nodes are unavailable:\n3 Insufficient cpu.",  # two lines
        )

    def ListJobs(self, request: pb.ListJobsRequest, context: Any) -> pb.ListJobsResponse:
        self.list_requests.append(request)
        start = int(request.page_token or 0)
        page = self.jobs[start : start + 2]
        token = str(start + 2) if start + 2 < len(self.jobs) else ""
        return pb.ListJobsResponse(jobs=page, next_page_token=token)

    def GetJob(self, request: pb.GetJobRequest, context: Any) -> pb.Job:
        return pb.Job(
            spec=pb.JobSpec(id=request.id, queue="default"),
            status=pb.JobStatus(phase=pb.JOB_PHASE_INQUEUE, pending=2),
            tasks=[
                pb.Task(id=f"{request.id}/w-0", status=pb.TASK_STATUS_PENDING),
                pb.Task(id=f"{request.id}/w-1", status=pb.TASK_STATUS_PENDING),
            ],
        )

    def Explain(self, request: pb.ExplainRequest, context: Any) -> pb.ExplainResponse:
        return pb.ExplainResponse(job_id=request.job_id, gate="gang", summary="waiting")

    def GetTaskLogs(self, request: pb.GetTaskLogsRequest, context: Any) -> pb.GetTaskLogsResponse:
        tasks = [f"{request.job_id}/w-0", f"{request.job_id}/w-1"]
        return pb.GetTaskLogsResponse(
            logs=[pb.TaskLog(task_id=t) for t in tasks if request.task_id in ("", t)]
        )

    def ListQueues(self, request: pb.ListQueuesRequest, context: Any) -> pb.ListQueuesResponse:
        return pb.ListQueuesResponse(
            queues=[
                pb.QueueView(
                    queue=pb.Queue(
                        name="ml",
                        weight=2,
                        priority=7,
                        state=pb.QUEUE_STATE_CLOSED,
                        guarantee=pb.ResourceList(quantities={"cpu": "4"}),
                        annotations={"owner": "ann"},
                    )
                ),
                pb.QueueView(queue=pb.Queue(name="default", weight=1)),
            ]
        )

    def ListNodes(self, request: pb.ListNodesRequest, context: Any) -> pb.ListNodesResponse:
        gpu = pb.Node(
            name="gpu-1",
            backend="rack-a",
            labels={"zone": "a", "kind": "gpu"},
            taints=[pb.Taint(key="gpu", value="yes", effect="NoSchedule")],
            devices=[pb.Device(id="0", type="nvidia.com/gpu", healthy=True)],
        )
        cpu = pb.Node(name="cpu-1", backend="rack-b", labels={"zone": "b"})
        return pb.ListNodesResponse(
            nodes=[
                pb.NodeView(node=gpu, task_count=1, device_holders={"0": "train/w-0"}),
                pb.NodeView(node=cpu),
            ]
        )


@pytest.fixture
def api() -> Iterator[Fake]:
    with serving(Fake()) as servicer:
        yield servicer


def columns_of(line: str) -> list[str]:
    return re.split(r" {3,}", line.strip())


# -- plain tables ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs"],
        ["jobs", "-o", "wide"],
        ["queues"],
        ["queues", "-o", "wide"],
        ["nodes"],
        ["nodes", "-o", "wide"],
        ["job", "job-1"],
    ],
    ids=" ".join,
)
def test_tables_off_a_terminal_are_plain_columns(
    api: Fake, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, _ = run(api, capsys, *argv)
    assert code == 0
    assert out
    assert not BOX & set(out), out
    lines = out.splitlines()
    assert all(line == line.rstrip() for line in lines)  # no padding after the last column
    header = next(line for line in lines if line.split()[0] in ("JOB", "QUEUE", "NODE", "TASK"))
    table = [line for line in lines[lines.index(header) :] if not line.startswith("Why pending")]
    # Every row's cells start where the header's do (three spaces apart, left aligned).
    starts = [m.start() for m in re.finditer(r"(?:^|(?<=   ))\S", header)]
    for row in table[1:]:
        assert all(row[s - 1] == " " for s in starts[1:]), (header, row)
        assert len(columns_of(row)) == len(columns_of(header))


def test_no_headers_before_or_after_the_command(
    api: Fake, capsys: pytest.CaptureFixture[str]
) -> None:
    _, with_headers, _ = run(api, capsys, "jobs")
    for argv in (["jobs", "--no-headers"], ["--no-headers", "jobs"]):
        code, out, _ = run(api, capsys, *argv)
        assert code == 0
        rows = [columns_of(line) for line in with_headers.splitlines()[1:]]
        assert [columns_of(line) for line in out.splitlines()] == rows
        assert out.split()[0] == "job-0"


def test_options_before_the_command_are_not_reset_by_it(
    api: Fake, capsys: pytest.CaptureFixture[str]
) -> None:
    args = cli.build_parser().parse_args(["--server", "a:1", "--token", "t", "-o", "json", "jobs"])
    assert (args.server, args.token, args.output) == ("a:1", "t", "json")
    args = cli.build_parser().parse_args(["jobs", "--server", "b:1"])
    assert args.server == "b:1"
    assert args.no_headers is False


# -- custom-columns and jsonpath ---------------------------------------------------------------


def test_custom_columns_are_paths_into_the_json_form(
    api: Fake, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        api,
        capsys,
        "jobs",
        "-o",
        "custom-columns=ID:.spec.id,PHASE:.status.phase,TEAM:.spec.task_groups[0].labels.team,"
        "REASON:.status.conditions[0].reason",
    )
    assert code == 0
    lines = out.splitlines()
    assert columns_of(lines[0]) == ["ID", "PHASE", "TEAM", "REASON"]
    assert columns_of(lines[1]) == ["job-0", "Running", "nlp", "NotEnoughResources"]
    assert columns_of(lines[2]) == ["job-1", "Running", "vision", "<none>"]  # kubectl's word
    code, out, _ = run(
        api,
        capsys,
        "--no-headers",
        "nodes",
        "-o",
        "custom-columns=N:node.name,DEV:.node.devices[*].id",
    )
    assert [columns_of(line) for line in out.splitlines()] == [["gpu-1", "0"], ["cpu-1", "<none>"]]
    # One object (muster job): one row.
    code, out, _ = run(
        api, capsys, "job", "job-1", "-o", "custom-columns=ID:.spec.id,N:.tasks[*].id"
    )
    assert out.splitlines()[1].split() == ["job-1", "job-1/w-0,job-1/w-1"]


def test_jsonpath_templates(api: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(api, capsys, "jobs", "-o", "jsonpath={.items[*].spec.id}")
    assert code == 0
    assert out == "job-0 job-1 job-2 job-3 job-4"
    template = '{range .items[*]}{.spec.id}{"\\t"}{.status.running}{"\\n"}{end}'
    code, out, _ = run(api, capsys, "jobs", "--limit", "2", "-o", f"jsonpath={template}")
    assert out == "job-0\t1\njob-1\t1\n"
    code, out, _ = run(api, capsys, "job", "job-3", "-o", "jsonpath={.spec.id}:{.status.phase}")
    assert out == "job-3:Inqueue"


@pytest.mark.parametrize(
    "value",
    ["yaml", "custom-columns=ID", "custom-columns=", "jsonpath={range .x}", "jsonpath={.a[}"],
)
def test_a_bad_output_format_is_a_usage_error(
    api: Fake, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--server", api.address, "jobs", "-o", value])  # type: ignore[attr-defined]
    assert info.value.code == 2
    assert "--output" in capsys.readouterr().err


def test_paths_and_templates() -> None:
    data = {
        "a": {"b": [{"c": 1}, {"c": 2}], "k.x/y": "v", "m": {"p": True}},
        "items": [{"id": "x"}, {"id": "y"}, {"id": "z"}],
    }
    assert JsonPath.parse(".a.b[*].c").find(data) == [1, 2]
    assert JsonPath.parse("a.b[-1].c").find(data) == [2]
    assert JsonPath.parse("{.a['k.x/y']}").find(data) == ["v"]
    assert JsonPath.parse("$.items[1:].id").find(data) == ["y", "z"]
    assert JsonPath.parse(".a.m.*").find(data) == [True]
    assert JsonPath.parse(".nope.deeper").find(data) == []
    assert Template.parse("{.a.m}").render(data) == '{"p":true}'
    assert Template.parse("{range .items[*]}[{.id}]{end}").render(data) == "[x][y][z]"
    with pytest.raises(FormatError):
        Template.parse("{end}")
    assert OutputFormat.parse("custom-columns=L:.labels['a,b'],N:.n").columns[0].header == "L"


# -- wide ----------------------------------------------------------------------------------------


def test_wide_adds_columns_and_keeps_each_row_on_one_line(
    api: Fake, capsys: pytest.CaptureFixture[str]
) -> None:
    _, narrow, _ = run(api, capsys, "queues")
    _, wide, _ = run(api, capsys, "queues", "-o", "wide")
    assert columns_of(wide.splitlines()[0]) == [
        "QUEUE",
        "PARENT",
        "WEIGHT",
        "PRIORITY",
        "STATE",
        "RECLAIMABLE",
        "CAPABILITY",
        "DESERVED",
        "GUARANTEE",
        "ALLOCATED",
        "PENDING",
        "RUNNING",
        "ANNOTATIONS",
    ]
    assert columns_of(wide.splitlines()[1])[3:5] == ["7", "Closed"]
    assert "owner=ann" in wide
    assert "PRIORITY" not in narrow
    _, wide, _ = run(api, capsys, "nodes", "-o", "wide")
    header = columns_of(wide.splitlines()[0])
    assert "TAINTS" in header
    assert "DEVICE HOLDERS" in header
    assert "gpu=yes:NoSchedule" in wide
    assert "0=train/w-0" in wide
    _, out, _ = run(api, capsys, "jobs", "-o", "wide")
    lines = out.splitlines()
    assert len(lines) == 6  # a header and five jobs: the two-line message stays on its row
    assert columns_of(lines[1])[-1] == "0/3 nodes are unavailable: 3 Insufficient cpu."


# -- sort, limit, labels -----------------------------------------------------------------------


def test_limit_comes_after_sort(api: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(api, capsys, "--no-headers", "jobs", "--sort=-submit", "--limit", "3")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == ["job-4", "job-3", "job-2"]
    api.list_requests.clear()
    code, out, _ = run(api, capsys, "jobs", "--limit", "2", "-o", "json")
    assert [j["spec"]["id"] for j in json.loads(out)] == ["job-0", "job-1"]
    assert len(api.list_requests) == 1  # no --sort: paging stops at the limit
    # The limit counts the jobs that pass the filters matched here, not the jobs read.
    code, out, _ = run(api, capsys, "jobs", "-l", "team=vision", "--limit", "2", "-o", "json")
    assert [j["spec"]["id"] for j in json.loads(out)] == ["job-1", "job-3"]
    code, _, err = run(api, capsys, "jobs", "--limit", "0")
    assert code == 2
    assert "--limit" in err


def test_label_selectors_on_jobs_and_nodes(api: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    def ids(*argv: str) -> list[str]:
        code, out, err = run(api, capsys, "--no-headers", *argv)
        assert code == 0, err
        return [line.split()[0] for line in out.splitlines()]

    assert ids("jobs", "-l", "team=nlp") == ["job-0", "job-2", "job-4"]
    assert ids("jobs", "-l", "team!=nlp") == ["job-1", "job-3"]
    assert ids("jobs", "-l", "team in (x, vision)", "--sort=-id") == ["job-3", "job-1"]
    assert ids("jobs", "-l", "!team") == []
    assert ids("nodes", "-l", "zone=a") == ["gpu-1"]
    assert ids("nodes", "-l", "zone,kind notin (gpu)") == ["cpu-1"]  # no kind: not in (gpu)
    assert ids("nodes", "-l", "zone", "-l", "!kind") == ["cpu-1"]  # repeated -l: all hold
    code, _, err = run(api, capsys, "nodes", "-l", "zone=a=b")
    assert code == 2
    assert "--selector" in err


def test_selector_parsing() -> None:
    sel = parse_selector("app=web, tier!=db,env in (prod,staging),!legacy,team")
    labels = {"app": "web", "env": "prod", "team": "x"}
    assert selector_matches(sel, labels)
    assert not selector_matches(sel, {**labels, "legacy": "1"})
    assert not selector_matches(sel, {**labels, "tier": "db"})
    assert selector_matches(parse_selector("a==1"), {"a": "1"})
    assert selector_matches(parse_selector("a notin (1)"), {})
    with pytest.raises(UsageError):
        parse_selector("a in 1")


# -- completion ----------------------------------------------------------------------------------


def complete(monkeypatch: pytest.MonkeyPatch, line: str) -> list[str]:
    monkeypatch.setenv("_ARGCOMPLETE", "1")
    monkeypatch.setenv("_ARGCOMPLETE_IFS", "\n")
    monkeypatch.setenv("COMP_LINE", line)
    monkeypatch.setenv("COMP_POINT", str(len(line)))
    stream = io.StringIO()
    exits: list[int] = []
    Finder()(
        cli.build_parser(),
        always_complete_options=False,
        exit_method=exits.append,
        output_stream=stream,
    )
    assert exits == [0]
    # A single completion ends with the space the shell is to type after it.
    return [c.rstrip(" ") for c in stream.getvalue().split("\n")] if stream.getvalue() else []


class Finder(argcomplete.CompletionFinder):
    def _init_debug_stream(self) -> None:
        # argcomplete writes its debug output to fd 9, which pytest's faulthandler may hold.
        argcomplete.io.debug_stream = sys.stderr


def test_completion_of_phases_job_ids_queues_and_formats(
    api: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = f"--server {api.address}"  # type: ignore[attr-defined]
    assert complete(monkeypatch, "muster jobs --phase ") == [
        "pending",
        "inqueue",
        "running",
        "completed",
        "failed",
        "cancelled",
    ]
    assert complete(monkeypatch, "muster jobs --phase ru") == ["running"]
    assert complete(monkeypatch, f"muster {server} job job-") == [f"job-{i}" for i in range(5)]
    assert complete(monkeypatch, f"muster logs {server} job-1 ") == ["w-0", "w-1"]
    assert complete(monkeypatch, f"muster jobs {server} --queue ") == ["ml", "default"]
    assert complete(monkeypatch, f"muster nodes {server} --backend ") == ["rack-a", "rack-b"]
    assert "--sort=-submit" in complete(monkeypatch, "muster jobs --sort=-s")
    assert "custom-columns=" in complete(monkeypatch, "muster jobs -o ")
    # No server: nothing offered, no error.
    assert complete(monkeypatch, "muster --server 127.0.0.1:9 job ") == []


# -- small messages ------------------------------------------------------------------------------


def test_submit_of_a_missing_file_names_it_once(
    api: Fake, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(api, capsys, "submit", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert err == f"error: {tmp_path / 'nope.yaml'}: No such file or directory\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text("{id: a, tasks: [{role: w, request: {cpu: 2x}}]}")
    code, _, err = run(api, capsys, "submit", str(bad))
    assert code == 2
    assert err.count(str(bad)) == 1
    assert "jobs[0].tasks[0].request.cpu" in err


def test_logs_of_a_job_that_has_not_started(api: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(api, capsys, "logs", "train")
    assert code == 1
    assert out == ""
    assert err == "error: no task of job train has started (Inqueue): no output yet\n"
    code, out, err = run(api, capsys, "logs", "train", "w-1")
    assert code == 1
    assert err == "error: task train/w-1 has not started (Pending): no output yet\n"


# -- the real command, piped, against a real server --------------------------------------------


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ServerHandle]:
    options = ServerOptions(
        listen="127.0.0.1:0", state=str(tmp_path / "muster.db"), cycle_period=3600.0
    )
    handle = await start_server(options)
    try:
        yield handle
    finally:
        await handle.stop()


async def test_the_piped_command_against_a_server(server: ServerHandle, tmp_path: Path) -> None:
    async def muster(*argv: str) -> tuple[int, str, str]:
        proc = await anyio.run_process(
            [sys.executable, "-m", "clients.cli", "--server", server.address, *argv],
            check=False,
            env={**os.environ, "COLUMNS": "60"},
        )
        return proc.returncode, proc.stdout.decode(), proc.stderr.decode()

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "".join(
            f"- {{id: j{i}, tasks: [{{role: w, replicas: 1, request: {{cpu: 1}}, labels: {{n: '{i % 2}'}}}}]}}\n"
            for i in range(5)
        )
    )
    code, _, err = await muster("submit", str(jobs))
    assert code == 0, err
    code, out, _ = await muster("jobs", "--sort=-submit", "--limit", "3")
    assert code == 0
    assert not BOX & set(out)
    lines = out.splitlines()
    assert lines[0].split() == [
        "JOB",
        "QUEUE",
        "OWNER",
        "PHASE",
        "RUNNING",
        "SUBMIT",
        "AGE",
        "REASON",
    ]
    assert [line.split()[0] for line in lines[1:]] == ["j4", "j3", "j2"]  # the newest three
    assert all(line == line.rstrip() for line in lines)
    code, out, _ = await muster(
        "jobs", "--no-headers", "-l", "n=1", "-o", "custom-columns=ID:.spec.id,Q:.spec.queue"
    )
    assert out == "j1   default\nj3   default\n"
    code, out, err = await muster("logs", "j0")
    assert code == 1
    assert out == ""
    assert err.startswith("error: no task of job j0 has started (")
    # Errors carry short enum names: 'Closed', not QUEUE_STATE_CLOSED.
    assert (await muster("queue", "create", "ml", "--state", "closed"))[0] == 0
    one = tmp_path / "one.yaml"
    one.write_text("{id: m1, queue: ml, tasks: [{role: w, replicas: 1, request: {cpu: 1}}]}")
    code, _, err = await muster("submit", str(one))
    assert code == 1
    assert err.startswith("error: FAILED_PRECONDITION: ")
    assert "queue 'ml' is Closed" in err
    assert "QUEUE_STATE" not in err
