"""The cluster model handed to a scheduling cycle.

This is the one contract between the server's cluster state (fed by adapters and submissions),
the scenario loader of ``muster simulate`` and the scheduling core (``server/session``,
``server/actions``, ``server/plugins``). It is plain data: the core never talks to the server state,
the store or the network. Resources are in canonical units (see ``muster.quantity``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

Resources = dict[str, float]


class TaskStatus(enum.IntEnum):
    """Task lifecycle; values equal the proto enum ``muster.v1.TaskStatus``."""

    PENDING = 1
    ALLOCATED = 2
    PIPELINED = 3
    BINDING = 4
    BOUND = 5
    RUNNING = 6
    RELEASING = 7
    SUCCEEDED = 8
    FAILED = 9
    # Its job was cancelled, or (a TYJob) ended before it ran or stopped it. Server only: backends
    # report Succeeded / Failed.
    CANCELLED = 10
    # On a node whose backend went silent (server only: the core never sees it; a cycle's snapshot
    # shows it Running, holding its node): Lost after the task eviction timeout, or Running again
    # when the backend answers.
    UNKNOWN = 11

    @property
    def title(self) -> str:
        return self.name.capitalize()

    @classmethod
    def from_title(cls, text: str) -> TaskStatus:
        return cls[text.upper()]


# Statuses whose resources are held on a node (Volcano's AllocatedStatus + Releasing; Unknown, on the
# server).
OCCUPYING = frozenset(
    {
        TaskStatus.ALLOCATED,
        TaskStatus.BINDING,
        TaskStatus.BOUND,
        TaskStatus.RUNNING,
        TaskStatus.RELEASING,
        TaskStatus.UNKNOWN,
    }
)
# Volcano's AllocatedStatus: counted as allocated to the job / queue.
ALLOCATED = frozenset(
    {TaskStatus.ALLOCATED, TaskStatus.BINDING, TaskStatus.BOUND, TaskStatus.RUNNING}
)
# Allocated as the server counts it (a queue's allocation, a gang's placed tasks): Unknown too,
# which a cycle sees Running, holding its node until it is lost.
ALLOCATED_OR_UNKNOWN = ALLOCATED | {TaskStatus.UNKNOWN}
ENDED = frozenset({TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED})
# Ended by itself, with an exit code (a Cancelled task was stopped by the server).
EXITED = frozenset({TaskStatus.SUCCEEDED, TaskStatus.FAILED})


class PodGroupPhase(enum.StrEnum):
    """Scheduler-side job phase (Volcano PodGroup phase)."""

    PENDING = "Pending"
    INQUEUE = "Inqueue"
    RUNNING = "Running"
    UNKNOWN = "Unknown"
    COMPLETED = "Completed"


@dataclass(slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes ``Toleration.ToleratesTaint``."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == taint.value


@dataclass(slots=True)
class PriorityClass:
    name: str
    value: int
    preemption_policy: str = "PreemptLowerPriority"
    global_default: bool = False


@dataclass(slots=True)
class NodeSpec:
    name: str
    allocatable: Resources
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[Taint] = field(default_factory=list)
    unschedulable: bool = False
    ready: bool = True
    backend: str = ""
    devices: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class QueueSpec:
    name: str
    parent: str | None = None
    weight: float = 1.0  # Volcano weight (>= 1 counts) / KAI over-quota weight (0 allowed)
    guarantee: Resources = field(default_factory=dict)
    deserved: Resources = field(default_factory=dict)
    capability: Resources = field(default_factory=dict)  # absent or inf: unlimited
    priority: int = 0
    reclaimable: bool = True
    state: str = "Open"  # Open | Closing | Closed
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class TaskSpec:
    uid: str  # unique in the snapshot ("ns/name" in scenarios, "<job id>/<role>-<i>" on the server)
    name: str
    namespace: str
    job: str  # uid of the owning job ("" for foreign tasks)
    request: Resources
    role: str = ""
    status: TaskStatus = TaskStatus.PENDING
    node: str | None = None
    priority: int = 0
    preemptable: bool = True
    preemption_policy: str = "PreemptLowerPriority"
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[Toleration] = field(default_factory=list)
    affinity: dict[str, Any] = field(default_factory=dict)  # Kubernetes form (nodeAffinity ...)
    sub_group: str | None = None
    gpu_groups: list[str] = field(default_factory=list)  # shared GPUs a fractional task sits on
    creation_index: int = 0  # submission order; ties in task order break on it
    devices: list[str] = field(default_factory=list)  # device ids held (a task on a node)
    gpu_fraction: float = 0.0  # KAI GPU sharing: the share of one GPU asked (0 < f < 1); 0: none


@dataclass(slots=True)
class SubGroupSpec:
    name: str
    min_member: int
    topology: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class TYJobSpec:
    """TY-Arranger's TYJob fields: one Leader task (role ``leader_role``) and WorkerSets (the
    other roles); the gang is the Leader plus ``min_workers`` workers."""

    leader_role: str = "leader"
    min_workers: int = 1
    restart_limit: int = 3
    clean_pod_policy: str = "All"  # Running | All | None
    job_queue_policy: str = ""  # Priority | DRF ("" : no schedulerPolicy)
    basic_policy: str = (
        ""  # Gang | BinPack | LeaderFirst | MinFragment | JobAffinity | JobAntiAffinity
    )
    leader_restarts: int = 0  # times the Leader was started again after failing


def ty_schedule_state(
    ty: TYJobSpec, leader_placed: bool, workers_placed: int, workers: int, failed: bool
) -> str:
    """TY-Arranger's schedule state: ScheduledSucceed when every pod is placed; ScheduledPartly when
    the Leader and minWorkersNum workers are; otherwise ScheduledFailed when the job can never be
    scheduled (``failed``), else Unscheduled."""
    if leader_placed and workers_placed >= workers:
        return "ScheduledSucceed"
    if leader_placed and workers_placed >= ty.min_workers:
        return "ScheduledPartly"
    return "ScheduledFailed" if failed else "Unscheduled"


def ty_stage(
    ty: TYJobSpec, leader: TaskStatus | None, workers_running: int, schedule_state: str
) -> str:
    """TY-Arranger's job stage from the Leader's status, the running workers and the schedule state:
    Succeeded when the Leader succeeded; Rescheduling while a failed Leader has restarts left
    (Failed once they are spent); Failed when it can never be scheduled; Pending until the gang is
    placed; Running once the Leader and minWorkersNum workers run; Starting in between."""
    if leader == TaskStatus.SUCCEEDED:
        return "Succeeded"
    if leader in (TaskStatus.FAILED, TaskStatus.RELEASING):
        return "Failed" if ty.leader_restarts >= ty.restart_limit else "Rescheduling"
    if schedule_state == "ScheduledFailed" or leader is None:
        return "Failed"
    if ty.leader_restarts and leader not in (TaskStatus.RUNNING, TaskStatus.BOUND):
        return "Rescheduling"  # started again after a failure, not running yet
    if schedule_state == "Unscheduled":
        return "Pending"
    if leader == TaskStatus.RUNNING and workers_running >= ty.min_workers:
        return "Running"
    return "Starting"


TY_JOB_QUEUE_POLICIES = ("Priority", "DRF")
TY_BASIC_POLICIES = (
    "Gang",
    "BinPack",
    "LeaderFirst",
    "MinFragment",
    "JobAffinity",
    "JobAntiAffinity",
)
TY_CLEAN_POD_POLICIES = ("Running", "All", "None")


@dataclass(frozen=True, slots=True)
class WaitingSummary:
    """What a cycle's queue window (server.session.window) reads of a job: whether it waits whole
    and, if so, how many of its tasks are best-effort, and its tasks' requests summed. Derived from
    the tasks: whoever keeps a job between cycles (the server's resident state) computes it once
    per change of the job (``server.session.window.summarize``), so a cycle does not walk a
    waiting job's tasks; None: the cycle computes it."""

    best_effort: int  # -1: it does not wait whole (a task holds something, or none asks)
    request: Resources


@dataclass(slots=True)
class JobSpec:
    uid: str  # "ns/name" in scenarios, the client-supplied id on the server
    name: str
    namespace: str
    queue: str
    tasks: list[TaskSpec]
    # The resolved gang minimum (muster.gang.gang_minimum of the API's / scenario's value): 0 is
    # no minimum (Volcano's minMember 0); None: every task (left unresolved).
    min_member: int | None = None
    min_task_member: dict[str, int] = field(default_factory=dict)
    min_resources: Resources | None = None
    priority: int = 0
    priority_class: str = ""
    preemptible: bool | None = None
    phase: PodGroupPhase = PodGroupPhase.PENDING
    sub_groups: list[SubGroupSpec] = field(default_factory=list)
    topology: dict[str, Any] = field(default_factory=dict)
    network_topology: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    stale_seconds: float | None = None
    creation_index: int = 0  # submission order (Volcano orders equal jobs by creation time)
    created_at: float | None = (
        None  # submission time, epoch seconds (sla waiting time); None: unknown
    )
    tyjob: TYJobSpec | None = None  # a TY-Arranger TYJob
    # Its time limit (JobSpec.time_limit_seconds): each task ends this long after it started; 0:
    # none. When it started running (the server's persisted start time, epoch seconds): its tasks
    # that hold nodes are expected to end at started_at + the limit (server/session/reservations.py).
    time_limit_seconds: float = 0.0
    started_at: float | None = None
    waiting: WaitingSummary | None = None  # None: computed by the cycle that needs it


@dataclass(slots=True)
class HyperNodeSpec:
    name: str
    tier: int
    nodes: list[str] = field(default_factory=list)
    hypernodes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Beyond:
    """A queue's waiting jobs past a cycle's queue window (server.session.window)."""

    jobs: int = 0
    first: str = ""  # the first of them in the queue's order
    request: Resources = field(default_factory=dict)  # what their tasks ask, in all
    # The minResources of those that are Inqueue (admitted: they count as inqueue resources).
    inqueue: Resources = field(default_factory=dict)


@dataclass(slots=True)
class Window:
    """What a session opened of its queues (server.session.window)."""

    # Per queue with jobs past its window, those jobs.
    beyond: dict[str, Beyond] = field(default_factory=dict)
    # The queues that have jobs, in the order of their first job in the whole snapshot (the order
    # the share plugins meet queues in, which their float sums follow).
    queue_order: list[str] = field(default_factory=list)
    lookback: int = 0  # maxQueueLookback (0: no window)

    def report(self) -> dict[str, BeyondWindow]:
        """Per queue, what the cycle's result says of the jobs past its window."""
        return {q: BeyondWindow(self.lookback, b.jobs, b.first) for q, b in self.beyond.items()}


@dataclass(slots=True)
class ClusterSnapshot:
    nodes: list[NodeSpec]
    queues: list[QueueSpec]
    jobs: list[JobSpec]
    # Tasks Muster does not schedule (pods of another scheduler ...): they only hold capacity.
    foreign_tasks: list[TaskSpec] = field(default_factory=list)
    priority_classes: dict[str, PriorityClass] = field(default_factory=dict)
    hypernodes: list[HyperNodeSpec] = field(default_factory=list)
    topologies: list[dict[str, Any]] = field(default_factory=list)
    # The time the cycle plans from (epoch seconds; reservations and start estimates). None: the
    # clock when the cycle runs. Simulations set it to their simulated time.
    now: float | None = None
    # The queue window its maker already applied (the server's resident state keeps one between
    # cycles): ``jobs`` are the window's, these the rest. None: the cycle opens its own window.
    window: Window | None = None


# A job's condition while it is left out of scheduling: a cycle failed on it (reason CycleFailed)
# or its stored spec is refused by today's validation (InvalidSpec). ``server.scheduler``. The
# same as ``muster.conditions.QUARANTINED``, which the core may not import (tests/test_layers.py).
QUARANTINED = "Quarantined"


@dataclass(slots=True)
class Condition:
    type: str  # Unschedulable | Scheduled | Unsatisfiable | Quarantined
    status: str = "True"
    reason: str = ""
    message: str = ""


@dataclass(slots=True)
class Explanation:
    """Why a job is (not) placed, from the last cycle (``muster explain``)."""

    gate: str  # none | queue | enqueue | gang | placement | unsatisfiable | quarantined
    summary: str
    node_reasons: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class JobEstimate:
    """When a pending job is expected to start (the reserve action, server/actions/muster/reserve.py)."""

    start: float | None  # epoch seconds; None: no estimate (``note`` says why)
    nodes: list[str] = field(default_factory=list)  # where it is expected to start
    reserved: bool = False  # those nodes are reserved for it from ``start``
    note: str = ""  # "no estimate: running tasks have no time limit" ...


@dataclass(slots=True)
class JobOutcome:
    phase: PodGroupPhase
    conditions: list[Condition] = field(default_factory=list)
    explanation: Explanation | None = None
    schedule_state: str = (
        ""  # TYJobs: Unscheduled | ScheduledSucceed | ScheduledFailed | ScheduledPartly
    )
    stage: str = ""  # TYJobs: Pending | Starting | Running | Rescheduling | Succeeded | Failed
    estimate: JobEstimate | None = None  # a pending job's start estimate (reserve action)


@dataclass(slots=True)
class BeyondWindow:
    """A queue's waiting jobs a cycle did not open, being past its first ``lookback``."""

    lookback: int
    jobs: int
    first: str  # the first of them in the queue's order


@dataclass(slots=True)
class CycleResult:
    """What one cycle decided. Task and job keys are the snapshot's uids."""

    cycle_id: int
    binds: dict[str, str] = field(default_factory=dict)  # task -> node (free resources)
    bind_devices: dict[str, list[str]] = field(default_factory=dict)
    bind_gpu_groups: dict[str, list[str]] = field(
        default_factory=dict
    )  # fractional tasks: the shared GPU
    # Device ids of every task holding a node after the cycle (bound, running, pipelined ...).
    task_devices: dict[str, list[str]] = field(default_factory=dict)
    task_gpu_groups: dict[str, list[str]] = field(
        default_factory=dict
    )  # fractional tasks: shared GPUs
    pipelined: dict[str, str] = field(default_factory=dict)  # task -> node (releasing resources)
    evictions: dict[str, str] = field(default_factory=dict)  # task -> reason
    moved: dict[str, tuple[str, str]] = field(default_factory=dict)  # task -> (from, to)
    jobs: dict[str, JobOutcome] = field(default_factory=dict)
    task_status: dict[str, tuple[TaskStatus, str | None]] = field(default_factory=dict)
    action_seconds: dict[str, float] = field(default_factory=dict)
    plugin_seconds: dict[str, float] = field(default_factory=dict)
    # Deserved share per queue computed by proportion (metrics: volcano_queue_deserved_*).
    queue_deserved: dict[str, Resources] = field(default_factory=dict)
    # Jobs this cycle left out because the cycle failed with them: job -> why (their outcome
    # carries the Quarantined condition).
    quarantined: dict[str, str] = field(default_factory=dict)
    # Per queue, its waiting jobs the cycle did not open (``maxQueueLookback``, server.session.window).
    beyond_window: dict[str, BeyondWindow] = field(default_factory=dict)
    # Pending jobs' start estimates and reservations (the reserve action): job -> estimate; each
    # is also its JobOutcome's ``estimate``.
    estimates: dict[str, JobEstimate] = field(default_factory=dict)
