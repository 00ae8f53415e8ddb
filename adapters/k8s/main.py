"""``muster-k8s-adapter``: schedule Kubernetes pods (``spec.schedulerName``) with Muster.

muster-k8s-adapter --server HOST:PORT [--kubeconfig FILE | --in-cluster | --api-server URL]
                   [--scheduler-name muster] [--name kubernetes] [--ledger PATH]
                   [--no-leader-elect | --lease-name NAME --lease-namespace NS ...]

Leader election is on by default: any second adapter (a second replica, a rollout's surge pod,
one started by hand) would otherwise bind too. Only the holder of the Lease
(``adapters.k8s.lease``) runs the adapter; the others wait to take over.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
from collections.abc import Callable

import anyio
import structlog
from kubernetes_asyncio import client

from adapters.k8s.adapter import K8sBackend
from adapters.k8s.kube import make_api_client
from adapters.k8s.lease import (
    LeaderElector,
    LeaseConfig,
    default_identity,
    default_lease_name,
    default_namespace,
)
from adapters.runtime import DecisionLedger, FileDecisionLedger
from muster.logs import configure_logging
from muster.transport import (
    add_server_arg,
    add_tls_args,
    add_token_args,
    tls_from_args,
    token_from_args,
)

log = structlog.get_logger("muster.k8s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="muster-k8s-adapter", description=__doc__.split("\n\n")[0])
    add_server_arg(p)
    add_tls_args(p)
    add_token_args(p)
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)"
    )
    source.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    source.add_argument(
        "--api-server", help="plain API server URL without auth (tests, kubectl proxy)"
    )
    p.add_argument(
        "--scheduler-name", default="muster", help="pods with this spec.schedulerName are Muster's"
    )
    p.add_argument("--name", default="kubernetes", help="backend name registered with the server")
    p.add_argument("--ledger", help="file remembering applied decisions across adapter restarts")
    p.add_argument("--bind-concurrency", type=int, default=64)
    p.add_argument(
        "--kai",
        action="store_true",
        help="also read KAI Scheduler's PodGroups and Queues (scheduling.run.ai; needs RBAC on that group)",
    )
    election = p.add_argument_group("leader election (a coordination.k8s.io/v1 Lease)")
    election.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run only while holding the Lease, so replicas never both bind (default: on)",
    )
    election.add_argument("--lease-name", help="Lease name (default: muster-k8s-adapter-<--name>)")
    election.add_argument(
        "--lease-namespace",
        help="Lease namespace (default: $POD_NAMESPACE, else the service account's, else "
        "muster-system)",
    )
    election.add_argument(
        "--lease-duration",
        type=_seconds,
        default=15.0,
        help="seconds a standby waits on an unrenewed Lease before taking it over (default 15)",
    )
    election.add_argument(
        "--renew-deadline",
        type=_seconds,
        default=10.0,
        help="seconds the leader keeps trying to renew before it stops binding (default 10; "
        "it renews every half of this)",
    )
    election.add_argument(
        "--retry-period",
        type=_seconds,
        default=2.0,
        help="seconds between tries to acquire, or to renew after a failure (default 2)",
    )
    p.add_argument("--log-format", choices=("console", "json"), default="console")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    if args.leader_elect:
        try:
            args.lease = lease_config(args)
        except ValueError as exc:
            p.error(str(exc))
    return args


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be > 0")
    return value


def lease_config(args: argparse.Namespace) -> LeaseConfig:
    return LeaseConfig(
        name=args.lease_name or default_lease_name(args.name),
        namespace=args.lease_namespace or default_namespace(),
        identity=default_identity(),
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
    )


def make_backend(
    api: client.ApiClient,
    args: argparse.Namespace,
    may_write: Callable[[], bool] | None = None,
) -> K8sBackend:
    ledger: DecisionLedger = FileDecisionLedger(args.ledger) if args.ledger else DecisionLedger()
    return K8sBackend(
        api,
        server=args.server,
        scheduler_name=args.scheduler_name,
        name=args.name,
        ledger=ledger,
        bind_concurrency=args.bind_concurrency,
        tls=tls_from_args(args),
        token=token_from_args(args),
        kai=args.kai,
        may_write=may_write,
    )


async def run(args: argparse.Namespace) -> None:
    api = await make_api_client(
        host=args.api_server, kubeconfig=args.kubeconfig, in_cluster=args.in_cluster
    )
    elector = LeaderElector(api, args.lease) if args.leader_elect else None
    backend = None if elector is not None else make_backend(api, args)

    async def lead() -> None:
        # With leader election, a new backend each term: informers, job book and runtime start
        # from the cluster as it is then.
        running = backend or make_backend(api, args, elector.is_leader if elector else None)
        log.info("starting", server=args.server, scheduler_name=args.scheduler_name)
        await running.run()

    try:
        async with anyio.create_task_group() as tg:

            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        log.info("stopping", signal=signal.Signals(signum).name)
                        if elector is not None:
                            elector.stop()  # cancels the backend, then releases the Lease
                        elif backend is not None:
                            backend.stop()
                        return

            tg.start_soon(on_signal)
            if elector is not None:
                await elector.run(lead)
            else:
                await lead()
            tg.cancel_scope.cancel()
    finally:
        await api.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(run, args)


if __name__ == "__main__":
    main()
