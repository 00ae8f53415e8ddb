"""Fixtures: an in-test OTLP receiver and a Muster server exporting to it, with /metrics on."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import grpc
import pytest

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service.app import ServerHandle, ServerOptions, start_server

from .otlp_receiver import Receiver

QUIET_PERIOD = 3600.0  # only wake-ups drive cycles: no periodic noise
WAIT = 20.0  # safety bound for waits; never part of a verdict


@pytest.fixture(autouse=True)
def _no_ambient_otel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's OTEL_* variables must not redirect the tests' spans."""
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
        "OTEL_SERVICE_NAME",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = await Receiver().start()
    try:
        yield r
    finally:
        await r.stop()


def options(tmp_path: Path, **overrides: object) -> ServerOptions:
    opts = ServerOptions(
        listen="127.0.0.1:0", state=str(tmp_path / "muster.db"), cycle_period=QUIET_PERIOD
    )
    for key, value in overrides.items():
        setattr(opts, key, value)
    return opts


@pytest.fixture
async def traced(tmp_path: Path, receiver: Receiver) -> AsyncIterator[ServerHandle]:
    handle = await start_server(
        options(tmp_path, otlp_endpoint=receiver.endpoint, metrics_listen="127.0.0.1:0")
    )
    try:
        yield handle
    finally:
        await handle.stop()


@pytest.fixture
async def stub(traced: ServerHandle) -> AsyncIterator[pb_grpc.SchedulerStub]:
    async with grpc.aio.insecure_channel(traced.address) as channel:
        yield pb_grpc.SchedulerStub(channel)


async def flush(handle: ServerHandle) -> None:
    """Export every finished span now (the batch processor would wait seconds)."""
    telemetry = handle.server.telemetry
    assert telemetry is not None
    assert telemetry.provider is not None
    ok = await anyio.to_thread.run_sync(telemetry.provider.force_flush, 10_000)
    assert ok, "span export did not finish"


async def flush_until(handle: ServerHandle, arrived: Callable[[], bool]) -> None:
    """Flush until ``arrived()``: an RPC's span ends after its reply is sent, so the client can
    see the reply before the span exists. Bounded by WAIT."""
    with anyio.fail_after(WAIT):
        while True:
            await flush(handle)
            if arrived():
                return
            await anyio.sleep(0.02)


async def next_cycle(handle: ServerHandle) -> None:
    with anyio.fail_after(WAIT):
        await handle.loop.next_cycle()


def rl(**quantities: str) -> pb.ResourceList:
    return pb.ResourceList(quantities={k.replace("_", "."): v for k, v in quantities.items()})


def node(name: str, cpu: str = "4", memory: str = "16Gi", **kw: object) -> pb.Node:
    return pb.Node(name=name, allocatable=rl(cpu=cpu, memory=memory), **kw)


def gang(
    job_id: str, replicas: int = 2, cpu: str = "1", queue: str = "", **kw: object
) -> pb.JobSpec:
    return pb.JobSpec(
        id=job_id,
        queue=queue,
        task_groups=[pb.TaskGroup(role="worker", replicas=replicas, request=rl(cpu=cpu))],
        **kw,
    )


async def register(
    stub: pb_grpc.SchedulerStub, backend: str = "agent-a", nodes: list[pb.Node] | None = None
) -> None:
    await stub.RegisterBackend(pb.RegisterBackendRequest(name=backend, kind="fake-agent"))
    await stub.SyncSnapshot(pb.SyncSnapshotRequest(backend=backend, nodes=nodes or []))


async def read_decisions(stream: object, count: int) -> list[pb.Decision]:
    out: list[pb.Decision] = []
    with anyio.fail_after(WAIT):
        async for decision in stream:  # type: ignore[attr-defined]
            out.append(decision)
            if len(out) == count:
                break
    return out
