"""The ``/metrics`` endpoint (``--metrics-listen HOST:PORT``), served by aiohttp on the event loop.

On the loop (not prometheus_client's threaded server) so that a scrape reads the cluster state
between two of its atomic updates, never in the middle of one. The HTTP endpoints (``/metrics``
and the dashboard) share ``HttpAccess``: HTTPS with the gRPC port's certificate when the server
has one, and under an auth policy the API's bearer tokens (verb ``read``).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import anyio.abc
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from server.service.auth import Policy, Principal

log = structlog.get_logger("muster.metrics")


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"--metrics-listen {listen!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class HttpAccess:
    """Who may use an HTTP endpoint of the server, and over what."""

    policy: Policy | None = None  # None: anyone who can connect
    tls_cert: str | None = None  # with tls_key: HTTPS
    tls_key: str | None = None

    def ssl_context(self) -> ssl.SSLContext | None:
        if not (self.tls_cert and self.tls_key):
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.tls_cert, self.tls_key)
        return context

    def check(self, request: web.Request, verb: str = "read") -> Principal | web.Response | None:
        """The caller (None without a policy), or the 401 / 403 answer to send instead."""
        if self.policy is None:
            return None
        who = self.policy.authenticate(
            [("authorization", request.headers.get("Authorization", ""))]
        )
        if who is None:
            return web.json_response(
                {"error": "a valid bearer token is required"},
                status=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not self.policy.allows(who, verb):
            return web.json_response({"error": f"user {who.name!r} may not {verb}"}, status=403)
        return who


class MetricsServer:
    """``await server.run(task_status=...)`` serves until cancelled; ``port`` is the bound port."""

    def __init__(
        self, registry: CollectorRegistry, listen: str, access: HttpAccess | None = None
    ) -> None:
        self.registry = registry
        self.host, self.requested_port = split_listen(listen)
        self.access = access or HttpAccess()
        self.port = 0

    async def _metrics(self, request: web.Request) -> web.Response:
        refused = self.access.check(request)
        if isinstance(refused, web.Response):
            return refused
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)

        context = self.access.ssl_context()

        def bound(port: int) -> None:
            self.port = port
            log.info(
                "metrics.listening",
                address=f"{'https' if context else 'http'}://{self.host}:{port}/metrics",
                auth=self.access.policy is not None,
            )

        await serve_app(app, self.host, self.requested_port, "metrics", bound, task_status, context)


async def serve_app(
    app: web.Application,
    host: str,
    port: int,
    what: str,
    bound: Callable[[int], None],
    task_status: anyio.abc.TaskStatus[int],
    ssl_context: ssl.SSLContext | None = None,
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
        sockets = (
            getattr(site._server, "sockets", None) or []
        )  # aiohttp exposes bound sockets only here
        actual = sockets[0].getsockname()[1] if sockets else port
        bound(actual)
        task_status.started(actual)
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
