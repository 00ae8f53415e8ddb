"""Reservations through the server (the core, then apply; no network): a waiting gang's start
estimate and reservation in GetJob, ListJobs and Explain, the refusal of a job that would delay it,
and the same plan after a restart, recomputed from what the store kept (start times, time limits)."""

from __future__ import annotations

import math
from pathlib import Path

from server_test_helpers import node, rl, send_statuses

from muster.devices import NVIDIA_GPU
from muster.v1 import muster_pb2 as pb
from server.config import DEFAULT_CONFIG_YAML, load_config
from server.model import CycleResult
from server.scheduler import SchedulerCore
from server.service import commands, ingest, snapshot
from server.service.api import queries
from server.service.apply import apply
from server.service.decisions import DecisionLog
from server.service.state import ClusterState
from server.service.store import SqliteStore

CONFIG = (
    DEFAULT_CONFIG_YAML.replace(
        '"enqueue, allocate, backfill"', '"enqueue, allocate, backfill, reserve"'
    )
    + "  - name: reservation\n"
)
H = 3600


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def gpu_node(name: str) -> pb.Node:
    n = node(name, cpu="16", memory="64Gi")
    n.allocatable.quantities[NVIDIA_GPU] = "8"
    return n


def job(job_id: str, replicas: int, limit: int) -> pb.JobSpec:
    request = rl(cpu="1")
    request.quantities[NVIDIA_GPU] = "8"
    return pb.JobSpec(
        id=job_id,
        task_groups=[pb.TaskGroup(role="w", replicas=replicas, request=request)],
        time_limit_seconds=limit,
    )


def new_state(clock: Clock) -> ClusterState:
    state = ClusterState(DecisionLog(bind_timeout=30), clock=clock)
    ingest.register_backend(state, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(
        state, pb.SyncSnapshotRequest(backend="a", nodes=[gpu_node("g0"), gpu_node("g1")])
    )
    return state


def run_cycle(state: ClusterState) -> CycleResult:
    capture = snapshot.capture(state)
    result = SchedulerCore(load_config(CONFIG)).run_cycle(capture.materialize(), capture.cycle_id)
    apply(state, capture, result)
    return result


def start(state: ClusterState, *tasks: str) -> None:
    """The backend binds ``tasks`` and reports them running."""
    acks = [
        pb.DecisionAck(decision_id=p.row.id, applied=True)
        for p in list(state.decisions.pending.values())
        if p.row.task_id in tasks and p.row.kind == "bind"
    ]
    ingest.ack(state, pb.AckDecisionsRequest(backend="a", acks=acks), {})
    send_statuses(
        state, "a", [pb.TaskStatusUpdate(task_id=t, status=pb.TASK_STATUS_RUNNING) for t in tasks]
    )


def test_estimates_reservations_and_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    state = new_state(clock)
    commands.submit_job(state, job("r", 1, 2 * H))
    assert run_cycle(state).binds == {"r/w-0": "g0"}
    start(state, "r/w-0")
    started = state.jobs["r"].status.start_time
    assert started == clock.now
    clock.now += 600
    commands.submit_job(state, job("big", 2, H))
    commands.submit_job(state, job("long", 1, 5 * H))
    result = run_cycle(state)
    assert result.binds == {}  # long would delay big: g1 is reserved for it
    view = queries.get_job(state, "big")
    st = view.status
    assert st.reserved
    assert list(st.estimated_nodes) == ["g0", "g1"]
    assert st.estimated_start.seconds == math.ceil((started + 2 * H) / 60) * 60  # r's limit
    long = queries.explain(state, "long")
    assert any("would delay reservation of job big on nodes g0..g1" in r for r in long.node_reasons)
    assert long.HasField("estimated_start")
    assert not long.reserved
    assert long.estimated_start.seconds >= st.estimated_start.seconds + H
    explained = queries.explain(state, "big")
    assert explained.reserved
    assert list(explained.estimated_nodes) == ["g0", "g1"]
    listed = {j.spec.id: j for j in queries.list_jobs(state, pb.ListJobsRequest()).jobs}
    assert listed["big"].status.reserved

    # A restart: the estimates are not stored; the first cycle plans them again, the same.
    store = SqliteStore(str(tmp_path / "s.db"))
    try:
        store.write(state.commit())
        clock.now += 60
        again = ClusterState(DecisionLog(bind_timeout=30), clock=clock)
        again.restore(store.load())
        assert not queries.get_job(again, "big").status.HasField("estimated_start")
        ingest.register_backend(again, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
        running = [
            pb.BackendTask(
                task_id="r/w-0", node="g0", status=pb.TASK_STATUS_RUNNING, request=rl(cpu="1")
            )
        ]
        ingest.sync_snapshot(
            again,
            pb.SyncSnapshotRequest(
                backend="a", nodes=[gpu_node("g0"), gpu_node("g1")], tasks=running
            ),
        )
        assert again.jobs["r"].status.start_time == started  # persisted
        assert run_cycle(again).binds == {}
        after = queries.get_job(again, "big").status
        assert after.reserved
        assert after.estimated_start == st.estimated_start
        assert list(after.estimated_nodes) == ["g0", "g1"]
    finally:
        store.close()

    # r ends early: big starts at once, and its estimate is gone.
    send_statuses(
        state, "a", [pb.TaskStatusUpdate(task_id="r/w-0", status=pb.TASK_STATUS_SUCCEEDED)]
    )
    assert set(run_cycle(state).binds) == {"big/w-0", "big/w-1"}
    assert not queries.get_job(state, "big").status.HasField("estimated_start")
