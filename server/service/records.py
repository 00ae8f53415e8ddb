"""The server state's record types: what the server keeps per backend, node, queue, job and task.

Mutable records, changed only through ``server.service.state.ClusterState`` (and the modules that work on
it: ingest, commands, apply); the store persists the ones with a ``row()`` / ``to_json()``.
Specs stay in their API form (protobuf) because that is what is stored and answered; the
scheduling core sees ``server.model`` copies made by ``server.service.snapshot``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from muster.devices import shared_gpu
from muster.phases import TERMINAL_PHASES
from muster.v1 import muster_pb2 as pb
from server import model
from server.model import QUARANTINED, PodGroupPhase, TaskStatus
from server.service.convert import checked_job_to_model, task_uid


def is_terminal_phase(phase: int) -> bool:
    return phase in TERMINAL_PHASES


@dataclass(slots=True)
class TaskRecord:
    uid: str
    job_id: str
    role: str
    index: int
    status: TaskStatus = TaskStatus.PENDING
    node: str | None = None
    backend: str = ""
    devices: list[str] = field(default_factory=list)  # held whole
    message: str = ""
    exit_code: int = 0
    gpu_group: str = ""  # KAI GPU sharing: the GPU a fractional task shares (devices then empty)
    # When a backend reported it Running (the server's clock; memory only, not a column): its time
    # limit's safety net counts from here (``timelimits.enforce_time_limits``). 0: not known.
    started: float = 0.0

    def row(self) -> tuple[Any, ...]:
        """The tasks table's columns in order (gpu_group, added later, last)."""
        return (
            self.uid,
            self.job_id,
            int(self.status),
            self.node,
            self.backend,
            json.dumps(self.devices) if self.devices else "[]",  # most tasks hold none: no encoder
            self.message,
            self.exit_code,
            self.gpu_group,
        )

    def read_legacy_shared_gpu(self, gpu_fraction: float) -> None:
        """A row stored before ``gpu_group`` existed names a fractional task's shared GPU as its
        one device (``gpu_fraction``, its task group's, tells): move it to ``gpu_group``."""
        if gpu_fraction and not self.gpu_group and self.devices:
            self.gpu_group, self.devices = shared_gpu(self.gpu_group, self.devices, gpu_fraction)


@dataclass(slots=True)
class ConditionRecord:
    type: str
    status: str
    reason: str
    message: str
    cycle_id: int
    transition_time: float


# What ``JobStatusRecord.from_json`` reads with: the decoder without ``json.loads``'s wrapper (the
# text is what ``to_json`` wrote), the scheduler phases by value, and what a status stored before
# job control or TYJobs holds.
_decode = json.JSONDecoder().raw_decode
_SCHED_PHASES = {p.value: p for p in PodGroupPhase}
_NO_CONTROL = ("", "", 0, "")
_NO_TY = ("", 0)


@dataclass(slots=True)
class JobStatusRecord:
    """Everything about a job that changes after submission (the spec never does)."""

    phase: int  # pb.JobPhase
    sched_phase: PodGroupPhase = PodGroupPhase.PENDING
    cancelled: bool = False
    conditions: list[ConditionRecord] = field(default_factory=list)
    explanation: dict[str, Any] | None = None  # {gate, summary, node_reasons, cycle_id}
    submit_time: float = 0.0
    start_time: float = 0.0
    finish_time: float = 0.0
    # TYJobs: the last cycle's schedule state, and how often the Leader was started again.
    schedule_state: str = ""
    leader_restarts: int = 0
    # Left out of scheduling: its Quarantined condition is true (kept with the condition, which is
    # what is stored; cycles skip the job without reading its conditions).
    quarantined: bool = False
    # Job control (server.service.control): held ("user" | "admin"; "" not held) and by whom, how
    # often it was requeued, where its dependencies stand ("" not yet decided, "met", "never").
    hold: str = ""
    held_by: str = ""
    requeue_count: int = 0
    dependency: str = ""
    # Accounting (ListJobHistory's "used", server.service.state.account_usage): resource ->
    # canonical quantity x seconds its tasks held their nodes up to ``used_at``, and what they
    # hold since then (canonical quantities).
    used: dict[str, float] = field(default_factory=dict)
    holding: dict[str, float] = field(default_factory=dict)
    used_at: float = 0.0
    # The last cycle's start estimate (the reserve action). Memory only, not stored: every cycle
    # plans it again from what is (start times and time limits are), so a restart loses nothing.
    estimate: model.JobEstimate | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "phase": self.phase,
                "sched_phase": self.sched_phase.value,
                "cancelled": self.cancelled,
                "conditions": [
                    [c.type, c.status, c.reason, c.message, c.cycle_id, c.transition_time]
                    for c in self.conditions
                ],
                "explanation": self.explanation,
                "times": [self.submit_time, self.start_time, self.finish_time],
                "ty": [self.schedule_state, self.leader_restarts],
                "ctl": [self.hold, self.held_by, self.requeue_count, self.dependency],
                "use": [self.used_at, self.used, self.holding],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> JobStatusRecord:
        # (read once per job by a restart: a million of them, so no step is taken twice)
        raw = _decode(text)[0]
        conditions = [ConditionRecord(*c) for c in raw["conditions"]]
        ctl = raw.get("ctl", _NO_CONTROL)  # stored before job control: none of it
        used_at, used, holding = raw.get("use") or (0.0, {}, {})  # stored before accounting
        schedule_state, leader_restarts = raw.get("ty", _NO_TY)
        submit_time, start_time, finish_time = raw["times"]
        return cls(
            phase=raw["phase"],
            sched_phase=_SCHED_PHASES[raw["sched_phase"]],
            cancelled=raw["cancelled"],
            conditions=conditions,
            explanation=raw["explanation"],
            submit_time=submit_time,
            start_time=start_time,
            finish_time=finish_time,
            schedule_state=schedule_state,
            leader_restarts=leader_restarts,
            quarantined=conditions != []
            and any(c.type == QUARANTINED and c.status == "True" for c in conditions),
            hold=ctl[0],
            held_by=ctl[1],
            requeue_count=ctl[2],
            dependency=ctl[3],
            used=used,
            holding=holding,
            used_at=used_at,
        )

    def put_condition(
        self, kind: str, status: str, reason: str, message: str, cycle_id: int, now: float
    ) -> bool:
        """Set condition ``kind``, replacing the one of that type; its transition time moves (to
        ``now``) only when its status does. False, nothing done, when it already says so."""
        old = next((c for c in self.conditions if c.type == kind), None)
        if old is not None and (old.status, old.reason, old.message) == (status, reason, message):
            return False
        since = old.transition_time if old is not None and old.status == status else now
        new = ConditionRecord(kind, status, reason, message, cycle_id, since)
        self.conditions = [c for c in self.conditions if c.type != kind] + [new]
        return True


@dataclass(slots=True)
class DecisionRow:
    id: int
    backend: str
    cycle_id: int
    task_id: str
    kind: str  # bind | evict
    payload: bytes  # serialized pb.Decision
    state: str  # pending | applied | rejected | expired
    reason: str
    deadline: float  # wall-clock seconds; 0 for evictions (they never expire)

    def row(self) -> tuple[Any, ...]:
        return (
            self.id,
            self.backend,
            self.cycle_id,
            self.task_id,
            self.kind,
            self.payload,
            self.state,
            self.reason,
            self.deadline,
        )


@dataclass(slots=True)
class BackendRecord:
    name: str
    kind: str
    labels: dict[str, str] = field(default_factory=dict)
    last_decision_id: int = 0


@dataclass(slots=True)
class NodeEntry:
    proto: pb.Node
    spec: model.NodeSpec  # immutable once built: replaced on every change


@dataclass(slots=True)
class QueueEntry:
    proto: pb.Queue
    spec: model.QueueSpec


@dataclass(slots=True)
class ForeignTask:
    backend: str
    spec: model.TaskSpec  # status RUNNING on spec.node


@dataclass(eq=False)
class JobRecord:
    id: str
    spec_bytes: bytes  # the normalized spec's deterministic serialization (resubmission identity)
    creation_index: int
    status: JobStatusRecord
    task_count: int  # its replicas in all (its tasks, built or not)
    # What passes over every job (filters, counts, the waiting index) read of its spec, without
    # parsing it: its queue, namespace and owner (one string per name: ``sys.intern``), its gang
    # minimum (``muster.gang.gang_minimum`` of its tasks), the array it is an element of ("" none),
    # and whether a cycle asks job control about it beyond its hold: it has dependencies or is
    # an array element (``server.service.control``).
    queue: str
    namespace: str
    owner: str
    min_member: int
    array_job_id: str
    controlled: bool
    # Its tasks, one per replica in task-group order (``tasks``); None: each one Pending as it
    # was submitted, built when first asked. A restart builds none for a job whose stored tasks
    # are all so: a million waiting jobs hold no task objects until a cycle opens them.
    _tasks: list[TaskRecord] | None = field(default=None, repr=False)
    # Told when the tasks are built (the state indexes them by uid).
    on_tasks_built: Callable[[JobRecord], None] | None = field(default=None, repr=False)
    # The parsed spec once used (``spec``); None: parsed from ``spec_bytes`` when first asked. A
    # restart keeps only the bytes: a parsed spec costs ~1.2 KiB, and most waiting jobs are only
    # read by the waiting index (``peek_spec``) until a cycle opens them.
    _spec: pb.JobSpec | None = field(default=None, repr=False)
    # The core's view of the spec, built on first use: a job read back from the store to answer
    # GetJob or ListJobs never needs it (building it costs more than answering).
    _template: model.JobSpec | None = field(default=None, repr=False)
    # What today's validation refuses in the spec ("" : nothing), known once the template is
    # built: a job stored by an earlier version, which the next cycle quarantines.
    refusal: str = field(default="", repr=False)

    @property
    def template(self) -> model.JobSpec:
        """Never mutated; its tasks are aligned with ``tasks``."""
        if self._template is None:
            self._template, self.refusal = checked_job_to_model(self.spec, self.creation_index)
        return self._template

    def adopt_template(self, template: model.JobSpec) -> None:
        """Take the core's view of a spec validated now (built from the quantities its
        validation parsed: nothing to refuse) instead of building it on first use."""
        self._template, self.refusal = template, ""

    def checked_template(self) -> tuple[model.JobSpec, str]:
        """The template, and what today's validation refuses in the spec ("" : nothing)."""
        return self.template, self.refusal

    def set_creation_index(self, index: int) -> None:
        """Give a prepared job its place among submissions (its template's and tasks' too)."""
        self.creation_index = index
        if self._template is not None:
            self._template.creation_index = index
            for task in self._template.tasks:
                task.creation_index = index

    @property
    def tasks(self) -> list[TaskRecord]:
        """Its tasks (built on first use: see ``_tasks``)."""
        if self._tasks is None:
            spec = self.peek_spec()
            self._tasks = fresh_tasks(spec)
            if self.on_tasks_built is not None:
                self.on_tasks_built(self)
        return self._tasks

    def release_tasks(self, on_built: Callable[[JobRecord], None]) -> None:
        """Forget the built tasks (every one as submitted: built again the same when asked);
        ``on_built`` is told when they are."""
        self._tasks = None
        self.on_tasks_built = on_built

    def release_views(self) -> None:
        """Forget the parsed spec and the core's view of it (both rebuilt from ``spec_bytes``)."""
        self._spec = None
        self._template, self.refusal = None, ""

    @property
    def tasks_built(self) -> bool:
        return self._tasks is not None

    def built_tasks(self) -> list[TaskRecord]:
        """Its tasks if built, else none (what the state indexed)."""
        return self._tasks if self._tasks is not None else []

    def all_pending(self) -> bool:
        """Every task Pending (without building them)."""
        return self._tasks is None or all(t.status is TaskStatus.PENDING for t in self._tasks)

    def task_views(self) -> list[TaskRecord]:
        """Its tasks to read: the built ones, else fresh Pending ones not kept (an answer about
        a waiting job does not make it hold task objects)."""
        return self._tasks if self._tasks is not None else fresh_tasks(self.peek_spec())

    @property
    def spec(self) -> pb.JobSpec:
        """The normalized spec (parsed on first use and kept)."""
        if self._spec is None:
            self._spec = pb.JobSpec.FromString(self.spec_bytes)
        return self._spec

    def peek_spec(self) -> pb.JobSpec:
        """The spec, without keeping it parsed if it is not: for a pass over many jobs that only
        reads them (the waiting index)."""
        return self._spec if self._spec is not None else pb.JobSpec.FromString(self.spec_bytes)

    @cached_property
    def groups(self) -> dict[str, pb.TaskGroup]:
        """Its task groups by role; built on first use (a job that only waits never needs it,
        and a million of them would hold a million dicts)."""
        return {tg.role: tg for tg in self.spec.task_groups}

    @cached_property
    def task_env(self) -> dict[str, str]:
        """What its tasks get in their environment (bind decisions' ``env``): an array element's
        array id and index, as Slurm's SLURM_ARRAY_JOB_ID / SLURM_ARRAY_TASK_ID."""
        if not self.spec.array_job_id:
            return {}
        return {
            "MUSTER_ARRAY_JOB_ID": self.spec.array_job_id,
            "MUSTER_ARRAY_INDEX": str(self.spec.array_index),
        }

    @property
    def active(self) -> bool:
        return not is_terminal_phase(self.status.phase)


def fresh_tasks(spec: pb.JobSpec) -> list[TaskRecord]:
    """A job's tasks as submitted: one Pending per replica, in task-group order."""
    return [
        TaskRecord(task_uid(spec.id, tg.role, i), spec.id, tg.role, i)
        for tg in spec.task_groups
        for i in range(tg.replicas)
    ]
