"""`muster jobs --start` (squeue --start), and the start estimate in `muster job` and `muster
explain` (docs/plugins/reservation.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from cli_helpers import run, serving
from test_cli_commands import FakeClientApi, api  # noqa: F401 - the fixture

from clients.render import estimate_line, node_list, start_time_text
from muster.v1 import muster_pb2 as pb

SOON = int(time.time()) + 2 * 3600


def waiting(fake: FakeClientApi) -> None:
    """job-0 reserved on 8 nodes, job-1 estimated on 2, job-2 with no estimate; the rest run."""
    fake.jobs[0].status.phase = pb.JOB_PHASE_INQUEUE
    fake.jobs[0].status.estimated_start.FromSeconds(SOON + 3600)
    fake.jobs[0].status.estimated_nodes.extend([f"n{i}" for i in range(1, 9)])
    fake.jobs[0].status.reserved = True
    fake.jobs[1].status.phase = pb.JOB_PHASE_INQUEUE
    fake.jobs[1].status.estimated_start.FromSeconds(SOON)
    fake.jobs[1].status.estimated_nodes.extend(["n3", "n4"])
    fake.jobs[2].status.phase = pb.JOB_PHASE_PENDING
    fake.jobs[2].status.estimate_note = "no estimate: running tasks have no time limit"


def test_jobs_start_lists_waiting_jobs_soonest_first(api, capsys):  # noqa: F811
    waiting(api)
    code, out, err = run(api, capsys, "jobs", "--start")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["JOB", "QUEUE", "PHASE", "START", "NODES", "SCHEDNODES", "NOTE"]
    # The server was asked for the waiting phases only.
    assert list(api.list_requests[-1].phases) == [pb.JOB_PHASE_PENDING, pb.JOB_PHASE_INQUEUE]
    ids = [line.split()[0] for line in lines[1:]]
    assert ids[:3] == ["job-1", "job-0", "job-2"]  # soonest first, no estimate last
    first = lines[1].split()
    assert first[3] == time.strftime("%H:%M", time.localtime(SOON))
    assert first[4:7] == ["2", "n3..n4", "estimated"]
    reserved = next(line for line in lines if line.startswith("job-0"))
    assert "n1..n8" in reserved
    assert reserved.rstrip().endswith("reserved")
    none = next(line for line in lines if line.startswith("job-2"))
    assert "no estimate: running tasks have no time limit" in none


def test_jobs_start_limit_keeps_the_soonest(api, capsys):  # noqa: F811
    """--limit cuts the soonest-first list: every waiting job is read and sorted first (not the
    first N in submission order, sorted after)."""
    waiting(api)
    code, out, err = run(api, capsys, "jobs", "--start", "--limit", "1")
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["job-1"]


class Reserved(FakeClientApi):
    """The fake API, its pending job reserved on 8 nodes."""

    def GetJob(self, request: pb.GetJobRequest, context: grpc.ServicerContext) -> pb.Job:
        job = super().GetJob(request, context)
        job.status.estimated_start.FromSeconds(SOON)
        job.status.estimated_nodes.extend([f"n{i}" for i in range(1, 9)])
        job.status.reserved = True
        return job

    def Explain(
        self, request: pb.ExplainRequest, context: grpc.ServicerContext
    ) -> pb.ExplainResponse:
        exp = super().Explain(request, context)
        exp.estimated_start.FromSeconds(SOON)
        exp.estimated_nodes.extend([f"n{i}" for i in range(1, 9)])
        exp.reserved = True
        return exp


@pytest.fixture
def reserved() -> Iterator[Reserved]:
    with serving(Reserved()) as servicer:
        yield servicer


def test_job_and_explain_show_the_reservation(reserved, capsys):  # noqa: F811
    when = time.strftime("%H:%M", time.localtime(SOON))
    code, out, _ = run(reserved, capsys, "job", "pending-1")
    assert code == 0
    assert f"Start: reserved: 8 nodes from {when} (n1..n8)" in out
    assert out.count("reserved: 8 nodes") == 1  # once, not again under the explanation
    code, out, _ = run(reserved, capsys, "explain", "pending-1")
    assert code == 0
    assert f"Start: reserved: 8 nodes from {when} (n1..n8)" in out


def test_estimate_texts() -> None:
    st = pb.JobStatus(estimate_note="no estimate: not admitted yet (enqueue)")
    assert estimate_line(st) == "no estimate: not admitted yet (enqueue)"
    assert estimate_line(pb.JobStatus()) == ""
    st = pb.JobStatus(estimated_nodes=["a"], reserved=False)
    st.estimated_start.FromSeconds(1_000_000)
    assert estimate_line(st, now=1_000_000 - 60).startswith("estimated: ")
    assert estimate_line(st, now=1_000_000 - 60).endswith("on 1 node (a)")
    assert start_time_text(st.estimated_start, now=0).count(" ") == 2  # far off: the date too
    assert node_list(["n1", "n2", "n3", "x", "n5"]) == "n1..n3,x,n5"
    assert node_list([]) == "-"
