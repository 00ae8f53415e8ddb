"""``muster-slurm-adapter``: Muster places the jobs of a real Slurm cluster.

    muster-slurm-adapter --server 127.0.0.1:50051 --staging-partition staging \\
        --run-partition batch [--poll-interval 0.25s] [--queue-from account|qos|partition|comment]

Polls Slurm (it has no event stream), sends the server deltas, and enforces binds / evictions
through ``scontrol`` (see ``adapters/slurm/backend.py`` and docs/slurm.md).
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import os
import pwd
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import structlog

from adapters.children import watch_children_with_pidfd
from adapters.runtime import DecisionLedger, FileDecisionLedger
from adapters.slurm.backend import Settings, SlurmBackend
from adapters.slurm.cli import SlurmCLI
from adapters.slurm.runtime import SlurmRuntime
from adapters.slurm.translate import QUEUE_SOURCES
from muster import transport
from muster.logs import configure_logging
from muster.transport import (
    add_tls_args,
    add_token_args,
    server_arg,
    tls_from_args,
    token_from_args,
)
from muster.v1 import muster_pb2_grpc as pb_grpc

log = structlog.get_logger("muster.slurm")


def parse_duration(text: str) -> float:
    """``0.5s`` / ``500ms`` / ``2`` / ``1m`` -> seconds (> 0)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 0.5s, 500ms, 2)")
    value = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[m.group(2)]
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="muster-slurm-adapter", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--server",
        required=True,
        type=server_arg,
        help="Muster server HOST:PORT, or a replicated deployment's servers "
        "HOST:PORT,HOST:PORT,... (the adapter follows the leader)",
    )
    add_tls_args(p)
    add_token_args(p)
    p.add_argument(
        "--name", default="slurm", help="backend name registered with the server (default slurm)"
    )
    p.add_argument(
        "--staging-partition",
        default="staging",
        help="DOWN partition jobs wait in (default staging)",
    )
    p.add_argument(
        "--run-partition", default="batch", help="partition Muster places jobs into (default batch)"
    )
    p.add_argument(
        "--poll-interval",
        type=parse_duration,
        default=0.25,
        help="Slurm job poll period (default 0.25s)",
    )
    p.add_argument(
        "--node-poll-interval",
        type=parse_duration,
        default=1.0,
        help="Slurm node poll period (default 1s; `sinfo --json` is the costly read)",
    )
    p.add_argument(
        "--queue-from",
        choices=QUEUE_SOURCES,
        default="account",
        help="which job field names the Muster queue (default account)",
    )
    p.add_argument(
        "--default-queue", default="default", help="queue for jobs with an empty queue field"
    )
    p.add_argument(
        "--job-prefix",
        default="slurm-",
        help="Muster job id = PREFIX + Slurm job id (default slurm-)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="keep the decision ledger here so a restarted adapter never re-applies a decision",
    )
    p.add_argument(
        "--slurm-bin", default="", help="directory of the Slurm commands (default: PATH)"
    )
    p.add_argument("--parallel", type=int, default=8, help="concurrent Slurm commands (default 8)")
    p.add_argument(
        "--decision-linger",
        type=parse_duration,
        default=0.01,
        help="after a decision arrives, wait this long for more to enforce together (default 10ms)",
    )
    p.add_argument(
        "--native-jobs-user",
        default="",
        metavar="USER",
        help="also run jobs submitted to Muster directly (not with sbatch): each becomes a Slurm "
        "job submitted at bind time, pinned to Muster's nodes, run as USER and USER's group "
        "(default: off; binds of such jobs are refused)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def native_identity(user: str) -> tuple[str, str, str]:
    """``--native-jobs-user`` -> (user, its primary group, the jobs' default working directory: its
    home, or /tmp when that does not exist), checked to exist on this host."""
    if not user:
        return "", "", ""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise SystemExit(f"--native-jobs-user: no user {user!r} on this host") from None
    try:
        group = grp.getgrgid(entry.pw_gid).gr_name
    except KeyError:
        group = str(entry.pw_gid)
    if entry.pw_uid == 0:
        log.warning(
            "--native-jobs-user is root: every client allowed to submit jobs runs commands as root"
        )
    return user, group, entry.pw_dir if os.path.isdir(entry.pw_dir) else "/tmp"


async def serve(args: argparse.Namespace, *, ready: anyio.Event | None = None) -> None:
    """Run the adapter until cancelled or SIGINT / SIGTERM."""
    cli = SlurmCLI(bin_dir=args.slurm_bin, parallel=args.parallel)
    if not await cli.ping():
        raise SystemExit(
            "slurmctld does not answer `scontrol ping` (is the cluster up? scripts/slurm-up.sh)"
        )
    native_user, native_group, native_workdir = native_identity(args.native_jobs_user)
    settings = Settings(
        native_user=native_user,
        native_group=native_group,
        native_workdir=native_workdir,
        staging_partition=args.staging_partition,
        run_partition=args.run_partition,
        queue_from=args.queue_from,
        default_queue=args.default_queue,
        job_prefix=args.job_prefix,
        poll_interval=args.poll_interval,
        node_poll_interval=args.node_poll_interval,
    )
    backend = SlurmBackend(cli, settings, name=args.name)
    ledger: DecisionLedger = (
        FileDecisionLedger(args.state_dir / f"{args.name}-ledger.json")
        if args.state_dir
        else DecisionLedger()
    )
    tls, token = tls_from_args(args), token_from_args(args)
    runtime = SlurmRuntime(
        backend,
        server=args.server,
        name=args.name,
        kind="slurm",
        ledger=ledger,
        tls=tls,
        token=token,
        max_batch=10_000,
        batch_linger=args.decision_linger,
        labels={"slurm.schedmd.com/run-partition": args.run_partition},
    )
    async with transport.channel(args.server, tls, token=token) as channel:
        backend.attach(runtime, pb_grpc.SchedulerStub(channel))
        async with anyio.create_task_group() as tg:

            async def watch_signals() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        log.info("stopping", signal=signal.Signals(signum).name)
                        runtime.stop()
                        tg.cancel_scope.cancel()
                        return

            async def run_runtime() -> None:
                await runtime.run()
                tg.cancel_scope.cancel()

            tg.start_soon(watch_signals)
            tg.start_soon(backend.run_poller)
            tg.start_soon(run_runtime)
            log.info(
                "slurm adapter started",
                server=args.server,
                staging=settings.staging_partition,
                run=settings.run_partition,
                queue_from=settings.queue_from,
            )
            if ready is not None:
                await runtime.wait_ready()
                ready.set()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging("json", args.log_level)
    watch_children_with_pidfd()
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(serve, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
