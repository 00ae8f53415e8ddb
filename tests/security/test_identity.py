"""Who a caller is under mutual TLS and an auth policy: a certificate is an identity only where the
policy maps it; backend identity is an authorization decision; every call is audited with the real
identity; reads are scoped per queue; reflection and /metrics need credentials."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import anyio
import grpc
import pytest
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tls_helpers import Authority

from clients.client import MusterClient
from clients.jobfile import job_from_dict
from muster import transport
from muster.transport import ClientTls
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service.app import ServerHandle, ServerOptions, start_server
from server.service.auth import PolicyError, parse_policy

POLICY = """
tokens:
  - {token: alice-token-1, user: alice, groups: [ml]}
  - {token: carol-token-1, user: carol}
  - {token: rack-b-token1, user: rack-b}
  - {token: ops-token-123, user: ops, groups: [admins]}
certificates:
  - {cn: rack-a, backend: rack-a}
  - {san: gw.hpc.example.org, backend: hpc}
  - {cn: dave, user: dave, groups: [ml]}
rules:
  - {subjects: ["group:ml"], verbs: [read, submit, cancel], queues: [ml]}
  - {subjects: ["user:carol"], verbs: [read], queues: [ml]}
  - {subjects: ["user:carol"], verbs: [submit], queues: [default]}
  - {subjects: ["user:rack-b"], verbs: [backend]}
  - {subjects: ["group:admins"], verbs: ["*"]}
"""


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, ClientTls | Path]:
    ca = Authority.new("muster-test-ca")
    server_cert, server_key = ca.issue("server", tmp_path, server=True)
    out: dict[str, ClientTls | Path] = {
        "ca": ca.write(tmp_path / "ca.crt"),
        "server_cert": server_cert,
        "server_key": server_key,
    }
    for name, sans in (
        ("alice", ()),
        ("rack-a", ()),
        ("dave", ()),
        ("gateway", ("gw.hpc.example.org",)),
    ):
        cert, key = ca.issue(name, tmp_path, server=False, dns_names=sans)
        out[name] = ClientTls(ca=str(out["ca"]), cert=str(cert), key=str(key))
    return out


def tls(pki: dict[str, ClientTls | Path], name: str) -> ClientTls:
    value = pki[name]
    assert isinstance(value, ClientTls)
    return value


@pytest.fixture
async def server(tmp_path: Path, pki: dict[str, ClientTls | Path]) -> AsyncIterator[ServerHandle]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    opts = ServerOptions(
        listen="127.0.0.1:0",
        state=str(tmp_path / "muster.db"),
        cycle_period=3600.0,
        auth_policy=str(policy),
        tls_cert=str(pki["server_cert"]),
        tls_key=str(pki["server_key"]),
        tls_client_ca=str(pki["ca"]),
        metrics_listen="127.0.0.1:0",
    )
    handle = await start_server(opts)
    try:
        async with MusterClient(
            handle.address, timeout=5, token="ops-token-123", tls=tls(pki, "alice")
        ) as ops:
            await ops.create_queue(pb.Queue(name="ml"))
        yield handle
    finally:
        await handle.stop()


async def code_of(call: object) -> tuple[grpc.StatusCode, str]:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


async def stream_code(stream: object) -> grpc.StatusCode:
    try:
        with anyio.fail_after(5):
            async for _ in stream:  # type: ignore[attr-defined]
                break
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def job(job_id: str, queue: str) -> pb.JobSpec:
    return job_from_dict(
        {
            "id": job_id,
            "queue": queue,
            "tasks": [{"role": "w", "replicas": 1, "request": {"cpu": "1"}}],
        }
    )


def backend_calls(stub: pb_grpc.SchedulerStub, name: str) -> Iterator[object]:
    """The unary backend RPCs for backend ``name``, one at a time (each starts when taken)."""
    node = pb.Node(name=f"{name}-0", allocatable=pb.ResourceList(quantities={"cpu": "1000"}))
    yield stub.RegisterBackend(pb.RegisterBackendRequest(name=name, kind="fake-agent"), timeout=5)
    yield stub.SyncSnapshot(pb.SyncSnapshotRequest(backend=name, nodes=[node]), timeout=5)
    yield stub.SendDeltas(pb.SendDeltasRequest(backend=name), timeout=5)
    yield stub.AckDecisions(pb.AckDecisionsRequest(backend=name), timeout=5)
    yield stub.Heartbeat(pb.HeartbeatRequest(backend=name), timeout=5)


async def test_a_user_certificate_without_a_token_is_no_backend(
    server: ServerHandle, pki: dict
) -> None:
    """The audited attack: alice's certificate (CN=alice, not in the policy) registers backend 'alice'."""
    async with transport.channel(server.address, tls(pki, "alice")) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        for call in backend_calls(stub, "alice"):
            code, details = await code_of(call)
            assert code == grpc.StatusCode.UNAUTHENTICATED, details
        assert (
            await stream_code(stub.StreamDecisions(pb.StreamDecisionsRequest(backend="alice")))
            == grpc.StatusCode.UNAUTHENTICATED
        )
    assert "alice" not in server.server.state.backends  # type: ignore[union-attr]
    assert not server.server.state.nodes  # type: ignore[union-attr]


async def test_a_mapped_user_certificate_is_that_user_and_gets_no_backend_verb(
    server: ServerHandle, pki: dict
) -> None:
    async with transport.channel(server.address, tls(pki, "dave")) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        for call in backend_calls(stub, "dave"):
            code, details = await code_of(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert "user 'dave' may not backend" in details
        assert (
            await stream_code(stub.StreamDecisions(pb.StreamDecisionsRequest(backend="dave")))
            == grpc.StatusCode.PERMISSION_DENIED
        )
        # ... but the rules apply as to a token of dave's: submit in ml, not in default
        reply = await stub.SubmitJob(pb.SubmitJobRequest(job=job("d1", "ml")), timeout=5)
        assert reply.created
        assert reply.job.spec.owner == "dave"
        code, _ = await code_of(
            stub.SubmitJob(pb.SubmitJobRequest(job=job("d2", "default")), timeout=5)
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED


async def test_a_backend_certificate_acts_as_its_backend_only(
    server: ServerHandle, pki: dict
) -> None:
    with structlog.testing.capture_logs() as logs:
        async with transport.channel(server.address, tls(pki, "rack-a")) as ch:
            stub = pb_grpc.SchedulerStub(ch)
            for call in backend_calls(stub, "rack-a"):
                assert (await code_of(call))[0] == grpc.StatusCode.OK
            for call in backend_calls(stub, "rack-b"):
                code, details = await code_of(call)
                assert code == grpc.StatusCode.PERMISSION_DENIED
                assert "'rack-a'" in details
                assert "'rack-b'" in details
            # a backend identity is not a user: no reads, no submissions
            assert (await code_of(stub.ListJobs(pb.ListJobsRequest(), timeout=5)))[
                0
            ] == grpc.StatusCode.PERMISSION_DENIED
            assert (
                await code_of(stub.SubmitJob(pb.SubmitJobRequest(job=job("x", "ml")), timeout=5))
            )[0] == grpc.StatusCode.PERMISSION_DENIED
    audits = [e for e in logs if e["event"] == "audit"]
    assert {e["who"] for e in audits if e["rpc"] == "RegisterBackend"} == {"backend:rack-a"}
    assert not [e for e in audits if e["who"] == "anonymous"]


async def test_a_backend_certificate_matched_by_its_subject_alternative_name(
    server: ServerHandle, pki: dict
) -> None:
    async with transport.channel(
        server.address, tls(pki, "gateway")
    ) as ch:  # CN=gateway, SAN gw.hpc.example.org
        stub = pb_grpc.SchedulerStub(ch)
        assert (await code_of(next(backend_calls(stub, "hpc"))))[0] == grpc.StatusCode.OK
        assert (await code_of(next(backend_calls(stub, "gateway"))))[
            0
        ] == grpc.StatusCode.PERMISSION_DENIED


async def test_token_only_and_token_with_an_unmapped_certificate(
    server: ServerHandle, pki: dict
) -> None:
    # rack-b authenticates with its token; alice's certificate is unmapped, so it adds nothing
    async with transport.channel(server.address, tls(pki, "alice"), token="rack-b-token1") as ch:
        stub = pb_grpc.SchedulerStub(ch)
        for call in backend_calls(stub, "rack-b"):
            assert (await code_of(call))[0] == grpc.StatusCode.OK
        assert (await code_of(next(backend_calls(stub, "rack-c"))))[
            0
        ] == grpc.StatusCode.PERMISSION_DENIED
    async with transport.channel(server.address, tls(pki, "alice"), token="alice-token-1") as ch:
        code, _ = await code_of(next(backend_calls(pb_grpc.SchedulerStub(ch), "alice")))
        assert code == grpc.StatusCode.PERMISSION_DENIED


async def test_certificate_and_token_must_agree(server: ServerHandle, pki: dict) -> None:
    # the same identity both ways: fine
    async with transport.channel(server.address, tls(pki, "dave"), token="ops-token-123") as ch:
        code, details = await code_of(
            pb_grpc.SchedulerStub(ch).ListQueues(pb.ListQueuesRequest(), timeout=5)
        )
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert "'dave'" in details
        assert "'ops'" in details
    async with transport.channel(server.address, tls(pki, "rack-a"), token="rack-b-token1") as ch:
        code, _ = await code_of(next(backend_calls(pb_grpc.SchedulerStub(ch), "rack-b")))
        assert code == grpc.StatusCode.UNAUTHENTICATED
    async with transport.channel(
        server.address, tls(pki, "rack-a"), token="not-a-valid-token"
    ) as ch:
        code, details = await code_of(next(backend_calls(pb_grpc.SchedulerStub(ch), "rack-a")))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert "not valid" in details


async def test_a_second_decision_stream_is_refused_with_tokens_too(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    handle = await start_server(
        ServerOptions(
            listen="127.0.0.1:0", state=":memory:", cycle_period=3600.0, auth_policy=str(policy)
        )
    )
    try:
        async with transport.channel(handle.address, None, token="rack-b-token1") as ch:
            stub = pb_grpc.SchedulerStub(ch)
            await stub.RegisterBackend(
                pb.RegisterBackendRequest(name="rack-b", kind="fake-agent"), timeout=5
            )
            first = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="rack-b"))
            with anyio.fail_after(5):
                while not handle.server.service._streams.get("rack-b"):  # type: ignore[union-attr]
                    await anyio.sleep(0.02)
            second = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="rack-b"))
            assert await stream_code(second) == grpc.StatusCode.FAILED_PRECONDITION
            first.cancel()
    finally:
        await handle.stop()


async def test_refused_streams_are_audited(server: ServerHandle, pki: dict) -> None:
    with structlog.testing.capture_logs() as logs:
        async with transport.channel(server.address, tls(pki, "dave")) as ch:
            stub = pb_grpc.SchedulerStub(ch)
            await stream_code(stub.StreamDecisions(pb.StreamDecisionsRequest(backend="rack-a")))
            await stream_code(stub.WatchJobs(pb.WatchJobsRequest(job_id="nope")))
        async with transport.channel(server.address, tls(pki, "alice")) as ch:
            await stream_code(pb_grpc.SchedulerStub(ch).WatchJobs(pb.WatchJobsRequest()))
    audits = [(e["who"], e["rpc"], e["result"]) for e in logs if e["event"] == "audit"]
    assert ("dave", "StreamDecisions", "PERMISSION_DENIED") in audits
    assert ("cert:alice", "WatchJobs", "UNAUTHENTICATED") in audits


async def test_reads_are_scoped_to_readable_queues_and_own_jobs(
    server: ServerHandle, pki: dict
) -> None:
    ca_only = tls(pki, "alice")  # a certificate the policy does not map: the tokens decide
    async with (
        MusterClient(server.address, timeout=5, token="alice-token-1", tls=ca_only) as alice,
        MusterClient(server.address, timeout=5, token="carol-token-1", tls=ca_only) as carol,
        MusterClient(server.address, timeout=5, token="ops-token-123", tls=ca_only) as ops,
    ):
        await alice.submit_job(job("a1", "ml"))
        await carol.submit_job(job("c1", "default"))  # carol submits in default, reads ml
        await ops.submit_job(job("o1", "default"))
        assert {j.spec.id async for j in alice.list_jobs()} == {"a1"}
        assert {j.spec.id async for j in carol.list_jobs()} == {"a1", "c1"}  # ml, and her own
        assert {j.spec.id async for j in ops.list_jobs()} == {"a1", "c1", "o1"}
        for call in (
            alice.stub.GetJob(pb.GetJobRequest(id="o1")),
            alice.stub.Explain(pb.ExplainRequest(job_id="o1")),
            alice.stub.GetTaskLogs(pb.GetTaskLogsRequest(job_id="o1")),
        ):
            code, details = await code_of(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert "queue 'default'" in details
        assert (await code_of(carol.stub.GetJob(pb.GetJobRequest(id="c1"))))[
            0
        ] == grpc.StatusCode.OK
        assert (
            await stream_code(alice.stub.WatchJobs(pb.WatchJobsRequest(job_id="o1")))
            == grpc.StatusCode.PERMISSION_DENIED
        )
        seen: list[str] = []
        with anyio.move_on_after(1):
            async for event in carol.stub.WatchJobs(pb.WatchJobsRequest(send_initial=True)):
                seen.append(event.job.spec.id)
        assert set(seen) == {"a1", "c1"}  # initial events and later changes, never o1


async def test_reflection_needs_credentials_and_health_does_not(
    server: ServerHandle, pki: dict
) -> None:
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    async with transport.channel(server.address, tls(pki, "alice")) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.ServerReflectionInfo(iter([request]), timeout=5):
                pass
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    async with transport.channel(server.address, tls(pki, "alice"), token="alice-token-1") as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        names = [
            s.name
            async for r in stub.ServerReflectionInfo(iter([request]), timeout=5)
            for s in r.list_services_response.service
        ]
        assert "muster.v1.Scheduler" in names


async def test_metrics_need_a_token_and_https_under_auth(server: ServerHandle, pki: dict) -> None:
    import ssl

    context = ssl.create_default_context(cafile=str(pki["ca"]))
    url = f"https://localhost:{server.metrics_port}/metrics"
    async with aiohttp.ClientSession() as session:
        async with session.get(url, ssl=context) as resp:
            assert resp.status == 401
        async with session.get(
            url, ssl=context, headers={"Authorization": "Bearer rack-b-token1"}
        ) as resp:
            assert resp.status == 403  # rack-b has no read verb
        async with session.get(
            url, ssl=context, headers={"Authorization": "Bearer alice-token-1"}
        ) as resp:
            assert resp.status == 200
            assert "muster_" in await resp.text()


def test_empty_policies_are_refused() -> None:
    for text in ("", "   \n", "{}", "tokens: []\n"):
        with pytest.raises(PolicyError):
            parse_policy(text, "p.yaml")
    with pytest.raises(PolicyError, match="exactly one of cn and san"):
        parse_policy("certificates: [{backend: x}]", "p.yaml")
    with pytest.raises(PolicyError, match="exactly one of backend and user"):
        parse_policy("certificates: [{cn: x, backend: x, user: x}]", "p.yaml")


async def test_an_empty_policy_written_while_running_keeps_the_old_one(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    handle = await start_server(
        ServerOptions(
            listen="127.0.0.1:0", state=":memory:", cycle_period=3600.0, auth_policy=str(policy)
        )
    )
    try:
        async with MusterClient(handle.address, timeout=5, token="ops-token-123") as ops:
            policy.write_text("")
            os.utime(policy, ns=(1, 10**18))
            assert [
                q.queue.name for q in await ops.list_queues()
            ]  # still allowed: the old policy stays
    finally:
        await handle.stop()


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


async def test_oversized_requests_without_credentials_cost_no_memory(tmp_path: Path) -> None:
    """8 concurrent 40 MiB GetJob calls with no token: refused before grpc reads them (the audit
    saw the server reach ~1 GiB when the size limit was the only check)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from server.service.main import main; sys.exit(main())",
            "--listen",
            f"127.0.0.1:{port}",
            "--state",
            ":memory:",
            "--auth-policy",
            str(policy),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        address = f"127.0.0.1:{port}"
        async with transport.channel(address) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            with anyio.fail_after(30):
                while True:
                    try:
                        await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                        break
                    except grpc.aio.AioRpcError:
                        await anyio.sleep(0.1)
            before = peak_rss_mib(proc.pid)
            stub = pb_grpc.SchedulerStub(ch)
            big = pb.GetJobRequest(id="x" * (40 * 1024 * 1024))
            codes: list[grpc.StatusCode] = []

            async def one() -> None:
                codes.append((await code_of(stub.GetJob(big, timeout=20)))[0])

            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(one)
            elapsed = time.monotonic() - started
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 8
        grown = peak_rss_mib(proc.pid) - before
        assert grown < 100, f"the server's peak memory grew by {grown:.0f} MiB"
        assert elapsed < 10
    finally:
        proc.terminate()
        proc.wait(10)
