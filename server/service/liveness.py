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
every backend's clock then, ``restart``); the transitions are ``ClusterState``'s
(``backend_silent``, ``backend_lost``, ``backend_back``), run from ``server.service.ingest``.
Times are the ``clock``'s (monotonic by default): a wall clock step must not silence everyone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container
from dataclasses import dataclass, replace

from muster.v1 import muster_pb2 as pb
from server.model import TaskStatus
from server.service.records import NodeEntry

# Kubernetes' defaults: node-monitor-grace-period 40 s, pod-eviction-timeout 5 min.
DEFAULT_NODE_GRACE = 40.0
DEFAULT_TASK_EVICTION = 300.0
# Heartbeats per grace period: a backend may miss three before it is declared silent.
HEARTBEATS_PER_GRACE = 4
MAX_HEARTBEAT_SECONDS = 10.0  # kubelet renews its lease every 10 s


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
