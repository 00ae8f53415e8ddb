"""Hostile input: answered INVALID_ARGUMENT / RESOURCE_EXHAUSTED naming the field, never
INTERNAL or UNKNOWN, quickly, and with the state unchanged."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from server_test_helpers import register, rpc_error

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.api import validate
from server.app import ServerHandle
from server.errors import DomainError

INVALID = grpc.StatusCode.INVALID_ARGUMENT
DEEP_YAML = "a: " + "[" * 5000 + "]" * 5000
DEEP_MAPPING = "".join("  " * i + f"k{i}:\n" for i in range(3000)) + "  " * 3000 + "v: 1\n"


@pytest.mark.parametrize("decision_id", [2**63, 2**64 - 1])
async def test_ack_with_a_decision_id_beyond_int64_is_invalid(stub: pb_grpc.SchedulerStub, decision_id: int) -> None:
    await register(stub)
    err = await rpc_error(stub.AckDecisions(pb.AckDecisionsRequest(
        backend="agent-a", acks=[pb.DecisionAck(decision_id=decision_id, applied=True)])))
    assert err.code() == INVALID and "acks[0].decision_id" in (err.details() or "")


async def test_stream_after_a_decision_id_beyond_int64_is_invalid(stub: pb_grpc.SchedulerStub) -> None:
    await register(stub)
    call = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="agent-a", after_decision_id=2**63))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in call:
            break
    assert err.value.code() == INVALID and "after_decision_id" in (err.value.details() or "")


@pytest.mark.parametrize("text", ["-0", "null", "[]", "'x'", "", "42", DEEP_YAML, DEEP_MAPPING])
async def test_update_config_takes_only_a_mapping_that_is_a_configuration(
    stub: pb_grpc.SchedulerStub, text: str
) -> None:
    before = await stub.GetConfig(pb.GetConfigRequest())
    err = await rpc_error(stub.UpdateConfig(pb.UpdateConfigRequest(yaml=text)))
    assert err.code() == INVALID and (err.details() or "").startswith("yaml: ")
    after = await stub.GetConfig(pb.GetConfigRequest())
    assert after == before


@pytest.mark.parametrize("text", [DEEP_YAML, DEEP_MAPPING, "x" * (2 * 1024 * 1024)])
async def test_simulate_refuses_deep_or_huge_documents(stub: pb_grpc.SchedulerStub, text: str) -> None:
    err = await rpc_error(stub.Simulate(pb.SimulateRequest(scenario=text)))
    assert err.code() in (INVALID, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert "scenario" in (err.details() or "")


async def test_undecodable_payload_is_invalid_argument_and_logged_once(server: ServerHandle, capsys) -> None:  # noqa: ANN001
    async with grpc.aio.insecure_channel(server.address) as channel:
        raw = channel.unary_unary("/muster.v1.Scheduler/SubmitJob",
                                  request_serializer=lambda b: b, response_deserializer=lambda b: b)
        codes = []
        for _ in range(5):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await raw(b"\xff\xff\xff\xff\x0f")
            codes.append(err.value.code())
        stub = pb_grpc.SchedulerStub(channel)
        assert (await stub.ListJobs(pb.ListJobsRequest())).jobs == []
    assert codes == [INVALID] * 5
    logged = capsys.readouterr()
    assert (logged.out + logged.err).count("undecodable request") == 1  # 5 requests, one line


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: pb.SubmitJobRequest(job=pb.JobSpec(id="j", annotations={"a": "x" * 70_000})), "job.annotations['a']"),
        (lambda: pb.SubmitJobRequest(job=pb.JobSpec(id="j", annotations={f"k{i}": "v" for i in range(10_001)})),
         "job.annotations: 10001 entries"),
        (lambda: pb.SubmitJobRequest(job=pb.JobSpec(id="j", task_groups=[pb.TaskGroup(
            role="w", replicas=1, command=["x" * 70_000])])), "job.task_groups[0].command[0]"),
        (lambda: pb.AckDecisionsRequest(backend="b", acks=[pb.DecisionAck(decision_id=1)] * 100_001), "acks: 100001 entries"),
        (lambda: pb.GetJobRequest(id="x" * 70_000), "id: 70,000 characters"),
    ],
)
def test_every_request_is_bounded_in_strings_lists_and_maps(build: Any, field: str) -> None:
    with pytest.raises(DomainError) as err:
        validate.check_bounds(build())
    assert err.value.message.startswith(field), err.value.message
    # Documents have their own (larger) bound, checked when parsed.
    validate.check_bounds(pb.UpdateConfigRequest(yaml="#" * 1_000_000))


async def test_an_oversized_field_is_invalid_argument_over_grpc(stub: pb_grpc.SchedulerStub) -> None:
    err = await rpc_error(stub.GetJob(pb.GetJobRequest(id="x" * 70_000)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith("id: 70,000 characters")
