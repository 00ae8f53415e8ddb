"""Task output through a real server: kept in the store across a restart (SQLite and PostgreSQL),
followed with WatchTaskLogs until the task ends (eof, or its end without one), and followed on a
follower of replicated servers. The backend is this test, speaking the backend RPCs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import grpc
import pytest
from conftest import server_options
from server_test_helpers import WAIT, gang, node, status_deltas, wait_for

from clients.client import MusterClient
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service.app import ServerHandle, ServerOptions, start_server

BACKEND = "rack"


async def leading(stub: pb_grpc.SchedulerStub) -> None:
    """Register the backend (a replicated server answers once it leads)."""

    async def registered() -> bool:
        try:
            await stub.RegisterBackend(pb.RegisterBackendRequest(name=BACKEND, kind="fake-agent"))
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    await wait_for(registered, "the server to lead")
    await stub.SyncSnapshot(pb.SyncSnapshotRequest(backend=BACKEND, nodes=[node("n0")]))


async def running(stub: pb_grpc.SchedulerStub, job_id: str, replicas: int = 1) -> list[str]:
    """Submit a job, take its binds, ack them and report its tasks running."""
    reply = await stub.SubmitJob(pb.SubmitJobRequest(job=gang(job_id, replicas=replicas, cpu="1")))
    tasks = [t.id for t in reply.job.tasks]
    stream = stub.StreamDecisions(pb.StreamDecisionsRequest(backend=BACKEND))
    binds: list[pb.Decision] = []
    with anyio.fail_after(WAIT):
        async for decision in stream:
            if decision.bind.job_id == job_id:
                binds.append(decision)
            if len(binds) == replicas:
                break
    stream.cancel()
    await stub.AckDecisions(
        pb.AckDecisionsRequest(
            backend=BACKEND, acks=[pb.DecisionAck(decision_id=d.id, applied=True) for d in binds]
        )
    )
    await status(stub, tasks, pb.TASK_STATUS_RUNNING)
    return tasks


async def status(stub: pb_grpc.SchedulerStub, tasks: list[str], value: int) -> None:
    await stub.SendDeltas(
        status_deltas(
            BACKEND,
            [
                pb.TaskStatusUpdate(task_id=t, status=value, node="n0")  # type: ignore[arg-type]
                for t in tasks
            ],
        )
    )


async def output(stub: pb_grpc.SchedulerStub, task: str, data: bytes, eof: bool = False) -> None:
    await stub.SendDeltas(
        pb.SendDeltasRequest(
            backend=BACKEND,
            deltas=[pb.Delta(task_log=pb.TaskLogChunk(task_id=task, data=data, eof=eof))],
        )
    )


async def logs(stub: pb_grpc.SchedulerStub, job_id: str) -> dict[str, tuple[bytes, int, bool]]:
    reply = await stub.GetTaskLogs(pb.GetTaskLogsRequest(job_id=job_id))
    return {e.task_id: (e.data, e.dropped_bytes, e.eof) for e in reply.logs}


@asynccontextmanager
async def served(
    options: ServerOptions,
) -> AsyncIterator[tuple[ServerHandle, pb_grpc.SchedulerStub]]:
    handle = await start_server(options)
    try:
        async with grpc.aio.insecure_channel(handle.address) as channel:
            yield handle, pb_grpc.SchedulerStub(channel)
    finally:
        await handle.stop()


async def kept_across_a_restart(options: ServerOptions) -> None:
    lines = b"".join(f"step {i}\n".encode() for i in range(2000))  # 19,780 bytes
    async with served(options) as (_handle, stub):
        await leading(stub)
        [task] = await running(stub, "j")
        for start in range(0, len(lines), 4096):
            await output(stub, task, lines[start : start + 4096])
        await output(stub, task, b"", eof=True)
        await status(stub, [task], pb.TASK_STATUS_SUCCEEDED)
        before = await logs(stub, "j")
    limit = options.task_log_limit
    assert before == {task: (lines[-limit:], len(lines) - limit, True)}
    async with served(options) as (_handle, stub):
        await leading(stub)
        assert await logs(stub, "j") == before


async def test_output_is_kept_across_a_restart_sqlite(tmp_path: Path) -> None:
    await kept_across_a_restart(server_options(tmp_path, task_log_limit=8192))


async def test_output_is_kept_across_a_restart_postgres(tmp_path: Path, pg_dsn: str) -> None:
    await kept_across_a_restart(
        server_options(tmp_path, state=pg_dsn, task_log_limit=8192, lease_renew=0.2)
    )


async def collect(
    client: MusterClient, job_id: str, task_id: str, into: list[pb.TaskLogEvent]
) -> None:
    async for event in client.follow_task_logs(job_id, task_id):
        into.append(event)


def text(events: list[pb.TaskLogEvent], task: str) -> bytes:
    return b"".join(e.data for e in events if e.task_id == task)


async def test_follow_sends_what_is_kept_then_what_comes_and_ends_with_the_task(
    tmp_path: Path,
) -> None:
    async with served(server_options(tmp_path)) as (handle, stub):
        await leading(stub)
        [task] = await running(stub, "f")
        await output(stub, task, b"before\n")
        events: list[pb.TaskLogEvent] = []
        async with (
            MusterClient(handle.address, timeout=5) as client,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(collect, client, "f", task, events)
            await wait_for(lambda: _has(events, b"before\n"), "kept")
            await output(stub, task, b"during\n")
            await wait_for(lambda: _async(text(events, task) == b"before\nduring\n"), "new output")
            assert not any(e.eof for e in events)
            # It ends: the backend says so, and sends the rest of its output with eof.
            await status(stub, [task], pb.TASK_STATUS_SUCCEEDED)
            await output(stub, task, b"last\n", eof=True)
            with anyio.fail_after(WAIT):
                while not any(e.eof for e in events):
                    await anyio.sleep(0.02)
        assert text(events, task) == b"before\nduring\nlast\n"
        assert events[-1].eof
        assert events[-1].offset == len(b"before\nduring\nlast\n")
        # Resumed from an offset: only what follows it.
        async with MusterClient(handle.address, timeout=5) as client:
            rest = [e async for e in client.follow_task_logs("f", task, offsets={task: 7})]
        assert b"".join(e.data for e in rest) == b"during\nlast\n"
        assert rest[-1].eof


async def _async(value: bool) -> bool:
    return value


async def _has(events: list[pb.TaskLogEvent], data: bytes) -> bool:
    return b"".join(e.data for e in events).startswith(data)


async def test_follow_of_a_job_ends_when_its_tasks_ended_even_without_eof(tmp_path: Path) -> None:
    async with served(server_options(tmp_path, task_log_limit=4096)) as (handle, stub):
        await leading(stub)
        tasks = await running(stub, "g", replicas=2)
        await output(stub, tasks[0], b"x" * 6000)  # more than the bound: the oldest dropped
        events: list[pb.TaskLogEvent] = []
        async with (
            MusterClient(handle.address, timeout=5) as client,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(collect, client, "g", "", events)
            await wait_for(lambda: _async(len(text(events, tasks[0])) == 4096), "the kept tail")
            await status(stub, tasks, pb.TASK_STATUS_FAILED)  # no output, no eof: a silent backend
            with anyio.fail_after(WAIT):
                while {e.task_id for e in events if e.eof} != set(tasks):
                    await anyio.sleep(0.05)
        first = next(e for e in events if e.task_id == tasks[0])
        assert first.dropped_bytes == 6000 - 4096
        assert first.offset == 6000 - 4096


async def test_follow_refuses_unknown_jobs_and_tasks(tmp_path: Path) -> None:
    async with served(server_options(tmp_path)) as (handle, stub):
        await leading(stub)
        await running(stub, "h")
        async with MusterClient(handle.address, timeout=5) as client:
            for job_id, task_id, code in (
                ("nope", "", grpc.StatusCode.NOT_FOUND),
                ("h", "h/worker-9", grpc.StatusCode.NOT_FOUND),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    async for _event in client.follow_task_logs(job_id, task_id):
                        pass
                assert info.value.code() == code


async def test_a_follower_serves_follow_from_the_store(tmp_path: Path, pg_dsn: str) -> None:
    """Two servers on one PostgreSQL: the backend talks to the leader, the follow is served by
    the follower, woken by the change feed, and ends when the task ends."""
    leader_opts = server_options(tmp_path / "a", state=pg_dsn, lease_renew=0.2)
    async with served(leader_opts) as (_leader, stub):
        await leading(stub)
        follower_opts = server_options(tmp_path / "b", state=pg_dsn, lease_renew=0.2)
        async with served(follower_opts) as (follower, _fstub):
            [task] = await running(stub, "r")
            await output(stub, task, b"one\n")
            events: list[pb.TaskLogEvent] = []
            async with (
                MusterClient(follower.address, timeout=5) as client,
                anyio.create_task_group() as tg,
            ):
                assert follower.server.replica is not None
                assert not follower.server.replica.leading
                tg.start_soon(collect, client, "r", task, events)
                await wait_for(lambda: _async(text(events, task) == b"one\n"), "kept output")
                await output(stub, task, b"two\n")
                await wait_for(lambda: _async(text(events, task) == b"one\ntwo\n"), "new output")
                await output(stub, task, b"", eof=True)
                await status(stub, [task], pb.TASK_STATUS_SUCCEEDED)
                with anyio.fail_after(WAIT):
                    while not any(e.eof for e in events):
                        await anyio.sleep(0.02)
            # GetTaskLogs is answered by the follower too (no longer leader-only).
            async with grpc.aio.insecure_channel(follower.address) as channel:
                got = await logs(pb_grpc.SchedulerStub(channel), "r")
            assert got == {task: (b"one\ntwo\n", 0, True)}


async def test_a_follow_goes_on_on_another_server_when_its_server_stops(
    tmp_path: Path, pg_dsn: str
) -> None:
    """The follow is served by a follower that then stops: the client reopens it on the other
    server from the offsets it has -- nothing twice, nothing missing."""
    async with served(server_options(tmp_path / "a", state=pg_dsn, lease_renew=0.2)) as (
        leader,
        stub,
    ):
        await leading(stub)
        [task] = await running(stub, "m")
        await output(stub, task, b"one\n")
        follower = await start_server(server_options(tmp_path / "b", state=pg_dsn, lease_renew=0.2))
        try:
            events: list[pb.TaskLogEvent] = []
            addresses = f"{follower.address},{leader.address}"  # the follower first
            async with (
                MusterClient(addresses, timeout=5, failover_timeout=20) as client,
                anyio.create_task_group() as tg,
            ):
                tg.start_soon(collect, client, "m", task, events)
                await wait_for(lambda: _async(text(events, task) == b"one\n"), "kept output")
                assert client.address == follower.address
                await follower.stop()
                await output(stub, task, b"two\n", eof=True)
                await status(stub, [task], pb.TASK_STATUS_SUCCEEDED)
                with anyio.fail_after(WAIT):
                    while not any(e.eof for e in events):
                        await anyio.sleep(0.02)
            assert text(events, task) == b"one\ntwo\n"
            assert [e.offset for e in events if e.data] == [0, 4]
        finally:
            await follower.stop()
