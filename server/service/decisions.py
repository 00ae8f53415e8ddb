"""The decision log and the server's streaming feeds.

``DecisionLog`` issues Bind / Evict decisions with ids that are monotonic across restarts (the
next id is persisted), keeps every unacknowledged decision in memory (and in the store with its
outcome), and fans each new decision out to the subscribers of the owning backend's feed.
``JobWatchHub`` fans job events out to WatchJobs subscribers.

A decision reaches a backend only once it is durable: ``issue`` holds it back, the state's
``commit`` hands the held ones to the write batch, and ``release`` offers them to subscribers after
the store wrote that batch. A server that crashes (or a leader that lost its lease, whose write is
refused) has sent nothing it did not save, so a backend never acts on a decision the next server
does not know. Every decision carries the issuing leader's ``term`` (0 without replication).

Both feeds use bounded per-subscriber buffers filled with ``send_nowait`` from the event loop: a
subscriber that falls behind is dropped (its stream is closed and flagged) instead of blocking the
server or growing memory. A dropped decision subscriber loses nothing: unacknowledged decisions are
resent when the backend reconnects.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from muster.v1 import muster_pb2 as pb
from server.service.records import DecisionRow

T = TypeVar("T")

DECISION_BUFFER = 10_000
# StreamDecisionBatches: decisions per message unless the backend asks for fewer (at most the buffer),
# and serialized bytes per message: well under gRPC's default 4 MiB receive limit, whatever the
# decisions carry (annotations, commands); a single larger decision goes alone.
DECISION_BATCH = 1_000
DECISION_BATCH_BYTES = 1 << 20
WATCH_BUFFER = (
    10_000  # a burst of 2,000 gangs makes ~8,000 events; falling behind costs a full re-list
)
RECENT_OUTCOMES = 10_000  # a cache: older outcomes are read from the store


@dataclass(eq=False)
class Subscriber(Generic[T]):
    """One streaming RPC's view of a feed."""

    send: MemoryObjectSendStream[T]
    receive: MemoryObjectReceiveStream[T]
    dropped: bool = False
    accepts: Callable[[T], bool] = field(default=lambda _item: True)

    @classmethod
    def open(cls, buffer: int, accepts: Callable[[T], bool] | None = None) -> Subscriber[T]:
        send, receive = anyio.create_memory_object_stream[T](buffer)
        sub = cls(send, receive)
        if accepts is not None:
            sub.accepts = accepts
        return sub

    def offer(self, item: T) -> bool:
        """Queue ``item`` without blocking; False (and the subscriber is dropped) when full."""
        if self.dropped:
            return False
        try:
            self.send.send_nowait(item)
        except anyio.WouldBlock:
            self.dropped = True
            self.send.close()
            return False
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        return True

    def close(self) -> None:
        self.send.close()


class DecisionObserver(Protocol):
    def on_issue(self, decision: pb.Decision, kind: str) -> None: ...

    def on_settle(self, decision: pb.Decision, kind: str, outcome: str) -> None: ...


@dataclass(slots=True)
class PendingDecision:
    row: DecisionRow
    decision: pb.Decision


class DecisionLog:
    def __init__(self, next_id: int = 1, bind_timeout: float = 30.0) -> None:
        self.next_id = next_id
        self.bind_timeout = bind_timeout
        self.term = 0  # the leadership term stamped on new decisions (0: not replicated)
        self.pending: dict[int, PendingDecision] = {}
        # Issued, not yet written: offered to subscribers by ``release`` once the store has them.
        self.unsent: dict[int, pb.Decision] = {}
        self._subscribers: dict[str, set[Subscriber[pb.Decision]]] = {}
        self.dirty: dict[int, DecisionRow] = {}
        self.counter_dirty = False
        # Outcomes of recently settled decisions: id -> (backend, state, serialized decision), so
        # (duplicate) acks rarely need the store.
        self.recent: OrderedDict[int, tuple[str, str, bytes]] = OrderedDict()
        # Telemetry (server.service.observability): counts decisions and stamps their trace context.
        self.observer: DecisionObserver | None = None

    # --- issuing ---------------------------------------------------------------------------------

    def issue(
        self,
        backend: str,
        cycle_id: int,
        task_id: str,
        *,
        bind: pb.BindDecision | None = None,
        evict: pb.EvictDecision | None = None,
        now: float | None = None,
    ) -> pb.Decision:
        now = time.time() if now is None else now
        decision_id = self.next_id
        self.next_id += 1
        self.counter_dirty = True
        decision = pb.Decision(id=decision_id, cycle_id=cycle_id, backend=backend, term=self.term)
        decision.created.FromNanoseconds(int(now * 1e9))  # what convert.timestamp gives, in place
        deadline = 0.0
        if bind is not None:
            decision.bind.CopyFrom(bind)
            deadline = now + self.bind_timeout
            decision.deadline.FromNanoseconds(int(deadline * 1e9))
        elif evict is not None:
            decision.evict.CopyFrom(evict)
        kind = "bind" if bind is not None else "evict"
        if self.observer is not None:
            self.observer.on_issue(decision, kind)
        row = DecisionRow(
            decision_id, backend, cycle_id, task_id, kind, b"", "pending", "", deadline
        )
        self.pending[decision_id] = PendingDecision(row, decision)
        self.dirty[decision_id] = row
        self.unsent[decision_id] = decision
        return decision

    def take_unsent(self) -> list[pb.Decision]:
        """The decisions issued since the last call, to ``release`` once written."""
        held = list(self.unsent.values())
        self.unsent.clear()
        return held

    def release(self, decisions: Iterable[pb.Decision]) -> None:
        """Offer written decisions to their backends' subscribers (those still pending: one
        settled meanwhile, e.g. cancelled, is not sent)."""
        for decision in decisions:
            if decision.id not in self.pending:
                continue
            subs = self._subscribers.get(decision.backend)
            if not subs:
                continue
            for sub in list(subs):
                if not sub.offer(decision):
                    subs.discard(sub)

    def settle(self, decision_id: int, state: str, reason: str = "") -> PendingDecision | None:
        """Record the outcome (applied | rejected | expired) of a pending decision."""
        pending = self.pending.pop(decision_id, None)
        if pending is None:
            return None
        self.unsent.pop(decision_id, None)
        pending.row.state = state
        pending.row.reason = reason
        if self.observer is not None:
            self.observer.on_settle(pending.decision, pending.row.kind, state)
        if not pending.row.payload:
            pending.row.payload = pending.decision.SerializeToString()
        self.dirty[decision_id] = pending.row
        self.recent[decision_id] = (pending.row.backend, state, pending.row.payload)
        if len(self.recent) > RECENT_OUTCOMES:
            self.recent.popitem(last=False)
        return pending

    def restore(self, rows: Iterable[DecisionRow], now: float) -> None:
        """Reload unacknowledged decisions after a restart.

        Bind deadlines restart from ``now``: backends need time to reconnect before their binds
        may expire.
        """
        for row in rows:
            decision = pb.Decision.FromString(row.payload)
            if row.kind == "bind":
                row.deadline = now + self.bind_timeout
                decision.deadline.FromNanoseconds(
                    int(row.deadline * 1e9)
                )  # convert.timestamp, in place
                self.dirty[row.id] = row
            self.pending[row.id] = PendingDecision(row, decision)

    def adopt(self, term: int, now: float) -> None:
        """A new leader takes over the pending decisions of the log it caught up with: they carry
        its term from now on (a backend that saw this term refuses lower ones), bind deadlines
        restart from ``now`` (backends need time to reconnect: nothing expires during that grace),
        and all are written again before they are sent."""
        self.term = term
        for decision_id, pending in self.pending.items():
            row, decision = pending.row, pending.decision
            decision.term = term
            if row.kind == "bind":
                row.deadline = now + self.bind_timeout
                decision.deadline.FromNanoseconds(int(row.deadline * 1e9))
            row.payload = b""  # serialized again (with the term) when drained
            self.dirty[decision_id] = row
            self.unsent[decision_id] = decision

    def absorb(self, rows: Iterable[DecisionRow]) -> None:
        """A follower mirrors the leader's log: pending rows are kept, settled ones dropped."""
        for row in rows:
            if row.state == "pending":
                self.pending[row.id] = PendingDecision(row, pb.Decision.FromString(row.payload))
            elif self.pending.pop(row.id, None) is not None or row.id not in self.recent:
                self.recent[row.id] = (row.backend, row.state, row.payload)
                if len(self.recent) > RECENT_OUTCOMES:
                    self.recent.popitem(last=False)
            self.next_id = max(self.next_id, row.id + 1)

    def forget_unwritten(self) -> None:
        """Nothing to write or send (a follower mirrors the store)."""
        self.unsent.clear()
        self.dirty.clear()
        self.counter_dirty = False

    def clear(self) -> None:
        """Forget everything (a server that lost its lease reloads from the store)."""
        self.close_all()
        self.pending.clear()
        self.recent.clear()
        self.forget_unwritten()
        self.term = 0

    def expired(self, now: float) -> list[PendingDecision]:
        return [p for p in self.pending.values() if p.row.kind == "bind" and p.row.deadline <= now]

    def pending_for_task(self, task_id: str) -> list[PendingDecision]:
        return [p for p in self.pending.values() if p.row.task_id == task_id]

    def drain_rows(self) -> list[tuple[Any, ...]]:
        rows = []
        for decision_id, row in self.dirty.items():
            if not row.payload:
                row.payload = self.pending[decision_id].decision.SerializeToString()
            rows.append(row.row())
        self.dirty.clear()
        return rows

    # --- feeds -----------------------------------------------------------------------------------

    def subscribe(self, backend: str, after_id: int) -> Subscriber[pb.Decision]:
        """A new feed subscriber, pre-loaded with the backend's unacked decisions with id > after_id."""
        backlog = sorted(
            (
                p.decision
                for p in self.pending.values()
                if p.row.backend == backend and p.row.id > after_id and p.row.id not in self.unsent
            ),
            key=lambda d: d.id,
        )
        sub: Subscriber[pb.Decision] = Subscriber.open(
            max(DECISION_BUFFER, len(backlog) + DECISION_BUFFER)
        )
        for decision in backlog:
            sub.offer(decision)
        self._subscribers.setdefault(backend, set()).add(sub)
        return sub

    def unsubscribe(self, backend: str, sub: Subscriber[pb.Decision]) -> None:
        self._subscribers.get(backend, set()).discard(sub)
        sub.close()

    def subscriber_count(self, backend: str) -> int:
        return len(self._subscribers.get(backend, ()))

    def close_all(self) -> None:
        for subs in self._subscribers.values():
            for sub in subs:
                sub.close()
        self._subscribers.clear()


class JobWatchHub:
    """WatchJobs fan-out: events are only built when someone is watching."""

    def __init__(self) -> None:
        self._subscribers: set[Subscriber[pb.JobEvent]] = set()
        # The last event's revision (JobEvent.revision): every published event takes the next.
        self.revision = 0

    def __bool__(self) -> bool:
        return bool(self._subscribers)

    def subscribe(self, accepts: Callable[[pb.JobEvent], bool]) -> Subscriber[pb.JobEvent]:
        sub: Subscriber[pb.JobEvent] = Subscriber.open(WATCH_BUFFER, accepts)
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber[pb.JobEvent]) -> None:
        self._subscribers.discard(sub)
        sub.close()

    def publish(self, event: pb.JobEvent) -> None:
        self.revision += 1
        event.revision = self.revision
        for sub in list(self._subscribers):
            if sub.accepts(event) and not sub.offer(event):
                self._subscribers.discard(sub)

    def close_all(self) -> None:
        for sub in self._subscribers:
            sub.close()
        self._subscribers.clear()
