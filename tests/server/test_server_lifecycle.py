"""Through gRPC: decisions stream/ack, restart from the store, watch, health, reflection, config."""

from __future__ import annotations

from pathlib import Path

import anyio
import grpc
import pytest
from conftest import server_options
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from server_test_helpers import (
    WAIT,
    gang,
    next_cycle,
    node,
    read_decisions,
    register,
    rpc_error,
    status_deltas,
)

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service import commands, rpc
from server.service.app import start_server


async def test_gang_waits_for_capacity_then_binds_in_one_cycle(server, stub) -> None:
    await register(stub, "a", [node(f"n{i}") for i in range(3)])
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("g", replicas=4, cpu="4")))
    await next_cycle(server)
    job = await stub.GetJob(pb.GetJobRequest(id="g"))
    assert [t.status for t in job.tasks] == [pb.TASK_STATUS_PENDING] * 4
    assert any(
        c.type == "Unschedulable" and c.status == "True" and c.reason for c in job.status.conditions
    )
    stream = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="a"))
    await stub.SendDeltas(
        pb.SendDeltasRequest(backend="a", deltas=[pb.Delta(node_upserted=node("n3"))])
    )
    decisions = await read_decisions(stream, 4)
    stream.cancel()
    assert len({d.cycle_id for d in decisions}) == 1  # the whole gang in one cycle
    assert sorted(d.bind.node for d in decisions) == ["n0", "n1", "n2", "n3"]
    assert all(d.HasField("deadline") for d in decisions)
    await stub.AckDecisions(
        pb.AckDecisionsRequest(
            backend="a", acks=[pb.DecisionAck(decision_id=d.id, applied=True) for d in decisions]
        )
    )
    await stub.SendDeltas(
        status_deltas(
            "a",
            [
                pb.TaskStatusUpdate(task_id=d.bind.task_id, status=pb.TASK_STATUS_SUCCEEDED)
                for d in decisions
            ],
        )
    )
    job = await stub.GetJob(pb.GetJobRequest(id="g"))
    assert job.status.phase == pb.JOB_PHASE_COMPLETED
    assert job.status.succeeded == 4


async def five_queued_binds(server, stub) -> list[pb.Decision]:
    """A gang of five bound in one cycle; its binds, read once from StreamDecisions (still unacked:
    a new stream sends them again)."""
    await register(stub, "a", [node(f"n{i}") for i in range(5)])
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("g", replicas=5, cpu="4")))
    await next_cycle(server)
    stream = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="a"))
    singles = await read_decisions(stream, 5)
    stream.cancel()
    return singles


async def read_batches(batches, count: int) -> list[list[pb.Decision]]:
    """The batches of a StreamDecisionBatches call until ``count`` decisions came; the call is ended."""
    out: list[list[pb.Decision]] = []
    with anyio.fail_after(WAIT):
        async for batch in batches:
            out.append(list(batch.decisions))
            if sum(len(b) for b in out) >= count:
                break
    batches.cancel()
    return out


async def test_decision_batches_carry_the_same_feed_in_order_up_to_max_batch(server, stub) -> None:
    singles = await five_queued_binds(server, stub)
    # The five binds are queued before the stream opens: they come two by two, then the rest.
    batches = stub.StreamDecisionBatches(pb.StreamDecisionsRequest(backend="a", max_batch=2))
    batched = await read_batches(batches, 5)
    assert [len(b) for b in batched] == [2, 2, 1]
    flat = [d for b in batched for d in b]
    assert [d.id for d in flat] == [d.id for d in singles] == sorted(d.id for d in singles)
    assert [d.bind.task_id for d in flat] == [d.bind.task_id for d in singles]
    err = await rpc_error(
        stub.StreamDecisionBatches(pb.StreamDecisionsRequest(backend="a", max_batch=10_001)).read()
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("max_batch")


async def test_decision_batches_stay_within_their_byte_limit(server, stub, monkeypatch) -> None:
    singles = await five_queued_binds(server, stub)
    one = max(d.ByteSize() for d in singles)
    # Room for two decisions a message: five queued binds come as 2, 2, 1 though max_batch allows 5.
    monkeypatch.setattr(rpc, "DECISION_BATCH_BYTES", 2 * one + one // 2)
    batches = stub.StreamDecisionBatches(pb.StreamDecisionsRequest(backend="a", max_batch=5))
    batched = await read_batches(batches, 5)
    assert [len(b) for b in batched] == [2, 2, 1]
    assert all(sum(d.ByteSize() for d in b) <= 2 * one + one // 2 for b in batched)


async def test_restart_keeps_jobs_and_resends_only_unacked(tmp_path: Path) -> None:
    opts = server_options(tmp_path)
    first = await start_server(opts)
    async with grpc.aio.insecure_channel(first.address) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        await register(stub, "a", [node(f"n{i}") for i in range(2)])
        await stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="team", weight=3)))
        await stub.SubmitJob(pb.SubmitJobRequest(job=gang("g", replicas=2, queue="team")))
        stream = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="a"))
        decisions = await read_decisions(stream, 2)
        stream.cancel()
        await stub.AckDecisions(
            pb.AckDecisionsRequest(
                backend="a", acks=[pb.DecisionAck(decision_id=decisions[0].id, applied=True)]
            )
        )
        cycles_before = first.state.next_cycle_id
    await first.stop()

    second = await start_server(opts)
    try:
        async with grpc.aio.insecure_channel(second.address) as ch:
            stub = pb_grpc.SchedulerStub(ch)
            job = await stub.GetJob(pb.GetJobRequest(id="g"))
            by_id = {t.id: t.status for t in job.tasks}
            assert by_id[decisions[0].bind.task_id] == pb.TASK_STATUS_BOUND
            assert by_id[decisions[1].bind.task_id] == pb.TASK_STATUS_BINDING
            assert {
                q.queue.name: q.queue.weight
                for q in (await stub.ListQueues(pb.ListQueuesRequest())).queues
            }["team"] == 3
            assert second.state.next_cycle_id >= cycles_before
            reg = await stub.RegisterBackend(pb.RegisterBackendRequest(name="a", kind="fake-agent"))
            assert reg.last_decision_id == decisions[1].id
            stream = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="a"))
            resent = await read_decisions(stream, 1)
            assert [d.id for d in resent] == [decisions[1].id]  # the acked one is never sent again
            await stub.AckDecisions(
                pb.AckDecisionsRequest(
                    backend="a",
                    acks=[
                        pb.DecisionAck(decision_id=decisions[1].id, applied=True),
                        pb.DecisionAck(
                            decision_id=decisions[0].id, applied=True
                        ),  # acked before the restart
                    ],
                )
            )
            # New decisions continue the id sequence.
            running = [
                pb.BackendTask(
                    task_id=d.bind.task_id,
                    node=d.bind.node,
                    request=d.bind.request,
                    status=pb.TASK_STATUS_RUNNING,
                )
                for d in decisions
            ]
            await stub.SyncSnapshot(
                pb.SyncSnapshotRequest(
                    backend="a", nodes=[node(f"n{i}") for i in range(3)], tasks=running
                )
            )
            job = await stub.GetJob(pb.GetJobRequest(id="g"))
            assert [t.status for t in job.tasks] == [pb.TASK_STATUS_RUNNING] * 2
            await stub.SubmitJob(pb.SubmitJobRequest(job=gang("h", replicas=1, cpu="1")))
            [fresh] = await read_decisions(stream, 1)
            stream.cancel()
            assert fresh.id > decisions[1].id
            assert fresh.bind.task_id == "h/worker-0"
            assert fresh.cycle_id >= cycles_before
    finally:
        await second.stop()


async def test_watch_jobs_events(server, stub) -> None:
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("before", replicas=1)))
    watch = stub.WatchJobs(pb.WatchJobsRequest(send_initial=True, queue="default"))
    first = await watch.read()
    assert first.type == pb.JobEvent.TYPE_ADDED
    assert first.job.spec.id == "before"
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("after", replicas=1)))
    await stub.CancelJob(pb.CancelJobRequest(id="after"))
    seen = []
    with anyio.fail_after(WAIT):
        while not seen or seen[-1][1] != pb.JOB_PHASE_CANCELLED:
            event = await watch.read()
            if event.job.spec.id == "after":
                seen.append((event.type, event.job.status.phase))
    watch.cancel()
    assert seen[0][0] == pb.JobEvent.TYPE_ADDED
    assert seen[-1] == (pb.JobEvent.TYPE_MODIFIED, pb.JOB_PHASE_CANCELLED)
    assert all(kind == pb.JobEvent.TYPE_MODIFIED for kind, _ in seen[1:])
    err = await rpc_error(stub.WatchJobs(pb.WatchJobsRequest(job_id="nope")).read())
    assert err.code() == grpc.StatusCode.NOT_FOUND


async def test_slow_watcher_is_dropped_cleanly(server, stub, monkeypatch) -> None:
    from server.service import decisions

    WATCH_BUFFER = 200  # the shipped buffer is 10,000: a smaller one overflows sooner
    monkeypatch.setattr(decisions, "WATCH_BUFFER", WATCH_BUFFER)
    watch = stub.WatchJobs(pb.WatchJobsRequest())
    await anyio.sleep(0)  # let the subscription start
    with anyio.fail_after(WAIT):
        while not server.state.watch:
            await anyio.sleep(0.01)
    for i in range(WATCH_BUFFER + 10):  # nobody reads: the buffer overflows
        commands.submit_job(server.state, gang(f"j{i}", replicas=1))
        server.state.commit()
    assert not server.state.watch  # dropped, not blocking the server

    async def read_until_the_error() -> None:
        while True:
            await watch.read()

    with anyio.fail_after(WAIT), pytest.raises(grpc.aio.AioRpcError) as err:
        await read_until_the_error()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await stub.GetJob(pb.GetJobRequest(id="j0"))).spec.id == "j0"


async def test_health_and_reflection(server) -> None:
    async with grpc.aio.insecure_channel(server.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", "muster.v1.Scheduler"):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        call = refl.ServerReflectionInfo()
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        resp = await call.read()
        await call.done_writing()
        names = {s.name for s in resp.list_services_response.service}
        assert "muster.v1.Scheduler" in names
        assert "grpc.health.v1.Health" in names


async def test_config_update_and_persistence(tmp_path: Path) -> None:
    opts = server_options(tmp_path)
    handle = await start_server(opts)
    text = (
        'actions: "enqueue, allocate"\ntiers:\n- plugins:\n  - name: gang\n  - name: predicates\n'
    )
    async with grpc.aio.insecure_channel(handle.address) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        before = await stub.GetConfig(pb.GetConfigRequest())
        updated = await stub.UpdateConfig(pb.UpdateConfigRequest(yaml=text))
        assert updated.generation == before.generation + 1
        assert updated.yaml == text
        await next_cycle(handle)
        assert handle.loop.core.config.actions == ["enqueue", "allocate"]
    await handle.stop()
    handle = await start_server(opts)
    try:
        async with grpc.aio.insecure_channel(handle.address) as ch:
            got = await pb_grpc.SchedulerStub(ch).GetConfig(pb.GetConfigRequest())
            assert got.yaml == text
            assert got.generation == updated.generation
    finally:
        await handle.stop()


async def test_config_file_hot_reload(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text('actions: "enqueue, allocate, backfill"\ntiers:\n- plugins:\n  - name: gang\n')
    handle = await start_server(
        server_options(tmp_path, config_path=str(path), expire_interval=0.05)
    )
    try:
        path.write_text('actions: "enqueue, allocate"\ntiers:\n- plugins:\n  - name: gang\n')
        import os

        os.utime(path, (1, 1))  # a different mtime, whatever the clock resolution
        with anyio.fail_after(WAIT):
            while "backfill" in handle.loop.configs.yaml:
                await anyio.sleep(0.02)
        await next_cycle(handle)
        assert handle.loop.core.config.actions == ["enqueue", "allocate"]
        # A broken file is ignored: the last good config stays.
        path.write_text("actions: [unclosed")
        os.utime(path, (2, 2))
        await anyio.sleep(0.3)
        assert handle.loop.configs.yaml.startswith('actions: "enqueue, allocate"')
    finally:
        await handle.stop()


async def test_explain_and_list_nodes(server, stub) -> None:
    await register(stub, "a", [node("n0", cpu="2")])
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("big", replicas=1, cpu="8")))
    await next_cycle(server)
    exp = await stub.Explain(pb.ExplainRequest(job_id="big"))
    assert exp.job_id == "big"
    assert exp.cycle_id > 0
    assert exp.summary
    views = (await stub.ListNodes(pb.ListNodesRequest(backend="a"))).nodes
    assert [(v.node.name, v.idle.quantities["cpu"], v.task_count) for v in views] == [
        ("n0", "2", 0)
    ]
    err = await rpc_error(stub.ListNodes(pb.ListNodesRequest(backend="zzz")))
    assert err.code() == grpc.StatusCode.NOT_FOUND
