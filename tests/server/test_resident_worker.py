"""The core's worker keeps the cluster between cycles and is sent only what changed
(snapshot.DeltaSender -> snapshot.ResidentState, server.service.core_runner)."""

from __future__ import annotations

import anyio
import pytest
from server_test_helpers import gang, node

from muster.v1 import muster_pb2 as pb
from server.config import DEFAULT_CONFIG_YAML, load_config
from server.scheduler import SchedulerCore
from server.service import commands, ingest, snapshot
from server.service.apply import apply
from server.service.core_runner import CoreRunner
from server.service.decisions import DecisionLog
from server.service.state import ClusterState


@pytest.fixture
def state() -> ClusterState:
    c = ClusterState(DecisionLog(bind_timeout=30))
    ingest.register_backend(c, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(
        c, pb.SyncSnapshotRequest(backend="a", nodes=[node(f"n{i}") for i in range(4)])
    )
    return c


def test_resident_copy_equals_a_fresh_snapshot_through_changes(state: ClusterState) -> None:
    sender, resident = snapshot.DeltaSender(), snapshot.ResidentState()

    def step() -> snapshot.CaptureDelta:
        cap = snapshot.capture(state)
        delta = sender.delta(cap)
        resident.apply(delta)
        assert resident.materialize() == cap.materialize()
        return delta

    commands.submit_job(state, gang("g1", replicas=2))
    first = step()
    assert first.full
    assert set(first.nodes) == {"n0", "n1", "n2", "n3"}
    assert set(first.jobs) == {"g1"}
    idle = step()  # nothing changed: nothing but the (empty) difference is sent
    assert not idle.full
    assert idle.size() == 0
    assert idle.node_order is None
    assert idle.job_order is None
    assert idle.queues is None
    assert idle.foreign is None
    assert idle.priority_classes is None

    commands.submit_job(state, gang("g2", replicas=1))
    added = step()
    assert set(added.jobs) == {"g2"}
    assert added.job_order is not None
    assert added.nodes == {}

    # A cycle binds g1: only g1's state travels.
    cap = snapshot.capture(state)
    result = SchedulerCore(load_config(DEFAULT_CONFIG_YAML)).run_cycle(
        cap.materialize(), cap.cycle_id
    )
    apply(state, cap, result)
    assert result.binds
    bound = step()
    assert set(bound.jobs) <= {"g1", "g2"}
    assert bound.jobs

    # A node joins, one is cordoned: those nodes travel, in the new order.
    ingest.sync_snapshot(
        state,
        pb.SyncSnapshotRequest(
            backend="a",
            nodes=[*(node(f"n{i}") for i in range(3)), node("n3", unschedulable=True), node("n4")],
        ),
    )
    changed = step()
    assert set(changed.nodes) == {"n3", "n4"}
    assert changed.node_order is not None

    commands.cancel_job(state, "g2")
    step()
    ingest.sync_snapshot(state, pb.SyncSnapshotRequest(backend="a", nodes=[node("n0")]))
    gone = step()
    assert gone.node_order == ["n0"]
    assert resident.node_order == ["n0"]


def test_resident_copies_only_what_a_delta_replaced(state: ClusterState) -> None:
    sender, resident = snapshot.DeltaSender(), snapshot.ResidentState()

    def step() -> tuple[dict[str, object], dict[str, object]]:
        cap = snapshot.capture(state)
        resident.apply(sender.delta(cap))
        snap = resident.materialize()
        assert snap == cap.materialize()
        return {j.uid: j for j in snap.jobs}, {n.name: n for n in snap.nodes}

    commands.submit_job(state, gang("g1", replicas=2))
    commands.submit_job(state, gang("g2", replicas=1))
    jobs, nodes = step()
    again_jobs, again_nodes = step()  # nothing changed: the same copies again
    assert all(again_jobs[k] is jobs[k] for k in jobs)
    assert all(again_nodes[k] is nodes[k] for k in nodes)
    commands.submit_job(state, gang("g3", replicas=1))
    more_jobs, _ = step()  # a new job: copied; the others are not
    assert all(more_jobs[k] is jobs[k] for k in jobs)
    assert "g3" in more_jobs

    # Jobs are bound and n3 cordoned: the bound jobs' copies and n3's are new, the other nodes' not.
    cap = snapshot.capture(state)
    result = SchedulerCore(load_config(DEFAULT_CONFIG_YAML)).run_cycle(
        cap.materialize(), cap.cycle_id
    )
    apply(state, cap, result)
    bound = {state.task_job[uid].id for uid in result.binds}
    ingest.sync_snapshot(
        state,
        pb.SyncSnapshotRequest(
            backend="a", nodes=[*(node(f"n{i}") for i in range(3)), node("n3", unschedulable=True)]
        ),
    )
    later_jobs, later_nodes = step()
    assert bound
    assert all(later_jobs[k] is not more_jobs[k] for k in bound)
    assert [k for k in nodes if later_nodes[k] is not nodes[k]] == ["n3"]


async def test_worker_process_schedules_on_deltas_and_recovers_from_a_restart(
    state: ClusterState,
) -> None:
    runner = CoreRunner("process")
    core = SchedulerCore(load_config(DEFAULT_CONFIG_YAML))
    try:
        commands.submit_job(state, gang("g1", replicas=2))
        cap = snapshot.capture(state)
        result = await runner.run(core, cap)
        assert runner.last_delta_size == 5  # 4 nodes + 1 job: everything, the first time
        assert sorted(result.binds) == ["g1/worker-0", "g1/worker-1"]
        apply(state, cap, result)

        commands.submit_job(state, gang("g2", replicas=1))
        cap = snapshot.capture(state)
        result = await runner.run(core, cap)
        assert runner.last_delta_size <= 2  # g1's new state, g2: no node travels again
        expected = SchedulerCore(load_config(DEFAULT_CONFIG_YAML)).run_cycle(
            cap.materialize(), cap.cycle_id
        )
        assert result.binds == expected.binds
        assert result.binds
        apply(state, cap, result)

        # The worker dies between cycles: the next one starts a new worker and sends everything.
        assert runner._process is not None
        runner._process.kill()
        await runner._process.wait()
        commands.submit_job(state, gang("g3", replicas=1))
        cap = snapshot.capture(state)
        with anyio.fail_after(60):
            result = await runner.run(core, cap)
        assert runner.last_delta_size == 4 + 3
        expected = SchedulerCore(load_config(DEFAULT_CONFIG_YAML)).run_cycle(
            cap.materialize(), cap.cycle_id
        )
        assert result.binds == expected.binds
    finally:
        await runner.aclose()


async def test_an_unchanged_cluster_gets_the_last_quiet_answer_without_the_worker(
    state: ClusterState,
) -> None:
    """A cycle is a function of the snapshot and the configuration: when nothing changed and the
    last cycle decided nothing, the worker is not asked again. A change, a new configuration, or a
    plugin that reads the clock means the worker runs."""
    runner = CoreRunner("process")
    core = SchedulerCore(load_config(DEFAULT_CONFIG_YAML))
    try:
        commands.submit_job(state, gang("huge", replicas=2, cpu="1000"))  # fits no node
        first = await runner.run(core, snapshot.capture(state))
        assert not first.binds
        assert runner.reused == 0
        cap = snapshot.capture(state)
        again = await runner.run(core, cap)
        assert runner.reused == 1
        assert again.cycle_id == cap.cycle_id
        assert not again.binds
        assert again.jobs == first.jobs  # the same verdict (why "huge" waits)

        commands.submit_job(state, gang("small", replicas=1))  # a change: the worker decides
        cap = snapshot.capture(state)
        placed = await runner.run(core, cap)
        assert runner.reused == 1
        assert list(placed.binds) == ["small/worker-0"]
        apply(state, cap, placed)
        await runner.run(core, snapshot.capture(state))  # the bind changed "small": the worker runs
        assert runner.reused == 1

        clocked = SchedulerCore(load_config(DEFAULT_CONFIG_YAML + "- plugins:\n  - name: sla\n"))
        await runner.run(clocked, snapshot.capture(state))
        await runner.run(clocked, snapshot.capture(state))
        assert runner.reused == 1  # sla's waiting times run out while nothing changes
    finally:
        await runner.aclose()
