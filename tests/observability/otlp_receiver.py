"""An in-test OTLP trace receiver: a grpc.aio server implementing opentelemetry-proto's
TraceService on a free loopback port. It keeps every span it receives, flattened."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tsp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tsg
from opentelemetry.proto.common.v1 import common_pb2


def any_value(v: common_pb2.AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str, dict[str, Any]]]  # (trace_id, span_id, attributes)
    status_code: int
    service: str = ""
    resource: dict[str, Any] = field(default_factory=dict)


class Receiver(tsg.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def Export(
        self, request: tsp.ExportTraceServiceRequest, context: Any
    ) -> tsp.ExportTraceServiceResponse:
        for rs in request.resource_spans:
            resource = attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(
                        ReceivedSpan(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            attributes=attrs(s.attributes),
                            events=[(e.name, attrs(e.attributes)) for e in s.events],
                            links=[
                                (lk.trace_id.hex(), lk.span_id.hex(), attrs(lk.attributes))
                                for lk in s.links
                            ],
                            status_code=s.status.code,
                            service=str(resource.get("service.name", "")),
                            resource=resource,
                        )
                    )
        return tsp.ExportTraceServiceResponse()

    async def start(self) -> Receiver:
        self.server = grpc.aio.server()
        tsg.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return self

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)

    # --- queries -------------------------------------------------------------------------------

    def named(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name == name]

    def children(self, parent: ReceivedSpan) -> list[ReceivedSpan]:
        return sorted(
            (
                s
                for s in self.spans
                if s.trace_id == parent.trace_id and s.parent_span_id == parent.span_id
            ),
            key=lambda s: s.start_ns,
        )
