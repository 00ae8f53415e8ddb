"""tdm: time-division multiplexing of revocable nodes (Volcano ``plugins/tdm``).

A node labelled ``volcano.sh/revocable-zone: <zone>`` belongs to a revocable zone, which is usable
only during the daily window given by the argument ``tdm.revocable-zone.<zone>: "HH:MM-HH:MM"``
(an end at or before the start means the next day). A task may use revocable nodes when its
annotation ``volcano.sh/revocable-zone`` is ``"*"`` (or, without it, when its annotation
``volcano.sh/preemptable`` is true). Registers:

* predicate -- a revocable node passes only while its zone is active, and only for tasks that
  may use revocable nodes; ordinary nodes always pass.
* node_order -- 100 (MaxNodeScore) on an active revocable node for such a task, else 0.
* preemptable -- a preemptable task or one that may use revocable nodes preempts nobody (reject);
  otherwise victims are Running preemptable tasks on ordinary nodes, per job at most its
  disruption budget (``volcano.sh/jdb-max-unavailable`` / ``volcano.sh/jdb-min-available`` job
  annotations, integer or percentage; default 1).
* victim -- when a zone is inactive, the Running preemptable tasks on its nodes (per job within the
  budget); at most once per ``tdm.evict.period`` (Go duration, default 1m).
* job_order -- non-preemptable jobs first (job annotation ``volcano.sh/preemptable``, default false).
* job_pipelined -- permit when the job is pipelined, else reject.
* job_starving -- a non-preemptable job with pending tasks.
"""

from __future__ import annotations

import contextlib
import math
import re
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from server.model import TaskStatus
from server.plugins.base import Plugin
from server.session.evaluator import Predicate, Scorer
from server.session.extension_points import (
    JOB_ORDER,
    JOB_PIPELINED,
    JOB_STARVING,
    NODE_ORDER,
    PERMIT,
    PREDICATE,
    REJECT,
    VICTIM,
)
from server.session.extension_points import PREEMPTABLE as PREEMPTABLE_POINT
from server.session.info import JobInfo, TaskInfo
from server.session.options import parse_go_duration
from server.session.session import Session

REVOCABLE_ZONE = "volcano.sh/revocable-zone"
PREEMPTABLE = "volcano.sh/preemptable"
JDB_MIN_AVAILABLE = "volcano.sh/jdb-min-available"
JDB_MAX_UNAVAILABLE = "volcano.sh/jdb-max-unavailable"
ZONE_PREFIX = "tdm.revocable-zone."
EVICT_PERIOD = "tdm.evict.period"
MAX_NODE_SCORE = 100.0
DEFAULT_POD_EVICT_NUM = 1

# Local wall clock, like Go's time.Now(); tests replace it.
now = datetime.now

# Volcano keeps the time of the last eviction round in a package variable: it outlives sessions.
_last_evict_at: dict[str, datetime | None] = {"at": None}

_CLOCK = re.compile(r"([0-9]{1,2}):([0-9]{2})")


def _clock(text: str) -> tuple[int, int]:
    """Go ``time.Parse("15:04", text)``: hour of one or two digits, minute of exactly two."""
    m = _CLOCK.fullmatch(text)
    if m is None or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        raise ValueError(f"cannot parse {text!r} as 15:04")
    return int(m.group(1)), int(m.group(2))


def parse_revocable_zone(raw: str, at: datetime | None = None) -> tuple[datetime, datetime]:
    """The window of a zone on the day of ``at`` (Volcano ``parseRevocableZone``)."""
    parts = raw.strip().split("-")
    if len(parts) != 2:
        raise ValueError(f"revocable zone {raw} format error")
    h1, m1 = _clock(parts[0])
    h2, m2 = _clock(parts[1])
    at = at or now()
    day = at.replace(hour=0, minute=0, second=0, microsecond=0)
    start = day + timedelta(hours=h1, minutes=m1)
    end = day + timedelta(hours=h2, minutes=m2)
    if (h1, m1) >= (h2, m2):
        end += timedelta(days=1)
    return start, end


def _parse_bool(value: str) -> bool | None:
    """Go ``strconv.ParseBool``."""
    if value in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if value in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return None


def task_preemptable(task: TaskInfo) -> bool:
    """Volcano GetPodPreemptable: annotation, then label, then the task's own setting."""
    for source in (task.spec.annotations, task.spec.labels):
        if PREEMPTABLE in source:
            return bool(_parse_bool(source[PREEMPTABLE]))
    return task.preemptable


def task_revocable_zone(task: TaskInfo) -> str:
    """Volcano GetPodRevocableZone: "*" when the task may run on revocable nodes, else ""."""
    annotations = task.spec.annotations
    if REVOCABLE_ZONE in annotations:
        return "*" if annotations[REVOCABLE_ZONE] == "*" else ""
    if PREEMPTABLE in annotations and _parse_bool(annotations[PREEMPTABLE]):
        return "*"
    return ""


def job_preemptable(job: JobInfo) -> bool:
    """Volcano JobInfo.Preemptable: the PodGroup annotation ``volcano.sh/preemptable``, default false."""
    value = job.spec.annotations.get(PREEMPTABLE)
    if value is not None:
        return bool(_parse_bool(value))
    return job.spec.preemptible is True


def int_or_percent(value: str, total: int) -> int:
    """Kubernetes intstr: an integer, or "N%" of ``total`` rounded up; anything else 0."""
    value = value.strip()
    try:
        return int(value)
    except ValueError:
        pass
    if value.endswith("%"):
        try:
            return math.ceil(int(value[:-1]) * total / 100)
        except ValueError:
            return 0
    return 0


def max_pod_evict_num(job: JobInfo) -> int:
    """Volcano getMaxPodEvictNum: how many more of the job's tasks its disruption budget allows."""
    annotations = job.spec.annotations
    running = len(job.index[TaskStatus.RUNNING])
    total = len(job.tasks)
    if JDB_MIN_AVAILABLE in annotations:
        minimum = int_or_percent(annotations[JDB_MIN_AVAILABLE], total)
        return running - minimum if running >= minimum else DEFAULT_POD_EVICT_NUM
    if JDB_MAX_UNAVAILABLE in annotations:
        maximum = int_or_percent(annotations[JDB_MAX_UNAVAILABLE], total)
        final = job.count(TaskStatus.SUCCEEDED, TaskStatus.FAILED)
        unavailable = total - final - running
        return 0 if unavailable >= maximum else maximum - unavailable
    return DEFAULT_POD_EVICT_NUM


def max_victims(job: JobInfo, candidates: list[TaskInfo]) -> list[TaskInfo]:
    return candidates[: max(0, min(max_pod_evict_num(job), len(candidates)))]


class TdmPlugin(Plugin):
    name = "tdm"
    reads_clock = True  # revocable zones open and close by the time of day
    ARGUMENTS = {f"{ZONE_PREFIX}*": "", EVICT_PERIOD: "1m"}

    def __init__(self, arguments: dict[str, Any] | None = None) -> None:
        super().__init__(arguments)
        self.zones: dict[str, str] = {
            k[len(ZONE_PREFIX) :]: str(v)
            for k, v in self.arguments.items()
            if k.startswith(ZONE_PREFIX)
        }
        self.evict_period = timedelta(minutes=1)
        with contextlib.suppress(ValueError):
            self.evict_period = timedelta(
                seconds=parse_go_duration(str(self.arguments.get(EVICT_PERIOD)))
            )

    def zone_error(self, zone: str, at: datetime) -> str:
        """Volcano availableRevocableZone: "" when the zone is active at ``at``, else why not."""
        raw = self.zones.get(zone)
        if raw is None:
            return f"revocable zone {zone} not support"
        try:
            start, end = parse_revocable_zone(raw, at)
        except ValueError as exc:
            return str(exc)
        # Volcano compares whole seconds.
        t, s, e = int(at.timestamp()), int(start.timestamp()), int(end.timestamp())
        if t < s or t > e:
            return f"current time beyond revocable zone {zone}:{raw}"
        return ""

    def on_session_open(self, ssn: Session) -> None:
        at = now()
        nodes = ssn.nodes
        node_zone = [labels.get(REVOCABLE_ZONE, "") for labels in nodes.labels]
        zone_errors = {z: self.zone_error(z, at) for z in set(node_zone) if z}
        revocable = np.array([bool(z) for z in node_zone], dtype=bool)
        active = np.array([bool(z) and not zone_errors[z] for z in node_zone], dtype=bool)
        # Per node: passes for a task that may use revocable nodes / for one that may not.
        pass_with_zone = ~revocable | active
        pass_without_zone = ~revocable

        def check(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            passes: np.ndarray = (
                pass_with_zone if task_revocable_zone(task) else pass_without_zone
            )[rows]
            return passes

        def reasons(task: TaskInfo, rows: np.ndarray) -> list[str]:
            out = []
            for i in rows:
                err = zone_errors.get(node_zone[i], "")
                out.append(err or "not allow to dispatch to revocable node")
            return out

        def score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            if not task_revocable_zone(task):
                return np.zeros(len(rows))
            return np.where(active[rows], MAX_NODE_SCORE, 0.0)

        def preemptable(
            preemptor: TaskInfo, preemptees: list[TaskInfo]
        ) -> tuple[list[TaskInfo], int]:
            if task_preemptable(preemptor) or task_revocable_zone(preemptor):
                return [], REJECT
            by_job: dict[str, list[TaskInfo]] = {}
            for t in preemptees:
                if not task_preemptable(t) or t.status != TaskStatus.RUNNING or t.node is None:
                    continue
                i = nodes.index.get(t.node)
                if i is None or node_zone[i]:
                    continue
                by_job.setdefault(t.job, []).append(t)
            victims: list[TaskInfo] = []
            for job_uid, tasks in by_job.items():
                job = ssn.jobs.get(job_uid)
                if job is not None:
                    victims.extend(max_victims(job, tasks))
            return victims, PERMIT

        def victims(_tasks: list[TaskInfo]) -> list[TaskInfo]:
            last = _last_evict_at["at"]
            current = now()
            if last is not None and last + self.evict_period > current:
                return []
            found: list[TaskInfo] = []
            for zone in self.zones:
                if not self.zone_error(zone, current):
                    continue
                by_job: dict[str, list[TaskInfo]] = {}
                for i, z in enumerate(node_zone):
                    if z != zone:
                        continue
                    for t in nodes.tasks[i].values():
                        if task_preemptable(t) and t.status == TaskStatus.RUNNING:
                            by_job.setdefault(t.job, []).append(t)
                for job_uid, tasks in by_job.items():
                    job = ssn.jobs.get(job_uid)
                    if job is not None:
                        found.extend(max_victims(job, tasks))
            _last_evict_at["at"] = current
            return found

        def job_order(left: JobInfo, right: JobInfo) -> int:
            lp, rp = job_preemptable(left), job_preemptable(right)
            if lp == rp:
                return 0
            return 1 if lp else -1

        ssn.register(PREDICATE, self.name, Predicate("task", check, reasons=reasons))
        ssn.register(NODE_ORDER, self.name, Scorer("task", score))
        ssn.register(PREEMPTABLE_POINT, self.name, preemptable)
        ssn.register(VICTIM, self.name, victims)
        ssn.register(JOB_ORDER, self.name, job_order)
        ssn.register(JOB_PIPELINED, self.name, lambda j: PERMIT if j.is_pipelined() else REJECT)
        ssn.register(
            JOB_STARVING,
            self.name,
            lambda j: not job_preemptable(j) and bool(j.index[TaskStatus.PENDING]),
        )
