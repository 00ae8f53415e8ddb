"""Authentication before a request's message is read (audit lines: server.service.audit).

grpc reads a unary request's whole message (up to the server's size limit, 64 MiB) before the
handler runs, so a caller with no credentials could make the server hold 64 MiB per call just by
sending. Under an auth policy this interceptor looks at what arrives before the message: a bearer
token the policy knows lets the call through unchanged; otherwise the call is turned into a
request-streaming one (the same bytes on the wire) whose first step checks the peer's certificate
against the policy and, when it names nobody, refuses with UNAUTHENTICATED without asking for the
message -- HTTP/2 flow control then keeps the rest of it on the client's side.

Health checks stay open (load balancers and kubelets probe without credentials); reflection, like
every Muster RPC, needs an identity.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, cast

import grpc
import structlog

from server.service.audit import audit
from server.service.auth import Policy, bearer_token, peer_name

log = structlog.get_logger("muster.service")

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
UNAUTHENTICATED_MESSAGE = (
    "authorization: a valid bearer token is required (metadata 'authorization: Bearer ...'), "
    "or a client certificate the auth policy maps to an identity"
)

# A method handler's behaviours as grpc.aio calls them. types-grpcio types RpcMethodHandler for the
# sync server (plain functions over iterators, taking grpc.ServicerContext); on grpc.aio they are
# coroutine and async-generator functions taking grpc.aio.ServicerContext, hence the casts below.
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
UnaryUnary: TypeAlias = Callable[[Any, Context], Awaitable[Any]]
UnaryStream: TypeAlias = Callable[[Any, Context], AsyncIterator[Any]]
StreamUnary: TypeAlias = Callable[[AsyncIterator[Any], Context], Awaitable[Any]]
StreamStream: TypeAlias = Callable[[AsyncIterator[Any], Context], AsyncIterator[Any]]


class AuthGate(grpc.aio.ServerInterceptor):
    """Refuses calls with no identity under ``policy`` before their request message is read."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(details)
        method: str = details.method
        if handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        metadata = tuple(details.invocation_metadata or ())
        if bearer_token(metadata) and self.policy.authenticate(metadata) is not None:
            return handler  # the common case: nothing added to the call
        return self._certificate_first(handler, method)

    async def _admit(self, method: str, context: Context) -> None:
        if self.policy.from_certificate(context.auth_context()) is not None:
            return  # the service identifies the caller fully (and checks a token against it)
        audit(
            peer_name(context.auth_context()),
            method.rsplit("/", 1)[-1],
            "UNAUTHENTICATED",
            "no valid token, no certificate the policy maps",
        )
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)

    def _certificate_first(self, handler: Handler, method: str) -> Handler:
        admit = self._admit
        kinds = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            unary_unary = cast(UnaryUnary, handler.unary_unary)

            async def unary_response(requests: AsyncIterator[Any], context: Context) -> Any:
                await admit(method, context)
                return await unary_unary(await _single(requests, context), context)

            return grpc.stream_unary_rpc_method_handler(unary_response, **kinds)
        if handler.unary_stream is not None:
            unary_stream = cast(UnaryStream, handler.unary_stream)

            async def stream_response(
                requests: AsyncIterator[Any], context: Context
            ) -> AsyncIterator[Any]:
                await admit(method, context)
                async for item in unary_stream(await _single(requests, context), context):
                    yield item

            return grpc.stream_stream_rpc_method_handler(stream_response, **kinds)
        if handler.stream_stream is not None:  # reflection
            stream_stream = cast(StreamStream, handler.stream_stream)

            async def streams(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
                await admit(method, context)
                async for item in stream_stream(requests, context):
                    yield item

            return grpc.stream_stream_rpc_method_handler(streams, **kinds)
        stream_unary = cast(StreamUnary, handler.stream_unary)  # the one kind left: never None here

        async def unary_of_stream(requests: AsyncIterator[Any], context: Context) -> Any:
            await admit(method, context)
            return await stream_unary(requests, context)

        return grpc.stream_unary_rpc_method_handler(unary_of_stream, **kinds)


async def _single(requests: AsyncIterator[Any], context: Context) -> Any:
    """The one message of a unary call read as a stream."""
    async for request in requests:
        return request
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request: no message")
    return None
