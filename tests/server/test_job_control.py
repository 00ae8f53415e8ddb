"""Job control through a real server (gRPC): hold / release, requeue, job arrays with a running
limit, dependencies (afterok, afternotok, afterany, after; never satisfied), authorization of
holds under an auth policy, and all of it surviving a restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import grpc
import pytest
from conftest import server_options
from server_test_helpers import WAIT, gang, next_cycle, node, register, rpc_error, status_deltas

from muster.conditions import job_reason
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.model import CycleResult, TaskStatus
from server.service import apply, commands, control, ingest, snapshot
from server.service.app import ServerHandle, start_server
from server.service.state import ClusterState

ANN = (("x-muster-user", "ann"),)
OPS = (("x-muster-user", "ops"),)


def one(job_id: str, **kw: object) -> pb.JobSpec:
    return gang(job_id, replicas=1, cpu="1", **kw)


def condition(job: pb.Job, kind: str) -> pb.Condition | None:
    return next((c for c in job.status.conditions if c.type == kind), None)


class Backend:
    """One backend's decision feed, read as the tests need it: binds and evictions issued so far,
    acknowledged and (binds) reported running."""

    def __init__(self, stub: pb_grpc.SchedulerStub, name: str = "a") -> None:
        self.stub = stub
        self.name = name
        self.seen: set[int] = set()

    async def take(self, count: int) -> list[pb.Decision]:
        """The next ``count`` decisions not taken before (the feed resends unacked ones)."""
        out: list[pb.Decision] = []
        stream = self.stub.StreamDecisions(pb.StreamDecisionsRequest(backend=self.name))
        with anyio.fail_after(WAIT):
            async for d in stream:
                if d.id in self.seen:
                    continue
                self.seen.add(d.id)
                out.append(d)
                if len(out) == count:
                    break
        stream.cancel()
        return out

    async def none_new(self) -> bool:
        """No decision beyond those taken (read for a moment)."""
        stream = self.stub.StreamDecisions(pb.StreamDecisionsRequest(backend=self.name))
        fresh: list[pb.Decision] = []
        with anyio.move_on_after(0.3):
            async for d in stream:
                if d.id not in self.seen:
                    fresh.append(d)
                    break
        stream.cancel()
        return not fresh

    async def ack(self, decisions: list[pb.Decision]) -> None:
        await self.stub.AckDecisions(
            pb.AckDecisionsRequest(
                backend=self.name,
                acks=[pb.DecisionAck(decision_id=d.id, applied=True) for d in decisions],
            )
        )

    async def report(self, task_ids: list[str], status: int, exit_code: int = 0) -> None:
        await self.stub.SendDeltas(
            status_deltas(
                self.name,
                [
                    pb.TaskStatusUpdate(
                        task_id=t,
                        status=status,
                        exit_code=exit_code,  # type: ignore[arg-type]
                    )
                    for t in task_ids
                ],
            )
        )

    async def run(self, count: int) -> list[pb.Decision]:
        """Take ``count`` binds, acknowledge them and report their tasks running."""
        binds = await self.take(count)
        assert all(d.HasField("bind") for d in binds), binds
        await self.ack(binds)
        await self.report([d.bind.task_id for d in binds], pb.TASK_STATUS_RUNNING)
        return binds


async def get(stub: pb_grpc.SchedulerStub, job_id: str) -> pb.Job:
    job: pb.Job = await stub.GetJob(pb.GetJobRequest(id=job_id))
    return job


# -- hold and release ------------------------------------------------------------------------------


async def test_a_held_job_is_never_scheduled_until_released(server, stub) -> None:
    await register(stub, "a", [node("n0"), node("n1")])
    feed = Backend(stub)
    await stub.SubmitJob(pb.SubmitJobRequest(job=one("h", hold=True)), metadata=ANN)
    await stub.SubmitJob(pb.SubmitJobRequest(job=one("p")), metadata=ANN)
    await next_cycle(server)
    [bind] = await feed.take(1)
    assert bind.bind.job_id == "p"  # room for both: only the held one waits
    await next_cycle(server)
    assert await feed.none_new()
    job = await get(stub, "h")
    assert (job.status.hold, job.status.held_by) == ("user", "ann")
    assert job.status.phase == pb.JOB_PHASE_PENDING
    held = condition(job, "Held")
    assert held is not None
    assert (held.status, held.reason) == ("True", "Held")
    assert "held by ann (user hold)" in held.message
    assert job_reason(job.status.conditions)[0] == "Held"
    explain = await stub.Explain(pb.ExplainRequest(job_id="h"))
    assert explain.gate == "held"

    reply = await stub.ReleaseJob(pb.ReleaseJobRequest(id="h"), metadata=ANN)
    assert [j.spec.id for j in reply.jobs] == ["h"]
    assert not reply.jobs[0].status.hold
    [bind] = await feed.take(1)
    assert bind.bind.job_id == "h"
    released = condition(await get(stub, "h"), "Held")
    assert released is not None
    assert (released.status, released.reason) == ("False", "Released")
    err = await rpc_error(stub.ReleaseJob(pb.ReleaseJobRequest(id="h")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is held" in err.details()


async def test_hold_applies_to_pending_jobs_and_names_who_held_it(server, stub) -> None:
    await register(stub, "a", [node("n0")])
    feed = Backend(stub)
    await stub.SubmitJob(pb.SubmitJobRequest(job=one("run")), metadata=ANN)
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("big", replicas=2, cpu="4")), metadata=ANN)
    await next_cycle(server)
    await feed.run(1)
    err = await rpc_error(stub.HoldJob(pb.HoldJobRequest(id="run"), metadata=ANN))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.details().startswith("id: job 'run' is Running: only a pending job can be held")
    err = await rpc_error(stub.HoldJob(pb.HoldJobRequest(id="nope")))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details().startswith("id: job 'nope'")
    # Someone else than the owner holds it: an admin hold; the owner's own hold leaves it so.
    reply = await stub.HoldJob(pb.HoldJobRequest(id="big"), metadata=OPS)
    assert (reply.jobs[0].status.hold, reply.jobs[0].status.held_by) == ("admin", "ops")
    await stub.HoldJob(pb.HoldJobRequest(id="big"), metadata=ANN)
    assert (await get(stub, "big")).status.hold == "admin"
    # Without an auth policy nobody is an administrator: anyone releases (docs/jobs.md).
    await stub.ReleaseJob(pb.ReleaseJobRequest(id="big"), metadata=ANN)
    assert not (await get(stub, "big")).status.hold


async def test_a_held_job_that_is_cancelled_is_no_longer_held(server, stub) -> None:
    """Conditions say what holds now: a cancelled held job ended, it does not wait on a hold."""
    await register(stub, "a", [node("n0")])
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("big", replicas=2, cpu="4")), metadata=ANN)
    await stub.HoldJob(pb.HoldJobRequest(id="big"), metadata=ANN)
    held = condition(await get(stub, "big"), "Held")
    assert held is not None
    assert held.status == "True"
    await stub.CancelJob(pb.CancelJobRequest(id="big"), metadata=ANN)
    job = await get(stub, "big")
    held = condition(job, "Held")
    assert held is not None
    assert held.status == "False"
    assert job_reason(job.status.conditions)[0] == "Cancelled"


# -- requeue -------------------------------------------------------------------------------------------


async def test_requeue_evicts_the_running_tasks_and_counts(server, stub) -> None:
    await register(stub, "a", [node("n0"), node("n1")])
    feed = Backend(stub)
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("r", replicas=2, cpu="4")))
    await next_cycle(server)
    await feed.run(2)
    assert (await get(stub, "r")).status.phase == pb.JOB_PHASE_RUNNING

    reply = await stub.RequeueJob(pb.RequeueJobRequest(id="r"))
    [job] = reply.jobs
    assert job.status.phase == pb.JOB_PHASE_PENDING
    assert job.status.requeue_count == 1
    assert not job.status.HasField("start_time")
    evictions = await feed.take(2)
    assert [(d.evict.job_id, d.evict.reason) for d in evictions] == [("r", "requeue")] * 2
    assert {t.status for t in (await get(stub, "r")).tasks} == {pb.TASK_STATUS_RELEASING}
    requeued = condition(await get(stub, "r"), "Requeued")
    assert requeued is not None
    assert requeued.status == "True"
    assert "once" in requeued.message

    await feed.ack(evictions)  # the tasks are Pending again, and placed again
    binds = await feed.run(2)
    assert {d.bind.job_id for d in binds} == {"r"}
    job = await get(stub, "r")
    assert job.status.phase == pb.JOB_PHASE_RUNNING
    assert job.status.requeue_count == 1

    # requeue --hold: stopped, and held once back to pending
    reply = await stub.RequeueJob(pb.RequeueJobRequest(id="r", hold=True))
    assert reply.jobs[0].status.hold == "user"
    assert reply.jobs[0].status.requeue_count == 2
    await feed.ack(await feed.take(2))
    await next_cycle(server)
    assert await feed.none_new()
    assert {t.status for t in (await get(stub, "r")).tasks} == {pb.TASK_STATUS_PENDING}

    err = await rpc_error(stub.RequeueJob(pb.RequeueJobRequest(id="r")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.details() == "id: job 'r' is Pending: it has not started, nothing to requeue"


async def test_requeue_of_a_job_whose_tasks_ended_runs_them_again(server, stub) -> None:
    await register(stub, "a", [node("n0"), node("n1")])
    feed = Backend(stub)
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("e", replicas=2, cpu="4", min_member=1)))
    await next_cycle(server)
    binds = await feed.run(2)
    await feed.report([binds[0].bind.task_id], pb.TASK_STATUS_SUCCEEDED)
    await stub.RequeueJob(pb.RequeueJobRequest(id="e"))
    job = await get(stub, "e")
    statuses = {t.id: t.status for t in job.tasks}
    assert statuses[binds[0].bind.task_id] == pb.TASK_STATUS_PENDING  # ran: again
    assert statuses[binds[1].bind.task_id] == pb.TASK_STATUS_RELEASING
    [evict] = await feed.take(1)
    assert evict.evict.task_id == binds[1].bind.task_id


# -- arrays --------------------------------------------------------------------------------------------


async def test_an_array_runs_at_most_n_elements_and_cancels_as_one(server, stub) -> None:
    await register(stub, "a", [node(f"n{i}") for i in range(6)])
    feed = Backend(stub)
    reply = await stub.SubmitJob(pb.SubmitJobRequest(job=one("arr", array="0-5%2")))
    assert reply.created
    assert list(reply.element_ids) == [f"arr_{i}" for i in range(6)]
    assert reply.job.spec.id == "arr_0"
    assert reply.job.spec.array_job_id == "arr"
    again = await stub.SubmitJob(pb.SubmitJobRequest(job=one("arr", array="0-5%2")))
    assert not again.created
    assert list(again.element_ids) == list(reply.element_ids)
    err = await rpc_error(stub.SubmitJob(pb.SubmitJobRequest(job=one("arr"))))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "array" in err.details()

    await next_cycle(server)
    binds = await feed.run(2)
    assert sorted(d.bind.job_id for d in binds) == ["arr_0", "arr_1"]
    for d in binds:
        index = d.bind.job_id.removeprefix("arr_")
        assert dict(d.bind.env) == {"MUSTER_ARRAY_JOB_ID": "arr", "MUSTER_ARRAY_INDEX": index}
    await next_cycle(server)
    assert await feed.none_new()  # room for all six: the limit keeps four waiting
    waiting = await get(stub, "arr_4")
    limit = condition(waiting, "ArrayTaskLimit")
    assert limit is not None
    assert (limit.status, limit.reason) == ("True", "JobArrayTaskLimit")
    assert "at most 2 elements at once" in limit.message
    assert job_reason(waiting.status.conditions)[0] == "JobArrayTaskLimit"
    assert (await stub.Explain(pb.ExplainRequest(job_id="arr_4"))).gate == "array-limit"

    await feed.report(["arr_0/worker-0"], pb.TASK_STATUS_SUCCEEDED)  # one ends: one more starts
    [bind] = await feed.run(1)
    assert bind.bind.job_id == "arr_2"
    started = condition(await get(stub, "arr_2"), "ArrayTaskLimit")
    assert started is not None
    assert started.status == "False"

    held = await stub.HoldJob(pb.HoldJobRequest(id="arr"))  # the pending elements only
    assert [j.spec.id for j in held.jobs] == ["arr_3", "arr_4", "arr_5"]
    assert not held.jobs[0].tasks  # an array's elements come without their tasks

    cancelled = await stub.CancelJob(pb.CancelJobRequest(id="arr"))
    assert list(cancelled.element_ids) == ["arr_1", "arr_2", "arr_3", "arr_4", "arr_5"]
    evictions = await feed.take(2)
    assert sorted((d.evict.job_id, d.evict.reason) for d in evictions) == [
        ("arr_1", "cancel"),
        ("arr_2", "cancel"),
    ]
    listed = (await stub.ListJobs(pb.ListJobsRequest())).jobs
    phases = {j.spec.id: j.status.phase for j in listed if j.spec.array_job_id == "arr"}
    assert phases["arr_0"] == pb.JOB_PHASE_COMPLETED
    assert {phases[f"arr_{i}"] for i in range(1, 6)} == {pb.JOB_PHASE_CANCELLED}
    again = await stub.CancelJob(pb.CancelJobRequest(id="arr"))  # a retry: the same answer
    assert list(again.element_ids) == list(cancelled.element_ids)


async def test_array_specs_are_validated_naming_the_field(server, stub) -> None:
    for spec, message in [
        ("5-1", "job.array: '5-1': '5-1': the range ends before it starts"),
        ("0-3%0", "job.array: '0-3%0': %0: the running limit must be a whole number >= 1"),
        ("a-b", "job.array: 'a-b': 'a-b' is not an index"),
    ]:
        err = await rpc_error(stub.SubmitJob(pb.SubmitJobRequest(job=one("x", array=spec))))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details().startswith(message), err.details()
    err = await rpc_error(stub.SubmitJob(pb.SubmitJobRequest(job=one("x", array_job_id="y"))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("job.array_job_id: set by the server")


# -- dependencies ------------------------------------------------------------------------------------


def after(job_id: str, kind: str, on: str) -> pb.JobSpec:
    return one(job_id, depends_on=[pb.JobDependency(job=on, type=kind)])


async def test_dependency_chain_afterok_afternotok_afterany_after(server, stub) -> None:
    await register(stub, "a", [node(f"n{i}") for i in range(2)])
    feed = Backend(stub)
    jobs = [
        one("a"),
        after("ok", "afterok", "a"),
        after("notok", "afternotok", "a"),
        after("any", "afterany", "a"),
        after("started", "after", "a"),
    ]
    await stub.SubmitJobs(pb.SubmitJobsRequest(jobs=jobs))  # a batch may name its earlier jobs
    await next_cycle(server)
    [bind] = await feed.take(1)
    assert bind.bind.job_id == "a"
    for waiting in ("ok", "notok", "any", "started"):
        job = await get(stub, waiting)
        dep = condition(job, "Dependency")
        assert dep is not None, waiting
        assert (dep.status, dep.reason) == ("True", "Dependency"), waiting
        assert dep.message.startswith("waits for ")
        assert "a pending" in dep.message
        assert job_reason(job.status.conditions)[0] == "Dependency"
    assert (await stub.Explain(pb.ExplainRequest(job_id="ok"))).gate == "dependency"

    await feed.ack([bind])
    await feed.report(["a/worker-0"], pb.TASK_STATUS_RUNNING)  # a started: `after` is met
    [bind] = await feed.run(1)
    assert bind.bind.job_id == "started"
    satisfied = condition(await get(stub, "started"), "Dependency")
    assert satisfied is not None
    assert (satisfied.status, satisfied.reason) == ("False", "Satisfied")

    await feed.report(["a/worker-0", "started/worker-0"], pb.TASK_STATUS_SUCCEEDED)
    binds = await feed.run(2)
    assert sorted(d.bind.job_id for d in binds) == ["any", "ok"]
    never = await get(stub, "notok")
    dep = condition(never, "Dependency")
    assert dep is not None
    assert (dep.status, dep.reason) == ("True", "DependencyNeverSatisfied")
    assert dep.message == (
        "afternotok:a can never be satisfied (a completed); the job stays pending until it is "
        "cancelled"
    )
    assert never.status.phase == pb.JOB_PHASE_PENDING
    assert job_reason(never.status.conditions)[0] == "DependencyNeverSatisfied"
    await next_cycle(server)
    assert await feed.none_new()
    assert (await stub.CancelJob(pb.CancelJobRequest(id="notok"))).job.status.phase == (
        pb.JOB_PHASE_CANCELLED
    )


async def test_afterok_on_a_failed_job_and_on_an_array(server, stub) -> None:
    await register(stub, "a", [node(f"n{i}") for i in range(3)])
    feed = Backend(stub)
    await stub.SubmitJob(pb.SubmitJobRequest(job=one("f")))
    await stub.SubmitJob(pb.SubmitJobRequest(job=one("arr", array="0-1")))
    await stub.SubmitJob(pb.SubmitJobRequest(job=after("on-f", "afterok", "f")))
    await stub.SubmitJob(pb.SubmitJobRequest(job=after("on-arr", "afterok", "arr")))
    err = await rpc_error(stub.SubmitJob(pb.SubmitJobRequest(job=after("x", "afterok", "ghost"))))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details().startswith("job.depends_on[0].job: job 'ghost' does not exist")
    err = await rpc_error(stub.SubmitJob(pb.SubmitJobRequest(job=after("x", "before", "f"))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("job.depends_on[0].type: 'before' is not one of")

    await next_cycle(server)
    binds = await feed.run(3)
    assert sorted(d.bind.job_id for d in binds) == ["arr_0", "arr_1", "f"]
    await feed.report(["f/worker-0"], pb.TASK_STATUS_FAILED, exit_code=3)
    await feed.report(["arr_0/worker-0"], pb.TASK_STATUS_SUCCEEDED)
    await next_cycle(server)
    dep = condition(await get(stub, "on-f"), "Dependency")
    assert dep is not None
    assert dep.reason == "DependencyNeverSatisfied"
    assert "f failed" in dep.message
    dep = condition(await get(stub, "on-arr"), "Dependency")
    assert dep is not None
    assert dep.reason == "Dependency"
    assert "arr_1 started" in dep.message
    await feed.report(["arr_1/worker-0"], pb.TASK_STATUS_SUCCEEDED)
    [bind] = await feed.run(1)
    assert bind.bind.job_id == "on-arr"


# -- authorization ----------------------------------------------------------------------------------

POLICY = """
tokens:
  - {token: carol-token-1, user: carol}
  - {token: dave-token-12, user: dave}
  - {token: ops-token-123, user: ops, groups: [admins]}
rules:
  - {subjects: ["user:carol", "user:dave"], verbs: [read, submit, cancel-own], queues: [default]}
  - {subjects: ["group:admins"], verbs: ["*"]}
"""


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[ServerHandle]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    handle = await start_server(server_options(tmp_path, auth_policy=str(policy)))
    try:
        yield handle
    finally:
        await handle.stop()


def bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


async def test_holds_are_authorized_as_cancel_and_an_admin_hold_needs_an_admin(guarded) -> None:
    async with grpc.aio.insecure_channel(guarded.address) as channel:
        stub = pb_grpc.SchedulerStub(channel)
        carol, dave, ops = (bearer(t) for t in ("carol-token-1", "dave-token-12", "ops-token-123"))
        await stub.SubmitJob(pb.SubmitJobRequest(job=one("c")), metadata=carol)
        err = await rpc_error(stub.HoldJob(pb.HoldJobRequest(id="c"), metadata=dave))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED  # not hers, no cancel right
        reply = await stub.HoldJob(pb.HoldJobRequest(id="c"), metadata=ops)
        assert (reply.jobs[0].status.hold, reply.jobs[0].status.held_by) == ("admin", "ops")
        err = await rpc_error(stub.ReleaseJob(pb.ReleaseJobRequest(id="c"), metadata=carol))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "held by ops (admin hold): only an administrator" in err.details()
        await stub.ReleaseJob(pb.ReleaseJobRequest(id="c"), metadata=ops)
        reply = await stub.HoldJob(pb.HoldJobRequest(id="c"), metadata=carol)  # her own hold
        assert (reply.jobs[0].status.hold, reply.jobs[0].status.held_by) == ("user", "carol")
        await stub.ReleaseJob(pb.ReleaseJobRequest(id="c"), metadata=carol)
        err = await rpc_error(stub.RequeueJob(pb.RequeueJobRequest(id="c"), metadata=dave))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED


# -- persistence --------------------------------------------------------------------------------------


async def test_holds_requeues_and_dependencies_survive_a_restart(tmp_path: Path) -> None:
    opts = server_options(tmp_path)
    first = await start_server(opts)
    try:
        async with grpc.aio.insecure_channel(first.address) as channel:
            stub = pb_grpc.SchedulerStub(channel)
            await register(stub, "a", [node("n0")])
            feed = Backend(stub)
            await stub.SubmitJob(pb.SubmitJobRequest(job=one("r")))
            await next_cycle(first)
            await feed.run(1)
            await stub.RequeueJob(pb.RequeueJobRequest(id="r", hold=True), metadata=OPS)
            await feed.ack(await feed.take(1))
            await stub.SubmitJob(pb.SubmitJobRequest(job=one("gone", array="0-2%1")))
            await stub.CancelJob(pb.CancelJobRequest(id="gone"))
            await stub.SubmitJob(pb.SubmitJobRequest(job=after("never", "afterok", "gone")))
            await next_cycle(first)
    finally:
        await first.stop()
    second = await start_server(opts)
    try:
        async with grpc.aio.insecure_channel(second.address) as channel:
            stub = pb_grpc.SchedulerStub(channel)
            job = await get(stub, "r")
            assert (job.status.hold, job.status.held_by, job.status.requeue_count) == (
                "admin",
                "ops",
                1,
            )
            never = await get(stub, "never")
            assert job_reason(never.status.conditions)[0] == "DependencyNeverSatisfied"
            assert second.state.jobs["never"].status.dependency == "never"
            assert sorted(second.state.arrays["gone"]) == ["gone_0", "gone_1", "gone_2"]
            await stub.ReleaseJob(pb.ReleaseJobRequest(id="r"))
            await register(stub, "a", [node("n0")])
            feed = Backend(stub)
            [bind] = await feed.take(1)
            assert bind.bind.job_id == "r"
    finally:
        await second.stop()


# -- a hold racing a cycle ---------------------------------------------------------------------------


def test_a_job_held_after_a_cycle_captured_it_is_not_placed_by_that_cycle() -> None:
    state = ClusterState()
    ingest.register_backend(state, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    ingest.sync_snapshot(state, pb.SyncSnapshotRequest(backend="a", nodes=[node("n0")]))
    commands.submit_job(state, one("h"))
    captured = snapshot.capture(state)
    assert [rec.id for rec, *_ in captured.jobs] == ["h"]
    control.hold(state, "h", "ann", admin=False)
    decided = CycleResult(captured.cycle_id, binds={"h/worker-0": "n0"})
    stats = apply.apply(state, captured, decided)
    assert (stats.binds, stats.dropped_binds) == (0, 1)
    assert state.tasks["h/worker-0"].status == TaskStatus.PENDING
    assert state.jobs["h"].status.explanation == {
        "gate": "held",
        "summary": "held by ann (user hold): not scheduled until released (muster release)",
        "node_reasons": {},
        "cycle_id": 0,
    }
    assert [rec.id for rec, *_ in snapshot.capture(state).jobs] == []  # and no later cycle
