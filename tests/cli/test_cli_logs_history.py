"""`muster logs -f` and `muster history` against a small fake server: what is printed as output
arrives, the dropped-bytes marker, the filters sent, the output formats, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import run, serving

from clients.history import parse_time
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]


def accounting(job_id: str, **fields: object) -> pb.JobAccounting:
    values: dict[str, object] = {
        "owner": "ann",
        "queue": "ml",
        "namespace": "default",
        "phase": pb.JOB_PHASE_COMPLETED,
        "elapsed_seconds": 125.0,
        "tasks": 2,
        "succeeded": 2,
        "requested": {"cpu": 500.0, "nvidia.com/gpu": 250.0, "memory": 1e9},
        "used": {"cpu": 480.5, "nvidia.com/gpu": 240.0},
        "exit_codes": {0: 2},
        "reason": "2/2 succeeded",
    }
    entry = pb.JobAccounting(job_id=job_id, **{**values, **fields})  # type: ignore[arg-type]
    entry.submit_time.FromSeconds(1_700_000_000)
    entry.start_time.FromSeconds(1_700_000_010)
    entry.finish_time.FromSeconds(1_700_000_135)
    return entry


class FakeApi(pb_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self.follows: list[pb.WatchTaskLogsRequest] = []
        self.history: list[pb.ListJobHistoryRequest] = []
        self.events: list[pb.TaskLogEvent] = []
        self.hang = threading.Event()  # set: the stream stays open after its events
        self.address = ""

    def WatchTaskLogs(self, request, context):
        self.follows.append(request)
        for event in self.events:
            if not request.task_id or event.task_id == request.task_id:
                yield event
        while self.hang.is_set() and context.is_active():
            time.sleep(0.05)

    def GetTaskLogs(self, request, context):
        return pb.GetTaskLogsResponse(
            logs=[
                pb.TaskLog(
                    task_id="train/w-0",
                    data=b"tail\n",
                    truncated=True,
                    dropped_bytes=4000,
                    size=4005,
                )
            ]
        )

    def ListJobHistory(self, request, context):
        self.history.append(request)
        pages = {
            "": ([accounting("a"), accounting("b", owner="bob", queue="default")], "2"),
            "2": (
                [
                    accounting(
                        "c", phase=pb.JOB_PHASE_FAILED, exit_codes={0: 1, 3: 1}, requeue_count=2
                    )
                ],
                "",
            ),
        }
        jobs, token = pages[request.page_token]
        return pb.ListJobHistoryResponse(jobs=jobs, next_page_token=token)


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with serving(FakeApi()) as servicer:
        yield servicer
        servicer.hang.clear()


def event(task: str, data: bytes = b"", offset: int = 0, **kw: object) -> pb.TaskLogEvent:
    return pb.TaskLogEvent(task_id=task, data=data, offset=offset, **kw)  # type: ignore[arg-type]


def test_follow_one_task_prints_its_output_as_it_is_and_the_dropped_marker(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.events = [
        event("train/w-0", b"step 1\nst", offset=100, dropped_bytes=100),
        event("train/w-0", "ep 2 \u00e9".encode()[:-1], offset=110),  # a character split in two
        event("train/w-0", "\u00e9".encode()[1:] + b"\n", offset=117),
        event("train/w-0", offset=119, eof=True),
    ]
    code, out, _ = run(api, capsys, "logs", "-f", "train/w-0")
    assert code == 0
    assert out == "[... 100 bytes dropped]\nstep 1\nstep 2 \u00e9\n"
    assert api.follows[-1].job_id == "train"
    assert api.follows[-1].task_id == "train/w-0"
    code, out, _ = run(api, capsys, "logs", "train", "w-0", "--follow")  # the other spelling
    assert code == 0
    assert api.follows[-1].task_id == "train/w-0"


def test_follow_a_job_heads_each_switch_of_task(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.events = [
        event("train/w-0", b"a1\n"),
        event("train/w-1", b"b1 no newline"),
        event("train/w-0", b"a2\n", offset=3),
        event("train/w-0", offset=6, eof=True),
        event("train/w-1", offset=13, eof=True),
    ]
    code, out, _ = run(api, capsys, "logs", "-f", "train")
    assert code == 0
    assert out == (
        "==> train/w-0 <==\na1\n==> train/w-1 <==\nb1 no newline\n==> train/w-0 <==\na2\n"
    )
    code, out, _ = run(api, capsys, "logs", "-f", "train", "-o", "json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(e["task_id"], e["eof"]) for e in lines][-2:] == [
        ("train/w-0", True),
        ("train/w-1", True),
    ]


def test_logs_without_follow_print_the_dropped_marker(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(api, capsys, "logs", "train/w-0")
    assert code == 0
    assert out == "[... 4000 bytes dropped]\ntail\n"
    code, _, err = run(api, capsys, "logs", "train/w-0", "w-1")
    assert code == 2
    assert "give the task once" in err


CLI_WITH_DEFAULT_SIGINT = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from clients.cli import main; sys.exit(main())"
)


def test_ctrl_c_ends_a_follow_cleanly(api: FakeApi) -> None:
    api.events = [event("train/w-0", b"first line\n")]
    api.hang.set()
    proc = subprocess.Popen(
        # A user's terminal gives the CLI Ctrl-C at its default; a suite run from a background
        # job of a non-interactive shell hands its children SIGINT ignored, which the CLI (as
        # Python does) would keep: the child is started with the default restored. faulthandler:
        # a CLI that does not end is made to show where it waits (SIGABRT below).
        [sys.executable, "-X", "faulthandler", "-c", CLI_WITH_DEFAULT_SIGINT, "--server"]
        + [api.address, "logs", "-f", "train/w-0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"first line\n"
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:  # say where it waits
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=20)
            pytest.fail(
                "muster logs -f still runs 20 s after SIGINT; its threads:\n" + err.decode()
            )
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert b"Traceback" not in err
    assert out == b""


def test_history_table_and_filters(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        api, capsys, "history", "--since", "2h", "--state", "failed", "--owner", "ann"
    )
    assert code == 0
    request = api.history[0]
    assert request.owner == "ann"
    assert list(request.phases) == [pb.JOB_PHASE_FAILED]
    assert abs(request.finished_after.seconds - (time.time() - 7200)) < 60
    assert not request.HasField("finished_before")
    lines = out.splitlines()
    assert lines[0].split() == [
        "JOB",
        "OWNER",
        "QUEUE",
        "STATE",
        "SUBMIT",
        "START",
        "END",
        "ELAPSED",
        "CPU-S",
        "REQ",
        "CPU-S",
        "USED",
        "GPU-S",
        "REQ",
        "GPU-S",
        "USED",
        "EXIT",
        "REQUEUES",
    ]
    # Every page; the owner is matched here too (the server did it already, this fake does not).
    assert [line.split()[0] for line in lines[1:]] == ["a", "c"]
    a = lines[1].split()
    assert a[1:4] == ["ann", "ml", "Completed"]
    assert a[7:] == ["2m", "500", "480", "250", "240", "0", "0"]
    assert lines[2].split()[-2:] == ["0x1,3x1", "2"]


def test_history_several_values_are_matched_here_and_json_is_the_api_objects(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        api, capsys, "history", "--queue", "ml", "--queue", "other", "--limit", "1", "-o", "json"
    )
    assert code == 0
    assert api.history[0].queue == ""
    assert [e["job_id"] for e in json.loads(out)] == ["a"]
    code, out, _ = run(
        api, capsys, "history", "--no-headers", "-o", "custom-columns=ID:.job_id,CPU:.used.cpu"
    )
    assert out.splitlines() == ["a   480.5", "b   480.5", "c   480.5"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--since", "yesterday"], "--since: 'yesterday' is not a time"),
        (["--state", "running"], "--state: 'running' is not one of completed, failed, cancelled"),
        (["--since", "1h", "--until", "2h"], "--until: must be later than --since"),
        (["--limit", "0"], "--limit: 0 must be at least 1"),
    ],
)
def test_history_bad_flags_exit_2(
    api: FakeApi, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run(api, capsys, "history", *argv)
    assert code == 2
    assert message in err
    assert not api.history


def test_parse_time() -> None:
    now = 1_700_000_000.0
    assert parse_time("90s", "--since", now) == now - 90
    assert parse_time("1d12h", "--since", now) == now - 1.5 * 86400
    assert parse_time("now", "--until", now) == now
    assert parse_time("2023-11-14T22:13:20+00:00", "--since", now) == now
    assert parse_time("2023-11-14T22:13:20Z", "--since", now) == now
