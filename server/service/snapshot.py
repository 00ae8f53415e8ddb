"""A cycle's view of the state: ``capture`` on the event loop, ``Capture.materialize`` elsewhere.

``capture(state)`` is cheap: it takes the immutable specs (node, queue and job templates are
replaced, never mutated) and each active job's task statuses and nodes. ``materialize`` deep-copies
that into a ``model.ClusterSnapshot`` (in a worker thread): the records go on changing while the
cycle runs. The scheduling core itself never changes its snapshot (every cycle in the tests checks
it), which lets the worker's ``ResidentState`` hand it what it holds. ``server.service.apply`` later
compares a cycle's result against the same capture and drops whatever the world changed in between.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from server import model
from server.config import SchedulerConfig
from server.model import OCCUPYING, PodGroupPhase, TaskStatus
from server.service.control import CycleGates
from server.service.records import JobRecord
from server.service.state import ClusterState
from server.session.window import lookback_of, summarize, waiting_order

# A task as a cycle sees it: status, node, the device ids it holds whole, the GPU it shares ("":
# none). The core has no Unknown: a task Unknown (its backend silent) is Running on its node there,
# holding it (the node itself is NotReady: nothing new goes there).
TaskState = tuple[TaskStatus, str | None, tuple[str, ...], str]
UNKNOWN, RUNNING = TaskStatus.UNKNOWN, TaskStatus.RUNNING


def core_status(status: TaskStatus) -> TaskStatus:
    """A task's status as the core sees it (it has no Unknown: see ``TaskState``)."""
    return RUNNING if status == UNKNOWN else status


@dataclass
class Capture:
    """What a cycle sees, captured on the event loop; ``materialize`` deep-copies it (in a thread)."""

    cycle_id: int
    nodes: list[model.NodeSpec]
    queues: list[model.QueueSpec]
    # (record, phase, per task state, Leader restarts) at capture time
    jobs: list[tuple[JobRecord, PodGroupPhase, list[TaskState], int]]
    foreign: list[model.TaskSpec]
    priority_classes: dict[str, model.PriorityClass]
    now: float | None = None  # the state's clock at capture: what the cycle plans from
    # The queue window the capture applied (``jobs`` are the window's), None: the core's own.
    window: model.Window | None = None

    @cached_property
    def by_job(self) -> dict[str, tuple[JobRecord, list[TaskState]]]:
        """Job id -> (record, per-task state) at capture time; built once (apply asks per chunk)."""
        return {rec.id: (rec, states) for rec, _, states, _ in self.jobs}

    def materialize(self) -> model.ClusterSnapshot:
        return materialize(
            self.nodes,
            self.queues,
            (_job_state(entry) for entry in self.jobs),
            self.foreign,
            self.priority_classes,
            self.now,
            self.window,
        )


# A job as a cycle sees it: template, phase, per task state, Leader restarts, submit time, start
# time (persisted: its running tasks' expected ends count from it).
JobState = tuple[model.JobSpec, PodGroupPhase, list[TaskState], int, float | None, float | None]


def _job_state(entry: tuple[JobRecord, PodGroupPhase, list[TaskState], int]) -> JobState:
    rec, phase, states, restarts = entry
    st = rec.status
    return rec.template, phase, states, restarts, st.submit_time or None, st.start_time or None


def materialize(
    nodes: list[model.NodeSpec],
    queues: list[model.QueueSpec],
    jobs: Iterable[JobState],
    foreign: list[model.TaskSpec],
    priority_classes: dict[str, model.PriorityClass],
    now: float | None = None,
    window: model.Window | None = None,
) -> model.ClusterSnapshot:
    """Deep copies: the server's records go on changing while a cycle runs on them."""
    return _snapshot(
        [_copy_node(n) for n in nodes],
        queues,
        [_copy_job(j) for j in jobs],
        foreign,
        priority_classes,
        now,
        window,
    )


def _snapshot(
    nodes: list[model.NodeSpec],
    queues: list[model.QueueSpec],
    jobs: list[model.JobSpec],
    foreign: list[model.TaskSpec],
    priority_classes: dict[str, model.PriorityClass],
    now: float | None = None,
    window: model.Window | None = None,
) -> model.ClusterSnapshot:
    return model.ClusterSnapshot(
        nodes=nodes,
        queues=[_copy_queue(q) for q in queues],
        jobs=jobs,
        foreign_tasks=[_copy_task(t, t.status, t.node, t.devices, t.gpu_groups) for t in foreign],
        priority_classes={
            k: model.PriorityClass(v.name, v.value, v.preemption_policy, v.global_default)
            for k, v in priority_classes.items()
        },
        now=now,
        window=window,  # (made per capture, never changed after: not copied)
    )


def _copy_job(job: JobState) -> model.JobSpec:
    tmpl, phase, states, restarts, submit_time, start_time = job
    tasks = [
        _copy_task(t, status, node, devices, [gpu_group] if gpu_group else [])
        for t, (status, node, devices, gpu_group) in zip(tmpl.tasks, states, strict=True)
    ]
    return model.JobSpec(
        uid=tmpl.uid,
        name=tmpl.name,
        namespace=tmpl.namespace,
        queue=tmpl.queue,
        tasks=tasks,
        min_member=tmpl.min_member,
        min_task_member=dict(tmpl.min_task_member),
        min_resources=dict(tmpl.min_resources) if tmpl.min_resources else None,
        priority=tmpl.priority,
        priority_class=tmpl.priority_class,
        preemptible=tmpl.preemptible,
        phase=phase,
        sub_groups=[model.SubGroupSpec(s.name, s.min_member) for s in tmpl.sub_groups],
        network_topology=dict(tmpl.network_topology),
        annotations=dict(tmpl.annotations),
        creation_index=tmpl.creation_index,
        created_at=submit_time,  # sla's waiting time
        tyjob=replace(tmpl.tyjob, leader_restarts=restarts) if tmpl.tyjob is not None else None,
        time_limit_seconds=tmpl.time_limit_seconds,
        started_at=start_time,
        # Once per copy: the resident state makes one per change of the job, not per cycle.
        waiting=summarize(tasks),
    )


def _copy_task(
    t: model.TaskSpec,
    status: TaskStatus,
    node: str | None,
    devices: Iterable[str],
    gpu_groups: Iterable[str],
) -> model.TaskSpec:
    return model.TaskSpec(
        uid=t.uid,
        name=t.name,
        namespace=t.namespace,
        job=t.job,
        request=dict(t.request),
        role=t.role,
        status=status,
        node=node,
        priority=t.priority,
        preemptable=t.preemptable,
        preemption_policy=t.preemption_policy,
        labels=dict(t.labels),
        annotations=dict(t.annotations),
        node_selector=dict(t.node_selector),
        tolerations=[model.Toleration(x.key, x.operator, x.value, x.effect) for x in t.tolerations],
        affinity=_deep(t.affinity) if t.affinity else {},
        sub_group=t.sub_group,
        gpu_groups=list(gpu_groups),
        creation_index=t.creation_index,
        devices=list(devices),
        gpu_fraction=t.gpu_fraction,
    )


def _copy_node(n: model.NodeSpec) -> model.NodeSpec:
    return model.NodeSpec(
        name=n.name,
        allocatable=dict(n.allocatable),
        labels=dict(n.labels),
        taints=[model.Taint(t.key, t.value, t.effect) for t in n.taints],
        unschedulable=n.unschedulable,
        ready=n.ready,
        backend=n.backend,
        devices=_deep(n.devices) if n.devices else [],
    )


def _copy_queue(q: model.QueueSpec) -> model.QueueSpec:
    return model.QueueSpec(
        name=q.name,
        parent=q.parent,
        weight=q.weight,
        guarantee=dict(q.guarantee),
        deserved=dict(q.deserved),
        capability=dict(q.capability),
        priority=q.priority,
        reclaimable=q.reclaimable,
        state=q.state,
        annotations=dict(q.annotations),
    )


def _deep(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep(v) for v in value]
    return value


def configure_window(state: ClusterState, config: SchedulerConfig) -> bool:
    """Set the state's waiting index to ``config``'s queue window; whether there is one."""
    lookback = lookback_of(config)
    state.waiting.configure(lookback, waiting_order(config) if lookback > 0 else None)
    return state.waiting.enabled


async def prepare_capture(state: ClusterState, config: SchedulerConfig) -> None:
    """Before ``capture`` on the event loop: file what the waiting index has not (every job,
    after a restart) a step at a time, so the capture itself stays short."""
    if configure_window(state, config):
        await state.waiting.settle_in_steps(state.jobs)


def capture(state: ClusterState, config: SchedulerConfig | None = None) -> Capture:
    """What the next cycle works on, taken now (cheap: references to immutable specs and each
    task's status and node); the cycle id is assigned here. With ``config``'s queue window
    (``maxQueueLookback``, server.session.window) the state's ``WaitingIndex`` picks the jobs:
    those that hold something or that the gates decide, and the first waiting jobs of each
    queue (the others are counted, not captured)."""
    cycle_id = state.next_cycle_id
    state.next_cycle_id += 1
    state.set_meta("next_cycle_id", str(state.next_cycle_id))
    index = state.waiting
    # (without a config: every job, the reference in tests)
    windowed = config is not None and configure_window(state, config)
    candidates: Iterable[JobRecord]
    if windowed:
        state.touch_changed_jobs()  # (changes not committed yet count too)
        index.settle(state.jobs)
        candidates = _others(state)
    else:
        candidates = state.jobs.values()
    chosen: list[JobRecord] = []
    # Tasks of jobs that are over but still hold a node (being released, or kept running by a
    # TYJob's cleanPodPolicy None), and of quarantined jobs, hold its capacity like foreign work.
    leftovers: list[model.TaskSpec] = []
    # Held jobs, jobs waiting for a dependency and array elements beyond their array's limit are
    # left out (their conditions say why); what they still hold is held like a quarantined job's.
    gates = CycleGates(state, cycle_id)
    for rec in candidates:
        if rec.active and not rec.status.quarantined and not gates.excludes(rec):
            if not rec.checked_template()[1]:
                chosen.append(rec)
                continue
            # A spec stored by an earlier version that today's bounds refuse: never scheduled.
            state.quarantine(
                rec,
                "InvalidSpec",
                f"left out of scheduling: {rec.refusal} (stored by an earlier "
                "version; refused today); it stays out until it is cancelled",
                cycle_id,
            )
        # Quarantined jobs and jobs that are over hold the nodes their tasks are on, like foreign work.
        if any(t.node and t.status in OCCUPYING for t in rec.tasks):
            leftovers += [
                replace(
                    spec,
                    job="",
                    status=core_status(t.status),
                    node=t.node,
                    devices=list(t.devices),
                    gpu_groups=[t.gpu_group] if t.gpu_group else [],
                )
                for spec, t in zip(rec.template.tasks, rec.tasks, strict=True)
                if t.node and t.status in OCCUPYING
            ]
    window = None
    if windowed:
        picked = index.pick(state.jobs, state.queues, chosen)
        chosen, window = picked.jobs, picked.window
    return Capture(
        cycle_id=cycle_id,
        nodes=[e.spec for e in state.nodes.values()],
        queues=[e.spec for e in state.queues.values()],
        jobs=[_captured(rec) for rec in chosen],
        foreign=[f.spec for f in state.foreign.values()] + leftovers,
        priority_classes=dict(state.priority_classes),
        now=state.clock(),
        window=window,
    )


def _others(state: ClusterState) -> list[JobRecord]:
    """The jobs the waiting index did not file, in creation order (array elements are asked in
    that order); ids of jobs that left memory are dropped."""
    others, jobs = state.waiting.others, state.jobs
    found = []
    for job_id in list(others):
        rec = dict.get(jobs, job_id)
        if rec is None:
            del others[job_id]
        else:
            found.append(rec)
    found.sort(key=lambda rec: rec.creation_index)
    return found


def _captured(rec: JobRecord) -> tuple[JobRecord, PodGroupPhase, list[TaskState], int]:
    return (
        rec,
        rec.status.sched_phase,
        [(core_status(t.status), t.node, tuple(t.devices), t.gpu_group) for t in rec.tasks],
        rec.status.leader_restarts,
    )


# -- the worker's resident copy ------------------------------------------------------------------
@dataclass
class CaptureDelta:
    """What changed since the capture the worker last saw (all of it when ``full``): nodes, queues
    and jobs by name, each sent again only when its spec or (for a job) its state changed; orders
    only when they changed. A cycle where little changed sends little."""

    full: bool
    nodes: dict[str, model.NodeSpec]
    node_order: list[str] | None
    queues: list[model.QueueSpec] | None
    jobs: dict[str, JobState]
    job_order: list[str] | None
    foreign: list[model.TaskSpec] | None
    priority_classes: dict[str, model.PriorityClass] | None
    now: float | None = None  # the capture's clock (always sent: not a change)
    window: model.Window | None = None  # the capture's queue window (always sent)
    window_changed: bool = False  # not the window of the capture before

    def size(self) -> int:
        """How many nodes and jobs it carries (what a cycle's transfer costs)."""
        return len(self.nodes) + len(self.jobs)

    def empty(self) -> bool:
        """Nothing changed since the capture the worker last saw."""
        return (
            not self.full
            and not self.nodes
            and not self.jobs
            and not self.window_changed
            and all(
                x is None
                for x in (
                    self.node_order,
                    self.queues,
                    self.job_order,
                    self.foreign,
                    self.priority_classes,
                )
            )
        )


class DeltaSender:
    """The server's record of what the worker holds, to send it only what changed. Specs are
    replaced, never mutated, so the same object is unchanged (others are compared by value). The
    dicts keep the capture's order."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """The worker holds nothing (new, or its state is in doubt): the next delta is full."""
        self._full = True
        self._nodes: dict[str, model.NodeSpec] = {}
        self._queues: list[model.QueueSpec] = []
        self._jobs: dict[str, JobState] = {}
        self._foreign: list[model.TaskSpec] = []
        self._priority_classes: dict[str, model.PriorityClass] = {}
        self._window: model.Window | None = None

    def delta(self, cap: Capture) -> CaptureDelta:
        full = self._full
        now_nodes = {n.name: n for n in cap.nodes}
        # A backend's full sync replaces equal specs: compared by value where not the same object.
        nodes = {
            name: n for name, n in now_nodes.items() if not _unchanged(self._nodes.get(name), n)
        }
        now_jobs = {state[0].uid: state for state in map(_job_state, cap.jobs)}
        jobs = {
            uid: state
            for uid, state in now_jobs.items()
            if _job_changed(self._jobs.get(uid), state)
        }
        out = CaptureDelta(
            full=full,
            nodes=nodes,
            node_order=list(now_nodes) if full or list(now_nodes) != list(self._nodes) else None,
            queues=cap.queues if full or not _same(cap.queues, self._queues) else None,
            jobs=jobs,
            job_order=list(now_jobs) if full or list(now_jobs) != list(self._jobs) else None,
            foreign=cap.foreign if full or cap.foreign != self._foreign else None,
            priority_classes=cap.priority_classes
            if full or cap.priority_classes != self._priority_classes
            else None,
            now=cap.now,
            window=cap.window,
            window_changed=full or cap.window != self._window,
        )
        self._full = False
        self._window = cap.window
        self._nodes, self._jobs = now_nodes, now_jobs
        self._queues, self._foreign = list(cap.queues), list(cap.foreign)
        self._priority_classes = dict(cap.priority_classes)
        return out


class ResidentState:
    """The worker's copy of the cluster between cycles, kept up to date by deltas (the dicts in
    the capture's order).

    ``materialize`` hands the core the nodes it holds, and builds a job's spec (its template with
    the tasks' states) only when a delta replaced the job: an unchanged job's spec is handed to the
    next cycle again. That relies on the scheduling core never changing its snapshot, which every
    cycle in the tests checks (tests/conftest.py)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.nodes: dict[str, model.NodeSpec] = {}
        self.queues: list[model.QueueSpec] = []
        self.jobs: dict[str, JobState] = {}
        self.foreign: list[model.TaskSpec] = []
        self.priority_classes: dict[str, model.PriorityClass] = {}
        self.now: float | None = None
        self.window: model.Window | None = None
        # The job specs the last snapshot was made of, with the state each was built from.
        self._job_copies: dict[str, tuple[JobState, model.JobSpec]] = {}

    @property
    def node_order(self) -> list[str]:
        return list(self.nodes)

    def apply(self, delta: CaptureDelta) -> None:
        if delta.full:
            self.clear()
        self.nodes.update(delta.nodes)
        if delta.node_order is not None:
            self.nodes = {name: self.nodes[name] for name in delta.node_order}
        self.jobs.update(delta.jobs)
        if delta.job_order is not None:
            self.jobs = {uid: self.jobs[uid] for uid in delta.job_order}
        if delta.queues is not None:
            self.queues = delta.queues
        if delta.foreign is not None:
            self.foreign = delta.foreign
        if delta.priority_classes is not None:
            self.priority_classes = delta.priority_classes
        self.now = delta.now
        self.window = delta.window

    def materialize(self) -> model.ClusterSnapshot:
        job_copies: dict[str, tuple[JobState, model.JobSpec]] = {}
        for uid, job in self.jobs.items():
            seen = self._job_copies.get(uid)
            job_copies[uid] = (
                seen
                if seen is not None and not _job_changed(seen[0], job)
                else (job, _copy_job(job))
            )
        self._job_copies = job_copies
        return _snapshot(
            list(self.nodes.values()),
            self.queues,
            [c for _, c in job_copies.values()],
            self.foreign,
            self.priority_classes,
            self.now,
            self.window,
        )


def _job_changed(known: JobState | None, now: JobState) -> bool:
    return known is None or known[0] is not now[0] or known[1:] != now[1:]


def _unchanged(known: Any, now: Any) -> bool:
    return known is now or (known is not None and known == now)


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(_unchanged(x, y) for x, y in zip(a, b, strict=True))
