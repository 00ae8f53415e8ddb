"""Parsers for Slurm 22.05 command output (pure functions, no I/O).

Covers what the adapter reads: ``sinfo --json`` and ``scontrol show node -o`` (nodes),
``squeue -O ...`` with ``|`` separators (the cheap poll; it honours filters, unlike
``squeue --json`` in 22.05; it also carries ``--constraint``, ``--exclusive`` and ``--time``),
``squeue --json`` (full re-sync: it also carries AdminComment),
``scontrol show job -o`` (placement verification), plus Slurm host lists, TRES/GRES strings and
memory sizes. Units: Slurm memory sizes are MiB-based (``1G`` = 1024 MiB).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from muster.timelimit import TimeLimitError, parse_time_limit

MIB = 1024 * 1024
_MEM_UNITS = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024, "P": 1024**3}


class SlurmParseError(ValueError):
    """Output of a Slurm command that does not have the expected shape."""


# ---------------------------------------------------------------------------------------------
# Host lists
# ---------------------------------------------------------------------------------------------

_HOSTLIST_ITEM = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?([^,\[]*)")


def expand_hostlist(text: str) -> list[str]:
    """``n[1-3,7],gpu5`` -> ``['n1', 'n2', 'n3', 'n7', 'gpu5']`` (order and zero padding kept)."""
    text = (text or "").strip()
    if not text or text in ("(null)", "None", "N/A"):
        return []
    hosts: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos] == ",":
            pos += 1
            continue
        m = _HOSTLIST_ITEM.match(text, pos)
        if not m or m.end() == pos:
            raise SlurmParseError(f"bad host list {text!r} at {pos}")
        prefix, ranges, suffix = m.group(1), m.group(2), m.group(3)
        if ranges is None:
            hosts.append(prefix + suffix)
        else:
            for part in ranges.split(","):
                lo, _, hi = part.partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    raise SlurmParseError(f"bad range {part!r} in host list {text!r}")
                width = len(lo)
                for i in range(int(lo), int(hi or lo) + 1):
                    hosts.append(f"{prefix}{i:0{width}d}{suffix}")
        pos = m.end()
    return hosts


# ---------------------------------------------------------------------------------------------
# Sizes, TRES and GRES
# ---------------------------------------------------------------------------------------------


def mem_to_bytes(text: str | int | float | None) -> int:
    """Slurm memory size (``2G``, ``512M``, ``1024`` = MiB) -> bytes."""
    if text is None:
        return 0
    if isinstance(text, int | float):
        return int(text * MIB)
    s = text.strip().upper()
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([KMGTP]?)B?", s)
    if not m:
        raise SlurmParseError(f"bad memory size {text!r}")
    return int(float(m.group(1)) * _MEM_UNITS[m.group(2)] * MIB)


def parse_tres(text: str) -> dict[str, str]:
    """``cpu=8,mem=8G,node=4,gres/gpu=4`` -> dict (empty for ``''``, ``N/A``, ``(null)``)."""
    out: dict[str, str] = {}
    if not text or text in ("N/A", "(null)"):
        return out
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def parse_gres(text: str) -> dict[str, int]:
    """GRES counts by name: ``gpu:fake:4`` / ``gres:gpu:2`` / ``gpu:fake:2(IDX:0-1),shard:8`` ->
    ``{'gpu': 4}``. A missing count means 1 (``--gres=gpu``)."""
    out: dict[str, int] = {}
    if not text or text in ("N/A", "(null)"):
        return out
    for item in re.split(r",(?![^(]*\))", text):
        item = re.sub(r"\(.*\)$", "", item.strip())
        if item.startswith("gres:") or item.startswith("gres/"):
            item = item[5:]
        if not item:
            continue
        parts = item.split(":")
        name = parts[0]
        count = 1
        if len(parts) > 1 and parts[-1].isdigit():
            count = int(parts[-1])
        elif len(parts) > 1 and re.fullmatch(r"[0-9]+[KMG]", parts[-1]):
            count = int(parts[-1][:-1]) * {"K": 1024, "M": 1024**2, "G": 1024**3}[parts[-1][-1]]
        out[name] = out.get(name, 0) + count
    return out


def null(text: str | None) -> str:
    """Slurm's ``(null)`` / ``N/A`` / ``None`` placeholders -> ``''``."""
    if text is None:
        return ""
    text = text.strip()
    return "" if text in ("(null)", "N/A", "None") else text


# ---------------------------------------------------------------------------------------------
# Nodes
# ---------------------------------------------------------------------------------------------

# Base states and flags after which Muster must not place new work on a node.
_UNSCHEDULABLE_STATES = frozenset(
    {
        "down",
        "drain",
        "drained",
        "draining",
        "fail",
        "failing",
        "future",
        "unknown",
        "error",
        "maint",
        "reboot",
        "power_down",
        "powered_down",
        "powering_down",
        "inval",
        "planned",
    }
)
_UNSCHEDULABLE_FLAGS = frozenset(
    {
        "DRAIN",
        "DRAINED",
        "DRAINING",
        "FAIL",
        "MAINTENANCE",
        "MAINT",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "POWER_DOWN",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWERING_UP",
        "INVALID_REG",
        "NOT_RESPONDING",
        "RESERVED",
        "PLANNED",
    }
)


@dataclass(slots=True)
class SlurmNode:
    name: str
    state: str  # base state, lower case: idle, mixed, allocated, down ...
    flags: list[str] = field(default_factory=list)  # upper case: DRAIN, NOT_RESPONDING ...
    cpus: int = 0
    real_memory_mb: int = 0
    gres: dict[str, int] = field(default_factory=dict)
    features: list[str] = field(default_factory=list)
    partitions: list[str] = field(default_factory=list)
    reason: str = ""
    alloc_cpus: int = 0
    alloc_memory_mb: int = 0

    @property
    def not_responding(self) -> bool:
        return "NOT_RESPONDING" in self.flags

    @property
    def schedulable(self) -> bool:
        return self.state not in _UNSCHEDULABLE_STATES and not (
            set(self.flags) & _UNSCHEDULABLE_FLAGS
        )


def _split_state(state: str) -> tuple[str, list[str]]:
    """``IDLE+DRAIN`` / ``DOWN*+NOT_RESPONDING`` -> (``idle``, ``['DRAIN']``)."""
    parts = state.split("+")
    base = parts[0]
    flags = [p.upper() for p in parts[1:] if p]
    if base.endswith("*"):  # sinfo's short form for "not responding"
        base = base[:-1]
        flags.append("NOT_RESPONDING")
    for suffix, flag in (
        ("~", "POWERED_DOWN"),
        ("#", "POWERING_UP"),
        ("%", "POWERING_DOWN"),
        ("$", "MAINTENANCE"),
        ("@", "REBOOT_REQUESTED"),
        ("!", "POWER_DOWN"),
    ):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            flags.append(flag)
    return base.lower(), flags


def parse_sinfo_json(text: str) -> list[SlurmNode]:
    """``sinfo --json`` (openapi v0.0.38): one entry per node (not per partition)."""
    try:
        data = json.loads(text)
        entries = data["nodes"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SlurmParseError(f"sinfo --json: {exc}") from None
    nodes: dict[str, SlurmNode] = {}
    for entry in entries:
        base, extra = _split_state(str(entry.get("state", "unknown")))
        flags = [str(f).upper() for f in entry.get("state_flags") or []] + extra
        features = entry.get("active_features") or entry.get("features") or ""
        node = SlurmNode(
            name=str(entry["name"]),
            state=base,
            flags=sorted(set(flags)),
            cpus=int(entry.get("cpus") or 0),
            real_memory_mb=int(entry.get("real_memory") or 0),
            gres=parse_gres(str(entry.get("gres") or "")),
            features=[f for f in str(features).split(",") if f],
            partitions=list(entry.get("partitions") or []),
            reason=str(entry.get("reason") or ""),
            alloc_cpus=int(entry.get("alloc_cpus") or 0),
            alloc_memory_mb=int(entry.get("alloc_memory") or 0),
        )
        nodes[node.name] = node
    return list(nodes.values())


def parse_key_values(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` record: ``Key=Value Key2=Value with spaces ...``.

    Values may contain spaces (``OS=Linux 6.1 #1 SMP``, ``Reason=not responding``), so a value
    runs until the next `` Key=`` token.
    """
    out: dict[str, str] = {}
    for m in re.finditer(
        r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:.]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9_/:.]*=|\s*$)", line
    ):
        out[m.group(1)] = m.group(2).strip()
    return out


def parse_scontrol_nodes(text: str) -> list[SlurmNode]:
    """``scontrol show node -o``: one node per line."""
    nodes: list[SlurmNode] = []
    for line in text.splitlines():
        if not line.strip().startswith("NodeName="):
            continue
        kv = parse_key_values(line.strip())
        base, flags = _split_state(kv.get("State", "UNKNOWN"))
        nodes.append(
            SlurmNode(
                name=kv["NodeName"],
                state=base,
                flags=sorted(set(flags)),
                cpus=int(kv.get("CPUTot") or 0),
                real_memory_mb=int(kv.get("RealMemory") or 0),
                gres=parse_gres(null(kv.get("Gres"))),
                features=[
                    f
                    for f in null(kv.get("ActiveFeatures") or kv.get("AvailableFeatures")).split(
                        ","
                    )
                    if f
                ],
                partitions=[p for p in null(kv.get("Partitions")).split(",") if p],
                reason=null(kv.get("Reason")),
                alloc_cpus=int(kv.get("CPUAlloc") or 0),
                alloc_memory_mb=int(kv.get("AllocMem") or 0),
            )
        )
    return nodes


# ---------------------------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------------------------

# The poll: fields each followed by '|'. Two fields may themselves contain '|': Feature (the
# ``--constraint`` expression, ``a|b``) is followed by FEATURE_END instead (a feature name has no
# '#': it starts a comment in slurm.conf), and Comment (free text) comes last.
SQUEUE_FIELDS = (
    "JobID",
    "State",
    "Partition",
    "NumNodes",
    "tres-alloc",
    "tres-per-node",
    "tres-per-job",
    "tres-per-task",
    "NumTasks",
    "Nice",
    "Account",
    "QOS",
    "ReqNodes",
    "NodeList",
    "Reason",
    "UserName",
    "OverSubscribe",
    "TimeLimit",
    "Feature",
    "Comment",
)
FEATURE_END = "#|"
SQUEUE_FORMAT = ",".join(
    f"{name}:{FEATURE_END if name == 'Feature' else '|'}" for name in SQUEUE_FIELDS
)
# ``squeue --json``'s ``shared`` -> the OverSubscribe word ``squeue -O OverSubscribe`` prints.
_JSON_SHARED = {"none": "NO", "user": "USER", "mcs": "MCS", "shared": "YES", "oversubscribe": "YES"}
# OverSubscribe -> SlurmJob.exclusive.
_EXCLUSIVE = {"NO": "node", "USER": "user", "MCS": "mcs"}

# Job states after which a job holds nothing and will not run again.
FINISHED_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)
# States in which a job occupies its nodes.
ACTIVE_STATES = frozenset(
    {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING"}
)


@dataclass(slots=True)
class SlurmJob:
    job_id: int
    state: str  # upper case: PENDING, RUNNING, COMPLETED ...
    partition: str
    num_nodes: int
    cpus: int = 0  # whole job
    memory_bytes: int = 0  # whole job
    gres_per_node: dict[str, int] = field(default_factory=dict)
    gres_per_job: dict[str, int] = field(default_factory=dict)
    gres_per_task: dict[str, int] = field(default_factory=dict)
    tasks_per_node: int = 1
    nice: int = 0
    account: str = ""
    qos: str = ""
    required_nodes: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    reason: str = ""
    user: str = ""
    comment: str = ""
    admin_comment: str = ""
    name: str = ""
    # ``--constraint`` as Slurm prints it (``gpu&ib``, ``[rack1|rack2]``; '' for none).
    features: str = ""
    # squeue's OverSubscribe: NO (``--exclusive``), USER (``--exclusive=user``), MCS
    # (``--exclusive=mcs``), YES (``--oversubscribe``), OK (the default: dedicated CPUs only).
    oversubscribe: str = ""
    # Its time limit in seconds (``--time``; Slurm keeps whole minutes), 0: none (UNLIMITED).
    time_limit: int = 0

    @property
    def exclusive(self) -> str:
        """``node`` (whole nodes, nobody else), ``user`` (nodes shared with this user's jobs only),
        ``mcs`` (with the same MCS label only) or '' (not exclusive)."""
        return _EXCLUSIVE.get(self.oversubscribe.upper(), "")

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def per_node_gres(self) -> dict[str, int]:
        """GRES each node of the job needs (``--gres`` per node, ``--gpus`` spread, per task x tasks)."""
        nodes = max(1, self.num_nodes)
        out = dict(self.gres_per_node)
        for name, count in self.gres_per_job.items():
            out[name] = max(out.get(name, 0), -(-count // nodes))
        for name, count in self.gres_per_task.items():
            out[name] = max(out.get(name, 0), count * max(1, self.tasks_per_node))
        return out


def slurm_time_limit(text: str) -> int:
    """squeue's TimeLimit (``10:00``, ``1:00:00``, ``1-02:04:00``) in seconds; ``UNLIMITED``,
    ``INFINITE``, ``NOT_SET`` and the like: 0."""
    text = null(text)
    if not text or not text[0].isdigit():
        return 0
    try:
        return parse_time_limit(text)
    except TimeLimitError:
        return 0


def _json_minutes(value: object) -> int:
    """``squeue --json``'s time_limit (minutes; null when unset) in seconds."""
    return value * 60 if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _int(text: str, default: int = 0) -> int:
    text = null(text)
    try:
        return int(text)
    except ValueError:
        return default


def _tasks_per_node(tasks: int, nodes: int) -> int:
    """A job's tasks spread over its nodes, rounded up (``-n3 -N2``: 2 on one of the nodes)."""
    return max(1, -(-tasks // max(1, nodes)))


def _job_from_tres(job: SlurmJob, tres: str) -> None:
    values = parse_tres(tres)
    if "cpu" in values:
        job.cpus = _int(values["cpu"])
    if "mem" in values:
        job.memory_bytes = mem_to_bytes(values["mem"])
    if "node" in values and not job.num_nodes:
        job.num_nodes = _int(values["node"])


def parse_squeue_format(text: str, known: dict[str, SlurmJob] | None = None) -> list[SlurmJob]:
    """Output of ``squeue -h -O SQUEUE_FORMAT``: one job per line.

    ``known``: line -> job from an earlier call, whose jobs are reused for lines that did not
    change (a poll sees the same lines again and again; the jobs are only read); it is left
    holding this output's lines."""
    jobs: list[SlurmJob] = []
    head = len(SQUEUE_FIELDS) - 2  # the fields before Feature
    seen: dict[str, SlurmJob] = {}
    for line in text.splitlines():
        if known is not None and line in known:
            jobs.append(seen.setdefault(line, known[line]))
            continue
        if not line.strip():
            continue
        parts = line.split("|", head)
        features, sep, comment = parts[-1].partition(FEATURE_END)
        if len(parts) != head + 1 or not sep:
            raise SlurmParseError(
                f"squeue line is not {len(SQUEUE_FIELDS)} fields of SQUEUE_FORMAT: {line!r}"
            )
        comment = comment[:-1] if comment.endswith("|") else comment
        row = dict(zip(SQUEUE_FIELDS, parts[:-1] + [features, comment], strict=True))
        if not row["JobID"].strip().isdigit():
            continue  # array / het job forms ("12_[1-5]", "13+0") are not supported: skip
        job = SlurmJob(
            job_id=int(row["JobID"]),
            state=row["State"].strip().upper(),
            partition=null(row["Partition"]),
            num_nodes=_int(row["NumNodes"]),
            gres_per_node=parse_gres(null(row["tres-per-node"])),
            gres_per_job=parse_gres(null(row["tres-per-job"])),
            gres_per_task=parse_gres(null(row["tres-per-task"])),
            tasks_per_node=_tasks_per_node(_int(row["NumTasks"], 1), _int(row["NumNodes"], 1)),
            nice=_int(row["Nice"]),
            account=null(row["Account"]),
            qos=null(row["QOS"]),
            required_nodes=expand_hostlist(null(row["ReqNodes"])),
            nodes=expand_hostlist(null(row["NodeList"])),
            reason=null(row["Reason"]),
            user=null(row["UserName"]),
            comment=null(comment),
            features=null(features),
            oversubscribe=null(row["OverSubscribe"]).upper(),
            time_limit=slurm_time_limit(row["TimeLimit"]),
        )
        _job_from_tres(job, row["tres-alloc"])
        jobs.append(job)
        seen[line] = job
    if known is not None:
        known.clear()
        known.update(seen)
    return jobs


def parse_squeue_json(text: str) -> list[SlurmJob]:
    """``squeue --json`` (v0.0.38). Slower than the format poll but carries ``admin_comment``."""
    try:
        entries = json.loads(text)["jobs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SlurmParseError(f"squeue --json: {exc}") from None
    jobs: list[SlurmJob] = []
    for e in entries:
        if e.get("array_task_string") or e.get("het_job_id"):
            continue
        tres = e.get("tres_alloc_str") or e.get("tres_req_str") or ""
        job = SlurmJob(
            job_id=int(e["job_id"]),
            state=str(e.get("job_state", "")).upper(),
            partition=str(e.get("partition") or ""),
            num_nodes=int(e.get("node_count") or 0),
            gres_per_node=parse_gres(str(e.get("tres_per_node") or "")),
            gres_per_job=parse_gres(str(e.get("tres_per_job") or "")),
            gres_per_task=parse_gres(str(e.get("tres_per_task") or "")),
            # 0 unless --ntasks-per-node was given: then spread the job's tasks over its nodes.
            tasks_per_node=int(e.get("tasks_per_node") or 0)
            or _tasks_per_node(int(e.get("tasks") or 1), int(e.get("node_count") or 1)),
            nice=int(e.get("nice") or 0),
            account=str(e.get("account") or ""),
            qos=str(e.get("qos") or ""),
            required_nodes=expand_hostlist(str(e.get("required_nodes") or "")),
            nodes=expand_hostlist(str(e.get("nodes") or "")),
            reason=null(str(e.get("state_reason") or "")),
            user=str(e.get("user_name") or ""),
            comment=str(e.get("comment") or ""),
            admin_comment=str(e.get("admin_comment") or ""),
            name=str(e.get("name") or ""),
            features=null(str(e.get("features") or "")),
            oversubscribe=_JSON_SHARED.get(str(e.get("shared") or "").lower(), "OK"),
            time_limit=_json_minutes(e.get("time_limit")),
        )
        _job_from_tres(job, tres)
        if job.nice > 2**31:  # 22.05 reports the unset nice as NICE_OFFSET-relative garbage
            job.nice = 0
        jobs.append(job)
    return jobs


@dataclass(slots=True)
class JobRecord:
    """The fields of ``scontrol show job -o`` the adapter verifies."""

    job_id: int
    state: str
    reason: str
    partition: str
    required_nodes: list[str]
    nodes: list[str]
    num_nodes: str
    exit_code: int
    signal: int
    restarts: int
    admin_comment: str
    raw: dict[str, str]


def parse_scontrol_job(text: str) -> JobRecord:
    """``scontrol show job -o ID`` (one line)."""
    line = next((ln for ln in text.splitlines() if ln.strip().startswith("JobId=")), "")
    if not line:
        raise SlurmParseError(f"not a scontrol job record: {text[:80]!r}")
    kv = parse_key_values(line.strip())
    exit_code, _, sig = kv.get("ExitCode", "0:0").partition(":")
    return JobRecord(
        job_id=int(kv["JobId"]),
        state=kv.get("JobState", "").upper(),
        reason=null(kv.get("Reason")),
        partition=null(kv.get("Partition")),
        required_nodes=expand_hostlist(null(kv.get("ReqNodeList"))),
        nodes=expand_hostlist(null(kv.get("NodeList"))),
        num_nodes=kv.get("NumNodes", ""),
        exit_code=_int(exit_code),
        signal=_int(sig),
        restarts=_int(kv.get("Restarts", "0")),
        admin_comment=null(kv.get("AdminComment")),
        raw=kv,
    )
