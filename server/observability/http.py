"""The ``/metrics`` endpoint (``--metrics-listen HOST:PORT``), served by aiohttp on the event loop.

On the loop (not prometheus_client's threaded server) so that a scrape reads the cluster state
between two of its atomic updates, never in the middle of one.
"""

from __future__ import annotations

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
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.requested_port, reuse_port=False)
            try:
                await site.start()
            except OSError as exc:
                raise OSError(f"cannot serve metrics on {self.host}:{self.requested_port}: {exc}") from None
            server = site._server  # aiohttp exposes the bound sockets only here
            sockets = getattr(server, "sockets", None) or []
            self.port = sockets[0].getsockname()[1] if sockets else self.requested_port
            log.info("metrics.listening", address=f"{self.host}:{self.port}")
            task_status.started(self.port)
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await runner.cleanup()
