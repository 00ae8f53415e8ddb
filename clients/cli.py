"""``muster``: the command-line client (see docs/cli.md).

Server address: ``--server`` or ``$MUSTER_SERVER`` (default 127.0.0.1:50051). Tables for people,
``--output json`` for scripts. Exit codes: 0 ok, 1 a gRPC error (printed as
``error: <CODE>: <message>``), 2 bad input (job file, scenario, flags: one line per problem).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import anyio
import grpc
from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table

from clients.client import DEFAULT_SERVER, MusterClient
from clients.jobfile import JobFileError, load_job_file
from muster.v1 import muster_pb2 as pb

PHASES = {name.removeprefix("JOB_PHASE_").lower(): value for name, value in pb.JobPhase.items() if value}
QUEUE_STATES = {"open": pb.QUEUE_STATE_OPEN, "closing": pb.QUEUE_STATE_CLOSING, "closed": pb.QUEUE_STATE_CLOSED}


class UsageError(Exception):
    """Bad input detected by the CLI itself (exit 2)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


class ScenarioProblems(UsageError):
    """An invalid scenario: its problem lines already name their field paths; printed bare,
    one per line, as docs/simulate.md specifies."""



# ---------------------------------------------------------------------------------------------
# Rendering helpers
# ---------------------------------------------------------------------------------------------


class Output:
    def __init__(self, fmt: str) -> None:
        self.json = fmt == "json"
        # Off a terminal, do not wrap at 80 columns: scripts grep these lines.
        wide = None if sys.stdout.isatty() else 240
        self.console = Console(highlight=False, soft_wrap=True, width=wide)

    def emit(self, data: Any, render: Callable[[], None]) -> None:
        if self.json:
            sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        else:
            render()

    def table(self, title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row))
        self.console.print(table)


def to_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def phase_name(value: int) -> str:
    return pb.JobPhase.Name(value).removeprefix("JOB_PHASE_").capitalize()


def status_name(value: int) -> str:
    return pb.TaskStatus.Name(value).removeprefix("TASK_STATUS_").capitalize()


def quantities(resources: pb.ResourceList) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(resources.quantities.items()))


def parse_resource_flag(text: str | None, flag: str) -> dict[str, str] | None:
    """``cpu=8,memory=32Gi`` -> {"cpu": "8", "memory": "32Gi"} (validated by the server)."""
    if text is None:
        return None
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name or not value:
            raise UsageError([f"{flag}: expected NAME=QUANTITY[,NAME=QUANTITY...], got {part!r}"])
        out[name.strip()] = value.strip()
    return out


def condition_line(cond: pb.Condition) -> str:
    text = f"{cond.type}={cond.status}"
    if cond.reason:
        text += f" {cond.reason}"
    if cond.message:
        text += f": {cond.message}"
    return text


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------


async def cmd_submit(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    specs: list[pb.JobSpec] = []
    problems: list[str] = []
    for path in args.files:
        try:
            specs.extend(load_job_file(path))
        except JobFileError as exc:
            problems.extend(f"{path}: {p}" for p in exc.problems)
    if problems:
        raise UsageError(problems)
    results = []
    for spec in specs:
        reply = await client.submit_job(spec)
        results.append(reply)
    out.emit(
        [{"id": r.job.spec.id, "created": r.created, "phase": phase_name(r.job.status.phase)} for r in results],
        lambda: out.table(
            None,
            ["JOB", "QUEUE", "TASKS", "RESULT"],
            [
                (
                    r.job.spec.id,
                    r.job.spec.queue,
                    sum(g.replicas for g in r.job.spec.task_groups),
                    "submitted" if r.created else "unchanged (already submitted)",
                )
                for r in results
            ],
        ),
    )
    return 0


async def cmd_jobs(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    phases = []
    for name in args.phase or []:
        if name.lower() not in PHASES:
            raise UsageError([f"--phase: {name!r} is not one of {', '.join(PHASES)}"])
        phases.append(PHASES[name.lower()])
    jobs = [
        job
        async for job in client.list_jobs(
            queue=args.queue or "", namespace=args.namespace or "", phases=phases, limit=args.limit
        )
    ]
    out.emit(
        [to_dict(j) for j in jobs],
        lambda: out.table(
            None,
            ["JOB", "NAMESPACE", "QUEUE", "PHASE", "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "REASON"],
            [
                (
                    j.spec.id,
                    j.spec.namespace,
                    j.spec.queue,
                    phase_name(j.status.phase),
                    j.status.pending,
                    j.status.running,
                    j.status.succeeded,
                    j.status.failed,
                    _last_reason(j),
                )
                for j in jobs
            ],
        ),
    )
    return 0


def _last_reason(job: pb.Job) -> str:
    for cond in reversed(job.status.conditions):
        if cond.status == "True" and cond.type == "Unschedulable":
            return cond.message or cond.reason
    return ""


async def cmd_job(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    job = await client.get_job(args.id)
    explanation: pb.ExplainResponse | None = None
    if job.status.phase in (pb.JOB_PHASE_PENDING, pb.JOB_PHASE_INQUEUE, pb.JOB_PHASE_UNSPECIFIED):
        try:
            explanation = await client.explain(args.id)
        except grpc.aio.AioRpcError:
            explanation = None  # no cycle has looked at it yet
    data = to_dict(job)
    if explanation is not None:
        data["explain"] = to_dict(explanation)

    def render() -> None:
        c = out.console
        s, st = job.spec, job.status
        c.print(f"[bold]Job[/bold] {s.id}  namespace={s.namespace} name={s.name} queue={s.queue}")
        c.print(
            f"Phase: {phase_name(st.phase)}   min_member={s.min_member or len(job.tasks)}   "
            f"pending={st.pending} running={st.running} succeeded={st.succeeded} failed={st.failed}"
        )
        for cond in st.conditions:
            c.print(f"Condition: {condition_line(cond)}" + (f" (cycle {cond.cycle_id})" if cond.cycle_id else ""))
        out.table(
            None,
            ["TASK", "ROLE", "STATUS", "NODE", "BACKEND", "DEVICES", "MESSAGE"],
            [
                (t.id, t.role, status_name(t.status), t.node, t.backend, ",".join(t.devices), t.message)
                for t in job.tasks
            ],
        )
        if explanation is not None:
            _render_explanation(out, explanation)

    out.emit(data, render)
    return 0


def _render_explanation(out: Output, exp: pb.ExplainResponse) -> None:
    if exp.gate in ("", "none"):  # placed, or nothing blocks it: no "why pending"
        where = f"cycle {exp.cycle_id}" if exp.cycle_id else "no cycle yet"
        out.console.print(f"Verdict ({where}): {exp.summary}")
        return
    out.console.print(f"Why pending (cycle {exp.cycle_id}, gate {exp.gate}): {exp.summary}")
    for reason, count in sorted(exp.node_reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        out.console.print(f"  {count:>7,} node(s): {reason}")


async def cmd_explain(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    exp = await client.explain(args.id)
    out.emit(to_dict(exp), lambda: (out.console.print(f"Job {exp.job_id}: {phase_name(exp.phase)}"), _render_explanation(out, exp)))
    return 0


async def cmd_cancel(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    job = await client.cancel_job(args.id)
    out.emit(to_dict(job), lambda: out.console.print(f"{job.spec.id}: {phase_name(job.status.phase)}"))
    return 0


async def cmd_queues(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    queues = await client.list_queues()
    out.emit(
        [to_dict(q) for q in queues],
        lambda: out.table(
            None,
            ["QUEUE", "PARENT", "WEIGHT", "STATE", "RECLAIMABLE", "CAPABILITY", "DESERVED", "ALLOCATED", "PENDING", "RUNNING"],
            [
                (
                    q.queue.name,
                    q.queue.parent or ("" if q.queue.name == "root" else "root"),
                    q.queue.weight,
                    pb.QueueState.Name(q.queue.state).removeprefix("QUEUE_STATE_").capitalize(),
                    q.queue.reclaimable if q.queue.HasField("reclaimable") else True,
                    quantities(q.queue.capability) or "-",
                    quantities(q.queue.deserved) or "-",
                    quantities(q.allocated) or "-",
                    q.pending_jobs,
                    q.running_jobs,
                )
                for q in queues
            ],
        ),
    )
    return 0


def _queue_from_flags(args: argparse.Namespace, base: pb.Queue | None = None) -> pb.Queue:
    queue = pb.Queue()
    if base is not None:
        queue.CopyFrom(base)
    queue.name = args.name
    if args.parent is not None:
        queue.parent = args.parent
    if args.weight is not None:
        queue.weight = args.weight
    if args.priority is not None:
        queue.priority = args.priority
    for flag, field in (("capability", "capability"), ("deserved", "deserved"), ("guarantee", "guarantee")):
        values = parse_resource_flag(getattr(args, flag), f"--{flag}")
        if values is not None:
            getattr(queue, field).Clear()
            getattr(queue, field).quantities.update(values)
    if args.reclaimable is not None:
        queue.reclaimable = args.reclaimable == "true"
    if args.state is not None:
        queue.state = QUEUE_STATES[args.state]
    return queue


async def cmd_queue(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    if args.queue_command == "delete":
        await client.delete_queue(args.name)
        out.emit({"deleted": args.name}, lambda: out.console.print(f"queue {args.name} deleted"))
        return 0
    if args.queue_command == "create":
        queue = await client.create_queue(_queue_from_flags(args))
        verb = "created"
    else:
        # Update is a full replace on the server: start from the current queue, change the flags given.
        current = {q.queue.name: q.queue for q in await client.list_queues()}
        base = current.get(args.name)
        if base is None:
            # Let the server produce the authoritative NOT_FOUND.
            base = pb.Queue(name=args.name)
        queue = await client.update_queue(_queue_from_flags(args, base))
        verb = "updated"
    out.emit(to_dict(queue), lambda: out.console.print(f"queue {queue.name} {verb}"))
    return 0


async def cmd_nodes(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    nodes = await client.list_nodes(args.backend or "")
    out.emit(
        [to_dict(n) for n in nodes],
        lambda: out.table(
            None,
            ["NODE", "BACKEND", "STATE", "ALLOCATABLE", "USED", "IDLE", "TASKS", "LABELS"],
            [
                (
                    n.node.name,
                    n.node.backend,
                    "NotReady" if n.node.not_ready else ("Cordoned" if n.node.unschedulable else "Ready"),
                    quantities(n.node.allocatable),
                    quantities(n.used),
                    quantities(n.idle),
                    n.task_count,
                    ",".join(f"{k}={v}" for k, v in sorted(n.node.labels.items())),
                )
                for n in nodes
            ],
        ),
    )
    return 0


async def cmd_watch(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    count = 0
    async for event in client.watch_jobs(
        queue=args.queue or "", namespace=args.namespace or "", job_id=args.job or "", send_initial=not args.no_initial
    ):
        job = event.job
        kind = pb.JobEvent.Type.Name(event.type).removeprefix("TYPE_")
        if out.json:
            sys.stdout.write(json.dumps({"type": kind, "job": to_dict(job)}) + "\n")
        else:
            st = job.status
            out.console.print(
                f"{kind:<8} {job.spec.id:<24} {phase_name(st.phase):<10} pending={st.pending} "
                f"running={st.running} succeeded={st.succeeded} failed={st.failed} {_last_reason(job)}"
            )
        sys.stdout.flush()
        count += 1
        if args.count and count >= args.count:
            break
    return 0


async def cmd_config(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    if args.config_command == "get":
        config = await client.get_config()
    else:
        try:
            with open(args.file) as handle:
                text = handle.read()
        except OSError as exc:
            raise UsageError([f"{args.file}: {exc.strerror or exc}"]) from None
        config = await client.update_config(text)
    out.emit(
        to_dict(config),
        lambda: (
            out.console.print(f"# generation {config.generation}"),
            sys.stdout.write(config.yaml if config.yaml.endswith("\n") else config.yaml + "\n"),
        ),
    )
    return 0


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
    out.emit(result, lambda: _render_simulation(out, result))
    return 0


def _render_simulation(out: Output, result: dict[str, Any]) -> None:
    tasks = result.get("tasks", {})
    out.table(
        "Tasks",
        ["TASK", "STATUS", "NODE"],
        [(uid, t.get("status", ""), t.get("node") or "") for uid, t in sorted(tasks.items())],
    )
    jobs = result.get("jobs", {})
    out.table(
        "Jobs",
        ["JOB", "PHASE", "CONDITIONS"],
        [
            (
                uid,
                j.get("phase", ""),
                "; ".join(f"{c.get('type')}: {c.get('reason', '')} {c.get('message', '')}".strip() for c in j.get("conditions", [])),
            )
            for uid, j in sorted(jobs.items())
        ],
    )
    evictions = result.get("evictions", [])
    if evictions:
        out.console.print("Evictions: " + ", ".join(evictions))
    moved = result.get("moved", {})
    for uid, move in sorted(moved.items()):
        out.console.print(f"Moved {uid}: {move.get('from')} -> {move.get('to')}")


# ---------------------------------------------------------------------------------------------
# Parser and entry point
# ---------------------------------------------------------------------------------------------

Command = Callable[[Any, argparse.Namespace, Output], Coroutine[Any, Any, int]]


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server",
        default=None,
        help=f"server address HOST:PORT (default $MUSTER_SERVER or {DEFAULT_SERVER})",
    )
    common.add_argument("--output", "-o", choices=["table", "json"], default=None, help="output format")
    common.add_argument("--timeout", type=float, default=30.0, help="seconds per call (default 30)")

    parser = argparse.ArgumentParser(prog="muster", description="Muster scheduler client.", parents=[common])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Command, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        p.set_defaults(func=func)
        return p

    p = add("submit", cmd_submit, "submit the jobs of one or more YAML job files")
    p.add_argument("files", nargs="+", metavar="FILE")

    p = add("jobs", cmd_jobs, "list jobs")
    p.add_argument("--queue")
    p.add_argument("--namespace", "-n")
    p.add_argument("--phase", action="append", help=f"filter by phase ({', '.join(PHASES)}); repeatable")
    p.add_argument("--limit", type=int, default=None)

    p = add("job", cmd_job, "show one job: status, placement per task, conditions, why pending")
    p.add_argument("id")

    p = add("explain", cmd_explain, "why a job is (not) placed, from the last cycle")
    p.add_argument("id")

    p = add("cancel", cmd_cancel, "cancel a job (its running tasks are evicted)")
    p.add_argument("id")

    add("queues", cmd_queues, "list queues")

    p = add("queue", cmd_queue, "create, update or delete a queue")
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

    p = add("nodes", cmd_nodes, "list nodes with used and idle resources")
    p.add_argument("--backend")

    p = add("watch", cmd_watch, "stream job changes")
    p.add_argument("--queue")
    p.add_argument("--namespace", "-n")
    p.add_argument("--job")
    p.add_argument("--no-initial", action="store_true", help="skip the current state of matching jobs")
    p.add_argument("--count", type=int, default=0, help="stop after this many events")

    p = add("config", cmd_config, "get or set the scheduler configuration (Volcano format)")
    csub = p.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    csub.add_parser("get", help="print the current configuration", parents=[common])
    c = csub.add_parser("set", help="replace the configuration with FILE", parents=[common])
    c.add_argument("file")

    p = add("simulate", cmd_simulate, "run a scenario through the scheduling core")
    p.add_argument("file")
    p.add_argument("--local", action="store_true", help="run in this process (no server needed)")
    p.add_argument("--cycles", type=int, default=0)
    return parser


def _merge_common(args: argparse.Namespace, argv: Sequence[str]) -> None:
    # A flag given before the subcommand is overwritten by the subparser's default; re-read it.
    pre = build_common_only().parse_known_args(argv)[0]
    for name in ("server", "output"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(pre, name))


def build_common_only() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--server")
    p.add_argument("--output", "-o")
    return p


async def _run(args: argparse.Namespace, out: Output) -> int:
    if args.command == "simulate" and args.local:
        return await cmd_simulate(None, args, out)
    async with MusterClient(args.server, timeout=args.timeout) as client:
        return await args.func(client, args, out)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    _merge_common(args, argv)
    args.server = args.server or os.environ.get("MUSTER_SERVER") or DEFAULT_SERVER
    fmt = args.output or ("json" if args.command == "simulate" and not sys.stdout.isatty() else "table")
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
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
