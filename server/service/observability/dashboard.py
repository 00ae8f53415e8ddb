"""The web dashboard (``--dashboard-listen HOST:PORT``, off by default), served by aiohttp on the
event loop like ``/metrics``: a static page (``dashboard/``: HTML, the script that draws it with
Chart.js, vendored) and one JSON endpoint, ``/api/overview``, read between two atomic updates of the
state. With an auth policy the endpoint wants the same bearer token as the API (verb ``read``);
the page asks for it once and keeps it in the tab's session storage.

``/api/overview``: queues (weight, deserved, allocated, capability, pending / running jobs), the
latest jobs with their phase and one-word reason, nodes with their CPU / memory / device
utilisation, and the recent cycles (CycleHistory: per-action seconds, each queue's CPU share)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog
from aiohttp import web

from muster.conditions import job_reason
from muster.jsonmap import short_enum_name, to_json_dict
from muster.quantity import from_canonical, parse_resources
from muster.v1 import muster_pb2 as pb
from server.service.api import queries
from server.service.observability.history import CycleHistory
from server.service.observability.http import HttpAccess, serve_app
from server.service.records import JobRecord
from server.service.state import ClusterState
from server.service.tls import is_loopback
from server.service.views import job_proto

log = structlog.get_logger("muster.dashboard")

STATIC = Path(__file__).with_name("dashboard")
RECENT_JOBS = 200


class DashboardServer:
    def __init__(
        self,
        state: ClusterState,
        history: CycleHistory,
        listen: str,
        *,
        access: HttpAccess | None = None,
        insecure: bool = False,
    ) -> None:
        self.state = state
        self.history = history
        self.access = access or HttpAccess()
        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit():
            raise OSError(f"--dashboard-listen {listen!r}: expected HOST:PORT")
        if self.access.ssl_context() is None and not insecure and not is_loopback(listen):
            raise OSError(
                f"--dashboard-listen {listen}: refusing plain HTTP off loopback; give --tls-cert/--tls-key "
                "(the dashboard then serves HTTPS) or --insecure"
            )
        self.host, self.requested_port = host.strip("[]"), int(port)
        self.port = 0

    # -- handlers --------------------------------------------------------------------------------
    async def _index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    async def _overview(self, request: web.Request) -> web.Response:
        who = self.access.check(request)
        if isinstance(who, web.Response):
            return who
        scope = None
        if who is not None and self.access.policy is not None:
            readable = self.access.policy.readable_queues(who)
            scope = None if readable is None else queries.ReadScope(readable, who.user)
        return web.json_response(overview(self.state, self.history, scope))

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        app = web.Application()
        app.router.add_get("/", self._index)
        app.router.add_get("/api/overview", self._overview)
        app.router.add_static("/static/", STATIC)
        context = self.access.ssl_context()

        def bound(port: int) -> None:
            self.port = port
            log.info(
                "dashboard.listening",
                address=f"{'https' if context else 'http'}://{self.host}:{port}/",
            )

        await serve_app(
            app, self.host, self.requested_port, "the dashboard", bound, task_status, context
        )


def overview(
    state: ClusterState, history: CycleHistory, scope: queries.ReadScope | None = None
) -> dict[str, Any]:
    """The dashboard's data; ``scope``: the jobs the caller may read (None: all)."""
    queues = [to_json_dict(v) for v in queries.list_queues(state).queues]
    jobs = []
    readable: list[JobRecord] = []
    for rec in reversed(state.jobs.values()):  # the newest the caller may read, not every job
        if scope is None or scope.allows(rec.queue, rec.owner):
            readable.append(rec)
            if len(readable) == RECENT_JOBS:
                break
    for rec in reversed(readable):
        job = job_proto(rec, with_tasks=False)
        code, message = job_reason(job.status.conditions)
        jobs.append(
            {
                "id": job.spec.id,
                "queue": job.spec.queue,
                "owner": job.spec.owner,
                "phase": short_enum_name(pb.JobPhase.DESCRIPTOR, job.status.phase),
                "stage": job.status.stage,
                "pending": job.status.pending,
                "running": job.status.running,
                "reason": code,
                "message": message,
                # A waiting job's start estimate (the reserve action): epoch seconds or None,
                # whether its nodes are reserved, its node count, or why there is none.
                "estimated_start": job.status.estimated_start.ToNanoseconds() / 1e9
                if job.status.HasField("estimated_start")
                else None,
                "reserved": job.status.reserved,
                "estimated_nodes": len(job.status.estimated_nodes),
                "estimate_note": job.status.estimate_note,
            }
        )
    nodes = []
    for view in queries.list_nodes(state, "").nodes:
        alloc = state.nodes[view.node.name].spec.allocatable
        used = parse_resources(dict(view.used.quantities))
        nodes.append(
            {
                "name": view.node.name,
                "backend": view.node.backend,
                "ready": not view.node.not_ready,
                "not_ready_reason": view.not_ready_reason,
                "utilisation": {
                    r: round(used.get(r, 0.0) / total, 4)
                    for r, total in sorted(alloc.items())
                    if total > 0 and r != "pods"
                },
                "allocatable": {r: from_canonical(r, v) for r, v in sorted(alloc.items())},
            }
        )
    return {
        "queues": queues,
        "jobs": jobs,
        "nodes": nodes,
        "cycles": [s.to_json() for s in history.samples],
    }
