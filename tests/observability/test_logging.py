"""Log lines in a cycle carry cycle_id and the trace ids; JSON rendering; stdlib loggers alike."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import structlog
from opentelemetry.sdk.trace import TracerProvider

from muster.logs import configure_logging
from server.model import CycleResult
from server.service.observability.cycletrace import CycleObservation


@pytest.fixture
def restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        structlog.configure(**saved)
        root.handlers[:] = handlers
        root.setLevel(level)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_cycle_lines_carry_cycle_and_trace_ids(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("json", "info")
    log = structlog.get_logger("test.cycle")
    tracer = TracerProvider().get_tracer("t")
    obs = CycleObservation(41, tracer=tracer, metrics=None, attributes={})
    with obs:
        log.info("inside.cycle", binds=3)
        with obs.applying():
            log.info("inside.apply")
        obs.finish(CycleResult(41), binds=0, evictions=0, dropped=0)
    log.info("after.cycle")
    lines = {line["event"]: line for line in json_lines(capsys.readouterr().err)}
    root_ctx = obs.root.get_span_context()
    inside = lines["inside.cycle"]
    assert inside["cycle_id"] == 41
    assert inside["level"] == "info"
    assert inside["binds"] == 3
    assert inside["trace_id"] == format(root_ctx.trace_id, "032x")
    assert inside["span_id"] == format(root_ctx.span_id, "016x")
    applying = lines["inside.apply"]
    assert applying["trace_id"] == inside["trace_id"]
    assert applying["span_id"] == format(obs.apply_span.get_span_context().span_id, "016x")
    assert "cycle_id" not in lines["after.cycle"]
    assert "trace_id" not in lines["after.cycle"]


def test_without_tracing_lines_have_cycle_id_only(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("json", "info")
    with CycleObservation(5, tracer=None, metrics=None, attributes={}):
        structlog.get_logger("t").info("quiet")
    [line] = json_lines(capsys.readouterr().err)
    assert line["cycle_id"] == 5
    assert "trace_id" not in line


def test_stdlib_loggers_render_as_json_and_debug_is_filtered(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("json", "info")
    logging.getLogger("grpc.something").warning("library says %s", "hi")
    logging.getLogger("grpc.something").info("too chatty")
    structlog.get_logger("t").debug("hidden")
    lines = json_lines(capsys.readouterr().err)
    assert [line["event"] for line in lines] == ["library says hi"]
    assert lines[0]["logger"] == "grpc.something"
    assert lines[0]["level"] == "warning"
    with pytest.raises(ValueError, match="log format"):
        configure_logging("xml", "info")
