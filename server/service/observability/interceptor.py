"""A grpc.aio server interceptor: a span per unary RPC, request counts and latency per method.

The opentelemetry-instrumentation-grpc package targets the sync server; this small interceptor
does what Muster needs on grpc.aio: it continues a caller's W3C trace context (``traceparent``
metadata), makes the RPC span current while the handler runs (so logs and decisions issued by
the handler carry it), records the status code, and lets hooks see request and response (the
SubmitJob hook remembers the submission's span for the cycle that will place the job).
Streaming RPCs (decision feeds, watches) live for hours: they are counted, not traced.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeAlias, cast

import grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from muster.tracing import extract
from server.service.observability.metrics import ServerMetrics

# grpc.aio's handler types. types-grpcio types RpcMethodHandler's behaviours for the sync server;
# on grpc.aio they are coroutine / async-generator functions taking grpc.aio.ServicerContext.
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"

# (request, response, span) after a successful unary call.
ResponseHook = Callable[[Any, Any, trace.Span], None]

TRACED_PREFIX = "/muster.v1."


def status_name(context: Context, default: grpc.StatusCode) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):
        for candidate in grpc.StatusCode:
            if candidate.value[0] == code:
                return candidate.name
    return default.name


class TelemetryInterceptor(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        tracer: trace.Tracer | None,
        metrics: ServerMetrics | None,
        hooks: Mapping[str, ResponseHook] | None = None,
    ) -> None:
        self.tracer = tracer
        self.metrics = metrics
        self.hooks = dict(hooks or {})

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(details)
        if handler is None:
            return handler
        method: str = details.method  # "/muster.v1.Scheduler/SubmitJob"
        if handler.unary_unary is not None:
            traced = self.tracer is not None and method.startswith(TRACED_PREFIX)
            metadata = dict(details.invocation_metadata or ()) if traced else {}
            return grpc.unary_unary_rpc_method_handler(
                self._unary(
                    cast(Callable[..., Awaitable[Any]], handler.unary_unary),
                    method,
                    traced,
                    metadata,
                ),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None and self.metrics is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(cast(Callable[..., AsyncIterator[Any]], handler.unary_stream), method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _unary(
        self,
        behavior: Callable[..., Awaitable[Any]],
        method: str,
        traced: bool,
        metadata: Mapping[str, Any],
    ) -> Callable[..., Awaitable[Any]]:
        metrics = self.metrics
        hook = self.hooks.get(method.rsplit("/", 1)[-1])
        service, _, name = method.strip("/").partition("/")

        async def call(request: Any, context: Context) -> Any:
            started = time.perf_counter()
            code = "OK"
            span: trace.Span = trace.INVALID_SPAN
            try:
                if traced:
                    assert self.tracer is not None
                    carrier = {k: v for k, v in metadata.items() if isinstance(v, str)}
                    with self.tracer.start_as_current_span(
                        method.strip("/"),
                        context=extract(carrier),
                        kind=SpanKind.SERVER,
                        attributes={
                            "rpc.system": "grpc",
                            "rpc.service": service,
                            "rpc.method": name,
                        },
                        record_exception=False,
                        set_status_on_exception=False,
                    ) as span:
                        try:
                            response = await behavior(request, context)
                        except BaseException:
                            code = status_name(context, grpc.StatusCode.UNKNOWN)
                            span.set_attribute("rpc.grpc.status_code", code)
                            span.set_status(Status(StatusCode.ERROR, context.details() or code))
                            raise
                        span.set_attribute("rpc.grpc.status_code", "OK")
                else:
                    try:
                        response = await behavior(request, context)
                    except BaseException:
                        code = status_name(context, grpc.StatusCode.UNKNOWN)
                        raise
                if hook is not None:
                    hook(request, response, span)
                return response
            finally:
                if metrics is not None:
                    metrics.api_request(name or method, code, time.perf_counter() - started)

        return call

    def _stream(
        self, behavior: Callable[..., AsyncIterator[Any]], method: str
    ) -> Callable[..., AsyncIterator[Any]]:
        metrics = self.metrics
        assert metrics is not None
        name = method.rsplit("/", 1)[-1]

        async def call(request: Any, context: Context) -> AsyncIterator[Any]:
            code = "OK"
            try:
                async for item in behavior(request, context):
                    yield item
            except BaseException:
                code = status_name(context, grpc.StatusCode.CANCELLED)
                raise
            finally:
                metrics.api_request(name, code, None)

        return call
