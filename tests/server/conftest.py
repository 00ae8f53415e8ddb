"""Fixtures for the server's tests: an in-process server on an ephemeral loopback port."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service.app import ServerHandle, ServerOptions, start_server

# Only wake-ups (submissions, cluster changes) drive cycles in tests: no periodic noise.
QUIET_PERIOD = 3600.0


def server_options(tmp_path: Path, **overrides: object) -> ServerOptions:
    opts = ServerOptions(
        listen="127.0.0.1:0", state=str(tmp_path / "muster.db"), cycle_period=QUIET_PERIOD
    )
    for key, value in overrides.items():
        setattr(opts, key, value)
    return opts


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ServerHandle]:
    handle = await start_server(server_options(tmp_path))
    try:
        yield handle
    finally:
        await handle.stop()


@pytest.fixture
async def stub(server: ServerHandle) -> AsyncIterator[pb_grpc.SchedulerStub]:
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield pb_grpc.SchedulerStub(channel)
