"""Through the API: KAI's -1 (unlimited) as a queue's quota (guarantee), a negative over-quota
weight refused saying where -1 belongs, and an affinity carrying a field this server's proto does
not know refused with INVALID_ARGUMENT naming its path."""

from __future__ import annotations

import math

import grpc
import pytest
from server_test_helpers import gang, rl, rpc_error

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service.convert import queue_to_model
from server.service.errors import DomainError
from server.service.validate import check_affinity, normalize_queue

INVALID = grpc.StatusCode.INVALID_ARGUMENT
GPU = "nvidia.com/gpu"


def res(quantities: dict[str, str]) -> pb.ResourceList:
    return pb.ResourceList(quantities=quantities)


def test_a_quota_of_minus_one_is_unlimited() -> None:
    queue = pb.Queue(name="q", guarantee=res({GPU: "-1", "cpu": "2"}), capability=res({GPU: "-1"}))
    valid = normalize_queue(queue)
    assert valid.guarantee == {GPU: math.inf, "cpu": 2000.0}
    assert valid.capability == {GPU: math.inf}
    # Read back from the store the same way.
    assert queue_to_model(valid.spec).guarantee == {GPU: math.inf, "cpu": 2000.0}


def test_a_negative_weight_is_refused_saying_where_minus_one_belongs() -> None:
    with pytest.raises(DomainError) as err:
        normalize_queue(pb.Queue(name="q", weight=-1))
    assert str(err.value).startswith("queue.weight: -1 is negative")
    assert "quota (guarantee) or a limit (capability)" in str(err.value)


def _affinity_with_unknown_field() -> pb.Affinity:
    """An affinity whose node_affinity carries field 7 (not in muster.proto), as a newer client
    would send it."""
    aff = pb.Affinity()
    aff.ParseFromString(bytes([(1 << 3) | 2, 2, (7 << 3) | 0, 1]))
    aff.node_affinity.required.add().match_expressions.add(key="zone", operator="In", values=["a"])
    return aff


def test_an_unknown_affinity_field_names_its_path() -> None:
    with pytest.raises(DomainError) as err:
        check_affinity("job.task_groups[0].affinity", _affinity_with_unknown_field())
    assert str(err.value) == (
        "job.task_groups[0].affinity.node_affinity: unknown field number 7 of NodeAffinity "
        "(known: required, preferred)"
    )


async def test_submit_with_an_unknown_affinity_field_is_invalid_argument(
    stub: pb_grpc.SchedulerStub,
) -> None:
    job = gang("aff", replicas=1, cpu="1")
    job.task_groups[0].affinity.MergeFrom(_affinity_with_unknown_field())
    err = await rpc_error(stub.SubmitJob(pb.SubmitJobRequest(job=job)))
    assert err.code() == INVALID, err.details()
    assert (err.details() or "").startswith(
        "job.task_groups[0].affinity.node_affinity: unknown field"
    )
    assert len((await stub.ListJobs(pb.ListJobsRequest())).jobs) == 0


async def test_create_queue_with_kai_minus_ones(stub: pb_grpc.SchedulerStub) -> None:
    created = await stub.CreateQueue(
        pb.QueueRequest(
            queue=pb.Queue(name="burst", guarantee=res({GPU: "-1"}), capability=rl(cpu="-1"))
        )
    )
    assert dict(created.guarantee.quantities) == {GPU: "-1"}
    err = await rpc_error(stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="w", weight=-1))))
    assert err.code() == INVALID
    assert (err.details() or "").startswith("queue.weight: -1 is negative")
