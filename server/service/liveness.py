"""Backend liveness: when each backend was last heard from, and what its silence changed.

Kubernetes' node lease, node-monitor-grace-period and pod-eviction-timeout, per backend: every
backend RPC (``Heartbeat`` included, which the adapter runtime sends every ``heartbeat_seconds``)
is contact. A backend not heard from for ``grace`` seconds is *silent*: its nodes are shown
NotReady (nothing new is bound to them) and its placed tasks Unknown. ``eviction`` seconds later
its tasks are *lost*: back to Pending, and their job's rule applies (a gang is placed again
whole). A backend heard from again is *back*: its nodes Ready, its Unknown tasks what they were,
and it is asked (``HeartbeatResponse.resync``) for a full SyncSnapshot that adopts what it still
runs and loses what it no longer does. A copy of a lost task it still runs is stopped.

``Liveness`` only keeps the books (in memory; a server that starts or takes over the lead starts
every backend's clock then, ``restart``, through ``start_liveness``); the transitions on the state
are this module's functions (``backend_silent``, ``backend_lost``, ``backend_back``), run from
``server.service.ingest``. They take the ``ClusterState`` as a ``LivenessState``: the state builds
on this module (it holds the books), so this module names the state by its shape, never imports it.
Times are the ``clock``'s (monotonic by default): a wall clock step must not silence everyone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container
from dataclasses import dataclass, replace
from typing import Protocol

import structlog

from muster.v1 import muster_pb2 as pb
from server.model import OCCUPYING, TaskStatus
from server.service.decisions import DecisionLog
from server.service.records import JobRecord, NodeEntry, TaskRecord
from server.service.tables import ChangeSet

# The transitions log as the state's, as they did when they were ClusterState methods.
log = structlog.get_logger("muster.state")

# Kubernetes' defaults: node-monitor-grace-period 40 s, pod-eviction-timeout 5 min.
DEFAULT_NODE_GRACE = 40.0
DEFAULT_TASK_EVICTION = 300.0
# Heartbeats per grace period: a backend may miss three before it is declared silent.
HEARTBEATS_PER_GRACE = 4
MAX_HEARTBEAT_SECONDS = 10.0  # kubelet renews its lease every 10 s
# What a silent backend's task becomes Unknown from.
ALIVE_ON_NODE = frozenset({TaskStatus.BINDING, TaskStatus.BOUND, TaskStatus.RUNNING})


@dataclass(slots=True)
class Contact:
    """One backend's standing: ``last`` contact, and since when it is silent (None: it is not)."""

    last: float
    silent_since: float | None = None
    lost: bool = False  # its tasks were declared lost (the eviction timeout passed)
    resync: bool = False  # back after a silence: a SyncSnapshot is wanted


class Liveness:
    """The liveness books (the module's docstring)."""

    def __init__(
        self,
        grace: float = DEFAULT_NODE_GRACE,
        eviction: float = DEFAULT_TASK_EVICTION,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if grace <= 0 or eviction < 0:
            raise ValueError(f"grace {grace} must be > 0 and eviction {eviction} >= 0")
        self.grace = grace
        self.eviction = eviction
        self.clock = clock
        self.started = clock()
        self.contacts: dict[str, Contact] = {}
        # Node name -> (the entry its backend sent, the NotReady entry shown instead) while the
        # backend is silent.
        self.hidden: dict[str, tuple[NodeEntry, NodeEntry]] = {}
        # Unknown task -> the status it had (what it gets back when its backend answers).
        self.held: dict[str, TaskStatus] = {}
        # Task -> (backend, node) it was declared lost from, until that backend says what became
        # of the copy it ran there (a report, or a SyncSnapshot without it).
        self.lost: dict[str, tuple[str, str]] = {}

    @property
    def heartbeat_seconds(self) -> float:
        """How often a backend should call Heartbeat: a quarter of the grace (10 s at most)."""
        return max(0.05, min(MAX_HEARTBEAT_SECONDS, self.grace / HEARTBEATS_PER_GRACE))

    def restart(self) -> None:
        """Forget everything and start every backend's clock now (a server starting, or taking
        over the lead: it has heard from no one yet, and declares no one dead for that)."""
        self.started = self.clock()
        self.contacts.clear()
        self.hidden.clear()
        self.held.clear()
        self.lost.clear()

    def contact_of(self, backend: str) -> Contact:
        """The backend's record; one not heard from yet counts from ``started``."""
        found = self.contacts.get(backend)
        if found is None:
            found = self.contacts[backend] = Contact(self.started)
        return found

    def heard(self, backend: str) -> tuple[Contact, float | None]:
        """``backend`` called: note it. Returns its record and, when it had been declared silent,
        how long it was silent (the caller brings it back); None otherwise."""
        contact = self.contact_of(backend)
        now = self.clock()
        silent_for = now - contact.last
        contact.last = now
        if contact.silent_since is None:
            return contact, None
        contact.silent_since = None
        contact.lost = False
        contact.resync = True
        return contact, silent_for

    def silent_for(self, backend: str) -> float:
        """Seconds since ``backend`` was last heard from (since ``started``: not yet)."""
        known = self.contacts.get(backend)
        return self.clock() - (known.last if known is not None else self.started)

    def last_contact_wall(self, backend: str) -> float:
        """The last contact as wall-clock seconds (for the API)."""
        return time.time() - self.silent_for(backend)

    def reason(self, entry: NodeEntry) -> str:
        """Why a node is NotReady ("" when it is Ready)."""
        backend = entry.spec.backend
        if entry.proto.name in self.hidden:
            return (
                f"backend {backend} silent for {self.silent_for(backend):.0f} s "
                f"(grace {self.grace:g} s)"
            )
        if entry.proto.not_ready:
            return f"reported by backend {backend}"
        return ""

    def forget_lost(self, backend: str, keep: Container[str]) -> None:
        """``backend`` sent its whole state: the lost copies it did not report (not in ``keep``)
        are gone."""
        for uid in [u for u, (b, _node) in self.lost.items() if b == backend and u not in keep]:
            del self.lost[uid]


def not_ready_entry(entry: NodeEntry) -> NodeEntry:
    """The entry shown for a silent backend's node: NotReady (a cycle places nothing on it)."""
    proto = pb.Node()
    proto.CopyFrom(entry.proto)
    proto.not_ready = True
    return NodeEntry(proto, replace(entry.spec, ready=False))


class LivenessState(Protocol):
    """What the transitions below need of the state (``server.service.state.ClusterState``, which
    builds on this module and so is named by its shape here, not imported)."""

    @property
    def liveness(self) -> Liveness: ...
    @property
    def nodes(self) -> dict[str, NodeEntry]: ...
    @property
    def tasks(self) -> dict[str, TaskRecord]: ...
    @property
    def task_job(self) -> dict[str, JobRecord]: ...
    @property
    def decisions(self) -> DecisionLog: ...
    @property
    def changes(self) -> ChangeSet: ...
    @property
    def on_change(self) -> Callable[[], None]: ...
    def after_task_change(self, job: JobRecord) -> None: ...
    def task_gone(self, rec: TaskRecord, why: str) -> None: ...


# -- the transitions (run from server.service.ingest; start_liveness from app and replica) ---------


def start_liveness(state: LivenessState) -> None:
    """This server starts serving backends (it starts, or takes over the lead): every backend's
    clock starts now, and a task a previous leader left Unknown is what it was placed as again
    (Binding while its bind is pending, else Running) until its backend says otherwise, or
    stays silent for the grace period again."""
    state.liveness.restart()
    touched: dict[str, JobRecord] = {}
    for rec in state.tasks.values():
        if rec.status == TaskStatus.UNKNOWN:
            rec.status, rec.message = _unknown_fallback(state, rec), ""
            state.changes.tasks.add(rec.uid)
            job = state.task_job[rec.uid]
            touched[job.id] = job
    for job in touched.values():
        state.after_task_change(job)


def _unknown_fallback(state: LivenessState, rec: TaskRecord) -> TaskStatus:
    for p in state.decisions.pending_for_task(rec.uid):
        if p.row.kind == "bind" and p.decision.bind.node == rec.node:
            return TaskStatus.BINDING
    return TaskStatus.RUNNING


def _status(state: LivenessState, uid: str) -> TaskStatus | None:
    rec = state.tasks.get(uid)
    return rec.status if rec is not None else None


def backend_silent(state: LivenessState, backend: str, silent_for: float) -> None:
    """Not heard from for the grace period: its nodes NotReady (no new binds), its placed tasks
    Unknown (their binds still expire at their deadline, back to Pending)."""
    lv = state.liveness
    why = f"backend {backend} silent for {silent_for:.0f} s"
    nodes = 0
    for name, entry in list(state.nodes.items()):
        if entry.spec.backend == backend and name not in lv.hidden:
            shown = not_ready_entry(entry)
            lv.hidden[name] = (entry, shown)
            state.nodes[name] = shown
            nodes += 1
    touched: dict[str, JobRecord] = {}
    unknown = 0
    for rec in state.tasks.values():
        if rec.backend != backend or not rec.node or rec.status not in ALIVE_ON_NODE:
            continue
        unknown += 1
        lv.held[rec.uid] = rec.status
        rec.status = TaskStatus.UNKNOWN
        rec.message = f"{why}: status unknown"
        state.changes.tasks.add(rec.uid)
        job = state.task_job[rec.uid]
        touched[job.id] = job
    for job in touched.values():
        state.after_task_change(job)
    level = log.warning if nodes or touched else log.info
    level(
        "backend.silent",
        backend=backend,
        silent_seconds=round(silent_for, 1),
        grace=lv.grace,
        nodes_not_ready=nodes,
        tasks_unknown=unknown,
        jobs=sorted(touched)[:20],
    )
    state.on_change()


def backend_lost(state: LivenessState, backend: str, silent_for: float) -> None:
    """Silent for the eviction timeout after its grace: the tasks on it are lost (back to
    Pending, or released if they were being evicted; their job's rule applies: a broken gang
    is evicted and placed again whole). Its nodes stay NotReady until it answers."""
    lv = state.liveness
    why = (
        f"lost: backend {backend} silent for {silent_for:.0f} s "
        f"(task eviction timeout {lv.eviction:g} s)"
    )
    binds: dict[str, list[int]] = {}
    for p in state.decisions.pending.values():
        if p.row.backend == backend and p.row.kind == "bind":
            binds.setdefault(p.row.task_id, []).append(p.row.id)
    touched: dict[str, JobRecord] = {}
    lost = 0
    # (a list: an earlier task's broken gang turns a later one Releasing, still on the backend)
    for rec in list(state.tasks.values()):
        if rec.backend != backend or not rec.node or rec.status not in OCCUPYING:
            continue
        lv.lost[rec.uid] = (backend, rec.node)
        lv.held.pop(rec.uid, None)
        for decision_id in binds.pop(rec.uid, ()):
            state.decisions.settle(decision_id, "expired", why)
        job = state.task_job[rec.uid]
        touched[job.id] = job
        state.task_gone(rec, why)
        lost += 1
    for job in touched.values():
        state.after_task_change(job)
    (log.warning if lost else log.info)(
        "backend.tasks_lost",
        backend=backend,
        silent_seconds=round(silent_for, 1),
        eviction_timeout=lv.eviction,
        tasks=lost,
        jobs=sorted(touched)[:20],
    )
    state.on_change()


def backend_back(state: LivenessState, backend: str, silent_for: float) -> None:
    """Heard from again after it was declared silent: its nodes as it reported them, its Unknown
    tasks what they were (the SyncSnapshot it is asked for adopts or loses them)."""
    lv = state.liveness
    nodes = 0
    for name, (own, shown) in list(lv.hidden.items()):
        if own.spec.backend != backend:
            continue
        del lv.hidden[name]
        if state.nodes.get(name) is shown:
            state.nodes[name] = own
            nodes += 1
    touched: dict[str, JobRecord] = {}
    known = 0
    for rec in state.tasks.values():
        if rec.backend == backend and rec.status == TaskStatus.UNKNOWN:
            known += 1
            held = lv.held.pop(rec.uid, None)
            rec.status = held if held is not None else _unknown_fallback(state, rec)
            rec.message = ""
            state.changes.tasks.add(rec.uid)
            job = state.task_job[rec.uid]
            touched[job.id] = job
    for uid in [u for u in lv.held if _status(state, u) != TaskStatus.UNKNOWN]:
        del lv.held[uid]  # left Unknown another way meanwhile (a bind expired, a job ended)
    for job in touched.values():
        state.after_task_change(job)
    log.info(
        "backend.back",
        backend=backend,
        silent_seconds=round(silent_for, 1),
        nodes_ready=nodes,
        tasks_known=known,
    )
    state.on_change()
