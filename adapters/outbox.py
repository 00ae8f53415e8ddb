"""The runtime's outbox: acks and deltas waiting for the server, sent in order and in batches.

Items are queued whether or not a connection is up (nothing is lost while disconnected) and sent
in their original order: consecutive acks as one ``AckDecisions``, consecutive deltas as one
``SendDeltas``, at most ``max_batch`` per RPC. While a burst of decisions is being applied,
deltas the backend raises are held back and queued after that burst's acks
(:meth:`Outbox.acks_first`), so the server sees "bind acknowledged" before "task Running". A batch
the server refuses as a whole (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION) is retried one
item at a time and the offending items are dropped with a log line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import anyio
import grpc
import structlog

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

log = structlog.get_logger("muster.adapter")

# Server answers meaning "this item is wrong", as opposed to "the connection is broken".
_ITEM_ERRORS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)


@dataclass(slots=True)
class _Item:
    """One queued outbound message: an ack or a delta."""

    ack: pb.DecisionAck | None = None
    delta: pb.Delta | None = None


class Outbox:
    """Acks and deltas of backend ``backend``, in order; see the module docstring."""

    def __init__(self, backend: str, *, max_batch: int = 500, flush_interval: float = 0.05) -> None:
        self.backend = backend
        self.max_batch = max_batch
        self.flush_interval = flush_interval
        self._items: list[_Item] = []
        self._deferred: list[_Item] | None = None  # deltas raised while applying a burst
        self._event = anyio.Event()

    def put_delta(self, delta: pb.Delta) -> None:
        item = _Item(delta=delta)
        if self._deferred is not None:
            self._deferred.append(item)
            return
        self._items.append(item)
        self._event.set()

    @contextmanager
    def acks_first(self, acks: list[pb.DecisionAck]) -> Iterator[None]:
        """Hold back deltas while the body runs; then queue ``acks`` (as the body left the list),
        followed by the held-back deltas."""
        self._deferred = []
        try:
            yield
        finally:
            deferred, self._deferred = self._deferred, None
            self._items.extend(_Item(ack=ack) for ack in acks)
            self._items.extend(deferred)
            self._event.set()

    @property
    def pending(self) -> int:
        return len(self._items) + len(self._deferred or ())

    def has_acks(self) -> bool:
        return any(item.ack is not None for item in self._items)

    async def run(self, stub: pb_grpc.SchedulerStub) -> None:
        """Send whatever is queued, as it is queued (until cancelled or an RPC fails)."""
        while True:
            await self._event.wait()
            self._event = anyio.Event()
            await anyio.sleep(self.flush_interval)  # coalesce a burst into one RPC
            await self.flush(stub)

    async def flush(self, stub: pb_grpc.SchedulerStub) -> None:
        """Send the outbox in order: consecutive acks as one RPC, consecutive deltas as another."""
        while self._items:
            head_is_ack = self._items[0].ack is not None
            run: list[_Item] = []
            for item in self._items:
                if (item.ack is not None) != head_is_ack or len(run) >= self.max_batch:
                    break
                run.append(item)
            await self._send_run(stub, run, head_is_ack)
            # Only drop what was sent: the outbox may have grown while we awaited.
            del self._items[: len(run)]

    async def _send_run(self, stub: pb_grpc.SchedulerStub, run: list[_Item], acks: bool) -> None:
        async def send(items: list[_Item]) -> None:
            if acks:
                await stub.AckDecisions(
                    pb.AckDecisionsRequest(
                        backend=self.backend, acks=[i.ack for i in items if i.ack]
                    )
                )
            else:
                await stub.SendDeltas(
                    pb.SendDeltasRequest(
                        backend=self.backend, deltas=[i.delta for i in items if i.delta]
                    )
                )

        try:
            await send(run)
            return
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in _ITEM_ERRORS:
                raise
            if len(run) == 1:
                log.warning(
                    "server refused item, dropping",
                    backend=self.backend,
                    kind="ack" if acks else "delta",
                    item=_describe(run[0]),
                    code=exc.code().name,
                    details=exc.details(),
                )
                return
        for item in run:  # find the offending item(s); the rest still go through
            await self._send_run(stub, [item], acks)


def _describe(item: _Item) -> str:
    if item.ack is not None:
        return f"ack {item.ack.decision_id}"
    assert item.delta is not None
    return f"delta {item.delta.WhichOneof('change')}"
