"""How the ``muster`` CLI shows things: tables for people, plain columns for pipes, JSON and
kubectl's ``custom-columns`` / ``jsonpath`` forms for scripts.

``--output`` (``-o``) takes ``table`` (default), ``wide`` (more columns, cells never wrapped),
``json`` (the API objects in Muster's JSON mapping), ``custom-columns=HEADER:PATH,...`` (a table of
the chosen fields of that JSON) or ``jsonpath=TEMPLATE`` (kubectl's template over that JSON: a
list command's objects are under ``.items``). Off a terminal a table is plain columns three spaces
apart (like kubectl: no box characters, no padding after the last column), so ``awk``/``cut`` can
read it; ``--no-headers`` drops the header line.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table
from rich.text import Text

from muster.conditions import job_reason
from muster.display import clock_text, folded_names
from muster.jsonmap import short_enum_name, to_json_dict
from muster.v1 import muster_pb2 as pb

COLUMN_GAP = "   "  # kubectl's tabwriter padding
EMPTY_CELL = "-"  # an empty cell would shift the fields `awk` counts
MISSING = "<none>"  # a custom column whose path finds nothing (kubectl's word)


class FormatError(ValueError):
    """An ``--output`` value that is not a format, or a path or template that does not parse."""


# ---------------------------------------------------------------------------------------------
# Paths and templates (kubectl's JSONPath, the part its custom-columns and jsonpath use)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    kind: str  # "key" | "index" | "slice" | "all"
    key: str = ""
    start: int | None = None
    stop: int | None = None


_NAME = re.compile(r"[^.\[\]{}\s]+")
_BRACKET = re.compile(
    r"""\[\s*(?:(?P<all>\*)|'(?P<sq>[^']*)'|"(?P<dq>[^"]*)"|(?P<start>-?\d*)\s*(?P<colon>:)\s*(?P<stop>-?\d*)|(?P<index>-?\d+))\s*\]"""
)


@dataclass(frozen=True)
class JsonPath:
    """``.spec.id``, ``.tasks[*].node``, ``.node.labels['kubernetes.io/hostname']``,
    ``.status.conditions[0].reason``, ``.items[1:3]``: field names, ``[N]`` (negative from the
    end), ``[A:B]``, ``[*]`` or ``.*`` (every element or value), quoted keys for names with dots.
    A leading ``@``/``$`` (the current object) and the braces of ``{.path}`` are optional."""

    text: str
    steps: tuple[_Step, ...]

    @classmethod
    def parse(cls, text: str) -> JsonPath:
        raw = text.strip()
        if raw.startswith("{") and raw.endswith("}"):
            raw = raw[1:-1].strip()
        if raw[:1] in ("@", "$"):
            raw = raw[1:]
        if raw and raw[0] not in ".[":
            raw = "." + raw  # kubectl's relaxed form: spec.id
        steps: list[_Step] = []
        pos = 0
        while pos < len(raw):
            if raw[pos] == ".":
                pos += 1
                if raw[pos : pos + 1] == "*":
                    steps.append(_Step("all"))
                    pos += 1
                    continue
                name = _NAME.match(raw, pos)
                if name is None:
                    if pos == len(raw) and not steps:
                        break  # "." alone: the object itself
                    raise FormatError(f"{text!r}: expected a field name at offset {pos}")
                steps.append(_Step("key", key=name.group()))
                pos = name.end()
            elif raw[pos] == "[":
                m = _BRACKET.match(raw, pos)
                if m is None:
                    raise FormatError(
                        f"{text!r}: expected [N], [A:B], [*] or ['key'] at offset {pos}"
                    )
                if m.group("all"):
                    steps.append(_Step("all"))
                elif m.group("sq") is not None or m.group("dq") is not None:
                    steps.append(_Step("key", key=m.group("sq") or m.group("dq") or ""))
                elif m.group("colon"):
                    start, stop = m.group("start"), m.group("stop")
                    steps.append(
                        _Step(
                            "slice",
                            start=int(start) if start else None,
                            stop=int(stop) if stop else None,
                        )
                    )
                else:
                    steps.append(_Step("index", start=int(m.group("index"))))
                pos = m.end()
            else:
                raise FormatError(f"{text!r}: unexpected {raw[pos]!r} at offset {pos}")
        return cls(text, tuple(steps))

    def find(self, data: Any) -> list[Any]:
        """Every value the path reaches (none when a field or index is missing)."""
        found = [data]
        for step in self.steps:
            found = [value for item in found for value in _apply(step, item)]
        return found


def _apply(step: _Step, item: Any) -> list[Any]:
    if step.kind == "key":
        return [item[step.key]] if isinstance(item, dict) and step.key in item else []
    if step.kind == "all":
        if isinstance(item, dict):
            return list(item.values())
        return list(item) if isinstance(item, list) else []
    if not isinstance(item, list):
        return []
    if step.kind == "slice":
        return item[step.start : step.stop]
    assert step.start is not None
    return [item[step.start]] if -len(item) <= step.start < len(item) else []


def scalar_text(value: Any) -> str:
    """A value as kubectl prints it: strings bare, everything else as (compact) JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class _Node:
    kind: str  # "text" | "path" | "range"
    text: str = ""
    path: JsonPath | None = None
    body: tuple[_Node, ...] = ()


_ACTION = re.compile(r"\{((?:[^{}'\"]|'[^']*'|\"(?:[^\"\\]|\\.)*\")*)\}")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}


@dataclass(frozen=True)
class Template:
    """kubectl's ``-o jsonpath=`` template: text with ``{PATH}`` (several values space-separated),
    ``{range PATH}...{end}`` (the body once per value, paths in it relative to that value) and
    ``{"\\n"}`` literals. Filters (``[?()]``) and recursive descent (``..``) are not supported."""

    nodes: tuple[_Node, ...]

    @classmethod
    def parse(cls, text: str) -> Template:
        stack: list[tuple[JsonPath | None, list[_Node]]] = [(None, [])]
        pos = 0
        for m in _ACTION.finditer(text):
            if m.start() > pos:
                stack[-1][1].append(_Node("text", text=_unescape(text[pos : m.start()])))
            pos = m.end()
            action = m.group(1).strip()
            if action.startswith("range ") or action.startswith("range\t"):
                stack.append((JsonPath.parse(action[len("range") :]), []))
            elif action == "end":
                if len(stack) == 1:
                    raise FormatError(f"jsonpath {text!r}: {{end}} without {{range}}")
                path, body = stack.pop()
                stack[-1][1].append(_Node("range", path=path, body=tuple(body)))
            elif action[:1] in ('"', "'") and action[-1:] == action[:1] and len(action) > 1:
                stack[-1][1].append(_Node("text", text=_unescape(action[1:-1])))
            else:
                stack[-1][1].append(_Node("path", path=JsonPath.parse(action)))
        rest = text[pos:]
        if "{" in rest or "}" in rest:
            raise FormatError(f"jsonpath {text!r}: unbalanced braces")
        if rest:
            stack[-1][1].append(_Node("text", text=_unescape(rest)))
        if len(stack) != 1:
            raise FormatError(f"jsonpath {text!r}: {{range}} without {{end}}")
        return cls(tuple(stack[0][1]))

    def render(self, data: Any) -> str:
        return "".join(_render(node, data) for node in self.nodes)


def _render(node: _Node, data: Any) -> str:
    if node.kind == "text":
        return node.text
    assert node.path is not None
    values = node.path.find(data)
    if node.kind == "path":
        return " ".join(scalar_text(v) for v in values)
    return "".join(_render(child, value) for value in values for child in node.body)


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), text)


@dataclass(frozen=True)
class Column:
    header: str
    path: JsonPath


def parse_custom_columns(spec: str) -> list[Column]:
    """``NAME:.spec.id,PHASE:.status.phase`` -> columns (kubectl's custom-columns)."""
    columns: list[Column] = []
    for part in _split_columns(spec):
        header, sep, path = part.partition(":")
        if not sep or not header.strip() or not path.strip():
            raise FormatError(
                f"custom-columns: expected HEADER:PATH[,HEADER:PATH...], got {part!r}"
            )
        columns.append(Column(header.strip(), JsonPath.parse(path)))
    if not columns:
        raise FormatError("custom-columns: give at least one HEADER:PATH")
    return columns


def _split_columns(spec: str) -> list[str]:
    """Split at commas outside brackets and quotes (``L:.labels['a,b']`` is one column)."""
    parts: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for ch in spec:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


@dataclass(frozen=True)
class OutputFormat:
    kind: str  # table | wide | json | custom-columns | jsonpath
    columns: tuple[Column, ...] = ()
    template: Template | None = None

    @classmethod
    def parse(cls, text: str) -> OutputFormat:
        name, sep, arg = text.partition("=")
        if name in ("table", "wide", "json", "text") and not sep:
            return cls("table" if name == "text" else name)
        if name == "custom-columns" and sep:
            return cls(name, columns=tuple(parse_custom_columns(arg)))
        if name == "jsonpath" and sep:
            if not arg.strip():
                raise FormatError("jsonpath: give a template, e.g. jsonpath='{.items[*].spec.id}'")
            return cls(name, template=Template.parse(arg))
        raise FormatError(
            f"{text!r} is not an output format: table, wide, json, custom-columns=HEADER:PATH,... "
            "or jsonpath=TEMPLATE"
        )


def output_format_arg(text: str) -> str:
    """The argparse ``type`` of ``--output``: checked here so a bad path is a usage error."""
    try:
        OutputFormat.parse(text)
    except FormatError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def cell_text(value: Any) -> str:
    """A table cell on one line: newlines and tabs become spaces; empty becomes ``-``."""
    text = "" if value is None else str(value)
    text = " ".join(text.splitlines()).replace("\t", " ").strip()
    return text or EMPTY_CELL


def plain_lines(columns: Sequence[str] | None, rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns three spaces apart, each as wide as its widest cell, the last one unpadded."""
    grid = ([list(columns)] if columns else []) + [list(r) for r in rows]
    if not grid:
        return []
    widths = [max(len(r[i]) for r in grid if i < len(r)) for i in range(len(grid[0]))]
    return [
        COLUMN_GAP.join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in grid
    ]


class Output:
    """Where a command's result goes: the data in a script's format (``json``,
    ``custom-columns``, ``jsonpath``: always computed from the JSON form), else its rendering
    (tables: rich on a terminal, plain columns otherwise)."""

    def __init__(
        self, fmt: str | OutputFormat, *, headers: bool = True, terminal: bool | None = None
    ) -> None:
        self.format = fmt if isinstance(fmt, OutputFormat) else OutputFormat.parse(fmt)
        self.json = self.format.kind == "json"
        self.wide = self.format.kind == "wide"  # more columns, cells never wrapped
        self.headers = headers
        self.terminal = sys.stdout.isatty() if terminal is None else terminal
        self._streamed_header = False
        # Off a terminal, do not wrap at 80 columns: scripts grep these lines. Markup off: job ids
        # and messages are printed as they are, '[' and all.
        self.console = Console(
            highlight=False, soft_wrap=True, markup=False, width=None if self.terminal else 240
        )

    @property
    def scripted(self) -> bool:
        """The result goes out in a script's format (no human rendering)."""
        return self.format.kind in ("json", "custom-columns", "jsonpath")

    def emit(self, data: Any, render: Callable[[], None]) -> None:
        kind = self.format.kind
        if kind == "json":
            sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        elif kind == "jsonpath":
            assert self.format.template is not None
            # Like kubectl: a list is under .items; nothing is added after the template's text.
            root = {"items": data} if isinstance(data, list) else data
            sys.stdout.write(self.format.template.render(root))
        elif kind == "custom-columns":
            items = data if isinstance(data, list) else [data]
            self.table(
                None,
                [c.header for c in self.format.columns],
                [self._custom_row(item) for item in items],
            )
        else:
            render()
        sys.stdout.flush()

    def emit_event(self, data: dict[str, Any], line: Callable[[], str]) -> None:
        """One item of a stream (``watch``): a JSON line, a template, a row, or ``line()``."""
        kind = self.format.kind
        if kind == "json":
            text = json.dumps(data) + "\n"
        elif kind == "jsonpath":
            assert self.format.template is not None
            text = self.format.template.render(data)
        elif kind == "custom-columns":
            headers = [c.header for c in self.format.columns]
            row = self._custom_row(data)
            widths = [max(len(h), len(c)) for h, c in zip(headers, row, strict=True)]
            text = ""
            if self.headers and not self._streamed_header:
                text = COLUMN_GAP.join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
                text = text.rstrip() + "\n"
                self._streamed_header = True
            text += COLUMN_GAP.join(c.ljust(w) for c, w in zip(row, widths, strict=True))
            text = text.rstrip() + "\n"
        else:
            text = line() + "\n"
        sys.stdout.write(text)
        sys.stdout.flush()

    def _custom_row(self, item: Any) -> list[str]:
        row = []
        for column in self.format.columns:
            values = column.path.find(item)
            row.append(",".join(scalar_text(v) for v in values) if values else MISSING)
        return [cell_text(v) for v in row]

    def line(self, text: str | Text) -> None:
        """A line of a human rendering (printed as it is, no markup)."""
        self.console.print(text)

    def table(
        self, title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        cells = [[cell_text(v) for v in row] for row in rows]
        if not self.terminal:
            if title and self.headers:
                sys.stdout.write(title + "\n")
            lines = plain_lines(columns if self.headers else None, cells)
            sys.stdout.write("".join(line + "\n" for line in lines))
            return
        table = Table(
            title=title if self.headers else None,
            title_justify="left",
            show_edge=False,
            pad_edge=False,
            show_header=self.headers,
        )
        for column in columns:
            table.add_column(column, no_wrap=self.wide)
        for row in cells:
            table.add_row(*(Text(c) for c in row))
        console = self.console
        if self.wide:
            # -o wide never wraps a cell: the table gets the width it needs (a long line is
            # folded by the terminal, as kubectl's are).
            needed = console.measure(table, options=console.options.update_width(10**6)).maximum
            if needed > console.width:
                console = Console(highlight=False, markup=False, width=needed, file=console.file)
        console.print(table)


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


def render_explanation(out: Output, exp: pb.ExplainResponse, *, estimate: bool = True) -> None:
    """``muster explain``'s lines (``estimate``: with the start estimate's line)."""
    line = estimate_line(exp) if estimate else ""
    if exp.gate in ("", "none"):  # placed, or nothing blocks it: no "why pending"
        where = f"cycle {exp.cycle_id}" if exp.cycle_id else "no cycle yet"
        out.console.print(f"Verdict ({where}): {exp.summary}")
        if line:
            out.console.print(f"Start: {line}")
        return
    out.console.print(f"Why pending (cycle {exp.cycle_id}, gate {exp.gate}): {exp.summary}")
    for reason, count in sorted(exp.node_reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        out.console.print(f"  {count:>7,} node(s): {reason}")
    if line:
        out.console.print(f"Start: {line}")


def start_time_text(ts: Any, now: float | None = None) -> str:
    """An estimated start as local time: "14:32" within the next 20 hours, else "May 02 14:32";
    "-" when unset."""
    if not ts.seconds and not ts.nanos:
        return EMPTY_CELL
    return clock_text(ts.seconds + ts.nanos / 1e9, time.time() if now is None else now)


def node_list(names: Sequence[str], limit: int = 6) -> str:
    """Node names, runs of numbered names folded ("n1..n8"); "-" for none."""
    return folded_names(names, limit) or EMPTY_CELL


def estimate_line(st: pb.JobStatus | pb.ExplainResponse, now: float | None = None) -> str:
    """A waiting job's start estimate in words: "reserved: 8 nodes from 14:32 (n1..n8)",
    "estimated: 14:32 on 2 nodes (n3,n4)", or why there is none; "" when the server gave none."""
    nodes = list(st.estimated_nodes)
    count = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    if st.HasField("estimated_start"):
        when = start_time_text(st.estimated_start, now)
        if st.reserved:
            return f"reserved: {count} from {when} ({node_list(nodes)})"
        return f"estimated: {when} on {count} ({node_list(nodes)})"
    return st.estimate_note


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
