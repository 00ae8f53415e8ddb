"""Assembling and running a Muster server: store -> state -> cycle loop -> gRPC service.

Three ways to run one:

* ``MusterServer(options).run()`` -- structured: returns after ``request_stop()`` (``server.service.main``
  uses it under a task group with a signal watcher);
* ``await start_server(options)`` -> ``ServerHandle`` for async code (tests): the server runs in a
  background task of the current event loop; ``await handle.stop()``;
* ``ServerThread(options)`` for synchronous code: the server runs its own event loop in a thread;
  ``with ServerThread(opts) as srv: srv.address``.

Use ``listen="127.0.0.1:0"`` to get a free ephemeral port; ``address`` / ``port`` tell which.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import anyio
import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.sdk.trace import TracerProvider

from muster import transport
from muster.v1 import muster_pb2 as pb
from server.service.api.gate import AuthGate
from server.service.api.handlers import add_scheduler_service
from server.service.auth import Policy
from server.service.decisions import DecisionLog
from server.service.errors import DomainError
from server.service.liveness import (
    DEFAULT_NODE_GRACE,
    DEFAULT_TASK_EVICTION,
    Liveness,
    start_liveness,
)
from server.service.logs import PER_TASK
from server.service.loop import ConfigManager, CycleLoop
from server.service.observability import Telemetry
from server.service.observability.dashboard import DashboardServer
from server.service.observability.history import CycleHistory
from server.service.observability.http import HttpAccess
from server.service.pgstore import PostgresStore, replica_application_name
from server.service.replica import Replica, ReplicaOptions
from server.service.rpc import SchedulerService
from server.service.state import ClusterState
from server.service.store import StateFileLost, StoredState, StoreWriter, open_store
from server.service.tls import ReloadingCredentials, TlsFiles, is_loopback

log = structlog.get_logger("muster.server")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Scheduler"].full_name


@dataclass
class ServerOptions:
    listen: str = "127.0.0.1:50051"
    state: str = "./var/muster.db"  # SQLite file; ":memory:" for throwaway servers;
    # postgresql://... : replicated servers sharing that database (docs/ha.md)
    advertise: str | None = None  # the address other replicas and clients reach this one at
    lease_duration: float = 3.0  # seconds the leader's lease lasts (database clock)
    lease_renew: float = 1.0  # seconds between renewals (and a follower's takeover attempts)
    config_path: str | None = None  # Volcano-format scheduler config; None: built-in
    cycle_period: float = 1.0
    min_cycle_interval: float = 0.05  # a burst of changes makes one cycle, not one per change
    cycle_worker: str = (
        "process"  # where the core runs: "process" (API never waits on it) or "thread"
    )
    bind_timeout: float = 30.0  # seconds a backend has to ack a bind before it expires
    # Dead backends (docs/operations.md): seconds without any RPC from a backend before its nodes
    # are NotReady and its tasks Unknown, and seconds after that before those tasks are lost.
    node_grace_period: float = DEFAULT_NODE_GRACE
    task_eviction_timeout: float = DEFAULT_TASK_EVICTION
    job_retention: float = 600.0  # seconds a finished job stays in memory (then: from the store)
    task_log_limit: int = PER_TASK  # bytes of task output kept per task (oldest dropped)
    expire_interval: float | None = None  # how often deadlines are checked; None: derived
    shutdown_grace: float = 2.0
    max_message_bytes: int = transport.MAX_MESSAGE_BYTES
    tls_cert: str | None = None  # with tls_key: serve TLS (see server/service/tls.py)
    tls_key: str | None = None
    tls_client_ca: str | None = None  # clients must present a certificate this CA signed (mTLS)
    insecure: bool = False  # allow plaintext on a non-loopback address (explicitly asked for)
    auth_policy: str | None = (
        None  # tokens and rules file (server/service/auth.py); None: no authentication
    )
    # Observability (docs/observability.md): OTLP/gRPC trace export (also OTEL_* env vars; off
    # by default), /metrics on HOST:PORT (off by default), or a ready-made provider (tests).
    otlp_endpoint: str | None = None
    metrics_listen: str | None = None
    dashboard_listen: str | None = None  # the web dashboard on HOST:PORT (off by default)
    tracer_provider: TracerProvider | None = None


class MusterServer:
    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.port = 0
        self.state: ClusterState | None = None
        self.loop: CycleLoop | None = None
        self.service: SchedulerService | None = None
        self.telemetry: Telemetry | None = None
        self.dashboard: DashboardServer | None = None
        self.replica: Replica | None = None
        self.replica_id = ""
        # asyncio (not anyio) events: they may be created before the loop runs (ServerThread).
        self.ready = asyncio.Event()
        self._stop = asyncio.Event()

    @property
    def address(self) -> str:
        host = self.options.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    @property
    def metrics_port(self) -> int:
        return self.telemetry.metrics_port if self.telemetry else 0

    @property
    def dashboard_port(self) -> int:
        return self.dashboard.port if self.dashboard else 0

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Serve until ``request_stop()`` (or cancellation), then shut down cleanly."""
        opts = self.options
        # StateFileInUse (another server has the file) or StateFileError (not a Muster state
        # database): a one-line refusal in server.service.main. The file's lock is held until close.
        self.replica_id = uuid.uuid4().hex[:12]
        store = open_store(
            opts.state,
            application_name=replica_application_name(self.replica_id, _where()),
            lease_duration=opts.lease_duration,
        )
        writer = StoreWriter(store)
        try:
            self.telemetry = Telemetry(
                otlp_endpoint=opts.otlp_endpoint,
                metrics_listen=opts.metrics_listen,
                tracer_provider=opts.tracer_provider,
            )
            stored = await anyio.to_thread.run_sync(store.load, time.time() - opts.job_retention)
            cluster = ClusterState(
                DecisionLog(bind_timeout=opts.bind_timeout),
                retention=opts.job_retention,
                archive=store,
                liveness=Liveness(opts.node_grace_period, opts.task_eviction_timeout),
            )
            cluster.restore(stored)
            cluster.task_logs.per_task = opts.task_log_limit
            if not isinstance(store, PostgresStore):  # a replica starts the clocks when it leads
                start_liveness(cluster)
            configs = ConfigManager(
                opts.config_path,
                stored_yaml=stored.meta.get("config_yaml"),
                generation=int(stored.meta.get("config_generation", 0)),
            )
            expire_interval = opts.expire_interval or max(
                0.05, min(1.0, opts.bind_timeout / 4, opts.node_grace_period / 4)
            )
            loop = CycleLoop(
                cluster,
                writer,
                configs,
                period=opts.cycle_period,
                min_interval=opts.min_cycle_interval,
                expire_interval=expire_interval,
                worker=opts.cycle_worker,  # type: ignore[arg-type]
            )
            cluster.on_change = loop.wake
            self.telemetry.attach(cluster)
            loop.telemetry = self.telemetry
            if not isinstance(store, PostgresStore):  # a replica writes only once it leads
                await writer.flush(cluster.commit)  # server id, restored deadlines
            service = SchedulerService(
                cluster,
                writer,
                loop,
                configs,
                bind_backends=bool(opts.tls_client_ca),
                policy=Policy(opts.auth_policy) if opts.auth_policy else None,
            )
            self.state, self.loop, self.service = cluster, loop, service
            # The HTTP endpoints take the gRPC port's certificate and tokens.
            access = HttpAccess(service.policy, opts.tls_cert, opts.tls_key)
            if self.telemetry.metrics_server is not None:
                self.telemetry.metrics_server.access = access
            if opts.dashboard_listen:
                loop.history = CycleHistory()
                self.dashboard = DashboardServer(
                    cluster,
                    loop.history,
                    opts.dashboard_listen,
                    access=access,
                    insecure=opts.insecure,
                )
            replicated = (store, stored) if isinstance(store, PostgresStore) else None
            await self._serve(service, loop, state_jobs=len(cluster.jobs), replicated=replicated)
        finally:
            try:
                if self.state is not None and (self.replica is None or self.replica.leading):
                    await writer.flush(self.state.commit)
            except StateFileLost:
                pass  # logged when it was found; nothing more can be saved
            except DomainError as exc:  # a replica that lost its lease: the next leader has it all
                log.warning("server.final_write_failed", error=str(exc))
            finally:
                await writer.close()  # also releases the state file's lock
                if self.telemetry is not None:
                    with anyio.CancelScope(
                        shield=True
                    ):  # export buffered spans (bounded by the exporter timeout)
                        await anyio.to_thread.run_sync(self.telemetry.shutdown)
                log.info("server.stopped")

    def _replica(
        self, store: PostgresStore, stored: StoredState, service: SchedulerService, loop: CycleLoop
    ) -> Replica:
        opts = self.options
        configs = service.configs
        replica = Replica(
            store,
            service.state,
            service.writer,
            ReplicaOptions(
                replica_id=self.replica_id,
                address=opts.advertise or self.address,
                lease_duration=opts.lease_duration,
                renew_interval=opts.lease_renew,
                job_retention=opts.job_retention,
            ),
            lead=loop.run,
            on_meta=configs.follow,
            on_demoted=service.end_decision_streams,
            telemetry=self.telemetry,
        )
        replica.started_from(stored)
        return replica

    async def _serve(
        self,
        service: SchedulerService,
        loop: CycleLoop,
        *,
        state_jobs: int,
        replicated: tuple[PostgresStore, StoredState] | None = None,
    ) -> None:
        opts = self.options
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", opts.max_message_bytes),
                ("grpc.max_send_message_length", opts.max_message_bytes),
                ("grpc.so_reuseport", 0),
                # Clients ping every few seconds (muster.transport) to notice a server that is
                # stopped or cut off while their streams look open: let them.
                ("grpc.http2.min_ping_interval_without_data_ms", 1000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_ping_strikes", 0),
            ],
            # The auth gate first: a call with no identity is refused before anything reads it.
            interceptors=[
                *([AuthGate(service.policy)] if service.policy is not None else []),
                *(self.telemetry.interceptors() if self.telemetry else ()),
            ],
        )
        add_scheduler_service(
            service, server
        )  # undecodable requests: INVALID_ARGUMENT, rate-limited log
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        try:
            if opts.tls_cert and opts.tls_key:
                files = TlsFiles(opts.tls_cert, opts.tls_key, opts.tls_client_ca)
                self.port = server.add_secure_port(
                    opts.listen, ReloadingCredentials(files).credentials
                )
            elif opts.insecure or is_loopback(opts.listen):
                self.port = server.add_insecure_port(opts.listen)
            else:
                raise OSError(
                    f"refusing to serve plaintext on {opts.listen} (not loopback): give --tls-cert and "
                    "--tls-key (docs/security.md), or --insecure to accept it"
                )
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {opts.listen}: {exc}") from None
        if self.port == 0:
            raise OSError(f"cannot listen on {opts.listen}")
        service.address = opts.advertise or self.address
        if replicated is not None:
            self.replica = service.replica = self._replica(*replicated, service, loop)
        await server.start()
        try:
            for name in ("", SERVICE_NAME):
                await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
            async with anyio.create_task_group() as tg:
                if self.telemetry is not None:
                    await tg.start(self.telemetry.run)  # /metrics listens before we say ready
                if self.dashboard is not None:
                    await tg.start(self.dashboard.run)
                replica = self.replica
                tg.start_soon(loop.run if replica is None else replica.run)

                def not_serving(_: Exception) -> None:  # the state file is gone: say so to probes
                    for name in ("", SERVICE_NAME):
                        tg.start_soon(
                            health_servicer.set, name, health_pb2.HealthCheckResponse.NOT_SERVING
                        )

                service.writer.on_lost = not_serving
                log.info(
                    "server.listening", address=self.address, state=opts.state, jobs=state_jobs
                )
                self.ready.set()
                await self._stop.wait()
                log.info("server.stopping")
                if replica is not None:  # hand the lease over before the port closes
                    with anyio.CancelScope(shield=True), anyio.move_on_after(opts.shutdown_grace):
                        await replica.handover()
                await health_servicer.enter_graceful_shutdown()
                service.close_streams()
                with anyio.CancelScope(shield=True):
                    await server.stop(opts.shutdown_grace)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                service.close_streams()
                await server.stop(0)


class ServerHandle:
    """A server running in a background task of the current asyncio loop."""

    def __init__(self, server: MusterServer, task: asyncio.Task[None]) -> None:
        self.server = server
        self._task = task

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def metrics_port(self) -> int:
        return self.server.metrics_port

    @property
    def dashboard_port(self) -> int:
        return self.server.dashboard_port

    @property
    def state(self) -> ClusterState:
        assert self.server.state is not None
        return self.server.state

    @property
    def loop(self) -> CycleLoop:
        assert self.server.loop is not None
        return self.server.loop

    async def stop(self) -> None:
        self.server.request_stop()
        await self._task


async def start_server(options: ServerOptions) -> ServerHandle:
    """Start a server in the background and return once it listens (errors propagate)."""
    return await start_server_with(MusterServer(options))


class ServerThread:
    """A server with its own event loop in a daemon thread, for synchronous callers."""

    def __init__(self, options: ServerOptions, start_timeout: float = 30.0) -> None:
        self.options = options
        self.start_timeout = start_timeout
        self.server = MusterServer(options)
        self._thread = threading.Thread(target=self._main, name="muster-server", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._aio_loop: asyncio.AbstractEventLoop | None = None

    def _main(self) -> None:
        async def body() -> None:
            self._aio_loop = asyncio.get_running_loop()
            handle = await start_server_with(self.server)
            self._started.set()
            await handle._task

        try:
            asyncio.run(body())
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            self._error = exc
        finally:
            self._started.set()

    def start(self) -> ServerThread:
        self._thread.start()
        if not self._started.wait(self.start_timeout):
            raise TimeoutError("muster server did not start in time")
        if self._error is not None:
            raise self._error
        return self

    @property
    def address(self) -> str:
        return self.server.address

    def stop(self, timeout: float = 30.0) -> None:
        if self._aio_loop is not None and self._thread.is_alive():
            self._aio_loop.call_soon_threadsafe(self.server.request_stop)
        self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


async def start_server_with(server: MusterServer) -> ServerHandle:
    task = asyncio.create_task(server.run(), name=f"muster-server {server.options.listen}")
    ready = asyncio.create_task(server.ready.wait())
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if not server.ready.is_set():
        ready.cancel()
        await task  # raises the startup error
        raise RuntimeError("server stopped before it was ready")
    return ServerHandle(server, task)


def _where() -> str:
    """Host and process, for this server's database sessions (pg_stat_activity)."""
    return f"{socket.gethostname()}:{os.getpid()}"
