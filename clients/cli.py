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
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from importlib import metadata
from typing import Any

import anyio
import argcomplete
import grpc
from argcomplete import shell_integration
from argcomplete.completers import ChoicesCompleter

from clients.client import DEFAULT_SERVER, MusterClient
from clients.commands import (
    JOB_SORT_KEYS,
    PHASES,
    QUEUE_STATES,
    ScenarioProblems,
    UsageError,
    cmd_cancel,
    cmd_config,
    cmd_explain,
    cmd_hold,
    cmd_job,
    cmd_jobs,
    cmd_logs,
    cmd_nodes,
    cmd_queue,
    cmd_queues,
    cmd_release,
    cmd_requeue,
    cmd_servers,
    cmd_submit,
    cmd_watch,
)
from clients.history import STATES as HISTORY_STATES
from clients.history import cmd_history
from clients.render import FormatError, Output, output_format_arg, render_simulation
from muster.logs import configure_logging
from muster.phases import WAITING_PHASES
from muster.transport import (
    add_tls_args,
    add_token_args,
    parse_addresses,
    server_arg,
    tls_from_args,
    token_from_args,
)
from muster.v1 import muster_pb2 as pb

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
Completer = Callable[..., Iterable[str]]

OUTPUT_FORMATS = {
    "table": "a table (plain columns when not a terminal)",
    "wide": "a table with more columns, cells never wrapped",
    "json": "the API objects (docs/api.md JSON mapping)",
    "custom-columns=": "HEADER:PATH,... paths into the JSON form",
    "jsonpath=": "a kubectl JSONPath template over the JSON form",
}
COMPLETION_TIMEOUT = 3.0  # seconds a completing shell waits for the server


def _completes(action: argparse.Action, completer: Completer) -> argparse.Action:
    """Give an argument argcomplete's completer (values offered on TAB)."""
    action.completer = completer  # type: ignore[attr-defined]
    return action


def from_server(
    fetch: Callable[[MusterClient, argparse.Namespace], Awaitable[Iterable[str]]],
) -> Completer:
    """A completer asking the server (the one the command line names) for the values: job ids,
    queue names ... Nothing is offered when no server answers within COMPLETION_TIMEOUT."""

    def complete(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
        async def ask() -> list[str]:
            async with MusterClient(
                resolve_server(parsed_args),
                timeout=COMPLETION_TIMEOUT,
                tls=tls_from_args(parsed_args),
                token=token_from_args(parsed_args),
                failover_timeout=0.0,
            ) as client:
                return [v for v in await fetch(client, parsed_args) if v.startswith(prefix)]

        try:
            return anyio.run(ask, backend="asyncio")
        except Exception:  # noqa: BLE001 - a completing shell shows nothing, not a traceback
            return []

    return complete


async def _job_ids(client: MusterClient, args: argparse.Namespace) -> list[str]:
    # Only the jobs the command applies to: ended jobs cannot be cancelled, only pending ones held
    # or released, only running ones requeued. Job control and cancel take an array's id too.
    phases: frozenset[pb.JobPhase] = {
        "cancel": WAITING_PHASES | {pb.JOB_PHASE_RUNNING},
        "hold": WAITING_PHASES,
        "release": WAITING_PHASES,
        "requeue": frozenset({pb.JOB_PHASE_RUNNING}),
    }.get(args.command, frozenset())
    ids: dict[str, None] = {}
    async for job in client.list_jobs(phases=phases, limit=5000):
        if args.command == "release" and not job.status.hold:
            continue
        if args.command != "jobs":  # `jobs --array`: array ids only
            ids[job.spec.id] = None
        if job.spec.array_job_id and args.command in ARRAY_COMMANDS:
            ids.setdefault(job.spec.array_job_id, None)
    return list(ids)


# Commands that take an array's id (for all its elements).
ARRAY_COMMANDS = frozenset({"cancel", "hold", "release", "requeue", "jobs"})


async def _task_names(client: MusterClient, args: argparse.Namespace) -> list[str]:
    job = await client.get_job(args.job)
    return [t.id.removeprefix(f"{job.spec.id}/") for t in job.tasks]


async def _queue_names(client: MusterClient, args: argparse.Namespace) -> list[str]:
    return [q.queue.name for q in await client.list_queues()]


async def _backends(client: MusterClient, args: argparse.Namespace) -> list[str]:
    return sorted({n.node.backend for n in await client.list_nodes()})


JOB_IDS, TASKS = from_server(_job_ids), from_server(_task_names)
QUEUES, BACKENDS = from_server(_queue_names), from_server(_backends)


def _common_options(for_subcommand: bool) -> argparse.ArgumentParser:
    """The options every command takes, before or after its name. A subcommand's copy has no
    defaults (argparse.SUPPRESS): an option given before the command name is not reset by it."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server",
        default=None,
        type=server_arg,
        help="server address HOST:PORT, or the servers of a replicated deployment "
        f"HOST:PORT,HOST:PORT,... (default $MUSTER_SERVER or {DEFAULT_SERVER})",
    )
    _completes(
        common.add_argument(
            "--output",
            "-o",
            type=output_format_arg,
            default=None,
            metavar="FORMAT",
            help="output format: table (default), wide (more columns, no wrapping), json "
            "(docs/api.md JSON mapping), custom-columns=HEADER:PATH,... (PATH into the JSON "
            "form, e.g. NAME:.spec.id) or jsonpath=TEMPLATE (kubectl's, e.g. "
            "'{.items[*].spec.id}')",
        ),
        ChoicesCompleter(OUTPUT_FORMATS),
    )
    common.add_argument(
        "--no-headers",
        action="store_true",
        default=False,
        help="print tables without their header line (and titles)",
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
    if for_subcommand:
        for action in common._actions:
            action.default = argparse.SUPPRESS
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common_options(for_subcommand=True)
    parser = argparse.ArgumentParser(
        prog="muster",
        description="Muster scheduler client.",
        parents=[_common_options(for_subcommand=False)],
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
        "  muster submit examples/job-volcano-gang.yaml\n  muster submit -o json jobs/*.yaml\n"
        "  muster submit --array 0-99%10 sweep.yaml     # 100 elements, 10 running at once\n"
        "  muster submit --dependency afterok:prep train.yaml\n"
        "  muster submit --hold train.yaml              # then: muster release train\n"
        "  muster submit --time 2:00:00 train.yaml      # each task ends (TimeLimit) after 2 h",
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument(
        "--hold", action="store_true", help="submit held: not scheduled until `muster release`"
    )
    p.add_argument(
        "--array",
        metavar="SPEC",
        help="submit each job as an array: 0-99, 1,3,5-7, 0-15:4; %%N runs at most N elements "
        "at once (0-99%%10); elements are ID_INDEX",
    )
    p.add_argument(
        "--dependency",
        "-d",
        metavar="LIST",
        help="wait for other jobs, Slurm's syntax: afterok:a:b,afterany:c (afterok, afternotok, "
        "afterany, after = started)",
    )
    p.add_argument(
        "--time",
        "-t",
        metavar="LIMIT",
        help="time limit of every job (sbatch's --time): 2h, 90m, 1h30m, or Slurm's MM, MM:SS, "
        "HH:MM:SS, D-HH, D-HH:MM:SS; each task is ended (Failed, TimeLimit) that long after it "
        "started",
    )

    p = add(
        "jobs",
        cmd_jobs,
        "list jobs",
        "  muster jobs --phase pending --phase inqueue\n  muster jobs --owner me --sort=-submit -o wide\n"
        "  muster jobs --sort=-submit --limit 3          # the three newest\n"
        "  muster jobs -l team=vision,tier!=batch\n"
        "  muster jobs --no-headers -o custom-columns=ID:.spec.id,PHASE:.status.phase\n"
        "  muster jobs -o jsonpath='{range .items[*]}{.spec.id}{\"\\n\"}{end}'\n"
        "  muster jobs --queue ml --queue research -o json",
    )
    _job_filter_args(p)
    _completes(
        p.add_argument(
            "--phase", action="append", help=f"filter by phase ({', '.join(PHASES)}); repeatable"
        ),
        ChoicesCompleter(dict.fromkeys(PHASES, "phase")),
    )
    _selector_arg(p, "jobs whose task groups carry these labels (one group matching all)")
    _completes(
        p.add_argument("--array", metavar="ID", help="only the elements of this job array"), JOB_IDS
    )
    p.add_argument(
        "--start",
        action="store_true",
        help="waiting jobs with their estimated start and nodes, soonest first (squeue --start; "
        "needs the reserve action, docs/plugins/reservation.md)",
    )
    _completes(
        p.add_argument(
            "--sort",
            help="submit (default), start, id, queue, owner or phase; --sort=-KEY reverses",
        ),
        ChoicesCompleter(
            {
                **dict.fromkeys(JOB_SORT_KEYS, "ascending"),
                **{f"-{k}": "descending" for k in JOB_SORT_KEYS},
            }
        ),
    )
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="at most N jobs: the first N in --sort order (default: submission order; with "
        "--start, soonest first)",
    )

    p = add(
        "job",
        cmd_job,
        "show one job: status, placement per task, conditions, why pending",
        "  muster job train-7\n  muster job train-7 -o json | jq '.tasks[].devices'",
    )
    _completes(p.add_argument("id"), JOB_IDS)

    p = add(
        "logs",
        cmd_logs,
        "print the output of a job's tasks (what their backend sent)",
        "  muster logs train            # every task, each under a ==> task <== header\n"
        "  muster logs train w-0        # one task (or its full id: muster logs train/w-0)\n"
        "  muster logs -f train/w-0     # and what follows, until the task ends (Ctrl-C stops)",
    )
    _completes(p.add_argument("job", metavar="JOB[/TASK]"), JOB_IDS)
    _completes(p.add_argument("task", nargs="?"), TASKS)
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing output as it arrives, until the task (every task of the job) ends",
    )

    p = add(
        "history",
        cmd_history,
        "finished jobs with their accounting (like sacct): times, CPU/GPU-seconds, exit codes",
        "  muster history --since 2h                 # jobs that ended in the last two hours\n"
        "  muster history --owner me --state failed --since 2024-05-01\n"
        "  muster history --queue ml -o wide\n"
        "  muster history --since 1d -o json | jq '.[].used'",
    )
    p.add_argument(
        "--since", metavar="TIME", help="ended at or after TIME: ISO 8601, or how long ago (2h, 1d)"
    )
    p.add_argument(
        "--until", metavar="TIME", help="ended before TIME: ISO 8601, or how long ago (30m)"
    )
    _job_filter_args(p)
    _completes(
        p.add_argument(
            "--state",
            action="append",
            help=f"only jobs that ended so ({', '.join(HISTORY_STATES)}); repeatable",
        ),
        ChoicesCompleter(dict.fromkeys(HISTORY_STATES, "state")),
    )
    p.add_argument(
        "--limit", type=int, default=None, metavar="N", help="at most N jobs (the earliest ended)"
    )

    p = add("explain", cmd_explain, "why a job is (not) placed, from the last cycle")
    _completes(p.add_argument("id"), JOB_IDS)

    # Commands given job ids and nothing else (each id is acted on and reported in turn).
    for command, func, help_text, examples in (
        (
            "cancel",
            cmd_cancel,
            "cancel jobs (their running tasks are evicted)",
            "  muster cancel train-7\n  muster cancel a b c        # each is reported; exit 1 if any failed",
        ),
        (
            "hold",
            cmd_hold,
            "hold pending jobs: not scheduled until released (an array's id: its pending elements)",
            "  muster hold train-7\n  muster hold sweep          # every pending element sweep_N",
        ),
        (
            "release",
            cmd_release,
            "release held jobs (an array's id: its held elements)",
            "  muster release train-7",
        ),
    ):
        p = add(command, func, help_text, examples)
        _completes(p.add_argument("ids", nargs="+", metavar="ID"), JOB_IDS)

    p = add(
        "requeue",
        cmd_requeue,
        "stop started jobs and send them back to pending (their tasks are evicted)",
        "  muster requeue train-7\n  muster requeue --hold train-7   # and hold it (scontrol requeuehold)",
    )
    p.add_argument("--hold", action="store_true", help="hold the job once it is back to pending")
    _completes(p.add_argument("ids", nargs="+", metavar="ID"), JOB_IDS)

    add(
        "queues",
        cmd_queues,
        "list queues",
        "  muster queues\n  muster queues -o wide          # with priority, guarantee, annotations\n"
        "  muster queues -o json",
    )

    p = add(
        "queue",
        cmd_queue,
        "create, update or delete a queue",
        "  muster queue create ml --weight 3 --capability cpu=64,nvidia.com/gpu=8\n"
        "  muster queue update ml --state closing\n  muster queue delete ml\n"
        "  muster queue create short --default-time 30m --max-time 4h",
    )
    qsub = p.add_subparsers(dest="queue_command", required=True, metavar="ACTION")
    for action in ("create", "update"):
        q = qsub.add_parser(action, help=f"{action} a queue", parents=[common])
        name = q.add_argument("name")
        if action == "update":
            _completes(name, QUEUES)
        _completes(q.add_argument("--parent"), QUEUES)
        q.add_argument("--weight", type=int)
        q.add_argument("--priority", type=int)
        q.add_argument("--capability", help="NAME=QTY,... upper limit ('-1' unlimited)")
        q.add_argument("--deserved", help="NAME=QTY,... fair share target")
        q.add_argument("--guarantee", help="NAME=QTY,... reserved for this queue")
        q.add_argument("--reclaimable", choices=["true", "false"])
        q.add_argument("--state", choices=list(QUEUE_STATES))
        q.add_argument(
            "--default-time",
            metavar="LIMIT",
            help="time limit of a job submitted without one (Slurm's DefaultTime): 2h, 30m, "
            "HH:MM:SS ...; 'none' for none",
        )
        q.add_argument(
            "--max-time",
            metavar="LIMIT",
            help="largest time limit a job may ask (Slurm's MaxTime; also the default when "
            "--default-time is not set); 'none' for none",
        )
    q = qsub.add_parser("delete", help="delete a queue", parents=[common])
    _completes(q.add_argument("name"), QUEUES)

    p = add(
        "nodes",
        cmd_nodes,
        "list nodes with used and idle resources",
        "  muster nodes\n  muster nodes -l zone=a -o wide       # with taints and device holders\n"
        "  muster nodes --backend rack-a -o json | jq '.[].device_holders'",
    )
    _completes(p.add_argument("--backend"), BACKENDS)
    _selector_arg(p, "nodes with these labels")

    p = add(
        "watch",
        cmd_watch,
        "stream job changes",
        "  muster watch --queue ml\n  muster watch --job train-7 --until-done && echo done",
    )
    _completes(p.add_argument("--queue"), QUEUES)
    p.add_argument("--namespace", "-n")
    _completes(p.add_argument("--job"), JOB_IDS)
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


def _job_filter_args(p: argparse.ArgumentParser) -> None:
    """``--queue``, ``--namespace`` and ``--owner``: the job filters of ``jobs`` and ``history``."""
    _completes(
        p.add_argument("--queue", action="append", help="only jobs of this queue; repeatable"),
        QUEUES,
    )
    p.add_argument("--namespace", "-n")
    _completes(
        p.add_argument(
            "--owner",
            action="append",
            help="only jobs this user submitted ('me': your login name); repeatable",
        ),
        ChoicesCompleter({"me": "your login name"}),
    )


def _selector_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--selector",
        "-l",
        action="append",
        metavar="SELECTOR",
        help=f"only {what}: key=value, key!=value, key, !key, 'key in (a,b)', "
        "'key notin (a,b)', comma-separated (all must hold); repeatable",
    )


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
    # Answers a completing shell and exits (a no-op otherwise); options are offered after a "-".
    argcomplete.autocomplete(parser, always_complete_options=False)
    args = parser.parse_args(argv)
    # Logs (e.g. of the core under `simulate --local`) go to stderr only: stdout is the result.
    configure_logging("console", os.environ.get("MUSTER_LOG_LEVEL", "warning"), cache=False)
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
    try:
        out = Output(fmt, headers=not args.no_headers)
    except FormatError as exc:
        print(f"error: --output: {exc}", file=sys.stderr)
        return 2
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
