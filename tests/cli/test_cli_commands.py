"""`muster` CLI against a small synchronous fake server: output, paging, flags, error mapping."""

from __future__ import annotations

import json

import grpc
import pytest
from cli_helpers import run, serving

from clients import cli
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc


class FakeClientApi(pb_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self.submitted: list[pb.JobSpec] = []
        self.batches: list[int] = []
        self.log_requests: list[pb.GetTaskLogsRequest] = []
        self.queues = {"default": pb.Queue(name="default", weight=1)}
        self.list_requests: list[pb.ListJobsRequest] = []
        self.jobs = [
            pb.Job(
                spec=pb.JobSpec(id=f"job-{i}", queue="default", namespace="default"),
                status=pb.JobStatus(phase=pb.JOB_PHASE_RUNNING, running=2),
            )
            for i in range(5)
        ]

    def SubmitJob(self, request, context):
        if request.job.queue == "nope":
            context.abort(grpc.StatusCode.NOT_FOUND, "job.queue: queue 'nope' does not exist")
        self.submitted.append(request.job)
        return pb.SubmitJobResponse(job=pb.Job(spec=request.job), created=True)

    def SubmitJobs(self, request, context):
        self.batches.append(len(request.jobs))
        for i, job in enumerate(request.jobs):
            if job.queue == "nope":
                context.abort(
                    grpc.StatusCode.NOT_FOUND, f"jobs[{i}].job.queue: queue 'nope' does not exist"
                )
        self.submitted.extend(request.jobs)
        return pb.SubmitJobsResponse(
            results=[pb.SubmitJobResponse(job=pb.Job(spec=j), created=True) for j in request.jobs]
        )

    def ListJobs(self, request, context):
        self.list_requests.append(request)
        start = int(request.page_token or 0)
        page = self.jobs[start : start + 2]
        token = str(start + 2) if start + 2 < len(self.jobs) else ""
        return pb.ListJobsResponse(jobs=page, next_page_token=token)

    def GetJob(self, request, context):
        if request.id != "pending-1":
            context.abort(grpc.StatusCode.NOT_FOUND, f"id: job {request.id!r} not found")
        return pb.Job(
            spec=pb.JobSpec(id="pending-1", queue="default", min_member=4),
            status=pb.JobStatus(
                phase=pb.JOB_PHASE_INQUEUE,
                pending=4,
                conditions=[
                    pb.Condition(
                        type="Unschedulable",
                        status="True",
                        reason="NotEnoughResources",
                        message="0/3 nodes available: 3 insufficient cpu",
                    )
                ],
            ),
            tasks=[
                pb.Task(id=f"pending-1/w-{i}", role="w", status=pb.TASK_STATUS_PENDING)
                for i in range(4)
            ],
        )

    def Explain(self, request, context):
        return pb.ExplainResponse(
            job_id=request.job_id,
            phase=pb.JOB_PHASE_INQUEUE,
            cycle_id=7,
            gate="gang",
            summary="0/3 nodes available: 3 insufficient cpu",
            node_reasons={"insufficient cpu": 3},
        )

    def CancelJob(self, request, context):
        if request.id == "ghost":
            context.abort(grpc.StatusCode.NOT_FOUND, f"id: job {request.id!r} not found")
        return pb.CancelJobResponse(
            job=pb.Job(
                spec=pb.JobSpec(id=request.id), status=pb.JobStatus(phase=pb.JOB_PHASE_CANCELLED)
            )
        )

    def GetTaskLogs(self, request, context):
        self.log_requests.append(request)
        logs = [
            pb.TaskLog(task_id="train/w-0", data=b"hello\n", eof=True),
            pb.TaskLog(task_id="train/w-1", data=b"tail", truncated=True),
        ]
        return pb.GetTaskLogsResponse(
            logs=[entry for entry in logs if request.task_id in ("", entry.task_id)]
        )

    def ListQueues(self, request, context):
        return pb.ListQueuesResponse(queues=[pb.QueueView(queue=q) for q in self.queues.values()])

    def UpdateQueue(self, request, context):
        if request.queue.name not in self.queues:
            context.abort(
                grpc.StatusCode.NOT_FOUND, f"queue.name: queue {request.queue.name!r} not found"
            )
        self.queues[request.queue.name] = request.queue
        return request.queue

    def CreateQueue(self, request, context):
        self.queues[request.queue.name] = request.queue
        return request.queue

    def Simulate(self, request, context):
        if "bad" in request.scenario:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "nodes[0].allocatable.cpu: '4x' is not a quantity\njobs[1].queue: unknown queue 'q'",
            )
        return pb.SimulateResponse(
            result_json=json.dumps({"binds": {"ns/p": "n1"}, "tasks": {}, "jobs": {}})
        )


@pytest.fixture
def api():
    with serving(FakeClientApi()) as servicer:
        yield servicer


def test_submit_many_jobs_from_one_file(api, capsys, tmp_path):
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "jobs:\n  - {id: a, tasks: [{role: w, replicas: 2, request: {cpu: 1}}]}\n"
        "  - {id: b, tasks: [{role: w, replicas: 1, request: {cpu: 1}}]}\n"
    )
    code, out, _ = run(api, capsys, "submit", str(path), "-o", "json")
    assert code == 0
    assert [j["id"] for j in json.loads(out)] == ["a", "b"]
    assert [s.id for s in api.submitted] == ["a", "b"]
    assert api.batches == [2]
    # A refused job refuses the batch: nothing of it is submitted, the error names the job.
    path.write_text(
        "jobs:\n  - {id: c, tasks: [{role: w, replicas: 1, request: {cpu: 1}}]}\n"
        "  - {id: d, queue: nope, tasks: [{role: w, replicas: 1, request: {cpu: 1}}]}\n"
    )
    code, _, err = run(api, capsys, "submit", str(path))
    assert code == 1
    assert "jobs[1].job.queue" in err
    assert [s.id for s in api.submitted] == ["a", "b"]


def test_submit_bad_file_exits_2_one_line_per_problem_and_sends_nothing(api, capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("- {id: a, tasks: [{role: w, request: {cpu: 2x}}]}\n- {tasks: [{role: w}]}\n")
    code, _, err = run(api, capsys, "submit", str(path))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 2
    assert all(line.startswith("error: ") for line in lines)
    assert "jobs[0].tasks[0].request.cpu" in lines[0]
    assert "jobs[1].id" in lines[1]
    assert api.submitted == []


def test_grpc_error_is_one_line_with_code(api, capsys, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("{id: a, queue: nope, tasks: [{role: w, request: {cpu: 1}}]}")
    code, _, err = run(api, capsys, "submit", str(path))
    assert code == 1
    assert err.strip() == "error: NOT_FOUND: job.queue: queue 'nope' does not exist"
    code, _, err = run(api, capsys, "job", "missing")
    assert code == 1
    assert err.startswith("error: NOT_FOUND: id:")
    assert "Traceback" not in err


def test_jobs_follows_pages_and_passes_filters(api, capsys):
    code, out, _ = run(
        api, capsys, "jobs", "--queue", "default", "--phase", "running", "-o", "json"
    )
    assert code == 0
    assert [j["spec"]["id"] for j in json.loads(out)] == [f"job-{i}" for i in range(5)]
    assert len(api.list_requests) == 3
    assert api.list_requests[0].queue == "default"
    assert list(api.list_requests[0].phases) == [pb.JOB_PHASE_RUNNING]
    code, _, err = run(api, capsys, "jobs", "--phase", "sleeping")
    assert code == 2
    assert "--phase" in err


def test_job_shows_conditions_tasks_and_why_pending(api, capsys):
    code, out, _ = run(api, capsys, "job", "pending-1")
    assert code == 0
    assert "Unschedulable=True NotEnoughResources: 0/3 nodes available: 3 insufficient cpu" in out
    assert "pending-1/w-3" in out
    assert "Why pending (cycle 7, gate gang)" in out
    code, out, _ = run(api, capsys, "job", "pending-1", "-o", "json")
    data = json.loads(out)
    assert data["explain"]["gate"] == "gang"
    assert len(data["tasks"]) == 4


def test_queue_update_keeps_unspecified_fields(api, capsys):
    code, _, _ = run(
        api,
        capsys,
        "queue",
        "create",
        "research",
        "--weight",
        "3",
        "--capability",
        "cpu=64,memory=256Gi",
    )
    assert code == 0
    assert dict(api.queues["research"].capability.quantities) == {"cpu": "64", "memory": "256Gi"}
    code, _, _ = run(
        api, capsys, "queue", "update", "research", "--reclaimable", "false", "--state", "closing"
    )
    assert code == 0
    q = api.queues["research"]
    assert q.weight == 3
    assert q.reclaimable is False
    assert q.state == pb.QUEUE_STATE_CLOSING
    assert dict(q.capability.quantities) == {"cpu": "64", "memory": "256Gi"}
    code, _, err = run(api, capsys, "queue", "update", "research", "--deserved", "cpu")
    assert code == 2
    assert "--deserved" in err
    code, _, err = run(api, capsys, "queue", "update", "ghost", "--weight", "2")
    assert code == 1
    assert "NOT_FOUND" in err


def test_simulate_invalid_scenario_prints_each_problem(api, capsys, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("bad: true\n")
    code, _, err = run(api, capsys, "simulate", str(path))
    assert code == 2
    assert err.strip().splitlines() == [
        "nodes[0].allocatable.cpu: '4x' is not a quantity",
        "jobs[1].queue: unknown queue 'q'",
    ]
    path.write_text("ok: true\n")
    code, out, _ = run(api, capsys, "simulate", str(path), "--output", "json")
    assert code == 0
    assert json.loads(out)["binds"] == {"ns/p": "n1"}


def test_server_from_environment(api, capsys, monkeypatch):
    monkeypatch.setenv("MUSTER_SERVER", api.address)
    assert cli.main(["queues", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["queue"]["name"] == "default"


def test_json_is_the_documented_mapping_short_enums_and_every_field(api, capsys):
    """One output contract: enum values in short form (``Running``, not ``JOB_PHASE_RUNNING``), every
    field present (zeros and empty lists too), and nothing but the JSON on stdout."""
    code, out, _ = run(api, capsys, "jobs", "-o", "json")
    job = json.loads(out)[0]
    assert job["status"]["phase"] == "Running"
    assert job["status"]["pending"] == 0
    assert job["status"]["failed"] == 0
    assert job["tasks"] == []
    assert job["spec"]["owner"] == ""
    assert "tyjob" not in job["spec"]
    code, out, _ = run(api, capsys, "job", "pending-1", "-o", "json")
    data = json.loads(out)
    assert {t["status"] for t in data["tasks"]} == {"Pending"}


def test_jobs_table_has_times_a_one_word_reason_and_wide_adds_the_message(api, capsys):
    api.jobs[0].status.submit_time.FromSeconds(1_700_000_000)
    api.jobs[0].status.conditions.add(
        type="Unschedulable",
        status="True",
        reason="NotEnoughResources",
        message="0/3 nodes are unavailable: 3 Insufficient cpu.",
    )
    code, out, _ = run(api, capsys, "jobs")
    header = out.splitlines()[0].split()
    # Off a terminal (capsys): plain columns, no box characters.
    assert header == ["JOB", "QUEUE", "OWNER", "PHASE", "RUNNING", "SUBMIT", "AGE", "REASON"]
    assert "NotEnoughResources" in out
    assert "Insufficient cpu" not in out
    assert "2023-11-14" in out  # the submit time (not today): date and time
    code, out, _ = run(api, capsys, "jobs", "-o", "wide")
    assert "MESSAGE" in out
    assert "3 Insufficient cpu" in out
    assert "NAMESPACE" in out


def test_jobs_filters_repeat_and_sort(api, capsys):
    for i, job in enumerate(api.jobs):
        job.spec.queue = "a" if i % 2 else "b"
        job.spec.owner = "ann" if i < 2 else "bob"
    code, out, _ = run(
        api,
        capsys,
        "jobs",
        "--queue",
        "a",
        "--queue",
        "b",
        "--owner",
        "ann",
        "--sort=-id",
        "-o",
        "json",
    )
    assert [j["spec"]["id"] for j in json.loads(out)] == ["job-1", "job-0"]
    assert api.list_requests[-1].queue == ""
    assert api.list_requests[-1].owner == "ann"
    run(api, capsys, "jobs", "--owner", "bob", "-o", "json")
    assert api.list_requests[-1].owner == "bob"  # one value: the server filters
    code, _, err = run(api, capsys, "jobs", "--sort", "size")
    assert code == 2
    assert "--sort" in err


def test_cancel_takes_several_ids_and_reports_each(api, capsys):
    code, out, _ = run(api, capsys, "cancel", "a", "ghost", "b")
    assert code == 1
    assert out.splitlines() == [
        "a: Cancelled",
        "ghost: error: NOT_FOUND: id: job 'ghost' not found",
        "b: Cancelled",
    ]


def test_weight_zero_is_refused_version_and_completion(api, capsys):
    code, _, err = run(api, capsys, "queue", "create", "q0", "--weight", "0")
    assert code == 2
    assert "--weight: 0 must be at least 1" in err
    assert "q0" not in api.queues
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("muster ")
    assert cli.main(["completion", "bash"]) == 0
    assert "complete" in capsys.readouterr().out  # a bash completion script


def test_an_unreachable_server_gets_a_hint(capsys):
    code = cli.main(["--server", "127.0.0.1:9", "--timeout", "2", "jobs"])
    err = capsys.readouterr().err
    assert code == 1
    assert "UNAVAILABLE" in err
    assert "--server" in err
    assert "MUSTER_SERVER" in err


def test_simulate_local_prints_only_json_on_stdout_even_with_logs(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MUSTER_LOG_LEVEL", "debug")  # the core logs every cycle at debug
    path = tmp_path / "s.yaml"
    path.write_text(
        "nodes: [{name: n1, allocatable: {cpu: '2'}}]\njobs: [{name: a, tasks: [{name: a0, request: {cpu: '1'}}]}]\n"
    )
    assert cli.main(["simulate", "--local", str(path), "-o", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["binds"] == {"default/a0": "n1"}  # nothing else on stdout


def test_logs_prints_each_tasks_output_under_a_header(api, capsys):
    code, out, _ = run(api, capsys, "logs", "train")
    assert code == 0
    assert (
        out
        == "==> train/w-0 <==\nhello\n==> train/w-1 <==\n[earlier output dropped: the server keeps the last 64 KiB]\ntail\n"
    )
    code, out, _ = run(api, capsys, "logs", "train", "w-1")
    assert code == 0
    assert api.log_requests[-1].task_id == "train/w-1"


@pytest.fixture(autouse=True)
def _restore_logging():
    """cli.main configures the process's logging, as the command does; later tests get it back."""
    import structlog

    yield
    structlog.reset_defaults()
