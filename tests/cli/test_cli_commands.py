"""`muster` CLI against a small synchronous fake server: output, paging, flags, error mapping."""

from __future__ import annotations

import json
from concurrent import futures

import grpc
import pytest

from clients import cli
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc


class FakeClientApi(pb_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self.submitted: list[pb.JobSpec] = []
        self.queues = {"default": pb.Queue(name="default", weight=1)}
        self.list_requests: list[pb.ListJobsRequest] = []
        self.jobs = [
            pb.Job(spec=pb.JobSpec(id=f"job-{i}", queue="default", namespace="default"),
                   status=pb.JobStatus(phase=pb.JOB_PHASE_RUNNING, running=2))
            for i in range(5)
        ]

    def SubmitJob(self, request, context):  # noqa: N802
        if request.job.queue == "nope":
            context.abort(grpc.StatusCode.NOT_FOUND, "job.queue: queue 'nope' does not exist")
        self.submitted.append(request.job)
        return pb.SubmitJobResponse(job=pb.Job(spec=request.job), created=True)

    def ListJobs(self, request, context):  # noqa: N802
        self.list_requests.append(request)
        start = int(request.page_token or 0)
        page = self.jobs[start : start + 2]
        token = str(start + 2) if start + 2 < len(self.jobs) else ""
        return pb.ListJobsResponse(jobs=page, next_page_token=token)

    def GetJob(self, request, context):  # noqa: N802
        if request.id != "pending-1":
            context.abort(grpc.StatusCode.NOT_FOUND, f"id: job {request.id!r} not found")
        return pb.Job(
            spec=pb.JobSpec(id="pending-1", queue="default", min_member=4),
            status=pb.JobStatus(
                phase=pb.JOB_PHASE_INQUEUE,
                pending=4,
                conditions=[pb.Condition(type="Unschedulable", status="True", reason="NotEnoughResources",
                                         message="0/3 nodes available: 3 insufficient cpu")],
            ),
            tasks=[pb.Task(id=f"pending-1/w-{i}", role="w", status=pb.TASK_STATUS_PENDING) for i in range(4)],
        )

    def Explain(self, request, context):  # noqa: N802
        return pb.ExplainResponse(job_id=request.job_id, phase=pb.JOB_PHASE_INQUEUE, cycle_id=7, gate="gang",
                                  summary="0/3 nodes available: 3 insufficient cpu",
                                  node_reasons={"insufficient cpu": 3})

    def ListQueues(self, request, context):  # noqa: N802
        return pb.ListQueuesResponse(queues=[pb.QueueView(queue=q) for q in self.queues.values()])

    def UpdateQueue(self, request, context):  # noqa: N802
        if request.queue.name not in self.queues:
            context.abort(grpc.StatusCode.NOT_FOUND, f"queue.name: queue {request.queue.name!r} not found")
        self.queues[request.queue.name] = request.queue
        return request.queue

    def CreateQueue(self, request, context):  # noqa: N802
        self.queues[request.queue.name] = request.queue
        return request.queue

    def Simulate(self, request, context):  # noqa: N802
        if "bad" in request.scenario:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "nodes[0].allocatable.cpu: '4x' is not a quantity\njobs[1].queue: unknown queue 'q'")
        return pb.SimulateResponse(result_json=json.dumps({"binds": {"ns/p": "n1"}, "tasks": {}, "jobs": {}}))


@pytest.fixture
def api():
    servicer = FakeClientApi()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_SchedulerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.address = f"127.0.0.1:{port}"
    yield servicer
    server.stop(grace=None)


def run(api, capsys, *argv):
    code = cli.main(["--server", api.address, *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_submit_many_jobs_from_one_file(api, capsys, tmp_path):
    path = tmp_path / "jobs.yaml"
    path.write_text("jobs:\n  - {id: a, tasks: [{role: w, replicas: 2, request: {cpu: 1}}]}\n"
                    "  - {id: b, tasks: [{role: w, replicas: 1, request: {cpu: 1}}]}\n")
    code, out, _ = run(api, capsys, "submit", str(path), "-o", "json")
    assert code == 0
    assert [j["id"] for j in json.loads(out)] == ["a", "b"]
    assert [s.id for s in api.submitted] == ["a", "b"]


def test_submit_bad_file_exits_2_one_line_per_problem_and_sends_nothing(api, capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("- {id: a, tasks: [{role: w, request: {cpu: 2x}}]}\n- {tasks: [{role: w}]}\n")
    code, _, err = run(api, capsys, "submit", str(path))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("error: ") for line in lines)
    assert "jobs[0].tasks[0].request.cpu" in lines[0] and "jobs[1].id" in lines[1]
    assert api.submitted == []


def test_grpc_error_is_one_line_with_code(api, capsys, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("{id: a, queue: nope, tasks: [{role: w, request: {cpu: 1}}]}")
    code, _, err = run(api, capsys, "submit", str(path))
    assert code == 1
    assert err.strip() == "error: NOT_FOUND: job.queue: queue 'nope' does not exist"
    code, _, err = run(api, capsys, "job", "missing")
    assert code == 1 and err.startswith("error: NOT_FOUND: id:") and "Traceback" not in err


def test_jobs_follows_pages_and_passes_filters(api, capsys):
    code, out, _ = run(api, capsys, "jobs", "--queue", "default", "--phase", "running", "-o", "json")
    assert code == 0
    assert [j["spec"]["id"] for j in json.loads(out)] == [f"job-{i}" for i in range(5)]
    assert len(api.list_requests) == 3
    assert api.list_requests[0].queue == "default" and list(api.list_requests[0].phases) == [pb.JOB_PHASE_RUNNING]
    code, _, err = run(api, capsys, "jobs", "--phase", "sleeping")
    assert code == 2 and "--phase" in err


def test_job_shows_conditions_tasks_and_why_pending(api, capsys):
    code, out, _ = run(api, capsys, "job", "pending-1")
    assert code == 0
    assert "Unschedulable=True NotEnoughResources: 0/3 nodes available: 3 insufficient cpu" in out
    assert "pending-1/w-3" in out and "Why pending (cycle 7, gate gang)" in out
    code, out, _ = run(api, capsys, "job", "pending-1", "-o", "json")
    data = json.loads(out)
    assert data["explain"]["gate"] == "gang" and len(data["tasks"]) == 4


def test_queue_update_keeps_unspecified_fields(api, capsys):
    code, _, _ = run(api, capsys, "queue", "create", "research", "--weight", "3", "--capability", "cpu=64,memory=256Gi")
    assert code == 0
    assert dict(api.queues["research"].capability.quantities) == {"cpu": "64", "memory": "256Gi"}
    code, _, _ = run(api, capsys, "queue", "update", "research", "--reclaimable", "false", "--state", "closing")
    assert code == 0
    q = api.queues["research"]
    assert q.weight == 3 and q.reclaimable is False and q.state == pb.QUEUE_STATE_CLOSING
    assert dict(q.capability.quantities) == {"cpu": "64", "memory": "256Gi"}
    code, _, err = run(api, capsys, "queue", "update", "research", "--deserved", "cpu")
    assert code == 2 and "--deserved" in err
    code, _, err = run(api, capsys, "queue", "update", "ghost", "--weight", "2")
    assert code == 1 and "NOT_FOUND" in err


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
    assert code == 0 and json.loads(out)["binds"] == {"ns/p": "n1"}


def test_server_from_environment(api, capsys, monkeypatch):
    monkeypatch.setenv("MUSTER_SERVER", api.address)
    assert cli.main(["queues", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["queue"]["name"] == "default"
