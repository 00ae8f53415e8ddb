"""What the CLI tests share: a fake Scheduler servicer served on a local port, and ``muster`` run
against it."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc
import pytest

from clients import cli
from muster.v1 import muster_pb2_grpc as pb_grpc

Servicer = TypeVar("Servicer", bound=pb_grpc.SchedulerServicer)


@contextmanager
def serving(servicer: Servicer) -> Iterator[Servicer]:
    """``servicer`` served on 127.0.0.1 (its ``address`` set) until the block ends."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_SchedulerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.address = f"127.0.0.1:{port}"  # type: ignore[attr-defined]
    try:
        yield servicer
    finally:
        server.stop(grace=None)


def run(api: Any, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``muster --server <api's address> argv...``: exit code, stdout, stderr."""
    code = cli.main(["--server", api.address, *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err
