"""Volcano and KAI ``Queue`` objects mirrored as Muster queues.

Every Queue an informer sees is created (or updated) on the server, ``root`` and parents first; a
deleted Queue is deleted there (unless the other kind still has a Queue of that name: Volcano's
wins). A queue the server refuses is logged and skipped; when the server is away the queue stays
dirty and is retried with backoff.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import grpc
import structlog

from adapters.k8s import translate as tr
from adapters.k8s.common import ITEM_ERRORS, Obj, ServerLink, WorkQueue, server_backoff
from adapters.k8s.informer import Informer
from muster.v1 import muster_pb2 as pb

log = structlog.get_logger("muster.k8s")


class QueueController:
    """Keeps the server's queues in step with the cluster's Volcano (and KAI) Queues."""

    def __init__(
        self, server: ServerLink, *, queues: Informer, kai_queues: Informer | None = None
    ) -> None:
        self.server = server
        # (informer, translation), first match wins
        self.sources: list[tuple[Informer, Callable[[Obj], pb.Queue]]] = [(queues, tr.queue_to_pb)]
        if kai_queues is not None:
            self.sources.append((kai_queues, tr.kai_queue_to_pb))
        self.enabled = False  # set once the first snapshot has pushed every queue
        self.refused: set[str] = set()  # queues the server refused, retried after another change
        self._dirty: WorkQueue[str] = WorkQueue()

    def on_queue(self, kind: str, queue: Obj, old: Obj | None) -> None:
        self._dirty.add(tr.meta(queue)["name"])

    async def run(self) -> None:
        backoff = server_backoff()
        while True:
            await self._dirty.wait()
            if not self.enabled:
                continue
            try:
                await self.sync(set(self._dirty.keys))
                backoff.reset()
            except grpc.aio.AioRpcError as exc:
                delay = backoff.next()
                log.info("queue sync failed, retrying", code=exc.code().name, delay=round(delay, 2))
                await anyio.sleep(delay)
                self._dirty.requeue(set())

    async def sync_all(self) -> None:
        await self.sync(
            {tr.meta(q)["name"] for informer, _ in self.sources for q in informer.cache.values()}
        )

    def desired(self, name: str) -> pb.Queue | None:
        """The Muster queue for ``name`` (Volcano's Queue first, then KAI's), or None."""
        for informer, translate in self.sources:
            obj = informer.cache.get(name)
            if obj is not None:
                return translate(obj)
        return None

    def _depth(self, name: str) -> int:
        depth, seen = 0, {name}
        queue = self.desired(name)
        while queue is not None and queue.parent and queue.parent not in seen:
            seen.add(queue.parent)
            depth += 1
            queue = self.desired(queue.parent)
        return depth

    async def sync(self, names: set[str]) -> None:
        stub = self.server.stub
        changed = False
        # Parents before children (the server refuses a queue whose parent it does not know).
        for name in sorted(names, key=lambda n: (n != "root", self._depth(n), n)):
            self._dirty.keys.discard(name)
            try:
                queue = self.desired(name)
                if queue is None:
                    await stub.DeleteQueue(pb.DeleteQueueRequest(name=name))
                    continue
                try:
                    await stub.CreateQueue(pb.QueueRequest(queue=queue))
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                        raise
                    await stub.UpdateQueue(pb.QueueRequest(queue=queue))
                self.refused.discard(name)
                changed = True
            except grpc.aio.AioRpcError as exc:
                if exc.code() in ITEM_ERRORS:
                    log.warning(
                        "queue refused by the server",
                        queue=name,
                        code=exc.code().name,
                        details=exc.details(),
                    )
                    self.refused.add(name)
                else:
                    self._dirty.add(name)  # server away: retried on the next sync
                    raise
        if changed and self.refused - names:
            # A queue refused earlier (e.g. its parent was missing) may be accepted now.
            self._dirty.requeue(self.refused - names)
