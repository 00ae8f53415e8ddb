"""The Python client against fake replicas: it finds and follows the leader, moves past a dead
address, resumes a watch on another server, and makes a write retried after a dropped connection
mean what the first try meant."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from clients.client import MusterClient, same_job_spec
from muster.v1 import muster_pb2 as pb

from .fakes import Replica, Store, closed_port_address, stored_spec


def spec(job_id: str, cpu: str = "1") -> pb.JobSpec:
    return pb.JobSpec(
        id=job_id,
        task_groups=[
            pb.TaskGroup(role="w", replicas=1, request=pb.ResourceList(quantities={"cpu": cpu}))
        ],
    )


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Store, Replica, Replica]]:
    """A follower and a leader sharing one store."""
    store = Store()
    follower = await Replica(store, "follower").start()
    leader = await Replica(store, "leader").start()
    store.leader = leader.address
    try:
        yield store, follower, leader
    finally:
        await follower.stop()
        await leader.stop()


async def next_event(events: AsyncIterator[pb.JobEvent]) -> pb.JobEvent:
    """The next watch event, within a bound (a broken resume must fail, not hang)."""
    return await asyncio.wait_for(anext(events), 10)


def client(*addresses: str, failover_timeout: float = 5.0) -> MusterClient:
    return MusterClient(
        ",".join(addresses), timeout=5, user="alice", failover_timeout=failover_timeout
    )


async def test_a_followers_hint_leads_to_the_leader_even_outside_the_list(cluster):
    store, follower, leader = cluster
    async with client(follower.address) as muster:  # the leader is not in the list
        reply = await muster.submit_job(spec("a"))
        assert reply.created
        assert "a" in store.jobs
        assert follower.calls == ["SubmitJob"]
        assert leader.calls == ["SubmitJob"]
        assert muster.address == leader.address
        # The leader is known now: the next write goes straight there.
        await muster.submit_job(spec("b"))
        assert follower.calls == ["SubmitJob"]
        assert leader.calls.count("SubmitJob") == 2


async def test_a_dead_first_address_moves_to_the_next(cluster):
    _, follower, _ = cluster
    sock, dead = closed_port_address()
    with sock:
        async with client(dead, follower.address) as muster:
            queues = await muster.list_queues()
            assert [q.queue.name for q in queues] == ["follower"]  # a read: any replica serves
            assert muster.address == follower.address
            assert muster.addresses == [dead, follower.address]


async def test_reads_stay_on_the_replica_that_answers(cluster):
    _, follower, leader = cluster
    async with client(follower.address, leader.address) as muster:
        for _ in range(3):
            await muster.list_queues()
        assert follower.calls == ["ListQueues"] * 3
        assert leader.calls == []


async def test_without_a_leader_a_write_is_retried_until_the_failover_timeout(cluster):
    store, follower, _ = cluster
    store.leader = ""  # an election: the follower refuses without a hint
    async with client(follower.address, failover_timeout=0.6) as muster:
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await muster.submit_job(spec("a"))
        elapsed = time.monotonic() - started
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert 0.55 <= elapsed < 3.0  # the last try comes at the deadline, not before
    assert follower.calls.count("SubmitJob") >= 3  # retried with a short backoff
    async with client(follower.address, failover_timeout=0) as muster:
        with pytest.raises(grpc.aio.AioRpcError):
            await muster.submit_job(spec("b"))
    assert follower.calls.count("SubmitJob") >= 4


async def test_a_leader_elected_during_the_retries_gets_the_write(cluster):
    store, follower, leader = cluster
    store.leader = ""
    async with client(follower.address, failover_timeout=10) as muster:

        async def elect() -> None:
            await asyncio.sleep(0.3)
            store.leader = leader.address

        task = asyncio.ensure_future(elect())
        reply = await muster.submit_job(spec("a"))
        await task
    assert reply.created
    assert leader.calls == ["SubmitJob"]


async def test_submit_retried_after_a_drop_is_a_success_when_the_stored_spec_matches(cluster):
    store, _, leader = cluster
    leader.drop_after_processing = 1  # processed, then the connection "drops"
    async with client(leader.address) as muster:
        reply = await muster.submit_job(spec("a"))
    assert not reply.created
    assert reply.job.spec.id == "a"
    # The retry was answered ALREADY_EXISTS and the client read the job to compare.
    assert leader.calls == ["SubmitJob", "SubmitJob", "GetJob"]
    assert store.jobs["a"].spec == stored_spec(spec("a"))


async def test_submit_retried_after_a_drop_fails_when_another_spec_is_stored(cluster):
    store, _, leader = cluster
    theirs = stored_spec(spec("a", cpu="2"), owner="bob")
    await store.put_job(pb.Job(spec=theirs))
    async with client(leader.address) as muster:
        # Not a retry: the ALREADY_EXISTS stands, the job is not even read.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await muster.submit_job(spec("a"))
        assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "GetJob" not in leader.calls
        # The first try is lost on its way: the retry meets the other job, reads it, and fails.
        leader.calls.clear()
        leader.drop_before_processing = 1
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await muster.submit_job(spec("a"))
        assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert leader.calls == ["SubmitJob", "SubmitJob", "GetJob"]
    assert store.jobs["a"].spec == theirs


async def test_submit_jobs_retried_after_a_drop_compares_every_job(cluster):
    store, _, leader = cluster
    leader.drop_after_processing = 1
    async with client(leader.address) as muster:
        results = await muster.submit_jobs([spec("a"), spec("b")])
    assert [r.job.spec.id for r in results] == ["a", "b"]
    assert not any(r.created for r in results)
    assert set(store.jobs) == {"a", "b"}


async def test_cancel_retried_after_a_drop_returns_the_cancelled_job(cluster):
    store, follower, leader = cluster
    await store.put_job(pb.Job(spec=stored_spec(spec("a")), status=pb.JobStatus(phase=1)))
    leader.drop_after_processing = 1  # cancelled, then the answer is lost
    async with client(follower.address) as muster:
        job = await muster.cancel_job("a")
    assert job.status.phase == pb.JOB_PHASE_CANCELLED
    assert leader.calls == ["CancelJob", "CancelJob"]


async def test_watch_resumes_on_another_server_without_repeating_what_was_seen(cluster):
    store, follower, leader = cluster
    await store.put_job(pb.Job(spec=stored_spec(spec("j0"))), publish=False)
    await store.put_job(pb.Job(spec=stored_spec(spec("j1"))), publish=False)
    async with client(follower.address, leader.address) as muster:
        events = muster.watch_jobs(send_initial=True)
        seen = [await next_event(events), await next_event(events)]
        assert [(e.type, e.job.spec.id) for e in seen] == [(1, "j0"), (1, "j1")]
        # While the follower is lost, j1 changes and j2 arrives (no one tells the follower's
        # stream); then its stream fails.
        changed = pb.Job(spec=stored_spec(spec("j1")), status=pb.JobStatus(phase=3))
        await store.put_job(changed, publish=False)
        await store.put_job(pb.Job(spec=stored_spec(spec("j2"))), publish=False)
        follower.end_streams()
        resumed = [await next_event(events), await next_event(events)]
        assert [(e.type, e.job.spec.id) for e in resumed] == [
            (pb.JobEvent.TYPE_MODIFIED, "j1"),  # was seen in another state
            (pb.JobEvent.TYPE_ADDED, "j2"),
        ]  # j0, unchanged, is not repeated
        assert resumed[0].job.status.phase == 3
        assert leader.watch_requests[-1].send_initial
        await store.put_job(pb.Job(spec=stored_spec(spec("j3"))))  # live again, on the leader
        live = await next_event(events)
        assert (live.type, live.job.spec.id) == (pb.JobEvent.TYPE_ADDED, "j3")
        await events.aclose()


async def test_watch_gives_up_after_the_failover_timeout(cluster):
    _, follower, _ = cluster
    sock, dead = closed_port_address()
    with sock:
        async with client(follower.address, dead, failover_timeout=0.5) as muster:
            events = muster.watch_jobs(send_initial=True)
            await follower.stop()
            started = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await next_event(events)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - started < 5


def test_same_job_spec_fills_server_defaults_and_ignores_the_owner():
    sent = spec("a")
    assert same_job_spec(sent, stored_spec(sent, owner="bob"))
    assert not same_job_spec(sent, stored_spec(spec("a", cpu="2")))
    other_queue = stored_spec(sent)
    other_queue.queue = "ml"
    assert not same_job_spec(sent, other_queue)


def test_addresses_parse_as_one_list():
    muster = MusterClient([" a:1 , b:2", "", "a:1,c:3"])
    assert muster.addresses == ["a:1", "b:2", "c:3"]
    assert muster.address == "a:1"
    with pytest.raises(ValueError, match="address: no server address"):
        MusterClient(" , ")
