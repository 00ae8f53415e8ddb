"""Replicated servers on a real PostgreSQL (started by the tests, durability settings left at
PostgreSQL's defaults): one leader, warm followers, and the faults of docs/ha.md -- leader killed,
leader paused past its lease, its database connections cut, a graceful handover.

Each fault runs under a steady stream of submissions and a recording backend
(tests/ha/harness.py) and asserts: no acknowledged job lost (all complete), no task started twice,
no node over-committed, no decision of a replaced leader delivered, no decision id reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from tests.ha.harness import (
    Deployment,
    RecordingBackend,
    ServerProc,
    Submitter,
    job_spec,
    leader_hint,
    unfinished,
)
from tests.pgserver import PostgresNotFound, PostgresServer

LEASE = 3.0
RENEW = 0.5


@pytest.fixture(scope="module")
def durable_postgres() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer(fast=False)
    except PostgresNotFound as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs PostgreSQL for the failover tests: {exc}")
        pytest.skip(f"{exc}: apt-get install postgresql")
    with server:
        yield server


@pytest.fixture
async def deployment(
    durable_postgres: PostgresServer, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Deployment]:
    name = f"ha_{request.node.name[:40].lower()}_{os.getpid()}"
    dsn = durable_postgres.new_database(name)
    servers = [
        ServerProc(i, dsn, tmp_path, lease_duration=LEASE, lease_renew=RENEW) for i in range(3)
    ]
    dep = Deployment(servers)
    dep.start()
    try:
        yield dep
    finally:
        dep.stop()
        with contextlib.suppress(Exception):
            durable_postgres.drop_database(name)


async def until(what: str, check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = check()  # type: ignore[operator]
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_one_leader_followers_answer_reads_and_name_the_leader(
    deployment: Deployment,
) -> None:
    leader = await deployment.leader()
    follower = next(s for s in deployment.servers if s is not leader)
    async with grpc.aio.insecure_channel(follower.address) as ch:
        stub = pb_grpc.SchedulerStub(ch)

        async def names_the_leader() -> bool:  # the lease as the database has it
            reply = await stub.ListServers(pb.ListServersRequest(), timeout=5)
            return reply.leader == leader.address

        await until("the follower to name the leader", names_the_leader, timeout=10)
        reply = await stub.ListServers(pb.ListServersRequest(), timeout=5)
        assert sorted(r.address for r in reply.servers) == sorted(deployment.addresses)
        assert [r.role for r in reply.servers].count("leader") == 1
        assert reply.term >= 1
        # A write to a follower: refused, not processed, naming the leader (once the follower's
        # own lease attempt has seen it: at most a renewal interval after the election).
        refusals: list[grpc.aio.AioRpcError] = []

        async def refused_naming_the_leader() -> bool:
            try:
                await stub.SubmitJob(pb.SubmitJobRequest(job=job_spec("on-follower")), timeout=5)
            except grpc.aio.AioRpcError as exc:
                refusals.append(exc)
                return leader_hint(exc) == leader.address
            raise AssertionError("a follower accepted a write")

        await until("a refusal naming the leader", refused_naming_the_leader, timeout=10)
        assert all(r.code() == grpc.StatusCode.UNAVAILABLE for r in refusals)
        assert "follower" in (refusals[-1].details() or "")
        # A job submitted to the leader is soon readable on the follower (warm copy).
        async with grpc.aio.insecure_channel(leader.address) as lch:
            await pb_grpc.SchedulerStub(lch).SubmitJob(
                pb.SubmitJobRequest(job=job_spec("on-leader")), timeout=5
            )

        async def visible() -> bool:
            try:
                job = await stub.GetJob(pb.GetJobRequest(id="on-leader"), timeout=2)
            except grpc.aio.AioRpcError:
                return False
            return job.spec.id == "on-leader"

        await until("the follower to see the job", visible, timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetJob(pb.GetJobRequest(id="on-follower"), timeout=2)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def _fault_run(
    deployment: Deployment, fault: str, *, jobs: int = 120, rate: float = 40.0
) -> None:
    """Submissions at ``rate`` while ``fault`` hits the leader a third of the way in; then every
    invariant."""
    leader = await deployment.leader()
    backend = RecordingBackend(deployment.addresses, nodes=4, hold=0.2)
    submitter = Submitter(deployment.addresses)
    tasks = [asyncio.create_task(backend.run()), asyncio.create_task(backend.report_loop())]
    try:
        await until("the backend to be served", lambda: backend.record.sessions > 0)
        submitting = asyncio.create_task(submitter.run(rate, jobs))
        await until("a third of the jobs", lambda: len(submitter.acked) >= jobs // 3, 30)
        old_term = backend.record.max_term
        faulted = time.monotonic()
        if fault == "kill":
            leader.kill()
        elif fault == "pause":
            leader.signal(signal.SIGSTOP)
        elif fault == "cut":
            assert deployment.terminate_store_sessions(leader) >= 1
        elif fault == "handover":
            leader.signal(signal.SIGTERM)
        if fault == "pause":
            # Paused past its lease: another replica leads; then the old one wakes up.
            await until(
                "a new leader's decision",
                lambda: backend.record.max_term > old_term,
                timeout=30,
            )
            leader.signal(signal.SIGCONT)
        await asyncio.wait_for(submitting, 120)
        await until(
            "every acknowledged job to run",
            lambda: len(backend.record.done) >= len(submitter.acked),
            timeout=60,
        )
        first_after = next(t for t, _term in backend.record.received if t > faulted)
        recovery = first_after - faulted
        missing = await unfinished(deployment.addresses, submitter.acked)
        deadline = time.monotonic() + 30
        while missing and time.monotonic() < deadline:  # the last Succeeded reports land
            await asyncio.sleep(0.2)
            missing = await unfinished(deployment.addresses, missing)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await backend.follower.close()
        await submitter.follower.close()
    record = backend.record
    assert len(submitter.acked) == jobs
    assert missing == [], f"acknowledged jobs lost or not completed: {missing[:10]}"
    assert record.started_twice == 0, [t for t, n in record.starts.items() if n > 1][:10]
    assert record.overcommits == 0
    assert record.stale_term == 0
    assert record.conflicting == 0
    assert recovery < 15, f"no decision for {recovery:.1f} s after the fault"
    if fault in ("kill", "pause", "handover"):
        assert record.max_term > old_term, "the leadership moved: a new term"
    if fault == "pause":
        # The paused leader woke up deposed: it follows, and committed nothing meanwhile.
        await until("the old leader to follow", lambda: _says_follower(leader), timeout=15)
    if fault == "handover":
        assert leader.wait(10) == 0  # a clean exit


def _says_follower(server: ServerProc) -> bool:
    text = server.log_path.read_text(errors="replace")
    return '"role": "follower"' in text and text.rfind('"role": "follower"') > text.rfind(
        '"role": "leader"'
    )


async def test_leader_killed(deployment: Deployment) -> None:
    await _fault_run(deployment, "kill")


async def test_leader_paused_past_its_lease_commits_nothing(deployment: Deployment) -> None:
    await _fault_run(deployment, "pause")


async def test_leader_database_connections_cut(deployment: Deployment) -> None:
    await _fault_run(deployment, "cut")


async def test_graceful_handover(deployment: Deployment) -> None:
    leader = await deployment.leader()
    term_before = await _term(deployment, leader)
    started = time.monotonic()
    leader.signal(signal.SIGTERM)
    # The signalled leader leads until it has handled the signal: the next one is another.
    new = await deployment.leader(timeout=10, other_than=leader)
    took = time.monotonic() - started
    assert new is not leader
    assert await _term(deployment, new) == term_before + 1
    assert took < LEASE, f"handover took {took:.2f} s: it must not wait for the lease to expire"
    assert leader.wait(10) == 0


async def test_handover_under_load(deployment: Deployment) -> None:
    await _fault_run(deployment, "handover")


async def _term(deployment: Deployment, server: ServerProc) -> int:
    async with grpc.aio.insecure_channel(server.address) as ch:
        reply = await pb_grpc.SchedulerStub(ch).ListServers(pb.ListServersRequest(), timeout=5)
    return int(reply.term)
