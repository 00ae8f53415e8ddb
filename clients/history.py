"""``muster history``: finished jobs with their accounting, like Slurm's ``sacct``
(ListJobHistory; docs/cli.md).

One row per finished job: who, where, how it ended, when (submit, start, end), how long it ran,
the CPU- and GPU-seconds it asked for (every task's request x the job's elapsed time) and used
(every task's request x the time it held its node), its exit codes and how often it was requeued.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime
from typing import Any

from clients.client import MusterClient
from clients.commands import PHASES, UsageError, choice_flags, duration, limit_flag, owner_flag
from clients.render import Output, phase_name, to_dict
from muster.devices import is_device_resource
from muster.duration import DurationError, parse_duration
from muster.phases import TERMINAL_PHASES
from muster.v1 import muster_pb2 as pb

# --state: the phases a job ends in.
STATES = {name: phase for name, phase in PHASES.items() if phase in TERMINAL_PHASES}


def parse_time(text: str, flag: str, now: float | None = None) -> float:
    """``2h`` / ``1d12h`` / ``30m`` / ``1w`` (that long ago: :mod:`muster.duration`), ``now``, or
    an ISO 8601 date or time (``2024-05-01``, ``2024-05-01T10:00``, with or without a zone;
    without one, local time) -> unix seconds. ``UsageError`` naming ``flag`` otherwise."""
    now = time.time() if now is None else now
    value = text.strip()
    if value == "now":
        return now
    try:
        ago = parse_duration(value)
    except DurationError as exc:
        raise UsageError([f"{flag}: {exc}"]) from None
    if ago is not None:
        return now - ago
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            [
                f"{flag}: {text!r} is not a time (ISO 8601 such as 2024-05-01T10:00, or how long "
                "ago: 90s, 30m, 2h, 1d, 1w, 1d12h)"
            ]
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # local time
    return when.timestamp()


def when(ts: Any) -> str:
    """A timestamp as local date and time to the second; "-" when unset."""
    if not ts.seconds and not ts.nanos:
        return "-"
    return datetime.fromtimestamp(ts.seconds).astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def amount(seconds: float) -> str:
    """Quantity-seconds for a table: whole above 100, one decimal below, 0 for none."""
    if not seconds:
        return "0"
    return f"{seconds:.0f}" if seconds >= 100 else f"{seconds:.1f}"


def gpu_seconds(values: Any) -> float:
    """Accelerator device seconds: every device resource (nvidia.com/gpu, amd.com/gpu, Ascend ...)."""
    return float(sum(v for name, v in values.items() if is_device_resource(name)))


def exit_codes(entry: pb.JobAccounting) -> str:
    """``0``, or ``0x3,1x2`` (code x tasks) when they differ; "-" when no task ended by itself."""
    codes = sorted(entry.exit_codes.items())
    if not codes:
        return "-"
    if len(codes) == 1:
        return str(codes[0][0])
    return ",".join(f"{code}x{count}" for code, count in codes)


async def cmd_history(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    phases = choice_flags(args.state, STATES, "--state")
    now = time.time()
    since = parse_time(args.since, "--since", now) if args.since else None
    until = parse_time(args.until, "--until", now) if args.until else None
    if since is not None and until is not None and until <= since:
        raise UsageError(["--until: must be later than --since"])
    queues, owners = args.queue or [], [owner_flag(o) for o in args.owner or []]
    limit = limit_flag(args)
    # One value of a filter goes to the server; several are matched here.
    entries: list[pb.JobAccounting] = []
    async for entry in client.list_job_history(
        queue=queues[0] if len(queues) == 1 else "",
        namespace=args.namespace or "",
        owner=owners[0] if len(owners) == 1 else "",
        phases=phases,
        since=since,
        until=until,
    ):
        if (not queues or entry.queue in queues) and (not owners or entry.owner in owners):
            entries.append(entry)
            if limit is not None and len(entries) >= limit:
                break

    def row(e: pb.JobAccounting) -> list[Any]:
        cells: list[Any] = [
            e.job_id,
            e.owner or "-",
            e.queue,
            phase_name(e.phase),
            when(e.submit_time),
            when(e.start_time),
            when(e.finish_time),
            duration(e.elapsed_seconds) if e.start_time.seconds else "-",
            amount(e.requested.get("cpu", 0.0)),
            amount(e.used.get("cpu", 0.0)),
            amount(gpu_seconds(e.requested)),
            amount(gpu_seconds(e.used)),
            exit_codes(e),
            e.requeue_count,
        ]
        if out.wide:
            cells[3:3] = [e.namespace]
            cells.append(f"{e.succeeded}/{e.failed}/{e.cancelled} of {e.tasks}")
            cells.append(e.reason)
        return cells

    columns = [
        "JOB",
        "OWNER",
        "QUEUE",
        "STATE",
        "SUBMIT",
        "START",
        "END",
        "ELAPSED",
        "CPU-S REQ",
        "CPU-S USED",
        "GPU-S REQ",
        "GPU-S USED",
        "EXIT",
        "REQUEUES",
    ]
    if out.wide:
        columns[3:3] = ["NAMESPACE"]
        columns += ["TASKS OK/FAILED/CANCELLED", "REASON"]
    out.emit(
        [to_dict(e) for e in entries], lambda: out.table(None, columns, [row(e) for e in entries])
    )
    return 0
