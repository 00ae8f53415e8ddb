"""The queue window on the server (issue 29): with ``maxQueueLookback`` a cycle opens only the first
waiting jobs of each queue; the others get no outcome in it, and Explain says why from the cycle's
record of each queue's window (server.service.api.queries, ``ClusterState.last_window``)."""

from __future__ import annotations

from server_test_helpers import node, rl

from muster.v1 import muster_pb2 as pb
from server.config import DEFAULT_CONFIG_YAML, load_config
from server.model import BeyondWindow, WaitingSummary
from server.scheduler import SchedulerCore
from server.service import commands, control, ingest, snapshot
from server.service.api import queries
from server.service.apply import apply_result
from server.service.decisions import DecisionLog
from server.service.state import ClusterState
from server.session.window import summarize

CONFIG = load_config(DEFAULT_CONFIG_YAML + "session: {maxQueueLookback: 2}\n")


def one_cpu(job_id: str) -> pb.JobSpec:
    return pb.JobSpec(
        id=job_id, task_groups=[pb.TaskGroup(role="w", replicas=1, request=rl(cpu="1"))]
    )


async def cycle(state: ClusterState) -> int:
    capture = snapshot.capture(state)
    result = SchedulerCore(CONFIG).run_cycle(capture.materialize(), capture.cycle_id)
    await apply_result(state, capture, result)
    return capture.cycle_id


async def test_explain_names_the_window_a_job_waited_past() -> None:
    state = ClusterState(DecisionLog(bind_timeout=30))
    ingest.register_backend(state, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(state, pb.SyncSnapshotRequest(backend="a", nodes=[node("n0", cpu="2")]))
    for i in range(5):
        commands.submit_job(state, one_cpu(f"j{i}"))
    first = await cycle(state)
    assert state.last_window == (first, {"default": BeyondWindow(2, 3, "j2")})
    assert "placed" in queries.explain(state, "j0").summary
    waiting = queries.explain(state, "j3")
    assert waiting.gate == "queue"
    assert waiting.cycle_id == first
    assert waiting.summary == (
        f"queue default: not considered in cycle {first}, which opened the first 2 waiting jobs "
        "of the queue (maxQueueLookback); 3 jobs wait past them"
    )

    # j0 and j1 hold the node: j2 and j3 are the first two waiting jobs now, and find no room.
    second = await cycle(state)
    assert state.last_window == (second, {"default": BeyondWindow(2, 1, "j4")})
    found = queries.explain(state, "j2")
    assert found.cycle_id == second
    assert "maxQueueLookback" not in found.summary
    assert f"not considered in cycle {second}" in queries.explain(state, "j4").summary

    # A job job control keeps out of cycles says so, not that it waited past the window.
    control.hold(state, "j4", "alice", admin=False)
    await cycle(state)
    assert "maxQueueLookback" not in queries.explain(state, "j4").summary


def test_the_snapshot_carries_each_jobs_waiting_summary() -> None:
    state = ClusterState(DecisionLog(bind_timeout=30))
    for i in range(3):
        commands.submit_job(state, one_cpu(f"j{i}"))
    resident = snapshot.ResidentState()
    resident.apply(snapshot.DeltaSender().delta(snapshot.capture(state)))
    jobs = resident.materialize().jobs
    assert [j.waiting for j in jobs] == [summarize(j.tasks) for j in jobs]
    assert jobs[0].waiting == WaitingSummary(0, {"cpu": 1000.0})
