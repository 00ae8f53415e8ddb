"""OpenTelemetry tracing: provider setup from ``--otlp-endpoint`` / ``OTEL_*``, and W3C propagation.

Tracing is off unless an OTLP endpoint is configured (``--otlp-endpoint`` or
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); ``OTEL_SDK_DISABLED=true``
or ``OTEL_TRACES_EXPORTER=none`` turn it off again. Off means no SDK provider exists at all: the
tracer is the API's no-op tracer and the server skips building cycle spans.

Each server builds its *own* ``TracerProvider`` (not the global one), so several servers in one
process (tests) export to different places. Everything else the SDK reads from the environment
still applies: ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``,
``OTEL_BSP_*`` (batching), ``OTEL_EXPORTER_OTLP_HEADERS`` / ``_TIMEOUT`` / ``_COMPRESSION`` ...
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRUE = frozenset({"1", "true", "yes", "on"})
PROPAGATOR = TraceContextTextMapPropagator()


@dataclass(frozen=True)
class TracingSettings:
    """Where spans go; ``None`` from :func:`tracing_settings` means tracing is off."""

    endpoint: str  # grpc endpoint URL, e.g. http://127.0.0.1:4317
    service_name: str
    insecure: bool


def normalize_endpoint(endpoint: str) -> tuple[str, bool]:
    """``host:port`` -> ``http://host:port`` (plaintext, like a local collector or Jaeger);
    an explicit ``https://`` keeps TLS. Returns (url, insecure)."""
    endpoint = endpoint.strip()
    if endpoint.startswith("https://"):
        return endpoint, False
    if endpoint.startswith("http://"):
        return endpoint, True
    return f"http://{endpoint}", True


def tracing_settings(
    otlp_endpoint: str | None, service_name: str, env: Mapping[str, str] | None = None
) -> TracingSettings | None:
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in TRUE:
        return None
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    if "none" in exporters or "otlp" not in exporters:
        return None
    endpoint = (
        otlp_endpoint
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )
    if not endpoint:
        return None
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    )
    if protocol != "grpc":
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: only 'grpc' is supported")
    url, insecure = normalize_endpoint(endpoint)
    if env.get("OTEL_EXPORTER_OTLP_INSECURE", "").strip().lower() in TRUE:
        insecure = True
    return TracingSettings(url, env.get("OTEL_SERVICE_NAME") or service_name, insecure)


def build_provider(
    settings: TracingSettings, exporter: SpanExporter | None = None
) -> TracerProvider:
    """An SDK provider exporting over OTLP/gRPC in batches (off the event loop, in the SDK's
    worker thread). An unreachable collector costs a failed export per batch, never a cycle."""
    if exporter is None:
        # Imported only when tracing is on: the exporter loads its protobuf/gRPC stack (~0.3 s).
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.endpoint, insecure=settings.insecure)
    resource = Resource.create({SERVICE_NAME: settings.service_name})
    # Cycle spans carry bounded events and links (see cycletrace); the SDK limits are a backstop.
    provider = TracerProvider(
        resource=resource, span_limits=SpanLimits(max_events=256, max_links=256)
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def provider_from_env(service_name: str, otlp_endpoint: str | None = None) -> TracerProvider | None:
    """A provider if the environment (or ``otlp_endpoint``) asks for tracing, else None."""
    settings = tracing_settings(otlp_endpoint, service_name)
    return build_provider(settings) if settings is not None else None


# --- W3C trace context in plain string maps (Decision.trace_context, gRPC metadata) --------------


def inject_current() -> dict[str, str]:
    """The current span's context as ``traceparent`` (+ ``tracestate``); {} without a span."""
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str]) -> otel_context.Context:
    """A context whose parent is the remote span in ``carrier`` (empty context if none)."""
    return PROPAGATOR.extract(dict(carrier))
