"""The resident queue window (server.service.waiting, issue 29): with ``maxQueueLookback`` the
server keeps each queue's waiting jobs in order between cycles and captures only the window.

The reference is the cycle's own window: a capture of every job, opened by
``server.session.window.open_window``. After every step of a random life of the state
(submissions of jobs, arrays, dependent and held jobs in several queues, cycles that bind,
tasks that run and end, cancellations, releases, holds, a restart from the store), the capture the
index makes must open the same jobs in the same order, with the same queues' order and the same
jobs past each window, their requests summed alike.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from server_test_helpers import node, rl, send_statuses

from muster.v1 import muster_pb2 as pb
from server.config import DEFAULT_CONFIG_YAML, load_config
from server.model import TaskStatus, Window
from server.scheduler import SchedulerCore
from server.service import commands, control, ingest, snapshot
from server.service.apply import apply_result
from server.service.decisions import DecisionLog
from server.service.state import ClusterState
from server.service.store import SqliteStore
from server.session.window import open_window

LOOKBACK = 3
CONFIG = load_config(DEFAULT_CONFIG_YAML + f"session: {{maxQueueLookback: {LOOKBACK}}}\n")
QUEUES = ("default", "qa", "qb")


def new_state(store: SqliteStore | None = None) -> ClusterState:
    """A state with a backend of 3 nodes and the queues; ``store``: restored from it first."""
    state = ClusterState(DecisionLog(bind_timeout=30))
    if store is not None:
        state.restore(store.load())
    ingest.register_backend(state, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(
        state,
        pb.SyncSnapshotRequest(backend="a", nodes=[node(f"n{i}", cpu="4") for i in range(3)]),
    )
    for name in QUEUES[1:]:
        if name not in state.queues:
            commands.create_queue(state, pb.Queue(name=name, parent="root", weight=1))
    return state


def spec(rng: random.Random, job_id: str, ids: list[str]) -> pb.JobSpec:
    replicas = rng.randint(1, 3)
    out = pb.JobSpec(
        id=job_id,
        queue=rng.choice(QUEUES),
        priority=rng.randint(1, 10),
        min_member=rng.choice([0, 0, 1]),
        task_groups=[
            pb.TaskGroup(
                role="w",
                replicas=replicas,
                request=rl(cpu=rng.choice(["1", "2", "500m"]), memory="1Gi"),
            )
        ],
    )
    if rng.random() < 0.2:
        out.min_resources.CopyFrom(rl(cpu="1"))
    roll = rng.random()
    if roll < 0.08:
        out.hold = True
    elif roll < 0.16 and ids:
        out.depends_on.append(pb.JobDependency(job=rng.choice(ids), type="afterok"))
    elif roll < 0.22:
        out.array = f"0-{rng.randint(2, 5)}%2"
    return out


def resident(state: ClusterState) -> tuple[list[str], Window]:
    captured = snapshot.capture(state, CONFIG)
    assert captured.window is not None
    return [j.uid for j in captured.materialize().jobs], captured.window


def reference(state: ClusterState) -> tuple[list[str], Window]:
    opened, window = open_window(snapshot.capture(state).materialize(), CONFIG)
    return [j.uid for j in opened.jobs], window


def assert_same_window(state: ClusterState) -> None:
    # The passes over holding jobs (time limits, allocations) see every job that holds a task,
    # before a capture files the changes too.
    holding = {
        rec.id
        for rec in state.active_jobs.values()
        if any(t.status != TaskStatus.PENDING for t in rec.tasks)
    }
    assert holding <= {rec.id for rec in state.jobs_that_may_hold()}
    jobs, window = resident(state)
    want_jobs, want = reference(state)
    assert jobs == want_jobs
    assert window.queue_order == want.queue_order
    assert window.lookback == want.lookback
    assert set(window.beyond) == set(want.beyond)
    for name, past in window.beyond.items():
        expected = want.beyond[name]
        assert (past.jobs, past.first) == (expected.jobs, expected.first), name
        for got, wanted in ((past.request, expected.request), (past.inqueue, expected.inqueue)):
            for resource in set(got) | set(wanted):
                assert math.isclose(
                    got.get(resource, 0.0), wanted.get(resource, 0.0), abs_tol=1e-6
                ), (name, resource)


async def one_cycle(state: ClusterState) -> None:
    captured = snapshot.capture(state, CONFIG)
    result = SchedulerCore(CONFIG).run_cycle(captured.materialize(), captured.cycle_id)
    await apply_result(state, captured, result)


def report(state: ClusterState, task_ids: list[str], status: int) -> None:
    send_statuses(state, "a", [pb.TaskStatusUpdate(task_id=t, status=status) for t in task_ids])


@pytest.mark.parametrize("seed", range(6))
async def test_the_resident_window_opens_what_the_cycles_window_opens(seed: int) -> None:
    rng = random.Random(seed)
    store = SqliteStore(":memory:")
    state = new_state()
    ids: list[str] = []
    for _ in range(40):
        roll = rng.random()
        if roll < 0.45:
            for _ in range(rng.randint(1, 6)):
                job_id = f"j{len(ids)}"
                commands.submit(state, spec(rng, job_id, ids))
                ids.append(job_id)
        elif roll < 0.6:
            await one_cycle(state)
        elif roll < 0.75:  # placed tasks run, some end (ok or failed)
            placed = [t.uid for t in state.tasks.values() if t.status.name == "BINDING"]
            report(state, placed, pb.TASK_STATUS_RUNNING)
            running = [t.uid for t in state.tasks.values() if t.status.name == "RUNNING"]
            done = rng.sample(running, k=len(running) // 2)
            report(state, done, rng.choice([pb.TASK_STATUS_SUCCEEDED, pb.TASK_STATUS_FAILED]))
        elif roll < 0.85 and ids:
            target = state.jobs.get(rng.choice(ids))
            if target is not None and target.active:
                if target.status.hold:
                    control.release(state, target.id, "alice", admin=True)
                elif rng.random() < 0.5:
                    commands.cancel_job(state, target.id)
                elif not any(t.node for t in target.tasks):
                    control.hold(state, target.id, "alice", admin=True)
        elif roll < 0.9:  # a restart: the index files every job again
            store.write(state.commit())
            state = new_state(store)
        if rng.random() < 0.7:
            store.write(state.commit())  # (a capture also sees changes not committed yet)
        assert_same_window(state)
    assert len(state.waiting) > 0, "the index never held a job: the test proves nothing"
    # Filed once per state (a new one, each restart), then kept by the change set alone.
    assert state.waiting.rebuilds == 1
    # ... and then the passes over holding jobs skip the filed ones.
    assert len(list(state.jobs_that_may_hold())) < len(state.active_jobs)


def one_cpu(job_id: str) -> pb.JobSpec:
    return pb.JobSpec(
        id=job_id, task_groups=[pb.TaskGroup(role="w", replicas=1, request=rl(cpu="1"))]
    )


def test_a_capture_carries_only_the_window() -> None:
    state = new_state()
    for i in range(50):
        commands.submit(state, one_cpu(f"j{i:02d}"))
    state.commit()
    captured = snapshot.capture(state, CONFIG)
    assert [rec.id for rec, *_ in captured.jobs] == ["j00", "j01", "j02"]
    assert captured.window is not None
    past = captured.window.beyond["default"]
    assert (past.jobs, past.first) == (47, "j03")
    assert past.request["cpu"] == pytest.approx(47_000.0)
    # The worker sees the window change when a job joins past it, though no captured job did.
    sender = snapshot.DeltaSender()
    sender.delta(captured)
    commands.submit(state, one_cpu("j99"))
    later = sender.delta(snapshot.capture(state, CONFIG))
    assert not later.jobs
    assert later.window_changed
    assert not later.empty()
    assert dataclasses.replace(later, window_changed=False).empty()
