"""Traces arrive at an OTLP receiver: cycle structure, attributes, the SubmitJob -> cycle link,
decision trace context and its continuation by the adapter runtime."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from adapters.runtime import BackendRuntime
from muster.tracing import normalize_endpoint, tracing_settings
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.model import CycleResult, Explanation, JobOutcome, PodGroupPhase
from server.service.app import ServerHandle, start_server
from server.service.observability.cycletrace import CycleObservation

from .conftest import (
    WAIT,
    flush,
    flush_until,
    gang,
    next_cycle,
    node,
    options,
    read_decisions,
    register,
)
from .otlp_receiver import ReceivedSpan, Receiver

SERVER_KIND = 2  # opentelemetry.proto SPAN_KIND_SERVER
STATUS_ERROR = 2


def cycle_placing(receiver: Receiver, tasks: int) -> ReceivedSpan:
    roots = [
        s for s in receiver.named("cycle") if s.attributes.get("muster.cycle.tasks_placed") == tasks
    ]
    assert roots, (
        f"no cycle span placed {tasks} tasks; got {[s.attributes for s in receiver.named('cycle')]}"
    )
    return roots[0]


def parse_traceparent(value: str) -> tuple[str, str]:
    version, trace_id, span_id, flags = value.split("-")
    assert version == "00"
    assert len(trace_id) == 32
    assert len(span_id) == 16
    return trace_id, span_id


# --- settings -------------------------------------------------------------------------------------


def test_tracing_is_off_by_default_and_follows_otel_env() -> None:
    assert tracing_settings(None, "muster-server", env={}) is None
    on = tracing_settings(
        None, "muster-server", env={"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"}
    )
    assert on is not None
    assert on.endpoint == "http://collector:4317"
    assert on.insecure
    traces_only = tracing_settings(
        None,
        "m",
        env={
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c:4317",
            "OTEL_SERVICE_NAME": "sched-a",
        },
    )
    assert traces_only is not None
    assert not traces_only.insecure
    assert traces_only.service_name == "sched-a"
    flag = tracing_settings("127.0.0.1:4317", "m", env={})
    assert flag is not None
    assert flag.endpoint == "http://127.0.0.1:4317"
    assert tracing_settings("127.0.0.1:4317", "m", env={"OTEL_SDK_DISABLED": "true"}) is None
    assert tracing_settings("127.0.0.1:4317", "m", env={"OTEL_TRACES_EXPORTER": "none"}) is None
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        tracing_settings("h:4318", "m", env={"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    assert normalize_endpoint("http://x:1") == ("http://x:1", True)


async def test_tracing_off_installs_nothing(tmp_path: Path) -> None:
    handle = await start_server(options(tmp_path))
    try:
        telemetry = handle.server.telemetry
        assert telemetry is not None
        assert telemetry.tracer is None
        assert telemetry.metrics is None
        assert telemetry.interceptors() == []
        async with grpc.aio.insecure_channel(handle.address) as channel:
            stub = pb_grpc.SchedulerStub(channel)
            await register(stub, nodes=[node("n1")])
            stream = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="agent-a"))
            await stub.SubmitJob(pb.SubmitJobRequest(job=gang("j1", replicas=1)))
            [decision] = await read_decisions(stream, 1)
            stream.cancel()
        assert dict(decision.trace_context) == {}
    finally:
        await handle.stop()


# --- one traced cycle -------------------------------------------------------------------------------


async def test_cycle_trace_structure_link_and_decision_context(
    traced: ServerHandle, stub: pb_grpc.SchedulerStub, receiver: Receiver
) -> None:
    await register(stub, nodes=[node("n1", cpu="8"), node("n2", cpu="8")])
    stream = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="agent-a"))
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("train", replicas=3, cpu="2")))
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("too-big", replicas=1, cpu="64")))
    decisions = await read_decisions(stream, 3)
    stream.cancel()
    await next_cycle(traced)
    await flush(traced)

    submit = list(receiver.named("muster.v1.Scheduler/SubmitJob"))
    assert len(submit) == 2
    assert all(s.kind == SERVER_KIND and s.attributes["rpc.method"] == "SubmitJob" for s in submit)
    assert all(s.attributes["rpc.grpc.status_code"] == "OK" for s in submit)

    root = cycle_placing(receiver, 3)
    assert root.parent_span_id == ""
    assert root.attributes["muster.cycle.nodes"] == 2
    assert root.attributes["muster.cycle.jobs"] >= 1
    assert root.attributes["muster.cycle.id"] >= 1
    assert root.attributes["muster.cycle.evictions"] == 0
    names = [c.name for c in receiver.children(root)]
    assert names[0] == "snapshot"
    assert names[1] == "session.open"
    assert "action.allocate" in names
    assert "action.enqueue" in names
    assert (
        names.index("action.enqueue")
        < names.index("action.allocate")
        < names.index("session.close")
    )
    assert names[-2:] == ["apply", "store.flush"]
    for child in receiver.children(root):  # children lie within the cycle
        assert root.start_ns <= child.start_ns <= child.end_ns <= root.end_ns, child.name
    session_open = next(c for c in receiver.children(root) if c.name == "session.open")
    assert "muster.plugin.gang.ms" in session_open.attributes

    # The cycle links to the submission of the job it placed.
    train_submit = next(s for s in submit if s.span_id in {lk[1] for lk in root.links})
    link = next(lk for lk in root.links if lk[1] == train_submit.span_id)
    assert link[0] == train_submit.trace_id
    assert link[2]["muster.job.id"] == "train"
    assert ("job.placed", {"muster.job.id": "train"}) in root.events
    pending = [attrs for name, attrs in root.events if name == "job.pending"]
    assert any(a["muster.job.id"] == "too-big" and a["muster.job.gate"] for a in pending)
    assert root.attributes["muster.cycle.jobs_placed"] == 1

    # Decisions carry the apply span's context.
    apply = next(c for c in receiver.children(root) if c.name == "apply")
    for decision in decisions:
        trace_id, span_id = parse_traceparent(decision.trace_context["traceparent"])
        assert (trace_id, span_id) == (root.trace_id, apply.span_id)


async def test_rpc_span_continues_caller_context_and_records_errors(
    traced: ServerHandle, stub: pb_grpc.SchedulerStub, receiver: Receiver
) -> None:
    caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    caller_span = "00f067aa0ba902b7"
    metadata = (("traceparent", f"00-{caller_trace}-{caller_span}-01"),)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetJob(pb.GetJobRequest(id="nope"), metadata=metadata)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    await flush_until(traced, lambda: bool(receiver.named("muster.v1.Scheduler/GetJob")))
    [span] = receiver.named("muster.v1.Scheduler/GetJob")
    assert (span.trace_id, span.parent_span_id) == (caller_trace, caller_span)
    assert span.attributes["rpc.grpc.status_code"] == "NOT_FOUND"
    assert span.status_code == STATUS_ERROR


# --- the adapter continues the trace -------------------------------------------------------------------


class RecordingBackend:
    def __init__(self, nodes: Sequence[pb.Node]) -> None:
        self.nodes = list(nodes)
        self.bound: list[str] = []

    async def list_nodes(self) -> Sequence[pb.Node]:
        return self.nodes

    async def list_tasks(self) -> Sequence[pb.BackendTask]:
        return []

    async def apply_bind(self, decision: pb.Decision) -> None:
        self.bound.append(decision.bind.task_id)

    async def apply_evict(self, decision: pb.Decision) -> None:
        return None


async def test_adapter_apply_span_is_a_child_of_the_cycle_apply_span(
    traced: ServerHandle, stub: pb_grpc.SchedulerStub, receiver: Receiver
) -> None:
    adapter_spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(adapter_spans))
    backend = RecordingBackend([node("n1", cpu="8")])
    runtime = BackendRuntime(
        backend,
        server=traced.address,
        name="rack-a",
        tracer_provider=provider,
        batch_linger=0.01,
        flush_interval=0.01,
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        with anyio.fail_after(WAIT):
            await runtime.wait_ready()
        await stub.SubmitJob(pb.SubmitJobRequest(job=gang("j", replicas=2, cpu="1")))
        with anyio.fail_after(WAIT):
            while len(backend.bound) < 2:
                await anyio.sleep(0.02)
        runtime.stop()
    await flush(traced)
    root = cycle_placing(receiver, 2)
    apply = next(c for c in receiver.children(root) if c.name == "apply")
    spans = [s for s in adapter_spans.get_finished_spans() if s.name == "apply_bind"]
    assert len(spans) == 2
    for span in spans:
        assert format(span.context.trace_id, "032x") == root.trace_id
        assert span.parent is not None
        assert format(span.parent.span_id, "016x") == apply.span_id
        assert span.attributes["muster.backend"] == "rack-a"
        assert span.attributes["muster.decisions.rejected"] == 0


# --- bounded per-job detail (unit level) ----------------------------------------------------------------


def test_job_events_and_links_are_bounded_on_a_big_cycle() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    submitter = tracer.start_span("submit")
    submitter.end()
    result = CycleResult(7)
    for i in range(10_000):
        result.jobs[f"job-{i}"] = JobOutcome(
            PodGroupPhase.INQUEUE,
            explanation=Explanation("placement", "0/3 nodes are unavailable: 3 Insufficient cpu."),
        )
    placed = [f"placed-{i}" for i in range(200)]
    obs = CycleObservation(
        7,
        tracer=tracer,
        metrics=None,
        attributes={},
        max_job_events=50,
        max_links=20,
        submission_of=lambda _job: submitter.get_span_context(),
        placed_of=lambda _r: placed,
    )
    with obs:
        obs.snapshot_done()
        obs.core_done()
        with obs.applying():
            pass
        obs.finish(result, binds=200, evictions=0, dropped=0)
    [root] = [s for s in exporter.get_finished_spans() if s.name == "cycle"]
    assert len(root.events) == 50
    assert root.attributes["muster.events.omitted"] == 10_200 - 50
    assert len(root.links) == 20
    assert root.attributes["muster.links.omitted"] == 180
    assert root.attributes["muster.cycle.pending.placement"] == 10_000
    assert root.attributes["muster.cycle.jobs_pending"] == 10_000


def test_a_failed_cycle_ends_its_span_with_an_error() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    obs = CycleObservation(3, tracer=provider.get_tracer("t"), metrics=None, attributes={})
    with pytest.raises(RuntimeError), obs:
        raise RuntimeError("core bug")
    [root] = exporter.get_finished_spans()
    assert root.name == "cycle"
    assert not root.status.is_ok
    assert any(e.name == "exception" for e in root.events)
