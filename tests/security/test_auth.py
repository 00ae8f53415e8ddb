"""Bearer tokens and per-verb, per-queue authorization (server/service/auth.py), with hot reload."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import structlog

from clients.client import MusterClient
from clients.jobfile import job_from_dict
from muster.v1 import muster_pb2 as pb
from server.service.app import ServerHandle, ServerOptions, start_server
from server.service.auth import PolicyError, parse_policy
from server.service.rpc import RPC_VERBS, SchedulerService

POLICY = """
tokens:
  - {token: alice-token-1, user: alice, groups: [ml]}
  - {token: bob-token-123, user: bob, groups: [web]}
  - {token: ops-token-123, user: ops, groups: [admins]}
  - {token: agent-token-1, user: rack-a, groups: [backends]}
rules:
  - {subjects: ["group:ml"], verbs: [read, submit, cancel], queues: [ml]}
  - {subjects: ["user:bob"], verbs: [read, submit], queues: [default]}
  - {subjects: ["group:admins"], verbs: ["*"]}
  - {subjects: ["group:backends"], verbs: [backend]}
"""


def job(job_id: str, queue: str) -> pb.JobSpec:
    return job_from_dict(
        {
            "id": job_id,
            "queue": queue,
            "tasks": [{"role": "w", "replicas": 1, "request": {"cpu": "1"}}],
        }
    )


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


@pytest.fixture
async def server(tmp_path: Path, policy_file: Path) -> AsyncIterator[ServerHandle]:
    opts = ServerOptions(
        listen="127.0.0.1:0",
        state=str(tmp_path / "muster.db"),
        cycle_period=3600.0,
        auth_policy=str(policy_file),
    )
    handle = await start_server(opts)
    try:
        async with MusterClient(handle.address, timeout=5, token="ops-token-123") as ops:
            await ops.create_queue(pb.Queue(name="ml"))
        yield handle
    finally:
        await handle.stop()


async def code_of(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


async def test_no_or_unknown_token_is_unauthenticated(server: ServerHandle) -> None:
    for token in ("", "not-a-known-token"):
        async with MusterClient(server.address, timeout=5, token=token) as client:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.list_queues()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "bearer token" in (err.value.details() or "")


async def test_submit_and_cancel_are_checked_per_queue(server: ServerHandle) -> None:
    async with (
        MusterClient(server.address, timeout=5, token="alice-token-1") as alice,
        MusterClient(server.address, timeout=5, token="bob-token-123") as bob,
    ):
        assert (await alice.submit_job(job("a1", "ml"))).created
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await alice.submit_job(job("a2", "default"))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert err.value.details() == "user 'alice' may not submit in queue 'default'"
        assert (await bob.submit_job(job("b1", "default"))).created
        # bob may read but not cancel, in any queue; alice may cancel in ml only
        assert await code_of(bob.cancel_job("a1")) == grpc.StatusCode.PERMISSION_DENIED
        assert await code_of(alice.cancel_job("b1")) == grpc.StatusCode.PERMISSION_DENIED
        assert await code_of(alice.cancel_job("a1")) == grpc.StatusCode.OK
        # reads are scoped like submit: bob reads queue default (and his own jobs), not ml
        assert {j.spec.id async for j in bob.list_jobs()} == {"b1"}
        assert {j.spec.id async for j in alice.list_jobs()} == {"a1"}


async def test_queues_and_configuration_need_their_verbs(server: ServerHandle) -> None:
    async with (
        MusterClient(server.address, timeout=5, token="alice-token-1") as alice,
        MusterClient(server.address, timeout=5, token="ops-token-123") as ops,
    ):
        assert (
            await code_of(alice.create_queue(pb.Queue(name="mine")))
            == grpc.StatusCode.PERMISSION_DENIED
        )
        closed = pb.Queue(name="default", state=pb.QUEUE_STATE_CLOSED)
        assert (
            await code_of(alice.stub.UpdateQueue(pb.QueueRequest(queue=closed)))
            == grpc.StatusCode.PERMISSION_DENIED
        )
        update = alice.stub.UpdateConfig(pb.UpdateConfigRequest(yaml="actions: enqueue"))
        assert await code_of(update) == grpc.StatusCode.PERMISSION_DENIED
        assert (
            await code_of(ops.stub.UpdateConfig(pb.UpdateConfigRequest(yaml="actions: enqueue")))
            == grpc.StatusCode.OK
        )
        names = {q.queue.name for q in await ops.list_queues()}
        assert names == {"root", "default", "ml"}


async def test_backend_rpcs_need_the_backend_verb(server: ServerHandle) -> None:
    register = pb.RegisterBackendRequest(name="rack-a", kind="fake-agent")
    async with (
        MusterClient(server.address, timeout=5, token="alice-token-1") as alice,
        MusterClient(server.address, timeout=5, token="agent-token-1") as agent,
    ):
        assert (
            await code_of(alice.stub.RegisterBackend(register)) == grpc.StatusCode.PERMISSION_DENIED
        )
        assert await code_of(agent.stub.RegisterBackend(register)) == grpc.StatusCode.OK


async def test_the_policy_file_is_reloaded_without_a_restart(
    server: ServerHandle, policy_file: Path
) -> None:
    async with MusterClient(server.address, timeout=5, token="carol-token-1") as carol:
        assert await code_of(carol.list_queues()) == grpc.StatusCode.UNAUTHENTICATED
        policy_file.write_text(
            POLICY.replace("rules:", "  - {token: carol-token-1, user: carol}\nrules:")
            + '  - {subjects: ["user:carol"], verbs: [read]}\n'
        )
        os.utime(
            policy_file, ns=(1, 10**18)
        )  # a new mtime even within the file system's granularity
        assert await code_of(carol.list_queues()) == grpc.StatusCode.OK
        policy_file.write_text("tokens: [not a mapping")  # broken: the previous policy stays
        os.utime(policy_file, ns=(1, 2 * 10**18))
        assert await code_of(carol.list_queues()) == grpc.StatusCode.OK


async def test_state_changing_calls_are_audited(server: ServerHandle) -> None:
    with structlog.testing.capture_logs() as logs:
        async with MusterClient(server.address, timeout=5, token="alice-token-1") as alice:
            await alice.submit_job(job("a1", "ml"))
            await code_of(alice.submit_job(job("a2", "default")))
            await alice.list_queues()
    audit = [(e["who"], e["rpc"], e["result"]) for e in logs if e.get("event") == "audit"]
    assert audit == [("alice", "SubmitJob", "OK"), ("alice", "SubmitJob", "PERMISSION_DENIED")]


def test_every_rpc_has_a_verb() -> None:
    methods = {m.name for m in pb.DESCRIPTOR.services_by_name["Scheduler"].methods}
    assert set(RPC_VERBS) == methods
    assert all(hasattr(SchedulerService, name) for name in methods)


@pytest.mark.parametrize(
    "text",
    [
        "tokens: [{token: short, user: a}]",
        "rules: [{subjects: [], verbs: [read]}]",
        "rules: [{subjects: ['*'], verbs: [fly]}]",
        "surprise: 1",
        "tokens: [{token: same-token-1, user: a}, {token: same-token-1, user: b}]",
    ],
)
def test_bad_policies_are_refused_with_the_reason(text: str) -> None:
    with pytest.raises(PolicyError):
        parse_policy(text, "policy.yaml")


async def test_a_backend_token_acts_only_for_its_own_backend(server: ServerHandle) -> None:
    async with MusterClient(
        server.address, timeout=5, token="agent-token-1"
    ) as agent:  # user rack-a
        other = pb.RegisterBackendRequest(name="rack-b", kind="fake-agent")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await agent.stub.RegisterBackend(other)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'rack-b'" in (err.value.details() or "")
        await agent.stub.RegisterBackend(
            pb.RegisterBackendRequest(name="rack-a", kind="fake-agent")
        )
        assert (
            await code_of(agent.stub.SyncSnapshot(pb.SyncSnapshotRequest(backend="rack-b")))
            == grpc.StatusCode.PERMISSION_DENIED
        )


def test_adapters_take_the_token_options() -> None:
    from adapters.agent.main import build_parser  # only this test needs the agent

    args = build_parser().parse_args(
        ["--name", "rack-a", "--inventory", "x.yaml", "--token", "agent-token-1"]
    )
    assert args.token == "agent-token-1"


async def test_jobs_record_their_owner_and_list_by_owner(server: ServerHandle) -> None:
    """The owner is the token's user, whatever the spec or the user claim says; ListJobs filters
    on it (memory here; the store's column in tests/server/test_tyjob_devices.py)."""
    async with MusterClient(
        server.address, timeout=5, token="alice-token-1", user="mallory"
    ) as alice:
        spoof = job("a1", "ml")
        spoof.owner = "bob"
        created = (await alice.submit_job(spoof)).job
        assert created.spec.owner == "alice"
    async with MusterClient(server.address, timeout=5, token="bob-token-123") as bob:
        await bob.submit_job(job("b1", "default"))
    async with MusterClient(server.address, timeout=5, token="ops-token-123") as ops:
        assert [j.spec.id async for j in ops.list_jobs(owner="alice")] == ["a1"]
        assert [j.spec.id async for j in ops.list_jobs(owner="bob")] == ["b1"]
        assert [j.spec.id async for j in ops.list_jobs(owner="nobody")] == []


async def test_cancel_own_lets_a_user_cancel_only_the_jobs_they_submitted(
    server: ServerHandle, policy_file: Path
) -> None:
    policy_file.write_text(
        POLICY.replace(
            '  - {subjects: ["user:bob"], verbs: [read, submit], queues: [default]}',
            '  - {subjects: ["user:bob", "user:alice"], verbs: [read, submit, cancel-own], queues: [default]}',
        )
    )
    os.utime(
        policy_file, (os.stat(policy_file).st_atime, os.stat(policy_file).st_mtime + 5)
    )  # reload
    async with (
        MusterClient(server.address, timeout=5, token="alice-token-1") as alice,
        MusterClient(server.address, timeout=5, token="bob-token-123") as bob,
    ):
        await alice.submit_job(job("mine", "default"))
        await bob.submit_job(job("his", "default"))
        assert await code_of(alice.cancel_job("his")) == grpc.StatusCode.PERMISSION_DENIED
        assert (await alice.cancel_job("mine")).status.phase == pb.JOB_PHASE_CANCELLED
        assert (await bob.cancel_job("his")).status.phase == pb.JOB_PHASE_CANCELLED
