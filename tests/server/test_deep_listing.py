"""Listing a deep job table (issue 29): ListJobs starts a page at its token in O(log n) (the job
table's creation-order index), and WatchJobs reads its initial events a chunk at a time as it
sends them, dropping the queued events those made stale."""

from __future__ import annotations

import anyio
import pytest
from server_test_helpers import gang

from muster.v1 import muster_pb2 as pb
from server.service import commands
from server.service.api import queries
from server.service.decisions import DecisionLog
from server.service.records import JobRecord
from server.service.state import ClusterState
from server.service.tables import JobTable


def record(job_id: str, creation_index: int) -> JobRecord:
    state = ClusterState(DecisionLog())
    commands.submit_job(state, gang(job_id, replicas=1))
    rec = state.jobs[job_id]
    rec.creation_index = creation_index
    return rec


def test_the_job_table_keeps_its_creation_order_index() -> None:
    table = JobTable()
    for job_id, index in [("c", 3), ("a", 1), ("e", 5), ("b", 2), ("d", 4)]:
        table[job_id] = record(job_id, index)
    assert [r.id for r in table.created_after(0)] == ["a", "b", "c", "d", "e"]
    assert [r.id for r in table.created_after(2)] == ["c", "d", "e"]
    assert [r.id for r in table.created_after(5)] == []
    del table["c"]
    table["b"] = record("b", 2)  # replaced: still once
    assert [r.id for r in table.created_after(1)] == ["b", "d", "e"]
    table.clear()
    assert list(table.created_after(0)) == []


def test_list_jobs_pages_follow_the_index() -> None:
    state = ClusterState(DecisionLog())
    for i in range(7):
        commands.submit_job(state, gang(f"j{i}", replicas=1))
    seen: list[str] = []
    token = ""
    while True:
        page = queries.list_jobs(state, pb.ListJobsRequest(page_size=3, page_token=token))
        seen += [j.spec.id for j in page.jobs]
        if not page.next_page_token:
            break
        token = page.next_page_token
    assert seen == [f"j{i}" for i in range(7)]


async def test_initial_events_are_read_as_sent_and_queued_stale_ones_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(queries, "INITIAL_CHUNK", 4)
    state = ClusterState(DecisionLog())
    for i in range(11):
        commands.submit_job(state, gang(f"j{i}", replicas=1))
    state.commit()
    sub, initial = queries.watch_jobs(state, pb.WatchJobsRequest(send_initial=True))
    stream = queries.watch_stream(initial, sub)
    events = [await anext(stream), await anext(stream)]
    assert [e.job.spec.id for e in events] == ["j0", "j1"]
    # While the initial events are being sent, j0 (sent) and j9 (not yet) are cancelled.
    commands.cancel_job(state, "j0")
    commands.cancel_job(state, "j9")
    state.commit()
    with anyio.fail_after(5):
        while len(events) < 12:
            events.append(await anext(stream))
    ids = [e.job.spec.id for e in events]
    assert ids == [f"j{i}" for i in range(11)] + ["j0"]
    j9 = events[9]
    assert (j9.type, j9.job.status.phase) == (pb.JobEvent.TYPE_ADDED, pb.JOB_PHASE_CANCELLED)
    last = events[-1]
    assert (last.type, last.job.status.phase) == (
        pb.JobEvent.TYPE_MODIFIED,
        pb.JOB_PHASE_CANCELLED,
    )
    # j9's queued MODIFIED event is older than its ADDED one: dropped, nothing else comes.
    with anyio.move_on_after(0.2) as idle:
        await anext(stream)
    assert idle.cancelled_caught
    state.watch.unsubscribe(sub)
