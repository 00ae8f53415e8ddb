"""Property-based fuzzing of every Scheduler RPC (hypothesis, bounded and derandomized).

Messages are generated from the proto descriptors (every field, strings empty / unicode / long,
integers at their type's extremes, unknown enum values, nested messages and maps), plus raw byte
strings that are not messages at all. For each call: the status is never INTERNAL or UNKNOWN, the
health check stays SERVING, and a rejected request leaves the visible state unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import server_options
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service.app import ServerThread

SERVICE = pb.DESCRIPTOR.services_by_name["Scheduler"]
METHODS = list(SERVICE.methods)
FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
EXAMPLES = 30
MAX_DEPTH = 3

INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
TEXT = st.one_of(
    st.sampled_from(
        ["", "a", "default", "root", "0", "-1", "1e309", "a/b", "x" * 300, "cpu", "2x", "1Gi"]
    ),
    st.text(max_size=12),
)


def scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type in INT_RANGES:
        lo, hi = INT_RANGES[field.type]
        return st.one_of(st.sampled_from([lo, hi, 0, 1, -1 if lo < 0 else 2]), st.integers(lo, hi))
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(
            allow_nan=True,
            allow_infinity=True,
            width=64 if field.type == FieldDescriptor.TYPE_DOUBLE else 32,
        )
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_STRING:
        return TEXT
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=16)
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-(2**31), 2**31 - 1))  # open enums
    raise TypeError(f"{field.full_name}: no strategy for type {field.type}")


def message(desc: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in desc.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field, value_field = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            if value_field.message_type is not None:
                if depth >= MAX_DEPTH:
                    continue
                value: st.SearchStrategy[Any] = message(value_field.message_type, depth + 1)
            else:
                value = scalar(value_field)
            fields[field.name] = st.dictionaries(scalar(key_field), value, max_size=3)
        elif field.message_type is not None:
            if depth >= MAX_DEPTH:
                continue
            inner = message(field.message_type, depth + 1)
            is_list = field.is_repeated
            fields[field.name] = st.lists(inner, max_size=3) if is_list else inner
        elif field.is_repeated:
            fields[field.name] = st.lists(scalar(field), max_size=4)
        else:
            fields[field.name] = scalar(field)
    cls = GetMessageClass(desc)

    def build(values: dict[str, Any]) -> Message:
        msg = cls()
        for name, v in values.items():
            target = getattr(msg, name)
            field = desc.fields_by_name[name]
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                for key, item in v.items():
                    if isinstance(item, Message):
                        target[key].CopyFrom(item)
                    else:
                        target[key] = item
            elif field.is_repeated:
                target.extend(v)
            elif field.message_type is not None:
                target.CopyFrom(v)
            else:
                setattr(msg, name, v)
        return msg

    return st.fixed_dictionaries({}, optional=fields).map(build)


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    with ServerThread(server_options(tmp)) as srv:
        # Names the generator often draws ("a", "default"): fuzzed requests reach past "unknown
        # backend / job" into the deeper validation and the store.
        with grpc.insecure_channel(srv.address) as ch:
            stub = pb_grpc.SchedulerStub(ch)
            stub.RegisterBackend(pb.RegisterBackendRequest(name="a", kind="fake-agent"), timeout=10)
            node = pb.Node(
                name="a", allocatable=pb.ResourceList(quantities={"cpu": "4", "memory": "8Gi"})
            )
            stub.SyncSnapshot(pb.SyncSnapshotRequest(backend="a", nodes=[node]), timeout=10)
            group = pb.TaskGroup(
                role="w", replicas=1, request=pb.ResourceList(quantities={"cpu": "1"})
            )
            stub.SubmitJob(
                pb.SubmitJobRequest(job=pb.JobSpec(id="a", task_groups=[group])), timeout=10
            )
        yield srv.address


@pytest.fixture(scope="module")
def channel(address: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(address) as ch:
        yield ch


def visible_state(channel: grpc.Channel) -> tuple[Any, ...]:
    stub = pb_grpc.SchedulerStub(channel)
    jobs = stub.ListJobs(pb.ListJobsRequest(), timeout=10)
    queues = stub.ListQueues(pb.ListQueuesRequest(), timeout=10)
    nodes = stub.ListNodes(pb.ListNodesRequest(), timeout=10)
    config = stub.GetConfig(pb.GetConfigRequest(), timeout=10)
    return (
        sorted(
            j.spec.SerializeToString(deterministic=True) for j in jobs.jobs
        ),  # phases move with cycles
        sorted(
            q.queue.SerializeToString(deterministic=True) for q in queues.queues
        ),  # not the usage
        sorted(n.node.SerializeToString(deterministic=True) for n in nodes.nodes),
        config.generation,
    )


def call(channel: grpc.Channel, method: Any, payload: bytes) -> grpc.StatusCode:
    path = f"/{SERVICE.full_name}/{method.name}"
    try:
        if method.server_streaming:
            stream = channel.unary_stream(
                path, request_serializer=lambda b: b, response_deserializer=lambda b: b
            )
            for _ in stream(payload, timeout=0.5):
                break
        else:
            unary = channel.unary_unary(
                path, request_serializer=lambda b: b, response_deserializer=lambda b: b
            )
            unary(payload, timeout=15)
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return, attr-defined]
    return grpc.StatusCode.OK


def check(channel: grpc.Channel, method: Any, payload: bytes) -> None:
    before = visible_state(channel)
    code = call(channel, method, payload)
    assert code not in FORBIDDEN, f"{method.name} answered {code.name}"
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    if code not in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED):
        after = visible_state(channel)
        changed = [
            part
            for part, b, a in zip(("jobs", "queues", "nodes", "config"), before, after, strict=True)
            if a != b
        ]
        assert not changed, (
            f"rejected {method.name} ({code.name}) changed {changed}: {before} -> {after}"
        )


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)


@pytest.mark.parametrize("method", METHODS, ids=[m.name for m in METHODS])
def test_generated_messages_never_break_the_server(channel: grpc.Channel, method: Any) -> None:
    @FUZZ
    @given(message(method.input_type))
    def run(request: Message) -> None:
        check(channel, method, request.SerializeToString())

    run()


@pytest.mark.parametrize("method", METHODS, ids=[m.name for m in METHODS])
def test_raw_bytes_never_break_the_server(channel: grpc.Channel, method: Any) -> None:
    @settings(FUZZ, max_examples=10)
    @given(st.binary(min_size=1, max_size=64))
    def run(payload: bytes) -> None:
        check(channel, method, payload)

    run()
