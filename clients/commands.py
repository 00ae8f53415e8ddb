"""The ``muster`` CLI's commands: each calls the server through :class:`MusterClient` and hands
the result to :class:`~clients.render.Output` (a table, or JSON with ``--output json``).

A command returns the exit code; bad input it detects itself raises :class:`UsageError` (exit 2);
a gRPC error propagates (exit 1, see :func:`clients.cli.main`).
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

import grpc

from clients.client import MusterClient
from clients.jobfile import JobFileError, load_job_file
from clients.render import (
    Output,
    condition_line,
    last_reason,
    phase_name,
    quantities,
    reason,
    render_explanation,
    status_name,
    to_dict,
)
from muster.gang import gang_minimum
from muster.jsonmap import short_enum_name
from muster.v1 import muster_pb2 as pb

# types-protobuf's EnumTypeWrapper.items() gives plain ints; protoc's .pyi names them pb.JobPhase.
PHASES = {
    name.removeprefix("JOB_PHASE_").lower(): cast(pb.JobPhase, value)
    for name, value in pb.JobPhase.items()
    if value
}
QUEUE_STATES = {
    "open": pb.QUEUE_STATE_OPEN,
    "closing": pb.QUEUE_STATE_CLOSING,
    "closed": pb.QUEUE_STATE_CLOSED,
}


class UsageError(Exception):
    """Bad input detected by the CLI itself (exit 2)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


class ScenarioProblems(UsageError):
    """An invalid scenario: its problem lines already name their field paths; printed bare,
    one per line, as docs/simulate.md specifies."""


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
    # Several jobs go in one all-or-nothing batch: a refused job leaves nothing half-submitted.
    results = (
        await client.submit_jobs(specs) if len(specs) > 1 else [await client.submit_job(specs[0])]
    )
    out.emit(
        [
            {"id": r.job.spec.id, "created": r.created, "phase": phase_name(r.job.status.phase)}
            for r in results
        ],
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


JOB_SORT_KEYS = ("submit", "start", "id", "queue", "owner", "phase")


async def cmd_jobs(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    phases = []
    for name in args.phase or []:
        if name.lower() not in PHASES:
            raise UsageError([f"--phase: {name!r} is not one of {', '.join(PHASES)}"])
        phases.append(PHASES[name.lower()])
    queues, owners = args.queue or [], [_owner(o) for o in args.owner or []]
    # One value of a filter goes to the server; several are matched here.
    jobs = [
        job
        async for job in client.list_jobs(
            queue=queues[0] if len(queues) == 1 else "",
            namespace=args.namespace or "",
            phases=phases,
            limit=args.limit,
            owner=owners[0] if len(owners) == 1 else "",
        )
        if (not queues or job.spec.queue in queues) and (not owners or job.spec.owner in owners)
    ]
    jobs = sort_jobs(jobs, args.sort)
    now = time.time()

    def row(j: pb.Job) -> list[Any]:
        code, message = reason(j)
        phase = phase_name(j.status.phase) + (f" ({j.status.stage})" if j.status.stage else "")
        tasks = f"{j.status.running}/{len(j.tasks)}"
        cells: list[Any] = [
            j.spec.id,
            j.spec.queue,
            j.spec.owner or "-",
            phase,
            tasks,
            clock(j.status.submit_time),
            age(j, now),
            code or "-",
        ]
        if out.wide:
            cells[1:1] = [j.spec.namespace]
            cells[6:6] = [
                j.status.pending,
                j.status.succeeded,
                j.status.failed,
                clock(j.status.start_time),
            ]
            cells.append(message)
        return cells

    columns = ["JOB", "QUEUE", "OWNER", "PHASE", "RUNNING", "SUBMIT", "AGE", "REASON"]
    if out.wide:
        columns[1:1] = ["NAMESPACE"]
        columns[6:6] = ["PENDING", "SUCCEEDED", "FAILED", "START"]
        columns.append("MESSAGE")
    out.emit([to_dict(j) for j in jobs], lambda: out.table(None, columns, [row(j) for j in jobs]))
    return 0


def sort_jobs(jobs: list[pb.Job], key: str | None) -> list[pb.Job]:
    """Submission order (the server's) unless ``key`` says otherwise; ``-KEY`` reverses."""
    if not key:
        return jobs
    reverse = key.startswith("-")
    name = key.lstrip("-")
    if name not in JOB_SORT_KEYS:
        raise UsageError(
            [f"--sort: {name!r} is not one of {', '.join(JOB_SORT_KEYS)} (prefix - to reverse)"]
        )
    keys: dict[str, Any] = {
        "submit": lambda j: j.status.submit_time.ToNanoseconds(),
        "start": lambda j: j.status.start_time.ToNanoseconds(),
        "id": lambda j: j.spec.id,
        "queue": lambda j: (j.spec.queue, j.spec.id),
        "owner": lambda j: (j.spec.owner, j.spec.id),
        "phase": lambda j: (j.status.phase, j.spec.id),
    }
    return sorted(jobs, key=keys[name], reverse=reverse)


def clock(ts: Any) -> str:
    """A timestamp as local time, HH:MM:SS today, else the date too; "-" when unset."""
    if not ts.seconds and not ts.nanos:
        return "-"
    when = datetime.fromtimestamp(ts.seconds).astimezone()
    today = datetime.now().astimezone().date()
    return when.strftime("%H:%M:%S" if when.date() == today else "%Y-%m-%d %H:%M")


def duration(seconds: float) -> str:
    """kubectl's AGE style: 45s, 12m, 3h5m, 2d4h."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def age(job: pb.Job, now: float) -> str:
    """Since submission; for an ended job, how long it ran (ELAPSED, start to finish)."""
    st = job.status
    if st.finish_time.seconds:
        start = st.start_time.seconds or st.submit_time.seconds
        return duration(st.finish_time.seconds - start) + " ran" if st.start_time.seconds else "-"
    return duration(now - st.submit_time.seconds) if st.submit_time.seconds else "-"


def _owner(value: str | None) -> str:
    if value == "me":
        try:
            return getpass.getuser()
        except (KeyError, OSError):
            return ""
    return value or ""


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
        c.print(
            f"[bold]Job[/bold] {s.id}  namespace={s.namespace} name={s.name} queue={s.queue} "
            f"owner={s.owner or '-'}"
        )
        c.print(
            f"Phase: {phase_name(st.phase)}   min_member={gang_minimum(s.min_member, len(job.tasks))}   "
            f"pending={st.pending} running={st.running} succeeded={st.succeeded} failed={st.failed}"
        )
        ran = (
            f" (ran {duration(st.finish_time.seconds - st.start_time.seconds)})"
            if st.finish_time.seconds and st.start_time.seconds
            else ""
        )
        c.print(
            f"Submitted: {clock(st.submit_time)}   Started: {clock(st.start_time)}   "
            f"Finished: {clock(st.finish_time)}{ran}"
        )
        if s.HasField("tyjob"):
            ty = s.tyjob
            c.print(
                f"TYJob: stage={st.stage} schedule_state={st.schedule_state} leader={ty.leader_role} "
                f"min_workers={ty.min_workers_num} priority={s.priority} "
                f"restarts={st.leader_restarts}/{ty.restart_limit} clean_pods={ty.clean_pod_policy} "
                f"policy={ty.scheduler_policy.job_queue_policy}/{ty.scheduler_policy.basic_policy}"
            )
        for cond in st.conditions:
            c.print(
                f"Condition: {condition_line(cond)}"
                + (f" (cycle {cond.cycle_id})" if cond.cycle_id else "")
            )
        out.table(
            None,
            ["TASK", "ROLE", "STATUS", "NODE", "BACKEND", "DEVICES", "MESSAGE"],
            [
                (
                    t.id,
                    t.role,
                    status_name(t.status),
                    t.node,
                    t.backend,
                    ",".join(t.devices),
                    t.message,
                )
                for t in job.tasks
            ],
        )
        if explanation is not None:
            render_explanation(out, explanation)

    out.emit(data, render)
    return 0


async def cmd_logs(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    """A job's task output as its backend sent it (the last 64 KiB per task), like `kubectl logs`."""
    task = args.task or ""
    if task and "/" not in task:
        task = f"{args.job}/{task}"  # `muster logs train w-0` for train/w-0
    logs = await client.task_logs(args.job, task)

    def render() -> None:
        many = len(logs) > 1
        for entry in logs:
            if many:
                sys.stdout.write(f"==> {entry.task_id} <==\n")
            if entry.truncated:
                sys.stdout.write("[earlier output dropped: the server keeps the last 64 KiB]\n")
            text = entry.data.decode("utf-8", errors="replace")
            sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
        sys.stdout.flush()

    out.emit([to_dict(entry) for entry in logs], render)
    return 0


async def cmd_explain(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    exp = await client.explain(args.id)

    def render() -> None:
        out.console.print(f"Job {exp.job_id}: {phase_name(exp.phase)}")
        render_explanation(out, exp)

    out.emit(to_dict(exp), render)
    return 0


async def cmd_cancel(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    """Cancel each id in turn; report every one (a refusal does not stop the others)."""
    results: list[dict[str, Any]] = []
    failed = 0
    for job_id in args.ids:
        try:
            job = await client.cancel_job(job_id)
        except grpc.aio.AioRpcError as exc:
            failed += 1
            results.append({"id": job_id, "error": f"{exc.code().name}: {exc.details()}"})
            continue
        results.append({"id": job_id, "job": to_dict(job)})

    def render() -> None:
        for r in results:
            if "error" in r:
                out.console.print(f"{r['id']}: error: {r['error']}")
            else:
                out.console.print(f"{r['id']}: {r['job']['status']['phase']}")

    out.emit(results, render)
    return 1 if failed else 0


async def cmd_queues(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    queues = await client.list_queues()
    out.emit(
        [to_dict(q) for q in queues],
        lambda: out.table(
            None,
            [
                "QUEUE",
                "PARENT",
                "WEIGHT",
                "STATE",
                "RECLAIMABLE",
                "CAPABILITY",
                "DESERVED",
                "ALLOCATED",
                "PENDING",
                "RUNNING",
            ],
            [
                (
                    q.queue.name,
                    q.queue.parent or ("" if q.queue.name == "root" else "root"),
                    q.queue.weight,
                    short_enum_name(pb.QueueState.DESCRIPTOR, q.queue.state),
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


def queue_from_flags(args: argparse.Namespace, base: pb.Queue | None = None) -> pb.Queue:
    queue = pb.Queue()
    if base is not None:
        queue.CopyFrom(base)
    queue.name = args.name
    if args.parent is not None:
        queue.parent = args.parent
    if args.weight is not None:
        if args.weight < 1:  # the API reads 0 as "unset" (weight 1): say so rather than do it
            raise UsageError([f"--weight: {args.weight} must be at least 1"])
        queue.weight = args.weight
    if args.priority is not None:
        queue.priority = args.priority
    for flag, field in (
        ("capability", "capability"),
        ("deserved", "deserved"),
        ("guarantee", "guarantee"),
    ):
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
        queue = await client.create_queue(queue_from_flags(args))
        verb = "created"
    else:
        # Update is a full replace on the server: start from the current queue, change the flags given.
        current = {q.queue.name: q.queue for q in await client.list_queues()}
        base = current.get(args.name)
        if base is None:
            # Let the server produce the authoritative NOT_FOUND.
            base = pb.Queue(name=args.name)
        queue = await client.update_queue(queue_from_flags(args, base))
        verb = "updated"
    out.emit(to_dict(queue), lambda: out.console.print(f"queue {queue.name} {verb}"))
    return 0


def device_cell(n: pb.NodeView) -> str:
    """Devices as ``free/total`` per resource, broken ones counted apart: ``huawei.com/Ascend910 5/8 (1 unhealthy)``."""
    parts = []
    by_type: dict[str, list[pb.Device]] = {}
    for d in n.node.devices:
        by_type.setdefault(d.type, []).append(d)
    for kind, devs in sorted(by_type.items()):
        broken = sum(1 for d in devs if not d.healthy)
        free = sum(1 for d in devs if d.healthy and d.id not in n.device_holders)
        parts.append(
            f"{kind} {free}/{len(devs)} free" + (f" ({broken} unhealthy)" if broken else "")
        )
    return ", ".join(parts)


async def cmd_nodes(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    nodes = await client.list_nodes(args.backend or "")
    out.emit(
        [to_dict(n) for n in nodes],
        lambda: out.table(
            None,
            [
                "NODE",
                "BACKEND",
                "STATE",
                "ALLOCATABLE",
                "USED",
                "IDLE",
                "TASKS",
                "DEVICES",
                "LABELS",
            ],
            [
                (
                    n.node.name,
                    n.node.backend,
                    "NotReady"
                    if n.node.not_ready
                    else ("Cordoned" if n.node.unschedulable else "Ready"),
                    quantities(n.node.allocatable),
                    quantities(n.used),
                    quantities(n.idle),
                    n.task_count,
                    device_cell(n),
                    ",".join(f"{k}={v}" for k, v in sorted(n.node.labels.items())),
                )
                for n in nodes
            ],
        ),
    )
    return 0


TERMINAL_PHASES = frozenset({pb.JOB_PHASE_COMPLETED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED})


async def cmd_watch(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    if args.until_done and not args.job:
        raise UsageError(["--until-done: give the job to wait for with --job ID"])
    count = 0
    async for event in client.watch_jobs(
        queue=args.queue or "",
        namespace=args.namespace or "",
        job_id=args.job or "",
        send_initial=not args.no_initial,
    ):
        job = event.job
        kind = pb.JobEvent.Type.Name(event.type).removeprefix("TYPE_")
        if out.json:
            sys.stdout.write(json.dumps(to_dict(event)) + "\n")
        else:
            st = job.status
            out.console.print(
                f"{kind:<8} {job.spec.id:<24} {phase_name(st.phase):<10} pending={st.pending} "
                f"running={st.running} succeeded={st.succeeded} failed={st.failed} {last_reason(job)}"
            )
        sys.stdout.flush()
        count += 1
        if args.count and count >= args.count:
            break
        if args.until_done and job.spec.id == args.job and job.status.phase in TERMINAL_PHASES:
            # Like `kubectl wait`: the exit status says how it ended.
            return 0 if job.status.phase == pb.JOB_PHASE_COMPLETED else 1
    return 0


async def cmd_servers(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    """The servers of a replicated deployment (ListServers), whichever replica answers."""
    try:
        reply = await client.list_servers()
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
        print(
            f"error: the server at {client.address} does not list servers (no ListServers: a "
            "server from before replication, running alone)",
            file=sys.stderr,
        )
        return 1
    now = time.time()

    def renewal(server: pb.ServerInfo) -> str:
        ts = server.last_renewal
        if not ts.seconds and not ts.nanos:
            return "-"
        return duration(now - ts.seconds - ts.nanos / 1e9) + " ago"

    def lag(server: pb.ServerInfo) -> str:
        return "-" if server.role == "leader" else f"{server.lag_seconds:.1f}s"

    def render() -> None:
        out.console.print(f"leader: {reply.leader or '(none)'}   term: {reply.term}")
        columns = ["ADDRESS", "ROLE", "TERM", "LAST RENEWAL", "LAG"]
        if out.wide:
            columns.append("ID")
        rows: list[list[Any]] = []
        for server in reply.servers:
            row: list[Any] = [
                server.address,
                server.role,
                server.term,
                renewal(server),
                lag(server),
            ]
            if out.wide:
                row.append(server.id)
            rows.append(row)
        out.table(None, columns, rows)

    out.emit([to_dict(server) for server in reply.servers], render)
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

    def render() -> None:
        out.console.print(f"# generation {config.generation}")
        sys.stdout.write(config.yaml if config.yaml.endswith("\n") else config.yaml + "\n")

    out.emit(to_dict(config), render)
    return 0
