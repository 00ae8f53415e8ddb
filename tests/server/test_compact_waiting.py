"""Waiting jobs held compactly (issue 29): a restart keeps a job's spec serialized and builds no
task objects for a job whose stored tasks are as submitted, until something asks for them."""

from __future__ import annotations

import pytest
from server_test_helpers import node, rl, send_statuses

from muster.v1 import muster_pb2 as pb
from server.config import DEFAULT_CONFIG_YAML, load_config
from server.scheduler import SchedulerCore
from server.service import commands, ingest, snapshot
from server.service.api import queries
from server.service.apply import apply_result
from server.service.decisions import DecisionLog
from server.service.records import JobRecord
from server.service.state import ClusterState, queue_allocated
from server.service.store import SqliteStore
from server.service.views import job_proto

CONFIG = load_config(DEFAULT_CONFIG_YAML + "session: {maxQueueLookback: 2}\n")


def gang(job_id: str, replicas: int = 2) -> pb.JobSpec:
    return pb.JobSpec(
        id=job_id,
        task_groups=[pb.TaskGroup(role="w", replicas=replicas, request=rl(cpu="1"))],
    )


def with_backend(state: ClusterState) -> ClusterState:
    ingest.register_backend(state, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(state, pb.SyncSnapshotRequest(backend="a", nodes=[node("n0", cpu="4")]))
    return state


async def restarted(jobs: int) -> tuple[ClusterState, ClusterState]:
    """A state with ``jobs`` waiting gangs of 2, its first cycle's binds applied, written to a
    store; and the state a restart from that store gives."""
    store = SqliteStore(":memory:")
    before = with_backend(ClusterState(DecisionLog(bind_timeout=30)))
    for i in range(jobs):
        commands.submit(before, gang(f"j{i}"))
    store.write(before.commit())
    captured = snapshot.capture(before, CONFIG)
    result = SchedulerCore(CONFIG).run_cycle(captured.materialize(), captured.cycle_id)
    await apply_result(before, captured, result)
    store.write(before.commit())
    after = ClusterState(DecisionLog(bind_timeout=30))
    after.restore(store.load())
    return before, with_backend(after)


async def test_a_restart_builds_tasks_only_for_jobs_that_hold_something() -> None:
    before, state = await restarted(6)
    bound = {rec.id for rec in before.jobs.values() if not rec.all_pending()}
    assert bound == {"j0", "j1"}  # the node holds two gangs of 2 x 1 cpu
    assert {rec.id for rec in state.jobs.values() if rec.tasks_built} == bound
    assert all(rec._spec is None for rec in state.jobs.values())  # kept serialized
    waiting = state.jobs["j5"]
    assert waiting.task_count == 2
    # Reading about it (its view, the allocations, the metrics' view of it) builds nothing ...
    assert [t.status for t in job_proto(waiting).tasks] == [pb.TASK_STATUS_PENDING] * 2
    assert queue_allocated(state)["default"]["cpu"] == 4000.0
    queues = {q.queue.name: q for q in queries.list_queues(state).queues}
    assert queues["default"].pending_jobs == 4
    listed = queries.list_jobs(state, pb.ListJobsRequest(queue="default", owner=""))
    assert [j.spec.id for j in listed.jobs] == [f"j{i}" for i in range(6)]
    # (the view of a listing reads specs and tasks without keeping them)
    assert not any(rec.tasks_built for rec in state.jobs.values() if rec.id not in bound)
    assert not any(rec._spec is not None for rec in state.jobs.values() if rec.id not in bound)
    # ... and the same answers as before the restart.
    for job_id in ("j0", "j4"):
        assert job_proto(state.jobs[job_id]) == job_proto(before.jobs[job_id])


async def test_a_task_asked_for_by_id_is_built_and_indexed() -> None:
    _, state = await restarted(6)
    waiting = state.jobs["j4"]
    assert "j4/w-1" in state.tasks  # built on the way
    assert waiting.tasks_built
    assert state.task_job["j4/w-0"] is waiting
    assert state.tasks["j4/w-1"] is waiting.tasks[1]
    assert state.tasks.get("j9/w-0") is None  # no such job: nothing built, nothing found
    assert "j4/w-7" not in state.tasks


async def test_a_cycle_opens_restored_jobs_and_their_tasks_report_as_any() -> None:
    _, state = await restarted(6)
    # The node is full: j0 and j1 run; end them, and the next window's jobs get the node.
    send_statuses(
        state,
        "a",
        [
            pb.TaskStatusUpdate(task_id=f"j{j}/w-{i}", status=pb.TASK_STATUS_SUCCEEDED)
            for j in (0, 1)
            for i in (0, 1)
        ],
    )
    captured = snapshot.capture(state, CONFIG)
    assert [rec.id for rec, *_ in captured.jobs] == ["j2", "j3"]
    result = SchedulerCore(CONFIG).run_cycle(captured.materialize(), captured.cycle_id)
    await apply_result(state, captured, result)
    assert sorted(result.binds) == ["j2/w-0", "j2/w-1", "j3/w-0", "j3/w-1"]
    assert state.tasks["j2/w-0"].status.name == "BINDING"
    assert not state.jobs["j5"].tasks_built


def test_jobs_submitted_to_a_running_server_become_compact_once_filed() -> None:
    state = with_backend(ClusterState(DecisionLog(bind_timeout=30)))
    for i in range(6):
        commands.submit(state, gang(f"j{i}"))
    assert all(rec.tasks_built for rec in state.jobs.values())  # written at submission
    state.commit()
    captured = snapshot.capture(state, CONFIG)
    opened = [rec.id for rec, *_ in captured.jobs]
    assert opened == ["j0", "j1"]  # the window (lookback 2)
    assert [j.uid for j in captured.materialize().jobs] == opened
    for rec in state.jobs.values():  # filed: compact, unless the capture opened it
        assert rec.tasks_built == (rec.id in opened)
        assert (rec._template is not None) == (rec.id in opened)
    # Its tasks are found by id all the same, and a listing says the same as before.
    assert state.tasks["j5/w-1"].uid == "j5/w-1"
    assert [t.status for t in job_proto(state.jobs["j4"]).tasks] == [pb.TASK_STATUS_PENDING] * 2


async def test_a_restart_reads_only_task_rows_that_say_more_than_the_spec() -> None:
    """Task rows as submitted stay out of memory on a restart; a Pending row with something to
    say (here a message) is read back like any held task."""
    store = SqliteStore(":memory:")
    state = with_backend(ClusterState(DecisionLog(bind_timeout=30)))
    for i in range(4):
        commands.submit(state, gang(f"j{i}"))
    store.write(state.commit())
    captured = snapshot.capture(state, CONFIG)
    await apply_result(
        state, captured, SchedulerCore(CONFIG).run_cycle(captured.materialize(), captured.cycle_id)
    )
    state.tasks["j3/w-1"].message = "bind refused by backend a"
    state.changes.tasks.add("j3/w-1")
    store.write(state.commit())
    loaded = {job.id: job for job in store.load().jobs}
    rows = {job_id: sorted(t.uid for t in job.tasks) for job_id, job in loaded.items()}
    assert rows == {
        "j0": ["j0/w-0", "j0/w-1"],
        "j1": ["j1/w-0", "j1/w-1"],
        "j2": [],
        "j3": ["j3/w-1"],
    }
    again = ClusterState(DecisionLog(bind_timeout=30))
    again.restore(store.load())
    for job_id in ("j0", "j2", "j3"):
        assert job_proto(again.jobs[job_id]) == job_proto(state.jobs[job_id])
    assert again.tasks["j3/w-1"].message == "bind refused by backend a"
    assert not again.jobs["j2"].tasks_built


async def test_filters_and_writes_of_waiting_jobs_read_no_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Filtering a listing by namespace, and writing a waiting job's status, read the record's
    queue, namespace and owner: no spec is parsed (a million waiting jobs are a million parses)."""
    _, state = await restarted(6)
    parsed: list[str] = []
    real = JobRecord.peek_spec
    monkeypatch.setattr(JobRecord, "peek_spec", lambda rec: parsed.append(rec.id) or real(rec))
    listed = queries.list_jobs(state, pb.ListJobsRequest(namespace="elsewhere"))
    assert (list(listed.jobs), parsed) == ([], [])
    listed = queries.list_jobs(state, pb.ListJobsRequest(namespace="default", page_size=2))
    assert [j.spec.id for j in listed.jobs] == ["j0", "j1"]
    waiting = state.jobs["j5"]
    waiting.status.dependency = "met"
    state.changes.jobs.add("j5")
    row = state.commit().jobs["j5"]
    assert row[4:6] == ("default", "default")
    assert row[8] == ""
    assert waiting._spec is None
