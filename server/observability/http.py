"""The ``/metrics`` endpoint (``--metrics-listen HOST:PORT``), served by aiohttp on the event loop.

On the loop (not prometheus_client's threaded server) so that a scrape reads the cluster state
between two of its atomic updates, never in the middle of one.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

import anyio
import anyio.abc
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = structlog.get_logger("muster.metrics")


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"--metrics-listen {listen!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


class MetricsServer:
    """``await server.run(task_status=...)`` serves until cancelled; ``port`` is the bound port."""

    def __init__(self, registry: CollectorRegistry, listen: str) -> None:
        self.registry = registry
        self.host, self.requested_port = split_listen(listen)
        self.port = 0

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def run(self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)

        def bound(port: int) -> None:
            self.port = port
            log.info("metrics.listening", address=f"{self.host}:{port}")

        await serve_app(app, self.host, self.requested_port, "metrics", bound, task_status)


async def serve_app(
    app: web.Application, host: str, port: int, what: str, bound: Callable[[int], None],
    task_status: anyio.abc.TaskStatus[int], ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Serve an aiohttp app on the event loop until cancelled; ``bound(port)`` once it listens."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_port=False)
        try:
            await site.start()
        except OSError as exc:
            raise OSError(f"cannot serve {what} on {host}:{port}: {exc}") from None
        sockets = getattr(site._server, "sockets", None) or []  # aiohttp exposes bound sockets only here
        actual = sockets[0].getsockname()[1] if sockets else port
        bound(actual)
        task_status.started(actual)
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
