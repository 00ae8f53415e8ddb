"""TLS and mutual TLS on the gRPC port, certificate reload, and the plaintext rules."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import grpc
import pytest
from tls_helpers import Authority

from clients.client import MusterClient
from muster import transport
from muster.transport import ClientTls
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service.app import MusterServer, ServerHandle, ServerOptions, start_server
from server.service.tls import is_loopback

QUIET = 3600.0


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca = Authority.new("muster-test-ca")
    server_cert, server_key = ca.issue("server", tmp_path, server=True)
    client_cert, client_key = ca.issue("rack-a", tmp_path, server=False)
    return {
        "ca": ca.write(tmp_path / "ca.crt"),
        "server_cert": server_cert,
        "server_key": server_key,
        "client_cert": client_cert,
        "client_key": client_key,
    }


def options(tmp_path: Path, **kw: object) -> ServerOptions:
    opts = ServerOptions(
        listen="127.0.0.1:0", state=str(tmp_path / "muster.db"), cycle_period=QUIET
    )
    for k, v in kw.items():
        setattr(opts, k, v)
    return opts


@pytest.fixture
async def tls_server(tmp_path: Path, pki: dict[str, Path]) -> AsyncIterator[ServerHandle]:
    handle = await start_server(
        options(tmp_path, tls_cert=str(pki["server_cert"]), tls_key=str(pki["server_key"]))
    )
    try:
        yield handle
    finally:
        await handle.stop()


@pytest.fixture
async def mtls_server(tmp_path: Path, pki: dict[str, Path]) -> AsyncIterator[ServerHandle]:
    handle = await start_server(
        options(
            tmp_path,
            tls_cert=str(pki["server_cert"]),
            tls_key=str(pki["server_key"]),
            tls_client_ca=str(pki["ca"]),
        )
    )
    try:
        yield handle
    finally:
        await handle.stop()


async def list_queues(address: str, tls: ClientTls | None) -> list[str]:
    async with transport.channel(address, tls) as ch:
        reply = await pb_grpc.SchedulerStub(ch).ListQueues(pb.ListQueuesRequest(), timeout=5)
    return sorted(q.queue.name for q in reply.queues)


async def test_tls_server_answers_tls_clients_and_refuses_plaintext(
    tls_server: ServerHandle, pki: dict[str, Path]
) -> None:
    assert "default" in await list_queues(tls_server.address, ClientTls(ca=str(pki["ca"])))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await list_queues(tls_server.address, None)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_client_that_does_not_trust_the_server_ca_is_refused(
    tls_server: ServerHandle, tmp_path: Path
) -> None:
    other = Authority.new("someone-else").write(tmp_path / "other-ca.crt")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await list_queues(tls_server.address, ClientTls(ca=str(other)))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_needs_a_client_certificate_from_the_ca(
    mtls_server: ServerHandle, pki: dict[str, Path]
) -> None:
    with_cert = ClientTls(
        ca=str(pki["ca"]), cert=str(pki["client_cert"]), key=str(pki["client_key"])
    )
    assert "default" in await list_queues(mtls_server.address, with_cert)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await list_queues(mtls_server.address, ClientTls(ca=str(pki["ca"])))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_the_client_library_reads_the_tls_environment(
    tls_server: ServerHandle, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MUSTER_TLS_CA", str(pki["ca"]))
    async with MusterClient(tls_server.address, timeout=5) as client:
        assert "default" in [q.queue.name for q in await client.list_queues()]


async def test_a_rotated_certificate_is_used_without_a_restart(
    tls_server: ServerHandle, pki: dict[str, Path], tmp_path: Path
) -> None:
    assert await list_queues(tls_server.address, ClientTls(ca=str(pki["ca"])))
    new_ca = Authority.new("rotated-ca")
    rotated = tmp_path / "rotated"
    rotated.mkdir()
    cert, key = new_ca.issue("server", rotated, server=True)
    os.replace(key, pki["server_key"])  # key first, then the certificate that goes with it
    os.replace(cert, pki["server_cert"])
    new_ca_file = new_ca.write(tmp_path / "rotated-ca.crt")
    assert "default" in await list_queues(tls_server.address, ClientTls(ca=str(new_ca_file)))
    with pytest.raises(grpc.aio.AioRpcError):
        await list_queues(
            tls_server.address, ClientTls(ca=str(pki["ca"]))
        )  # the old CA no longer matches


async def test_plaintext_off_loopback_needs_insecure(tmp_path: Path) -> None:
    server = MusterServer(options(tmp_path, listen="0.0.0.0:0"))
    with pytest.raises(OSError, match="refusing to serve plaintext"):
        await server.run()


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1:50051")
    assert is_loopback("localhost:1")
    assert is_loopback("[::1]:5")
    assert not is_loopback("0.0.0.0:50051")
    assert not is_loopback("10.0.0.4:1")
    assert not is_loopback(":50051")
    assert not is_loopback("muster.example.com:443")


def backend_tls(pki: dict[str, Path]) -> ClientTls:
    return ClientTls(
        ca=str(pki["ca"]), cert=str(pki["client_cert"]), key=str(pki["client_key"])
    )  # CN=rack-a


async def test_under_mutual_tls_a_backend_acts_only_as_the_backend_its_certificate_names(
    mtls_server: ServerHandle, pki: dict[str, Path]
) -> None:
    async with transport.channel(mtls_server.address, backend_tls(pki)) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        await stub.RegisterBackend(
            pb.RegisterBackendRequest(name="rack-a", kind="fake-agent"), timeout=5
        )
        node = pb.Node(name="a-0", allocatable=pb.ResourceList(quantities={"cpu": "4"}))
        await stub.SyncSnapshot(pb.SyncSnapshotRequest(backend="rack-a", nodes=[node]), timeout=5)
        calls = [
            stub.RegisterBackend(
                pb.RegisterBackendRequest(name="rack-b", kind="fake-agent"), timeout=5
            ),
            stub.SyncSnapshot(pb.SyncSnapshotRequest(backend="rack-b"), timeout=5),
            stub.SendDeltas(pb.SendDeltasRequest(backend="rack-b"), timeout=5),
            stub.AckDecisions(pb.AckDecisionsRequest(backend="rack-b"), timeout=5),
        ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "'rack-a'" in (err.value.details() or "")
            assert "'rack-b'" in (err.value.details() or "")
        stream = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="rack-b"), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stream.read()  # the first message, or the call's error
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        nodes = await stub.ListNodes(pb.ListNodesRequest(), timeout=5)
        assert [n.node.name for n in nodes.nodes] == ["a-0"]  # rack-a's node, untouched


async def test_under_mutual_tls_a_second_decision_stream_for_a_backend_is_refused(
    mtls_server: ServerHandle, pki: dict[str, Path]
) -> None:
    async with transport.channel(mtls_server.address, backend_tls(pki)) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        await stub.RegisterBackend(
            pb.RegisterBackendRequest(name="rack-a", kind="fake-agent"), timeout=5
        )
        first = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="rack-a"))
        await anyio_sleep_until_streams(mtls_server, "rack-a")
        second = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="rack-a"), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await second.read()  # the first message, or the call's error
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "live decision stream" in (err.value.details() or "")
        first.cancel()


async def anyio_sleep_until_streams(server: ServerHandle, backend: str) -> None:
    with anyio.fail_after(5):
        while not server.server.service._streams.get(backend):  # type: ignore[union-attr]
            await anyio.sleep(0.02)
