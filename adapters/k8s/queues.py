"""Volcano ``Queue`` objects mirrored as Muster queues.

Every Queue the informer sees is created (or updated) on the server, ``root`` first; a deleted
Queue is deleted there. A queue the server refuses is logged and skipped; when the server is away
the queue stays dirty and is retried with backoff.
"""

from __future__ import annotations

import anyio
import grpc
import structlog

from adapters.k8s import translate as tr
from adapters.k8s.common import ITEM_ERRORS, Obj, ServerLink, WorkQueue, server_backoff
from adapters.k8s.informer import Informer
from muster.v1 import muster_pb2 as pb

log = structlog.get_logger("muster.k8s")


class QueueController:
    """Keeps the server's queues in step with the cluster's Volcano Queues."""

    def __init__(self, server: ServerLink, *, queues: Informer) -> None:
        self.server = server
        self.queues = queues
        self.enabled = False  # set once the first snapshot has pushed every queue
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
        await self.sync({tr.meta(q)["name"] for q in self.queues.cache.values()})

    async def sync(self, names: set[str]) -> None:
        stub = self.server.stub
        for name in sorted(names, key=lambda n: (n != "root", n)):
            self._dirty.keys.discard(name)
            obj = self.queues.cache.get(name)
            try:
                if obj is None:
                    await stub.DeleteQueue(pb.DeleteQueueRequest(name=name))
                    continue
                queue = tr.queue_to_pb(obj)
                try:
                    await stub.CreateQueue(pb.QueueRequest(queue=queue))
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                        raise
                    await stub.UpdateQueue(pb.QueueRequest(queue=queue))
            except grpc.aio.AioRpcError as exc:
                if exc.code() in ITEM_ERRORS:
                    log.warning("queue refused by the server", queue=name, code=exc.code().name, details=exc.details())
                else:
                    self._dirty.add(name)  # server away: retried on the next sync
                    raise
