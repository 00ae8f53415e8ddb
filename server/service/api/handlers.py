"""The Scheduler service's method handlers, registered from the proto's service descriptor.

What the generated ``add_SchedulerServicer_to_server`` does, except for requests that do not
decode: there grpc would log a full traceback per request and answer UNKNOWN. Here the request
becomes ``UNDECODABLE``, the call is answered INVALID_ARGUMENT naming the message type, and the
event is logged at most once per peer per minute, so a misbehaving client cannot flood the log.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError, Message

from muster.v1 import muster_pb2 as pb

log = structlog.get_logger("muster.api")

SERVICE = pb.DESCRIPTOR.services_by_name["Scheduler"]
LOG_EVERY_SECONDS = 60.0


class _Undecodable:
    """Stands for a request whose bytes are not a valid message."""


UNDECODABLE = _Undecodable()


class _PeerLogLimiter:
    """Allows one log line per peer per period; remembers a bounded number of peers."""

    def __init__(self, period: float, max_peers: int = 10_000) -> None:
        self.period = period
        self.max_peers = max_peers
        self._last: dict[str, float] = {}

    def allow(self, peer: str, now: float) -> bool:
        last = self._last.get(peer)
        if last is not None and now - last < self.period:
            return False
        if len(self._last) >= self.max_peers:
            self._last.clear()  # a flood of distinct peers: start over rather than grow
        self._last[peer] = now
        return True


def _decoder(message: type[Message]) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return message.FromString(data)
        except (DecodeError, RuntimeWarning, ValueError):
            return UNDECODABLE

    return decode


def add_scheduler_service(servicer: Any, server: grpc.aio.Server) -> None:
    """Register every method of the Scheduler service on ``server``."""
    limiter = _PeerLogLimiter(LOG_EVERY_SECONDS)

    async def refuse(
        method: str, type_name: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        peer = context.peer() or "?"
        if limiter.allow(peer, time.monotonic()):
            log.warning(
                "undecodable request",
                method=method,
                peer=peer,
                message=type_name,
                note=f"further ones from this peer are not logged for {LOG_EVERY_SECONDS:.0f} s",
            )
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"request: not a valid {type_name} message"
        )

    def unary(name: str, type_name: str, behaviour: Any) -> Any:
        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if request is UNDECODABLE:
                await refuse(name, type_name, context)
            return await behaviour(request, context)

        return handle

    def streaming(name: str, type_name: str, behaviour: Any) -> Any:
        async def handle(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            if request is UNDECODABLE:
                await refuse(name, type_name, context)
            async for item in behaviour(request, context):
                yield item

        return handle

    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in SERVICE.methods:
        if method.client_streaming:
            raise TypeError(f"{method.name}: client streaming is not supported here")
        request_type = getattr(pb, method.input_type.name)
        response_type = getattr(pb, method.output_type.name)
        behaviour = getattr(servicer, method.name)
        type_name = method.input_type.full_name
        if method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                streaming(method.name, type_name, behaviour),
                request_deserializer=_decoder(request_type),
                response_serializer=response_type.SerializeToString,
            )
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                unary(method.name, type_name, behaviour),
                request_deserializer=_decoder(request_type),
                response_serializer=response_type.SerializeToString,
            )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),)
    )
