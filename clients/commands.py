"""The ``muster`` CLI's commands: each calls the server through :class:`MusterClient` and hands
the result to :class:`~clients.render.Output` (a table, or JSON with ``--output json``).

A command returns the exit code; bad input it detects itself raises :class:`UsageError` (exit 2);
a gRPC error propagates (exit 1, see :func:`clients.cli.main`).
"""

from __future__ import annotations

import argparse
import codecs
import re
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, TypeVar, cast

import grpc
from rich.text import Text

from clients.client import MusterClient, login_name
from clients.jobfile import JobFileError, load_job_file
from clients.render import (
    Output,
    condition_line,
    estimate_line,
    last_reason,
    node_list,
    phase_name,
    quantities,
    reason,
    render_explanation,
    start_time_text,
    status_name,
    to_dict,
)
from muster.devices import chip_number
from muster.gang import gang_minimum
from muster.jobcontrol import (
    ArraySpecError,
    format_dependencies,
    parse_array,
    parse_dependencies,
)
from muster.jsonmap import short_enum_name
from muster.phases import TERMINAL_PHASES, WAITING_PHASES
from muster.timelimit import TimeLimitError, format_time_limit, parse_time_limit
from muster.v1 import muster_pb2 as pb

UTF8 = codecs.getincrementaldecoder("utf-8")  # output split mid-character decodes whole
# types-protobuf's EnumTypeWrapper.values() gives plain ints; protoc's .pyi names them pb.JobPhase.
PHASES = {
    short_enum_name(pb.JobPhase.DESCRIPTOR, value).lower(): cast(pb.JobPhase, value)
    for value in pb.JobPhase.values()
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
    origins: list[tuple[str, int]] = []  # per job: its file and its place there
    problems: list[str] = []
    for path in args.files:
        try:
            loaded = load_job_file(path)
        except JobFileError as exc:
            problems.extend(exc.problems)  # each starts with the file's name
            continue
        specs.extend(loaded)
        origins.extend((str(path), k) for k in range(len(loaded)))
    if problems:
        raise UsageError(problems)
    _submit_flags(specs, args)
    _submit_time(specs, args)
    # Several jobs go in one all-or-nothing batch: a refused job leaves nothing half-submitted.
    try:
        results = (
            await client.submit_jobs(specs)
            if len(specs) > 1
            else [await client.submit_job(specs[0])]
        )
    except grpc.aio.AioRpcError as exc:
        details = _refusal_in_files(exc.details() or "", specs, origins)
        if details is None:
            raise
        raise grpc.aio.AioRpcError(
            exc.code(), exc.initial_metadata(), exc.trailing_metadata(), details
        ) from None
    out.emit(
        [
            {"id": r.job.spec.id, "created": r.created, "phase": phase_name(r.job.status.phase)}
            | (
                {"array": r.job.spec.array_job_id, "elements": list(r.element_ids)}
                if r.element_ids
                else {}
            )
            for r in results
        ],
        lambda: out.table(
            None,
            ["JOB", "QUEUE", "TASKS", "RESULT"],
            [
                (
                    r.job.spec.array_job_id if r.element_ids else r.job.spec.id,
                    r.job.spec.queue,
                    sum(g.replicas for g in r.job.spec.task_groups),
                    ("submitted" if r.created else "unchanged (already submitted)")
                    + _array_note(r),
                )
                for r in results
            ],
        ),
    )
    return 0


def _submit_flags(specs: Sequence[pb.JobSpec], args: argparse.Namespace) -> None:
    """``submit --hold / --array / --dependency``: set on every job of the files (a flag wins over
    the file, as sbatch's options over #SBATCH lines)."""
    problems: list[str] = []
    deps: list[tuple[str, str]] = []
    if getattr(args, "array", None):
        try:
            parse_array(args.array)
        except ArraySpecError as exc:
            problems.append(f"--array: {args.array!r}: {exc}")
    if getattr(args, "dependency", None):
        try:
            deps = parse_dependencies(args.dependency)
        except ArraySpecError as exc:
            problems.append(f"--dependency: {args.dependency!r}: {exc}")
    if problems:
        raise UsageError(problems)
    for spec in specs:
        if getattr(args, "hold", False):
            spec.hold = True
        if getattr(args, "array", None):
            spec.array = args.array
        if deps:
            del spec.depends_on[:]
            spec.depends_on.extend(pb.JobDependency(job=job, type=kind) for kind, job in deps)


def _submit_time(specs: Sequence[pb.JobSpec], args: argparse.Namespace) -> None:
    """``submit --time LIMIT`` (sbatch's): every job of the files gets that time limit."""
    text = getattr(args, "time", None)
    if not text:
        return
    try:
        seconds = parse_time_limit(text)
    except TimeLimitError as exc:
        raise UsageError([f"--time: {exc}"]) from None
    for spec in specs:
        spec.time_limit_seconds = seconds


def _array_note(result: pb.SubmitJobResponse) -> str:
    ids = result.element_ids
    if not ids:
        return ""
    return (
        f": array of {len(ids)} ({ids[0]} .. {ids[-1]})"
        if len(ids) > 1
        else f": array of 1 ({ids[0]})"
    )


_BATCH_PLACE = re.compile(r"jobs\[(\d+)\]\.(.*)", re.DOTALL)


def _refusal_in_files(
    details: str, specs: Sequence[pb.JobSpec], origins: Sequence[tuple[str, int]]
) -> str | None:
    """A batch's refusal naming a job by its place in the batch (``jobs[3].job.queue: ...``) told
    as a job file's problems are: ``FILE: jobs[K].job.queue: ... (job 'ID')``, K its place in that
    file. None: not such a refusal (a lone job's refusal names its field only: one file, one job)."""
    batch = _BATCH_PLACE.fullmatch(details)
    if batch is None or len(specs) < 2 or int(batch[1]) >= len(specs):
        return None
    index, rest = int(batch[1]), batch[2]
    path, k = origins[index]
    named = f" (job {specs[index].id!r})"
    return f"{path}: jobs[{k}].{rest}" + ("" if rest.endswith(named) else named)


JOB_SORT_KEYS = ("submit", "start", "id", "queue", "owner", "phase")

_REQUIREMENT = re.compile(
    r"""^\s*(?:
        (?P<absent>!)\s*(?P<akey>[^\s=!(),]+)
      | (?P<skey>[^\s=!(),]+)\s+(?P<setop>in|notin)\s*\((?P<values>[^()]*)\)
      | (?P<key>[^\s=!(),]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s=!(),]*))?
    )\s*$""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Requirement:
    """One term of a label selector: ``key=value`` (or ``==``), ``key!=value``, ``key``
    (present), ``!key`` (absent), ``key in (a,b)``, ``key notin (a,b)``."""

    key: str
    op: str  # "=" | "!=" | "exists" | "!exists" | "in" | "notin"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op == "exists":
            return value is not None
        if self.op == "!exists":
            return value is None
        if self.op in ("=", "in"):
            return value is not None and value in self.values
        return value is None or value not in self.values  # != and notin, as in Kubernetes


def parse_selector(text: str) -> list[Requirement]:
    """A Kubernetes label selector (``-l``): terms separated by commas, all of which must hold."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    requirements: list[Requirement] = []
    for term in terms:
        m = _REQUIREMENT.match(term)
        if m is None or not term.strip():
            raise UsageError(
                [
                    f"--selector: {term.strip()!r} is not a label requirement (key=value, key!=value, "
                    "key, !key, 'key in (a,b)', 'key notin (a,b)')"
                ]
            )
        if m.group("absent"):
            requirements.append(Requirement(m.group("akey"), "!exists"))
        elif m.group("setop"):
            values = frozenset(v.strip() for v in m.group("values").split(",") if v.strip())
            requirements.append(Requirement(m.group("skey"), m.group("setop"), values))
        elif m.group("op"):
            op = "!=" if m.group("op") == "!=" else "="
            requirements.append(Requirement(m.group("key"), op, frozenset([m.group("value")])))
        else:
            requirements.append(Requirement(m.group("key"), "exists"))
    return requirements


def selector_matches(requirements: Sequence[Requirement], labels: Mapping[str, str]) -> bool:
    return all(r.matches(labels) for r in requirements)


def job_matches(requirements: Sequence[Requirement], job: pb.Job) -> bool:
    """Jobs have no labels of their own: a job matches when one of its task groups' labels (the
    labels its tasks carry) satisfies the whole selector."""
    return not requirements or any(
        selector_matches(requirements, group.labels) for group in job.spec.task_groups
    )


def _selectors(args: argparse.Namespace) -> list[Requirement]:
    return [r for text in args.selector or [] for r in parse_selector(text)]


def limit_flag(args: argparse.Namespace) -> int | None:
    """``--limit N`` (None: no limit); UsageError below 1."""
    if args.limit is not None and args.limit < 1:
        raise UsageError([f"--limit: {args.limit} must be at least 1"])
    limit: int | None = args.limit
    return limit


Choice = TypeVar("Choice")


def choice_flags(
    names: Sequence[str] | None, choices: Mapping[str, Choice], flag: str
) -> list[Choice]:
    """The values of a repeated ``flag`` (``--phase``, ``--state``), by name in any case;
    UsageError naming the flag for a name not in ``choices``."""
    found = []
    for name in names or []:
        if name.lower() not in choices:
            raise UsageError([f"{flag}: {name!r} is not one of {', '.join(choices)}"])
        found.append(choices[name.lower()])
    return found


async def cmd_jobs(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    phases = choice_flags(args.phase, PHASES, "--phase")
    start = bool(getattr(args, "start", False))
    if start and not phases:  # squeue --start: the jobs that wait
        phases = sorted(WAITING_PHASES)
    queues, owners = args.queue or [], [owner_flag(o) for o in args.owner or []]
    selector, limit = _selectors(args), limit_flag(args)
    sort_jobs([], args.sort)  # a bad --sort is refused before any call
    # The server lists in submission order. In that order the first `limit` matches are the
    # answer (paging stops there); in another (--sort, or --start's soonest first) every match is
    # read, sorted, then cut to `limit`.
    stop_at = limit if not args.sort and not start else None
    jobs: list[pb.Job] = []
    # One value of a filter goes to the server; several (and labels) are matched here.
    listing = client.list_jobs(
        queue=queues[0] if len(queues) == 1 else "",
        namespace=args.namespace or "",
        phases=phases,
        owner=owners[0] if len(owners) == 1 else "",
    )
    # list_jobs is an async generator (typed as an iterator): closed here when --limit stops early.
    async with aclosing(cast(AsyncGenerator[pb.Job, None], listing)):
        async for job in listing:
            if (
                (not queues or job.spec.queue in queues)
                and (not owners or job.spec.owner in owners)
                and job_matches(selector, job)
                and (not getattr(args, "array", None) or job.spec.array_job_id == args.array)
            ):
                jobs.append(job)
                if stop_at is not None and len(jobs) >= stop_at:
                    break
    if start and not args.sort:  # soonest first; jobs with no estimate last, in submission order
        jobs.sort(
            key=lambda j: (
                not j.status.HasField("estimated_start"),
                j.status.estimated_start.ToNanoseconds(),
            )
        )
    jobs = sort_jobs(jobs, args.sort)[:limit]
    now = time.time()
    if start:
        start_rows = [start_row(j, now) for j in jobs]
        start_columns = ["JOB", "QUEUE", "PHASE", "START", "NODES", "SCHEDNODES", "NOTE"]
        out.emit([to_dict(j) for j in jobs], lambda: out.table(None, start_columns, start_rows))
        return 0

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
                time_limit_cell(j.spec.time_limit_seconds),
                elapsed(j, now),
            ]
            cells.append(message)
        return cells

    columns = ["JOB", "QUEUE", "OWNER", "PHASE", "RUNNING", "SUBMIT", "AGE", "REASON"]
    if out.wide:
        columns[1:1] = ["NAMESPACE"]
        columns[6:6] = ["PENDING", "SUCCEEDED", "FAILED", "START", "TIME LIMIT", "ELAPSED"]
        columns.append("MESSAGE")
    out.emit([to_dict(j) for j in jobs], lambda: out.table(None, columns, [row(j) for j in jobs]))
    return 0


def start_row(job: pb.Job, now: float) -> list[Any]:
    """``muster jobs --start`` (squeue --start): when a waiting job is expected to start, on
    which nodes, and whether they are reserved for it (else why there is no estimate)."""
    st = job.status
    nodes = list(st.estimated_nodes)
    if st.HasField("estimated_start"):
        note = "reserved" if st.reserved else "estimated"
    else:
        note = st.estimate_note or "no estimate yet"
    return [
        job.spec.id,
        job.spec.queue,
        phase_name(st.phase),
        start_time_text(st.estimated_start, now) if st.HasField("estimated_start") else "-",
        len(nodes) if nodes else "-",
        node_list(nodes),
        note,
    ]


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
    position = {id(j): i for i, j in enumerate(jobs)}
    keys: dict[str, Any] = {
        # Jobs submitted in the same instant: the server's order (submission order) decides.
        "submit": lambda j: (j.status.submit_time.ToNanoseconds(), position[id(j)]),
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


def time_limit_cell(seconds: int) -> str:
    """A job's time limit (``2h``, ``1h30m``), ``-`` for none."""
    return format_time_limit(seconds) if seconds else "-"


def elapsed(job: pb.Job, now: float) -> str:
    """How long the job has run (Slurm's TIME): from its start to its end, or to now while it runs;
    ``-`` before it started."""
    st = job.status
    if not st.start_time.seconds:
        return "-"
    end = st.finish_time.seconds or now
    return format_time_limit(max(0, end - st.start_time.seconds))


def owner_flag(value: str | None) -> str:
    """An ``--owner`` value: ``me`` is the login name."""
    return login_name() if value == "me" else value or ""


async def cmd_job(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    job = await client.get_job(args.id)
    explanation: pb.ExplainResponse | None = None
    if job.status.phase in WAITING_PHASES or job.status.phase == pb.JOB_PHASE_UNSPECIFIED:
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
            Text.assemble(
                ("Job", "bold"),
                f" {s.id}  namespace={s.namespace} name={s.name} queue={s.queue} "
                f"owner={s.owner or '-'}",
            )
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
        c.print(
            f"Time limit: {time_limit_cell(s.time_limit_seconds)}   "
            f"Elapsed: {elapsed(job, time.time())}"
        )
        for text in control_lines(job):
            c.print(text)
        if line := estimate_line(st):
            c.print(f"Start: {line}")
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
                    ",".join([*t.devices, t.gpu_group] if t.gpu_group else t.devices),
                    t.message,
                )
                for t in job.tasks
            ],
        )
        if explanation is not None:
            render_explanation(out, explanation, estimate=False)  # (its line is above)

    out.emit(data, render)
    return 0


def control_lines(job: pb.Job) -> list[str]:
    """``muster job``'s lines on job control: the hold, requeues, the array, the dependencies."""
    s, st = job.spec, job.status
    lines = []
    if st.hold:
        lines.append(f"Held: {st.hold} hold by {st.held_by or 'its owner'} (muster release {s.id})")
    if st.requeue_count:
        lines.append(f"Requeued: {st.requeue_count} times")
    if s.array_job_id:
        lines.append(f"Array: {s.array_job_id} index {s.array_index} of {s.array}")
    if s.depends_on:
        deps = format_dependencies((d.type, d.job) for d in s.depends_on)
        lines.append(f"Depends on: {deps}")
    return lines


async def cmd_logs(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    """A job's task output as its backend sent it (what the server keeps of it, 1 MiB per task
    by default), like `kubectl logs`; with --follow, then what comes until the task ends."""
    job_id, _, task = args.job.partition("/")  # `muster logs train/w-0`
    task = task or args.task or ""
    if task and "/" not in task:
        task = f"{job_id}/{task}"  # `muster logs train w-0` for train/w-0
    if job_id != args.job and args.task:
        raise UsageError([f"give the task once: {args.job} names it already"])
    args.job = job_id
    if getattr(args, "follow", False):
        return await follow_logs(client, job_id, task, out)
    logs = await client.task_logs(args.job, task)
    waiting: dict[str, int] = {}  # task id -> status, for the tasks that have not started
    if any(not entry.data for entry in logs):
        job = await client.get_job(args.job)
        waiting = {t.id: t.status for t in job.tasks if t.status in NOT_STARTED}
        if not any(entry.data for entry in logs):
            if logs and all(entry.task_id in waiting for entry in logs):
                # Like `kubectl logs` of a pod still waiting: an error, not empty success.
                what = (
                    f"task {task} has not started ({status_name(waiting[task])})"
                    if task
                    else f"no task of job {args.job} has started ({phase_name(job.status.phase)})"
                )
                print(f"error: {what}: no output yet", file=sys.stderr)
                return 1
            print(f"{task or args.job}: no output yet", file=sys.stderr)

    def render() -> None:
        many = len(logs) > 1
        for entry in logs:
            if many:
                sys.stdout.write(f"==> {entry.task_id} <==\n")
            if entry.dropped_bytes:
                sys.stdout.write(dropped_marker(entry.dropped_bytes))
            elif entry.truncated:  # a server from before dropped_bytes
                sys.stdout.write("[earlier output dropped: the server keeps the last 64 KiB]\n")
            if not entry.data and many and entry.task_id in waiting:
                sys.stdout.write(f"[not started: {status_name(waiting[entry.task_id])}]\n")
            text = entry.data.decode("utf-8", errors="replace")
            sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
        sys.stdout.flush()

    out.emit([to_dict(entry) for entry in logs], render)
    return 0


def dropped_marker(count: int) -> str:
    return f"[... {count} bytes dropped]\n"


async def follow_logs(client: MusterClient, job_id: str, task: str, out: Output) -> int:
    """`muster logs -f`: output as it arrives until the task (every task of the job) ends; with
    several tasks a `==> task <==` header whenever the output switches task (like `tail -f`)."""
    decoders: dict[str, codecs.IncrementalDecoder] = {}
    current = ""
    at_line_start = True
    async for event in client.follow_task_logs(job_id, task):
        if out.scripted:
            out.emit_event(to_dict(event), lambda: "")
            continue
        decoder = decoders.setdefault(event.task_id, UTF8(errors="replace"))
        text = decoder.decode(event.data, final=event.eof)
        if not text and not event.dropped_bytes:
            continue
        if not task and event.task_id != current:
            sys.stdout.write(("" if at_line_start else "\n") + f"==> {event.task_id} <==\n")
            current, at_line_start = event.task_id, True
        if event.dropped_bytes:
            sys.stdout.write(("" if at_line_start else "\n") + dropped_marker(event.dropped_bytes))
            at_line_start = True
        if text:
            sys.stdout.write(text)
            at_line_start = text.endswith("\n")
        sys.stdout.flush()
    if not at_line_start and not out.scripted:
        sys.stdout.write("\n")
        sys.stdout.flush()
    return 0


async def cmd_explain(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    exp = await client.explain(args.id)

    def render() -> None:
        out.console.print(f"Job {exp.job_id}: {phase_name(exp.phase)}")
        render_explanation(out, exp)

    out.emit(to_dict(exp), render)
    return 0


async def cmd_cancel(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    """Cancel each id in turn; report every one (a refusal does not stop the others). An array's
    id cancels every element."""

    async def cancel(job_id: str) -> dict[str, Any]:
        reply = await client.cancel(job_id)
        result: dict[str, Any] = {"job": to_dict(reply.job)}
        if reply.element_ids:
            result["elements"] = list(reply.element_ids)
        return result

    results = await _each_id(args.ids, cancel)

    def render() -> None:
        for r in results:
            if "error" in r:
                out.console.print(f"{r['id']}: error: {r['error']}")
            elif "elements" in r:
                out.console.print(
                    f"{r['id']}: {r['job']['status']['phase']} ({len(r['elements'])} array elements)"
                )
            else:
                out.console.print(f"{r['id']}: {r['job']['status']['phase']}")

    out.emit(results, render)
    return 1 if any("error" in r for r in results) else 0


async def _each_id(
    ids: Sequence[str], act: Callable[[str], Awaitable[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """``act`` on each id in turn, a result each: ``{"id": ...}`` with what ``act`` returned, or
    with the ``error`` that refused it (a refusal does not stop the others)."""
    results: list[dict[str, Any]] = []
    for job_id in ids:
        try:
            result = await act(job_id)
        except grpc.aio.AioRpcError as exc:
            results.append({"id": job_id, "error": f"{exc.code().name}: {exc.details()}"})
            continue
        results.append({"id": job_id, **result})
    return results


async def cmd_hold(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    """``muster hold ID...``: hold pending jobs (an array's id: its pending elements)."""
    return await _control(out, args.ids, client.hold_job, "held")


async def cmd_release(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    """``muster release ID...``: release held jobs (an array's id: its held elements)."""
    return await _control(out, args.ids, client.release_job, "released")


async def cmd_requeue(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    """``muster requeue [--hold] ID...``: stop started jobs and send them back to pending."""
    return await _control(
        out,
        args.ids,
        partial(client.requeue_job, hold=args.hold),
        "requeued and held" if args.hold else "requeued",
    )


async def _control(
    out: Output,
    ids: Sequence[str],
    act: Callable[[str], Awaitable[list[pb.Job]]],
    done: str,
) -> int:
    """Each id in turn, one line each (``a: held (user hold by ann)``, or its error); exit 1 if
    any failed, as ``cancel``."""

    async def acted(job_id: str) -> dict[str, Any]:
        return {"jobs": [to_dict(j) for j in await act(job_id)]}

    results = await _each_id(ids, acted)

    def line(r: dict[str, Any]) -> str:
        if "error" in r:
            return f"{r['id']}: error: {r['error']}"
        jobs = r["jobs"]
        if len(jobs) != 1 or jobs[0]["spec"]["id"] != r["id"]:
            return f"{r['id']}: {done} ({len(jobs)} array elements)"
        st = jobs[0]["status"]
        note = f" ({st['hold']} hold by {st['held_by'] or 'its owner'})" if st["hold"] else ""
        count = f", requeued {st['requeue_count']}x" if done.startswith("requeued") else ""
        return f"{r['id']}: {done}, {st['phase']}{note}{count}"

    def render() -> None:
        for r in results:
            out.console.print(line(r))

    out.emit(results, render)
    return 1 if any("error" in r for r in results) else 0


async def cmd_queues(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    queues = await client.list_queues()
    columns = [
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
    ]
    if out.wide:
        columns[3:3] = ["PRIORITY"]
        columns[8:8] = ["GUARANTEE"]
        columns.append("ANNOTATIONS")

    def row(q: pb.QueueView) -> list[Any]:
        cells: list[Any] = [
            q.queue.name,
            q.queue.parent or ("" if q.queue.name == "root" else "root"),
            q.queue.weight,
            short_enum_name(pb.QueueState.DESCRIPTOR, q.queue.state or pb.QUEUE_STATE_OPEN),
            q.queue.reclaimable if q.queue.HasField("reclaimable") else True,
            quantities(q.queue.capability) or "-",
            quantities(q.queue.deserved) or "-",
            quantities(q.allocated) or "-",
            q.pending_jobs,
            q.running_jobs,
        ]
        if out.wide:
            cells[3:3] = [q.queue.priority]
            cells[8:8] = [quantities(q.queue.guarantee) or "-"]
            cells.append(pairs(q.queue.annotations))
        return cells

    out.emit(
        [to_dict(q) for q in queues], lambda: out.table(None, columns, [row(q) for q in queues])
    )
    return 0


def pairs(mapping: Mapping[str, str]) -> str:
    """``a=1,b=2`` (sorted), as kubectl shows labels."""
    return ",".join(f"{k}={v}" for k, v in sorted(mapping.items()))


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
    for flag, field in (
        ("default_time", "default_time_limit_seconds"),
        ("max_time", "max_time_limit_seconds"),
    ):
        text = getattr(args, flag, None)
        if text is not None:
            setattr(queue, field, queue_time_flag(text, f"--{flag.replace('_', '-')}"))
    return queue


def queue_time_flag(text: str, flag: str) -> int:
    """A queue's ``--default-time`` / ``--max-time`` in seconds; ``none`` (Slurm's ``UNLIMITED``,
    ``INFINITE``, ``0``) is 0: no limit."""
    if text.strip().lower() in ("none", "unlimited", "infinite", "0"):
        return 0
    try:
        return parse_time_limit(text)
    except TimeLimitError as exc:
        raise UsageError([f"{flag}: {exc}"]) from None


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
    """Devices as ``free/total`` per resource, shared and broken ones counted apart:
    ``huawei.com/Ascend910 5/8 free (1 unhealthy)``, ``nvidia.com/gpu 2/4 free (1 shared)``."""
    parts = []
    by_type: dict[str, list[pb.Device]] = {}
    for d in n.node.devices:
        by_type.setdefault(d.type, []).append(d)
    for kind, devs in sorted(by_type.items()):
        broken = sum(1 for d in devs if not d.healthy)
        shared = sum(1 for d in devs if d.id in n.shared_gpus)
        free = sum(1 for d in devs if d.healthy and d.id not in n.device_holders)
        notes = [f"{shared} shared"] if shared else []
        notes += [f"{broken} unhealthy"] if broken else []
        parts.append(
            f"{kind} {free}/{len(devs)} free" + (f" ({', '.join(notes)})" if notes else "")
        )
    return ", ".join(parts)


def idle_cell(n: pb.NodeView) -> str:
    """What a new task could take: whole healthy devices nobody holds or shares, then the GPUs
    that fractional tasks share with the part of each still free, in GPU order:
    ``cpu=4, nvidia.com/gpu=2 +2 shared (0.5, 0.25 free)``."""
    text = quantities(n.idle)
    if n.shared_gpus:
        free = ", ".join(f"{n.shared_gpus[g]:.4g}" for g in sorted(n.shared_gpus, key=_device_key))
        text += f" +{len(n.shared_gpus)} shared ({free} free)"
    return text


def _device_key(device_id: str) -> tuple[int, str]:
    """Device ids in their natural order: ``2`` before ``10``."""
    number = chip_number(device_id)
    return (-1 if number is None else number, device_id)


async def cmd_nodes(client: MusterClient, args: argparse.Namespace, out: Output) -> int:
    selector = _selectors(args)
    nodes = [
        n
        for n in await client.list_nodes(args.backend or "")
        if selector_matches(selector, n.node.labels)
    ]
    columns = [
        "NODE",
        "BACKEND",
        "STATE",
        "ALLOCATABLE",
        "USED",
        "IDLE",
        "TASKS",
        "DEVICES",
        "LABELS",
    ]
    if out.wide:
        columns[8:8] = ["TAINTS", "DEVICE HOLDERS"]

    def row(n: pb.NodeView) -> list[Any]:
        cells: list[Any] = [
            n.node.name,
            n.node.backend,
            "NotReady" if n.node.not_ready else ("Cordoned" if n.node.unschedulable else "Ready"),
            quantities(n.node.allocatable),
            quantities(n.used),
            idle_cell(n),
            n.task_count,
            device_cell(n),
            pairs(n.node.labels),
        ]
        if out.wide:
            cells[8:8] = [
                ",".join(f"{t.key}={t.value}:{t.effect}" for t in n.node.taints),
                pairs(n.device_holders),
            ]
        return cells

    out.emit([to_dict(n) for n in nodes], lambda: out.table(None, columns, [row(n) for n in nodes]))
    return 0


NOT_STARTED = frozenset(
    {
        pb.TASK_STATUS_UNSPECIFIED,
        pb.TASK_STATUS_PENDING,
        pb.TASK_STATUS_ALLOCATED,
        pb.TASK_STATUS_PIPELINED,
        pb.TASK_STATUS_BINDING,
    }
)


def watch_line(kind: str, job: pb.Job) -> str:
    st = job.status
    return (
        f"{kind:<8} {job.spec.id:<24} {phase_name(st.phase):<10} pending={st.pending} "
        f"running={st.running} succeeded={st.succeeded} failed={st.failed} {last_reason(job)}"
    ).rstrip()


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
        kind = short_enum_name(pb.JobEvent.Type.DESCRIPTOR, event.type).upper()
        out.emit_event(to_dict(event), partial(watch_line, kind, job))
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
