"""``muster-agent``: a fake bare-metal cluster that really runs what Muster binds to it.

    muster-agent --server 127.0.0.1:50051 --name rack-a --inventory examples/inventory-a.yaml \\
                 [--state-dir var/agent-a] [--kill-grace 5] [--log-format console|json]

It registers its inventory's nodes through :class:`adapters.runtime.BackendRuntime` and runs each
bound task as a real process (:class:`adapters.agent.agent.FakeAgent`; see docs/agent.md).

``--server`` (or MUSTER_SERVER) may list the servers of a replicated deployment, comma-separated:
the agent serves the leader and follows it when it changes (:mod:`adapters.runtime`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import anyio
import structlog

from adapters.agent.agent import FakeAgent
from adapters.agent.inventory import InventoryError, load_inventory
from adapters.runtime import BackendRuntime, DecisionLedger, FileDecisionLedger
from muster.logs import configure_logging
from muster.transport import (
    add_server_arg,
    add_tls_args,
    add_token_args,
    tls_from_args,
    token_from_args,
)

log = structlog.get_logger("muster.agent")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="muster-agent", description="Fake bare-metal Muster backend."
    )
    add_server_arg(parser)
    parser.add_argument("--name", required=True, help="backend name (unique per server)")
    parser.add_argument("--inventory", required=True, help="YAML file of nodes (see docs/agent.md)")
    parser.add_argument(
        "--state-dir", help="keep tasks and applied decision ids across agent restarts"
    )
    parser.add_argument(
        "--kill-grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL"
    )
    parser.add_argument(
        "--backoff-max", type=float, default=5.0, help="longest reconnect delay (seconds)"
    )
    parser.add_argument("--log-format", choices=["console", "json"], default="console")
    parser.add_argument("--log-level", default="info")
    add_tls_args(parser)
    add_token_args(parser)
    return parser


async def serve(args: argparse.Namespace) -> None:
    inventory = load_inventory(args.inventory)
    agent = FakeAgent(
        args.name,
        inventory,
        inventory_path=args.inventory,
        state_dir=args.state_dir,
        kill_grace=args.kill_grace,
    )
    ledger: DecisionLedger = (
        FileDecisionLedger(Path(args.state_dir) / "ledger.json")
        if args.state_dir
        else DecisionLedger()
    )
    runtime = BackendRuntime(
        agent,
        server=args.server,
        name=args.name,
        kind="fake-agent",
        ledger=ledger,
        backoff_max=args.backoff_max,
        tls=tls_from_args(args),
        token=token_from_args(args),
    )
    log.info(
        "agent starting", name=args.name, server=args.server, nodes=len(inventory), pid=os.getpid()
    )
    async with anyio.create_task_group() as tg:

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    log.info("signal received, stopping", name=args.name)
                    runtime.stop()
                    return

        tg.start_soon(on_signal)
        await agent.run(runtime)
        tg.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    try:
        anyio.run(serve, args, backend="asyncio")
    except InventoryError as exc:
        print(f"error: inventory {args.inventory}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
