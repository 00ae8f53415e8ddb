"""``muster-server``: the Muster scheduler as a gRPC service.

    muster-server --listen 127.0.0.1:50051 --state ./var/muster.db [--config FILE]
                  [--cycle-period 1.0] [--cycle-worker process|thread] [--bind-timeout 30] [--job-retention 600]
                  [--node-grace-period 40] [--task-eviction-timeout 300] [--task-log-limit 1Mi]
                  [--log-format console|json]
                  [--log-level info] [--otlp-endpoint HOST:4317] [--metrics-listen HOST:PORT]

Stops cleanly on SIGTERM / SIGINT. Once listening it logs ``server.listening`` with the bound
address and prints one line ``muster-server listening on HOST:PORT`` to stdout (useful with
``--listen 127.0.0.1:0``).

A failure to start or to keep running is one line per cause on stderr, ``muster-server: ...``, the
causes taken out of the task groups' exception groups (``report_failure``): exit status 2 for a
bad ``--config`` / ``--auth-policy`` / TLS setting or a ``--state`` file that is not a Muster state
database, 1 for the rest (the state file in use by another server, a port that cannot be bound, a
cycle worker process that cannot start). Only an unexpected error also prints its traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from pathlib import Path

import anyio
import structlog

from muster.logs import LEVELS, configure_logging
from muster.quantity import QuantityError, parse_quantity
from muster.tracing import tracing_settings
from server.config import ConfigError, load_config
from server.service.app import MusterServer, ServerOptions
from server.service.auth import Policy, PolicyError
from server.service.core_runner import CoreWorkerError
from server.service.gctune import tune_gc
from server.service.liveness import DEFAULT_NODE_GRACE, DEFAULT_TASK_EVICTION
from server.service.logs import MIN_PER_TASK, PER_TASK
from server.service.observability.http import split_listen
from server.service.store import StateFileError, StateFileInUse


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be > 0")
    return value


def byte_size(text: str) -> int:
    """``--task-log-limit``: bytes, as a quantity (``1Mi``, ``512Ki``, ``65536``)."""
    try:
        value = parse_quantity(text)
    except QuantityError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < MIN_PER_TASK or value != int(value):
        raise argparse.ArgumentTypeError(
            f"{text} must be a whole number of bytes, at least {MIN_PER_TASK} (4Ki)"
        )
    return int(value)


def listen_address(text: str) -> str:
    try:
        split_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="muster-server", description="Muster batch / gang scheduler (gRPC)"
    )
    p.add_argument(
        "--listen", default="127.0.0.1:50051", help="HOST:PORT to serve on (port 0: any free port)"
    )
    p.add_argument(
        "--tls-cert",
        default=os.environ.get("MUSTER_TLS_CERT"),
        help="serve TLS with this PEM certificate chain",
    )
    p.add_argument(
        "--tls-key", default=os.environ.get("MUSTER_TLS_KEY"), help="its PEM private key"
    )
    p.add_argument(
        "--tls-client-ca",
        default=os.environ.get("MUSTER_TLS_CLIENT_CA"),
        help="require client certificates signed by this CA (mutual TLS)",
    )
    p.add_argument(
        "--auth-policy",
        default=os.environ.get("MUSTER_AUTH_POLICY"),
        help="tokens and per-verb/per-queue rules (YAML, hot reloaded; docs/security.md)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow plaintext on a non-loopback --listen address (loopback is plaintext by default)",
    )
    p.add_argument(
        "--config", default=None, help="Volcano-format scheduler config file (hot reloaded)"
    )
    p.add_argument(
        "--state",
        default=os.environ.get("MUSTER_STATE", "./var/muster.db"),
        help="where state is kept: a SQLite file (one server), or a postgresql:// URI shared by "
        "replicated servers, one of which leads (docs/ha.md); env MUSTER_STATE",
    )
    p.add_argument(
        "--advertise",
        default=None,
        help="HOST:PORT other replicas and clients reach this server at (replicated servers; "
        "default: the --listen address)",
    )
    p.add_argument(
        "--lease-duration",
        type=positive_float,
        default=3.0,
        help="seconds the leader's lease lasts on the database clock (replicated servers; default 3)",
    )
    p.add_argument(
        "--lease-renew",
        type=positive_float,
        default=1.0,
        help="seconds between lease renewals and takeover attempts (default 1)",
    )
    p.add_argument(
        "--cycle-period", type=positive_float, default=1.0, help="seconds between cycles"
    )
    p.add_argument(
        "--min-cycle-interval",
        type=float,
        default=0.05,
        help="at least this many seconds from one cycle's start to the next: a burst of "
        "submissions and deltas coalesces into one cycle (default 0.05)",
    )
    p.add_argument(
        "--cycle-worker",
        choices=("process", "thread"),
        default="process",
        help="run the scheduling core in a worker process (default: the API never waits on it) or a thread",
    )
    p.add_argument(
        "--bind-timeout", type=positive_float, default=30.0, help="seconds to ack a bind"
    )
    p.add_argument(
        "--node-grace-period",
        type=positive_float,
        default=DEFAULT_NODE_GRACE,
        help="seconds without any call from a backend before its nodes are NotReady and its tasks "
        "Unknown (Kubernetes' node-monitor-grace-period)",
    )
    p.add_argument(
        "--task-eviction-timeout",
        type=positive_float,
        default=DEFAULT_TASK_EVICTION,
        help="seconds a silent backend's tasks stay Unknown before they are lost and placed again "
        "(Kubernetes' pod-eviction-timeout)",
    )
    p.add_argument(
        "--job-retention",
        type=positive_float,
        default=600.0,
        help="seconds a finished job stays in memory; afterwards it is answered from the state file",
    )
    p.add_argument(
        "--task-log-limit",
        type=byte_size,
        default=PER_TASK,
        metavar="BYTES",
        help="task output kept per task in the state store, oldest dropped first (default 1Mi)",
    )
    p.add_argument("--log-format", choices=("console", "json"), default="console")
    p.add_argument("--log-level", choices=LEVELS, default="info")
    p.add_argument(
        "--otlp-endpoint",
        default=None,
        help="export traces over OTLP/gRPC to HOST:PORT (e.g. Jaeger's 4317); also OTEL_EXPORTER_OTLP_ENDPOINT",
    )
    p.add_argument(
        "--metrics-listen",
        default=None,
        type=listen_address,
        help="serve Prometheus /metrics on HOST:PORT",
    )
    p.add_argument(
        "--dashboard-listen",
        default=os.environ.get("MUSTER_DASHBOARD_LISTEN"),
        type=listen_address,
        help="serve the web dashboard on HOST:PORT (off by default; same tokens as the API; HTTPS with "
        "--tls-cert, plain HTTP off loopback only with --insecure)",
    )
    return p.parse_args(argv)


async def serve(options: ServerOptions) -> None:
    server = MusterServer(options)
    async with anyio.create_task_group() as tg:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    structlog.get_logger("muster.server").info(
                        "server.signal", signal=signal.Signals(signum).name
                    )
                    server.request_stop()
                    return

        async def announce() -> None:
            await server.ready.wait()
            sys.stdout.write(f"muster-server listening on {server.address}\n")
            sys.stdout.flush()

        tg.start_soon(stop_on_signal)
        tg.start_soon(announce)
        await server.run()
        tg.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    tune_gc()
    options = ServerOptions(
        listen=args.listen,
        state=args.state,
        config_path=args.config,
        cycle_period=args.cycle_period,
        min_cycle_interval=max(0.0, args.min_cycle_interval),
        cycle_worker=args.cycle_worker,
        bind_timeout=args.bind_timeout,
        node_grace_period=args.node_grace_period,
        task_eviction_timeout=args.task_eviction_timeout,
        job_retention=args.job_retention,
        task_log_limit=args.task_log_limit,
        otlp_endpoint=args.otlp_endpoint,
        metrics_listen=args.metrics_listen,
        dashboard_listen=args.dashboard_listen,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        insecure=args.insecure,
        auth_policy=args.auth_policy,
        advertise=args.advertise,
        lease_duration=args.lease_duration,
        lease_renew=args.lease_renew,
    )
    if args.lease_renew >= args.lease_duration:
        sys.stderr.write("muster-server: --lease-renew must be shorter than --lease-duration\n")
        return 2
    if args.auth_policy:  # fail fast, before anything listens
        try:
            Policy(args.auth_policy)
        except (OSError, PolicyError) as exc:
            sys.stderr.write(f"muster-server: --auth-policy {args.auth_policy}: {exc}\n")
            return 2
    if bool(args.tls_cert) != bool(args.tls_key) or (args.tls_client_ca and not args.tls_cert):
        sys.stderr.write(
            "muster-server: --tls-cert and --tls-key go together; --tls-client-ca needs them\n"
        )
        return 2
    try:
        tracing_settings(args.otlp_endpoint, "muster-server")
    except ValueError as exc:
        sys.stderr.write(f"muster-server: {exc}\n")
        return 2
    if args.config:  # fail fast, before anything listens
        try:
            load_config(Path(args.config).read_text())
        except (OSError, UnicodeDecodeError, ConfigError) as exc:
            sys.stderr.write(f"muster-server: --config {args.config}: {exc}\n")
            return 2
    try:
        anyio.run(serve, options, backend="asyncio")
    except KeyboardInterrupt:
        return 0
    # Often wrapped in task groups' exception groups: report each cause.
    except BaseException as exc:  # noqa: BLE001 - the process's last word
        return report_failure(exc)
    return 0


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or ``exc`` itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


# Failures that explain themselves in one line (no traceback), and the exit status of each.
EXPECTED_FAILURES: tuple[tuple[type[BaseException], int], ...] = (
    (StateFileInUse, 1),  # like a port in use: another server has it
    (StateFileError, 2),  # like a bad --config: this file cannot be the state
    (CoreWorkerError, 1),
    (OSError, 1),
)


def report_failure(exc: BaseException) -> int:
    """One ``muster-server: ...`` line per cause on stderr; a traceback only for an unexpected
    one (a bug). Returns the exit status."""
    status = 0
    for failure in leaves(exc):
        if isinstance(failure, KeyboardInterrupt | SystemExit):
            if isinstance(failure, SystemExit) and isinstance(failure.code, int):
                status = max(status, failure.code)
            continue
        code = next((c for kind, c in EXPECTED_FAILURES if isinstance(failure, kind)), None)
        if code is None:  # unexpected: its own traceback (not the groups around it), then the line
            traceback.print_exception(failure, file=sys.stderr)
            sys.stderr.write(f"muster-server: unexpected {type(failure).__name__}: {failure}\n")
            status = max(status, 1)
            continue
        sys.stderr.write(f"muster-server: {failure}\n")
        status = max(status, code)
    return status


if __name__ == "__main__":
    sys.exit(main())
