"""``muster-k8s-adapter``: schedule Kubernetes pods (``spec.schedulerName``) with Muster.

muster-k8s-adapter --server HOST:PORT [--kubeconfig FILE | --in-cluster | --api-server URL]
                   [--scheduler-name muster] [--name kubernetes] [--ledger PATH]
"""

from __future__ import annotations

import argparse
import signal

import anyio
import structlog

from adapters.k8s.adapter import K8sBackend
from adapters.k8s.kube import make_api_client
from adapters.runtime import DecisionLedger, FileDecisionLedger
from muster.logs import configure_logging
from muster.transport import add_tls_args, add_token_args, tls_from_args, token_from_args

log = structlog.get_logger("muster.k8s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="muster-k8s-adapter", description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="127.0.0.1:50051", help="Muster server address (HOST:PORT)")
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
    p.add_argument("--log-format", choices=("console", "json"), default="console")
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> None:
    api = await make_api_client(
        host=args.api_server, kubeconfig=args.kubeconfig, in_cluster=args.in_cluster
    )
    ledger: DecisionLedger = FileDecisionLedger(args.ledger) if args.ledger else DecisionLedger()
    backend = K8sBackend(
        api,
        server=args.server,
        scheduler_name=args.scheduler_name,
        name=args.name,
        ledger=ledger,
        bind_concurrency=args.bind_concurrency,
        tls=tls_from_args(args),
        token=token_from_args(args),
        kai=args.kai,
    )
    try:
        async with anyio.create_task_group() as tg:

            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        log.info("stopping", signal=signal.Signals(signum).name)
                        backend.stop()
                        return

            tg.start_soon(on_signal)
            log.info("starting", server=args.server, scheduler_name=args.scheduler_name)
            await backend.run()
            tg.cancel_scope.cancel()
    finally:
        await api.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    try:
        anyio.run(run, args)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
