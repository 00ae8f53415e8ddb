"""/metrics: series exist with Volcano's names and their values follow jobs, decisions and RPCs."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import anyio
import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service import ingest
from server.service.app import ServerHandle, start_server
from server.service.observability.http import split_listen
from server.service.observability.metrics import exponential_buckets_range

from .conftest import WAIT, gang, next_cycle, node, options, read_decisions, register

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(handle: ServerHandle) -> Samples:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{handle.metrics_port}/metrics") as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
async def metered(tmp_path: Path) -> ServerHandle:
    handle = await start_server(options(tmp_path, metrics_listen="127.0.0.1:0"))
    try:
        yield handle  # type: ignore[misc]
    finally:
        await handle.stop()


def test_volcano_bucket_layout_and_listen_parsing() -> None:
    buckets = exponential_buckets_range(1, 5000, 20)
    assert len(buckets) == 20
    assert buckets[0] == pytest.approx(1)
    assert buckets[-1] == pytest.approx(5000)
    assert split_listen("0.0.0.0:9090") == ("0.0.0.0", 9090)
    assert split_listen("[::1]:9090") == ("::1", 9090)
    for bad in ("9090", "host:", "host:port"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            split_listen(bad)


async def test_metrics_follow_jobs_decisions_and_requests(metered: ServerHandle) -> None:
    assert metered.metrics_port > 0
    async with grpc.aio.insecure_channel(metered.address) as channel:
        stub = pb_grpc.SchedulerStub(channel)
        await stub.CreateQueue(
            pb.QueueRequest(
                queue=pb.Queue(
                    name="team",
                    capability=pb.ResourceList(quantities={"cpu": "10", "nvidia.com/gpu": "2"}),
                )
            )
        )
        await register(stub, nodes=[node("n1", cpu="4")])
        before = await scrape(metered)
        assert value(before, "muster_backends_registered", kind="fake-agent") == 1
        assert value(before, "muster_backends_connected", kind="fake-agent") == 0
        assert value(before, "volcano_queue_capacity_milli_cpu", queue_name="team") == 10_000
        assert (
            value(
                before,
                "volcano_queue_capacity_scalar_resources",
                queue_name="team",
                resource="nvidia.com/gpu",
            )
            == 2_000
        )
        assert value(before, "volcano_queue_allocated_milli_cpu", queue_name="team") == 0

        stream = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="agent-a"))
        with anyio.fail_after(WAIT):  # the subscription is registered once the stream starts
            while value(await scrape(metered), "muster_backends_connected", kind="fake-agent") != 1:
                await anyio.sleep(0.02)

        await stub.SubmitJob(
            pb.SubmitJobRequest(job=gang("fits", replicas=2, cpu="1", queue="team"))
        )
        await stub.SubmitJob(
            pb.SubmitJobRequest(job=gang("huge", replicas=3, cpu="64", queue="team"))
        )
        decisions = await read_decisions(stream, 2)
        await next_cycle(metered)
        during = await scrape(metered)
        assert value(during, "muster_jobs", queue="team", phase="Running") == 1
        assert value(during, "muster_tasks", queue="team", status="Binding") == 2
        assert value(during, "muster_tasks", queue="team", status="Pending") == 3
        assert value(during, "volcano_queue_allocated_milli_cpu", queue_name="team") == 2_000
        assert value(during, "volcano_unschedule_job_count") == 1
        assert value(during, "volcano_unschedule_task_count", job_id="huge") == 3
        assert value(during, "volcano_unschedule_task_count", job_id="fits") == 0
        assert (
            sum(
                v
                for (n, labels), v in during.items()
                if n == "muster_unschedulable_jobs" and ("queue", "team") in labels
            )
            == 1
        )
        assert value(during, "muster_decisions_issued_total", type="bind") == 2
        assert value(during, "muster_decisions_pending", type="bind") == 2
        assert value(during, "muster_api_requests_total", method="SubmitJob", code="OK") == 2
        assert value(during, "volcano_e2e_scheduling_latency_milliseconds_count") >= 1
        assert (
            value(during, "volcano_action_scheduling_latency_milliseconds_count", action="allocate")
            >= 1
        )
        assert (
            value(
                during,
                "volcano_plugin_scheduling_latency_milliseconds_count",
                plugin="gang",
                OnSession="OnSessionOpen",
            )
            >= 1
        )
        assert value(during, "muster_cycles_total", result="ok") >= 1
        assert value(during, "muster_cycle_binds_total") == 2

        first, second = decisions
        await stub.AckDecisions(
            pb.AckDecisionsRequest(
                backend="agent-a",
                acks=[
                    pb.DecisionAck(decision_id=first.id, applied=True),
                    pb.DecisionAck(decision_id=second.id, applied=False, reason="node full"),
                ],
            )
        )
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.GetJob(pb.GetJobRequest(id="missing"))
        stream.cancel()
        after = await scrape(metered)
        assert value(after, "muster_decisions_total", type="bind", outcome="applied") == 1
        assert value(after, "muster_decisions_total", type="bind", outcome="rejected") == 1
        assert value(after, "muster_decision_ack_latency_seconds_count", type="bind") == 2
        assert value(after, "muster_decisions_pending", type="bind") == 0
        assert value(after, "muster_api_requests_total", method="GetJob", code="NOT_FOUND") == 1
        assert value(after, "muster_api_requests_total", method="AckDecisions", code="OK") == 1
        # The rejected bind sends the gang back to Pending; the applied task is released too.
        assert (
            value(after, "muster_tasks", queue="team", status="Bound")
            + value(after, "muster_tasks", queue="team", status="Releasing")
            + value(after, "muster_tasks", queue="team", status="Pending")
            == 5
        )


async def test_expired_binds_are_counted(metered: ServerHandle) -> None:
    async with grpc.aio.insecure_channel(metered.address) as channel:
        stub = pb_grpc.SchedulerStub(channel)
        await register(stub, nodes=[node("n1", cpu="4")])
        await stub.SubmitJob(pb.SubmitJobRequest(job=gang("j", replicas=1, cpu="1")))
        await next_cycle(metered)
        assert value(await scrape(metered), "muster_decisions_pending", type="bind") == 1
        expired = ingest.expire(metered.state, now=metered.state.clock() + 3600)
        assert expired == 1
        samples = await scrape(metered)
        assert value(samples, "muster_decisions_total", type="bind", outcome="expired") == 1
        assert value(samples, "muster_decision_ack_latency_seconds_count", type="bind") == 0


async def test_metrics_port_in_use_fails_startup(tmp_path: Path, metered: ServerHandle) -> None:
    (tmp_path / "other").mkdir()
    # A bare OSError, or the OSError inside a task group's exception group.
    with pytest.raises((OSError, BaseExceptionGroup)) as failure:
        await start_server(
            options(tmp_path / "other", metrics_listen=f"127.0.0.1:{metered.metrics_port}")
        )
    error = failure.value
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    assert isinstance(error, OSError), failure.value
    assert "cannot serve metrics" in str(error), failure.value
