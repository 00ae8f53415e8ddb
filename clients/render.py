"""How the ``muster`` CLI shows things: tables for people, JSON for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table

from muster.conditions import job_reason
from muster.jsonmap import short_enum_name, to_json_dict
from muster.v1 import muster_pb2 as pb


class Output:
    """Where a command's result goes: the data as JSON (``--output json``), else its rendering."""

    def __init__(self, fmt: str) -> None:
        self.json = fmt == "json"
        self.wide = fmt == "wide"  # tables with every column
        # Off a terminal, do not wrap at 80 columns: scripts grep these lines.
        wide = None if sys.stdout.isatty() else 240
        self.console = Console(highlight=False, soft_wrap=True, width=wide)

    def emit(self, data: Any, render: Callable[[], None]) -> None:
        if self.json:
            sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        else:
            render()

    def table(
        self, title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row))
        self.console.print(table)


def to_dict(message: Message) -> dict[str, Any]:
    """Muster's JSON mapping (``muster.jsonmap``): every field, short enum names."""
    return to_json_dict(message)


def phase_name(value: int) -> str:
    return short_enum_name(pb.JobPhase.DESCRIPTOR, value)


def status_name(value: int) -> str:
    return short_enum_name(pb.TaskStatus.DESCRIPTOR, value)


def quantities(resources: pb.ResourceList) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(resources.quantities.items()))


def condition_line(cond: pb.Condition) -> str:
    text = f"{cond.type}={cond.status}"
    if cond.reason:
        text += f" {cond.reason}"
    if cond.message:
        text += f": {cond.message}"
    return text


def last_reason(job: pb.Job) -> str:
    """Where a job stands in a line: how it ended, or why it waits ('' when placed)."""
    code, message = reason(job)
    return message or code


def reason(job: pb.Job) -> tuple[str, str]:
    """(one-word reason code, message): ``muster.conditions.job_reason``."""
    return job_reason(job.status.conditions)


def render_explanation(out: Output, exp: pb.ExplainResponse) -> None:
    if exp.gate in ("", "none"):  # placed, or nothing blocks it: no "why pending"
        where = f"cycle {exp.cycle_id}" if exp.cycle_id else "no cycle yet"
        out.console.print(f"Verdict ({where}): {exp.summary}")
        return
    out.console.print(f"Why pending (cycle {exp.cycle_id}, gate {exp.gate}): {exp.summary}")
    for reason, count in sorted(exp.node_reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        out.console.print(f"  {count:>7,} node(s): {reason}")


def render_simulation(out: Output, result: dict[str, Any]) -> None:
    tasks = result.get("tasks", {})
    out.table(
        "Tasks",
        ["TASK", "STATUS", "NODE", "DEVICES"],
        [
            (uid, t.get("status", ""), t.get("node") or "", ",".join(t.get("devices") or []))
            for uid, t in sorted(tasks.items())
        ],
    )
    jobs = result.get("jobs", {})
    out.table(
        "Jobs",
        ["JOB", "PHASE", "CONDITIONS"],
        [
            (
                uid,
                j.get("phase", "")
                + (f" ({j['scheduleState']}, {j['stage']})" if j.get("scheduleState") else ""),
                "; ".join(
                    f"{c.get('type')}: {c.get('reason', '')} {c.get('message', '')}".strip()
                    for c in j.get("conditions", [])
                ),
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
