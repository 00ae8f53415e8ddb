"""Time limits through a real server: validation, queue defaults and maxima, the bind decision, the
server's safety net (a backend that never ends the task), the job's end, and restarts."""

from __future__ import annotations

from pathlib import Path

import anyio
import grpc
from conftest import server_options
from server_test_helpers import WAIT, gang, node, read_decisions, register, rpc_error, status_deltas

from muster.timelimit import MAX_TIME_LIMIT
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service.app import start_server


async def create_queue(stub, name: str, **limits: int) -> pb.Queue:
    return await stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name=name, **limits)))


async def test_a_limit_beyond_the_largest_is_refused_naming_the_field(server, stub) -> None:
    err = await rpc_error(
        stub.SubmitJob(
            pb.SubmitJobRequest(job=gang("j", replicas=1, time_limit_seconds=MAX_TIME_LIMIT + 1))
        )
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("job.time_limit_seconds: 2147483648 is more than")


async def test_queue_limits_are_validated(server, stub) -> None:
    err = await rpc_error(
        create_queue(stub, "q", default_time_limit_seconds=7200, max_time_limit_seconds=3600)
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "queue.default_time_limit_seconds: 7200 (2h) is more than the queue's maximum, "
        "max_time_limit_seconds 3600 (1h)"
    )
    err = await rpc_error(create_queue(stub, "q", max_time_limit_seconds=MAX_TIME_LIMIT + 1))
    assert err.details().startswith("queue.max_time_limit_seconds: 2147483648 is more than")
    queue = await create_queue(
        stub, "q", default_time_limit_seconds=1800, max_time_limit_seconds=14400
    )
    assert (queue.default_time_limit_seconds, queue.max_time_limit_seconds) == (1800, 14400)


async def test_queue_default_and_maximum_apply_at_submit(server, stub) -> None:
    await create_queue(stub, "short", default_time_limit_seconds=1800, max_time_limit_seconds=14400)
    await create_queue(stub, "capped", max_time_limit_seconds=600)
    # No limit of its own: the queue's default, written into the stored spec.
    sent = gang("a", replicas=1, queue="short")
    first = await stub.SubmitJob(pb.SubmitJobRequest(job=sent))
    assert first.created
    assert first.job.spec.time_limit_seconds == 1800
    again = await stub.SubmitJob(pb.SubmitJobRequest(job=sent))
    assert not again.created  # resubmitting the same file stays a no-op
    # A limit of its own within the maximum is kept.
    own = await stub.SubmitJob(
        pb.SubmitJobRequest(job=gang("b", replicas=1, queue="short", time_limit_seconds=7200))
    )
    assert own.job.spec.time_limit_seconds == 7200
    # Over the maximum: refused, naming both values (Slurm's partition MaxTime).
    err = await rpc_error(
        stub.SubmitJob(
            pb.SubmitJobRequest(job=gang("c", replicas=1, queue="short", time_limit_seconds=18000))
        )
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "job.time_limit_seconds: 18000 (5h) is more than the maximum time limit of queue "
        "'short', 14400 (4h)"
    )
    # A queue with a maximum and no default: the maximum is the default (as Slurm's MaxTime).
    capped = await stub.SubmitJob(pb.SubmitJobRequest(job=gang("d", replicas=1, queue="capped")))
    assert capped.job.spec.time_limit_seconds == 600
    # In a batch the refusal names the job.
    err = await rpc_error(
        stub.SubmitJobs(
            pb.SubmitJobsRequest(
                jobs=[
                    gang("e", replicas=1, queue="capped"),
                    gang("f", replicas=1, queue="capped", time_limit_seconds=601),
                ]
            )
        )
    )
    assert err.details().startswith("jobs[1].job.time_limit_seconds: 601 (10m1s) is more than")
    assert err.details().endswith("(job 'f')")
    # The default queue has no limits: a job without one has none.
    free = await stub.SubmitJob(pb.SubmitJobRequest(job=gang("g", replicas=1)))
    assert free.job.spec.time_limit_seconds == 0


async def test_the_safety_net_stops_a_task_its_backend_never_ends(server, stub) -> None:
    """A backend that runs the task and never ends it: past the limit and the grace the server
    evicts it (reason TimeLimit); acknowledged, the task is Failed and the job with it."""
    server.state.time_limit_grace = 0.2
    await register(stub, "never-ends", [node("n1")])
    stream = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="never-ends"))
    await stub.SubmitJob(
        pb.SubmitJobRequest(job=gang("slow", replicas=2, cpu="1", time_limit_seconds=1))
    )
    binds = await read_decisions(stream, 2)
    assert [d.bind.time_limit_seconds for d in binds] == [1, 1]  # backends need no lookup
    await stub.AckDecisions(
        pb.AckDecisionsRequest(
            backend="never-ends",
            acks=[pb.DecisionAck(decision_id=d.id, applied=True) for d in binds],
        )
    )
    await stub.SendDeltas(
        status_deltas(
            "never-ends",
            [
                pb.TaskStatusUpdate(
                    task_id=d.bind.task_id, status=pb.TASK_STATUS_RUNNING, node="n1"
                )
                for d in binds
            ],
        )
    )
    evictions = await read_decisions(stream, 2)
    stream.cancel()
    assert sorted(d.evict.task_id for d in evictions) == ["slow/worker-0", "slow/worker-1"]
    assert {d.evict.reason for d in evictions} == {"TimeLimit"}
    job = await stub.GetJob(pb.GetJobRequest(id="slow"))
    assert {t.message for t in job.tasks} == {"evicting: TimeLimit"}
    await stub.AckDecisions(
        pb.AckDecisionsRequest(
            backend="never-ends",
            acks=[pb.DecisionAck(decision_id=d.id, applied=True) for d in evictions],
        )
    )
    job = await stub.GetJob(pb.GetJobRequest(id="slow"))
    assert job.status.phase == pb.JOB_PHASE_FAILED
    assert {t.status for t in job.tasks} == {pb.TASK_STATUS_FAILED}
    assert {t.message for t in job.tasks} == {
        "TimeLimit: time limit 1s reached (stopped by the server)"
    }
    [ended] = [c for c in job.status.conditions if c.type == "Ended"]
    assert ended.reason == "TimeLimit"
    assert ended.message == (
        "task slow/worker-0 reached its time limit (1s); task slow/worker-1 reached its time "
        "limit (1s); 0/2 succeeded; the gang needs 2"
    )


async def test_a_backend_reporting_the_limit_fails_the_gang(server, stub) -> None:
    """The agent's report (Failed, TimeLimit) ends the job Failed; its other task is stopped."""
    await register(stub, "agent", [node("n1")])
    stream = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="agent"))
    await stub.SubmitJob(
        pb.SubmitJobRequest(job=gang("g", replicas=2, cpu="1", time_limit_seconds=120))
    )
    binds = await read_decisions(stream, 2)
    await stub.AckDecisions(
        pb.AckDecisionsRequest(
            backend="agent", acks=[pb.DecisionAck(decision_id=d.id, applied=True) for d in binds]
        )
    )
    first = binds[0].bind.task_id
    await stub.SendDeltas(
        status_deltas(
            "agent",
            [
                pb.TaskStatusUpdate(
                    task_id=first,
                    status=pb.TASK_STATUS_FAILED,
                    node="n1",
                    message="TimeLimit: time limit 2m reached",
                    exit_code=-15,
                )
            ],
        )
    )
    [stop] = await read_decisions(stream, 1)
    stream.cancel()
    assert stop.evict.reason == "job-failed"
    job = await stub.GetJob(pb.GetJobRequest(id="g"))
    assert job.status.phase == pb.JOB_PHASE_FAILED
    [ended] = [c for c in job.status.conditions if c.type == "Ended"]
    assert (ended.reason, ended.message) == (
        "TimeLimit",
        f"task {first} reached its time limit (2m); 0/2 succeeded; the gang needs 2",
    )


async def test_time_limits_survive_a_restart(tmp_path: Path) -> None:
    opts = server_options(tmp_path)
    first = await start_server(opts)
    async with grpc.aio.insecure_channel(first.address) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        await create_queue(
            stub, "short", default_time_limit_seconds=1800, max_time_limit_seconds=3600
        )
        await stub.SubmitJob(pb.SubmitJobRequest(job=gang("a", replicas=1, queue="short")))
    await first.stop()
    second = await start_server(opts)
    try:
        async with grpc.aio.insecure_channel(second.address) as ch:
            stub = pb_grpc.SchedulerStub(ch)
            job = await stub.GetJob(pb.GetJobRequest(id="a"))
            assert job.spec.time_limit_seconds == 1800
            queues = {
                q.queue.name: q.queue
                for q in (await stub.ListQueues(pb.ListQueuesRequest())).queues
            }
            short = queues["short"]
            assert (short.default_time_limit_seconds, short.max_time_limit_seconds) == (1800, 3600)
            # The same submission is still a no-op after the restart.
            again = await stub.SubmitJob(
                pb.SubmitJobRequest(job=gang("a", replicas=1, queue="short"))
            )
            assert not again.created
            with anyio.fail_after(WAIT):
                err = await rpc_error(
                    stub.SubmitJob(
                        pb.SubmitJobRequest(
                            job=gang("b", replicas=1, queue="short", time_limit_seconds=3601)
                        )
                    )
                )
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await second.stop()
