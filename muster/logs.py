"""structlog setup for the server: console or JSON lines on stderr, with trace correlation.

Every line logged while an OpenTelemetry span is current carries ``trace_id`` / ``span_id``
(hex, as Jaeger shows them), so a log line leads to its trace and back. The cycle loop binds
``cycle_id`` for the lines of a cycle (see ``server.service.observability.cycletrace``). Lines from
standard-library loggers (grpc, aiohttp, the OTLP exporter) go through the same renderer.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from opentelemetry import trace

LEVELS = ("debug", "info", "warning", "error")


def add_trace_context(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: trace_id / span_id of the current span (nothing without tracing)."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event.setdefault("trace_id", format(ctx.trace_id, "032x"))
        event.setdefault("span_id", format(ctx.span_id, "016x"))
    return event


class _CurrentStderr:
    """Whatever ``sys.stderr`` is when a line is written (tests and embedders replace it), so a
    logger configured once never writes to a stream someone closed since."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def configure_logging(fmt: str = "console", level: str = "info", *, cache: bool = True) -> None:
    """structlog to stderr: readable on a terminal, one JSON object per line with ``json``.
    ``cache``: bind loggers once (servers); a short-lived embedder (the CLI, tests) passes False so
    a later reconfiguration (e.g. ``structlog.testing.capture_logs``) still reaches them."""
    if fmt not in ("console", "json"):
        raise ValueError(f"log format {fmt!r}: expected console or json")
    renderer: structlog.typing.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_trace_context,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info if fmt == "json" else structlog.dev.set_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=cache,
    )
    # Standard-library loggers (grpc, aiohttp, opentelemetry) render the same way; warnings and up
    # only, so a chatty library cannot flood the log.
    handler = logging.StreamHandler(_CurrentStderr())
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(logging.WARNING, getattr(logging, level.upper())))
