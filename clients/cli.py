"""``muster``: the command-line client (see docs/cli.md).

Server address: ``--server`` or ``$MUSTER_SERVER`` (default 127.0.0.1:50051); a replicated
deployment's servers comma-separated (the client follows the leader). Tables for people,
``--output json`` for scripts. Exit codes: 0 ok, 1 a gRPC error (printed as
``error: <CODE>: <message>``), 2 bad input (job file, scenario, flags: one line per problem).

This module is the argument parsing and the entry point, plus ``simulate`` (whose ``--local``
mode runs the scheduling core in this process: the one place a client imports ``server``). The
other commands are in :mod:`clients.commands`, how results are shown in :mod:`clients.render`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from importlib import metadata
from typing import Any

import anyio
import argcomplete
import grpc
from argcomplete import shell_integration

from clients.client import DEFAULT_SERVER, MusterClient
from clients.commands import (
    PHASES,
    QUEUE_STATES,
    ScenarioProblems,
    UsageError,
    cmd_cancel,
    cmd_config,
    cmd_explain,
    cmd_job,
    cmd_jobs,
    cmd_logs,
    cmd_nodes,
    cmd_queue,
    cmd_queues,
    cmd_servers,
    cmd_submit,
    cmd_watch,
)
from clients.render import Output, render_simulation
from muster.logs import configure_logging
from muster.transport import (
    add_tls_args,
    add_token_args,
    parse_addresses,
    server_arg,
    tls_from_args,
    token_from_args,
)

DEFAULT_TIMEOUT = 30.0


async def cmd_simulate(client: MusterClient | None, args: argparse.Namespace, out: Output) -> int:
    try:
        with open(args.file) as handle:
            text = handle.read()
    except OSError as exc:
        raise UsageError([f"{args.file}: {exc.strerror or exc}"]) from None
    if args.local:
        from server.simulate import ScenarioError, simulate_text

        try:
            result = await anyio.to_thread.run_sync(simulate_text, text, args.cycles or None)
        except ScenarioError as exc:
            raise ScenarioProblems(exc.problems) from None
    else:
        assert client is not None
        try:
            result = await client.simulate(text, args.cycles or 0)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise ScenarioProblems((exc.details() or "invalid scenario").splitlines()) from None
            raise
    out.emit(result, lambda: render_simulation(out, result))
    return 0


# ---------------------------------------------------------------------------------------------
# Parser and entry point
# ---------------------------------------------------------------------------------------------

Command = Callable[[Any, argparse.Namespace, Output], Coroutine[Any, Any, int]]


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server",
        default=None,
        type=server_arg,
        help="server address HOST:PORT, or the servers of a replicated deployment "
        f"HOST:PORT,HOST:PORT,... (default $MUSTER_SERVER or {DEFAULT_SERVER})",
    )
    common.add_argument(
        "--output",
        "-o",
        choices=["table", "wide", "json"],
        default=None,
        help="output format: table, wide (every column) or json (docs/api.md JSON mapping)",
    )
    common.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds per call (default {DEFAULT_TIMEOUT:g})",
    )
    common.add_argument(
        "--failover-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long a call keeps looking for a server that answers, following the leader "
        "(default: --timeout with several --server addresses; 0 with one: every address and a "
        "leader a refusal names are tried once)",
    )
    add_tls_args(common)
    add_token_args(common)

    parser = argparse.ArgumentParser(
        prog="muster",
        description="Muster scheduler client.",
        parents=[common],
        epilog="examples:\n  muster submit examples/jobs-demo.yaml\n  muster jobs --owner me --phase running\n"
        '  muster job demo-big\n  eval "$(muster completion bash)"   # tab completion',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"muster {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, func: Command, help_text: str, examples: str = ""
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            parents=[common],
            epilog=f"examples:\n{examples}" if examples else None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(func=func)
        return p

    p = add(
        "submit",
        cmd_submit,
        "submit the jobs of one or more YAML job files",
        "  muster submit examples/job-volcano-gang.yaml\n  muster submit -o json jobs/*.yaml",
    )
    p.add_argument("files", nargs="+", metavar="FILE")

    p = add(
        "jobs",
        cmd_jobs,
        "list jobs",
        "  muster jobs --phase pending --phase inqueue\n  muster jobs --owner me --sort=-submit -o wide\n"
        "  muster jobs --queue ml --queue research -o json",
    )
    p.add_argument("--queue", action="append", help="only jobs of this queue; repeatable")
    p.add_argument("--namespace", "-n")
    p.add_argument(
        "--owner",
        action="append",
        help="only jobs this user submitted ('me': your login name); repeatable",
    )
    p.add_argument(
        "--phase", action="append", help=f"filter by phase ({', '.join(PHASES)}); repeatable"
    )
    p.add_argument(
        "--sort", help="submit (default), start, id, queue, owner or phase; --sort=-KEY reverses"
    )
    p.add_argument("--limit", type=int, default=None)

    p = add(
        "job",
        cmd_job,
        "show one job: status, placement per task, conditions, why pending",
        "  muster job train-7\n  muster job train-7 -o json | jq '.tasks[].devices'",
    )
    p.add_argument("id")

    p = add(
        "logs",
        cmd_logs,
        "print the output of a job's tasks (what their backend sent)",
        "  muster logs train            # every task, each under a ==> task <== header\n"
        "  muster logs train w-0        # one task (or its full id train/w-0)",
    )
    p.add_argument("job")
    p.add_argument("task", nargs="?")

    p = add("explain", cmd_explain, "why a job is (not) placed, from the last cycle")
    p.add_argument("id")

    p = add(
        "cancel",
        cmd_cancel,
        "cancel jobs (their running tasks are evicted)",
        "  muster cancel train-7\n  muster cancel a b c        # each is reported; exit 1 if any failed",
    )
    p.add_argument("ids", nargs="+", metavar="ID")

    add("queues", cmd_queues, "list queues", "  muster queues\n  muster queues -o json")

    p = add(
        "queue",
        cmd_queue,
        "create, update or delete a queue",
        "  muster queue create ml --weight 3 --capability cpu=64,nvidia.com/gpu=8\n"
        "  muster queue update ml --state closing\n  muster queue delete ml",
    )
    qsub = p.add_subparsers(dest="queue_command", required=True, metavar="ACTION")
    for action in ("create", "update"):
        q = qsub.add_parser(action, help=f"{action} a queue", parents=[common])
        q.add_argument("name")
        q.add_argument("--parent")
        q.add_argument("--weight", type=int)
        q.add_argument("--priority", type=int)
        q.add_argument("--capability", help="NAME=QTY,... upper limit ('-1' unlimited)")
        q.add_argument("--deserved", help="NAME=QTY,... fair share target")
        q.add_argument("--guarantee", help="NAME=QTY,... reserved for this queue")
        q.add_argument("--reclaimable", choices=["true", "false"])
        q.add_argument("--state", choices=list(QUEUE_STATES))
    q = qsub.add_parser("delete", help="delete a queue", parents=[common])
    q.add_argument("name")

    p = add(
        "nodes",
        cmd_nodes,
        "list nodes with used and idle resources",
        "  muster nodes\n  muster nodes --backend rack-a -o json | jq '.[].device_holders'",
    )
    p.add_argument("--backend")

    p = add(
        "watch",
        cmd_watch,
        "stream job changes",
        "  muster watch --queue ml\n  muster watch --job train-7 --until-done && echo done",
    )
    p.add_argument("--queue")
    p.add_argument("--namespace", "-n")
    p.add_argument("--job")
    p.add_argument(
        "--no-initial", action="store_true", help="skip the current state of matching jobs"
    )
    p.add_argument("--count", type=int, default=0, help="stop after this many events")
    p.add_argument(
        "--until-done",
        action="store_true",
        help="with --job: exit when the job ends (status 0 if it completed, 1 otherwise)",
    )

    add(
        "servers",
        cmd_servers,
        "list the servers of a replicated deployment: role, term, last renewal, lag",
        "  muster servers --server a:50051,b:50051,c:50051\n  muster servers -o json | jq '.[].role'",
    )

    p = add(
        "config",
        cmd_config,
        "get or set the scheduler configuration (Volcano format)",
        "  muster config get > scheduler.yaml\n  muster config set scheduler.yaml",
    )
    csub = p.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    csub.add_parser("get", help="print the current configuration", parents=[common])
    c = csub.add_parser("set", help="replace the configuration with FILE", parents=[common])
    c.add_argument("file")

    p = add(
        "completion",
        cmd_completion,
        "print a shell completion script",
        '  eval "$(muster completion bash)"      # in ~/.bashrc\n  muster completion zsh > ~/.zfunc/_muster',
    )
    p.add_argument("shell", choices=["bash", "zsh", "fish", "tcsh"])

    p = add(
        "simulate",
        cmd_simulate,
        "run a scenario through the scheduling core",
        "  muster simulate --local examples/scenarios/gang-basic.yaml\n"
        "  muster simulate --local scenario.yaml --cycles 3 -o json | jq .binds",
    )
    p.add_argument("file")
    p.add_argument("--local", action="store_true", help="run in this process (no server needed)")
    p.add_argument("--cycles", type=int, default=0)
    return parser


def _merge_common(args: argparse.Namespace, argv: Sequence[str]) -> None:
    # A flag given before the subcommand is overwritten by the subparser's default; re-read it.
    pre = build_common_only().parse_known_args(argv)[0]
    for name in ("server", "output", "timeout", "failover_timeout"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(pre, name))


def build_common_only() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--server")
    p.add_argument("--output", "-o")
    p.add_argument("--timeout", type=float)
    p.add_argument("--failover-timeout", type=float)
    return p


def resolve_server(args: argparse.Namespace) -> list[str]:
    """The addresses to use: ``--server``, else $MUSTER_SERVER, else the default (ValueError
    naming where an empty list came from)."""
    if args.server:
        return parse_addresses(args.server, "--server")
    env = os.environ.get("MUSTER_SERVER")
    if env:
        return parse_addresses(env, "MUSTER_SERVER")
    return [DEFAULT_SERVER]


def _version() -> str:
    try:
        return metadata.version("muster")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


async def cmd_completion(client: MusterClient | None, args: argparse.Namespace, out: Output) -> int:
    sys.stdout.write(shell_integration.shellcode(["muster"], shell=args.shell))
    return 0


async def _run(args: argparse.Namespace, out: Output) -> int:
    if args.command == "simulate" and args.local:
        return await cmd_simulate(None, args, out)
    if args.command == "completion":
        return await cmd_completion(None, args, out)
    try:
        tls = tls_from_args(args)
        token = token_from_args(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    async with MusterClient(
        args.server,
        timeout=args.timeout,
        tls=tls,
        token=token,
        failover_timeout=args.failover_timeout,
    ) as client:
        code: int = await args.func(client, args, out)
        return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    argcomplete.autocomplete(parser)  # answers a completing shell and exits; a no-op otherwise
    args = parser.parse_args(argv)
    # Logs (e.g. of the core under `simulate --local`) go to stderr only: stdout is the result.
    configure_logging("console", os.environ.get("MUSTER_LOG_LEVEL", "warning"), cache=False)
    _merge_common(args, argv)
    try:
        addresses = resolve_server(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.server = ",".join(addresses)
    args.timeout = DEFAULT_TIMEOUT if args.timeout is None else args.timeout
    if args.failover_timeout is None:
        # Several addresses: ride out a failover. One: a server that does not answer fails at
        # once, as before replication (a refusal naming the leader is still followed).
        args.failover_timeout = args.timeout if len(addresses) > 1 else 0.0
    fmt = args.output or (
        "json" if args.command == "simulate" and not sys.stdout.isatty() else "table"
    )
    out = Output(fmt)
    try:
        return anyio.run(_run, args, out, backend="asyncio")
    except UsageError as exc:
        prefix = "" if isinstance(exc, ScenarioProblems) else "error: "
        for problem in exc.problems:
            print(f"{prefix}{problem}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            print(
                f"hint: no Muster server answered at {args.server}; give its address with --server HOST:PORT "
                "or MUSTER_SERVER (start one with `muster-server`, or `make demo`)",
                file=sys.stderr,
            )
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
