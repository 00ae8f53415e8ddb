"""Hostile input: answered INVALID_ARGUMENT / RESOURCE_EXHAUSTED naming the field, never
INTERNAL or UNKNOWN, quickly, and with the state unchanged."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any, ClassVar

import grpc
import pytest
from server_test_helpers import gang, node, register, rpc_error, wait_for

from muster.devices import MAX_DEVICES_PER_NODE
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.plugins import PLUGINS
from server.plugins.base import Plugin
from server.service import validate
from server.service.app import ServerHandle, ServerOptions, start_server
from server.service.errors import DomainError

INVALID = grpc.StatusCode.INVALID_ARGUMENT
DEEP_YAML = "a: " + "[" * 5000 + "]" * 5000
DEEP_MAPPING = "".join("  " * i + f"k{i}:\n" for i in range(3000)) + "  " * 3000 + "v: 1\n"


@pytest.mark.parametrize("decision_id", [2**63, 2**64 - 1])
async def test_ack_with_a_decision_id_beyond_int64_is_invalid(
    stub: pb_grpc.SchedulerStub, decision_id: int
) -> None:
    await register(stub)
    err = await rpc_error(
        stub.AckDecisions(
            pb.AckDecisionsRequest(
                backend="agent-a", acks=[pb.DecisionAck(decision_id=decision_id, applied=True)]
            )
        )
    )
    assert err.code() == INVALID
    assert "acks[0].decision_id" in (err.details() or "")


async def test_stream_after_a_decision_id_beyond_int64_is_invalid(
    stub: pb_grpc.SchedulerStub,
) -> None:
    await register(stub)
    call = stub.StreamDecisions(
        pb.StreamDecisionsRequest(backend="agent-a", after_decision_id=2**63)
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()  # the first message, or the call's error
    assert err.value.code() == INVALID
    assert "after_decision_id" in (err.value.details() or "")


@pytest.mark.parametrize("text", ["-0", "null", "[]", "'x'", "", "42", DEEP_YAML, DEEP_MAPPING])
async def test_update_config_takes_only_a_mapping_that_is_a_configuration(
    stub: pb_grpc.SchedulerStub, text: str
) -> None:
    before = await stub.GetConfig(pb.GetConfigRequest())
    err = await rpc_error(stub.UpdateConfig(pb.UpdateConfigRequest(yaml=text)))
    assert err.code() == INVALID
    assert (err.details() or "").startswith("yaml: ")
    after = await stub.GetConfig(pb.GetConfigRequest())
    assert after == before


@pytest.mark.parametrize("text", [DEEP_YAML, DEEP_MAPPING, "x" * (2 * 1024 * 1024)])
async def test_simulate_refuses_deep_or_huge_documents(
    stub: pb_grpc.SchedulerStub, text: str
) -> None:
    err = await rpc_error(stub.Simulate(pb.SimulateRequest(scenario=text)))
    assert err.code() in (INVALID, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert "scenario" in (err.details() or "")


async def test_undecodable_payload_is_invalid_argument_and_logged_once(
    server: ServerHandle, capsys
) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        raw = channel.unary_unary(
            "/muster.v1.Scheduler/SubmitJob",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
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
        (
            lambda: pb.SubmitJobRequest(job=pb.JobSpec(id="j", annotations={"a": "x" * 70_000})),
            "job.annotations['a']",
        ),
        (
            lambda: pb.SubmitJobRequest(
                job=pb.JobSpec(id="j", annotations={f"k{i}": "v" for i in range(10_001)})
            ),
            "job.annotations: 10001 entries",
        ),
        (
            lambda: pb.SubmitJobRequest(
                job=pb.JobSpec(
                    id="j", task_groups=[pb.TaskGroup(role="w", replicas=1, command=["x" * 70_000])]
                )
            ),
            "job.task_groups[0].command[0]",
        ),
        (
            lambda: pb.AckDecisionsRequest(
                backend="b", acks=[pb.DecisionAck(decision_id=1)] * 100_001
            ),
            "acks: 100001 entries",
        ),
        (lambda: pb.GetJobRequest(id="x" * 70_000), "id: 70,000 characters"),
    ],
)
def test_every_request_is_bounded_in_strings_lists_and_maps(build: Any, field: str) -> None:
    with pytest.raises(DomainError) as err:
        validate.check_bounds(build())
    assert err.value.message.startswith(field), err.value.message
    # Documents have their own (larger) bound, checked when parsed.
    validate.check_bounds(pb.UpdateConfigRequest(yaml="#" * 1_000_000))


async def test_an_oversized_field_is_invalid_argument_over_grpc(
    stub: pb_grpc.SchedulerStub,
) -> None:
    err = await rpc_error(stub.GetJob(pb.GetJobRequest(id="x" * 70_000)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("id: 70,000 characters")


# -- quantities bounded where they enter (muster.quantity.MAX_CANONICAL, MAX_DEVICES_PER_NODE) -----

HUGE_QUANTITIES = ["1e308", "1e309", "9" * 400, "nan", "inf", "1e999999999"]


@pytest.mark.parametrize(
    "cpu", HUGE_QUANTITIES, ids=["1e308", "1e309", "400-digits", "nan", "inf", "1e999999999"]
)
async def test_a_quantity_beyond_the_bound_is_refused_at_submit(
    stub: pb_grpc.SchedulerStub, cpu: str
) -> None:
    started = time.perf_counter()
    err = await rpc_error(stub.SubmitJob(pb.SubmitJobRequest(job=gang("j", replicas=1, cpu=cpu))))
    assert time.perf_counter() - started < 5
    assert err.code() == INVALID, err.details()
    assert (err.details() or "").startswith("job.task_groups[0].request.cpu: "), err.details()
    assert (await stub.ListJobs(pb.ListJobsRequest())).jobs == []


async def test_the_bound_is_named_and_anything_up_to_it_is_accepted(
    stub: pb_grpc.SchedulerStub,
) -> None:
    err = await rpc_error(
        stub.SubmitJob(pb.SubmitJobRequest(job=gang("j", replicas=1, cpu="9007199254741")))
    )
    assert err.details() == (
        "job.task_groups[0].request.cpu: '9007199254741' is more than the largest quantity "
        "allowed (9007199254740992m)"
    )
    created = await stub.SubmitJob(
        pb.SubmitJobRequest(job=gang("j", replicas=1, cpu="9007199254740"))
    )
    assert created.created


def _scenario(cpu: str, node_quantities: str = "cpu: 4") -> str:
    return (
        f"nodes:\n- name: n0\n  allocatable: {{{node_quantities}}}\n"
        f"jobs:\n- name: j\n  tasks:\n  - name: t\n    request: {{cpu: {cpu}}}\n"
    )


@pytest.mark.parametrize(
    "cpu",
    [*(f'"{q}"' for q in HUGE_QUANTITIES), ".nan", ".inf", "1e999"],
    ids=[
        "1e308",
        "1e309",
        "400-digits",
        "nan",
        "inf",
        "1e999999999",
        "yaml-nan",
        "yaml-inf",
        "yaml-1e999",
    ],
)
async def test_simulate_refuses_a_quantity_beyond_the_bound(
    stub: pb_grpc.SchedulerStub, cpu: str
) -> None:
    err = await rpc_error(stub.Simulate(pb.SimulateRequest(scenario=_scenario(cpu))))
    assert err.code() == INVALID, err.details()
    assert (err.details() or "").startswith("jobs[0].tasks[0].request.cpu: "), err.details()


@pytest.mark.parametrize(
    ("count", "why"),
    [("1e30", "largest quantity allowed"), ("100000", "more than a node may have")],
)
async def test_simulate_refuses_a_node_with_too_many_devices_quickly(
    stub: pb_grpc.SchedulerStub, count: str, why: str
) -> None:
    started = time.perf_counter()
    err = await rpc_error(
        stub.Simulate(
            pb.SimulateRequest(scenario=_scenario("1", f'cpu: 4, huawei.com/Ascend910: "{count}"'))
        )
    )
    assert time.perf_counter() - started < 5
    assert err.code() == INVALID, err.details()
    details = err.details() or ""
    assert details.startswith("nodes[0].allocatable.huawei.com/Ascend910: "), details
    assert why in details, details


def _gpu_node(name: str, gpus: str, listed: int = 0) -> pb.Node:
    return pb.Node(
        name=name,
        allocatable=pb.ResourceList(quantities={"cpu": "4", "nvidia.com/gpu": gpus}),
        devices=[pb.Device(id=str(i), type="nvidia.com/gpu", healthy=True) for i in range(listed)],
    )


async def test_a_backend_node_with_too_many_devices_is_refused(
    server: ServerHandle, stub: pb_grpc.SchedulerStub
) -> None:
    await register(stub)
    started = time.perf_counter()
    err = await rpc_error(
        stub.SyncSnapshot(
            pb.SyncSnapshotRequest(
                backend="agent-a", nodes=[node("ok"), _gpu_node("n1", "1000000000000")]
            )
        )
    )
    assert err.code() == INVALID
    assert (err.details() or "").startswith(
        "nodes[1].allocatable.nvidia.com/gpu: 1000000000000 devices are more "
        f"than a node may have ({MAX_DEVICES_PER_NODE} per device resource)"
    )
    err = await rpc_error(
        stub.SendDeltas(
            pb.SendDeltasRequest(
                backend="agent-a", deltas=[pb.Delta(node_upserted=_gpu_node("n1", "1000000000000"))]
            )
        )
    )
    assert err.code() == INVALID
    assert (err.details() or "").startswith(
        "deltas[0].node_upserted.allocatable.nvidia.com/gpu: "
    ), err.details()
    listed = MAX_DEVICES_PER_NODE + 1
    err = await rpc_error(
        stub.SyncSnapshot(
            pb.SyncSnapshotRequest(backend="agent-a", nodes=[_gpu_node("n1", "8", listed=listed)])
        )
    )
    assert err.code() == INVALID
    assert (err.details() or "").startswith(
        f"nodes[0].devices: {listed} devices of type nvidia.com/gpu"
    ), err.details()
    assert time.perf_counter() - started < 5
    assert server.state.nodes == {}
    # A node at the bound is taken, and a 1-GPU job placed on it.
    await stub.SyncSnapshot(
        pb.SyncSnapshotRequest(
            backend="agent-a", nodes=[_gpu_node("n1", str(MAX_DEVICES_PER_NODE))]
        )
    )
    await stub.SubmitJob(
        pb.SubmitJobRequest(
            job=pb.JobSpec(
                id="g",
                task_groups=[
                    pb.TaskGroup(
                        role="w",
                        replicas=1,
                        request=pb.ResourceList(quantities={"cpu": "1", "nvidia.com/gpu": "1"}),
                    )
                ],
            )
        )
    )
    await wait_for(lambda: _task_status(stub, "g", pb.TASK_STATUS_BINDING), "the GPU job placed")


async def _task_status(stub: pb_grpc.SchedulerStub, job_id: str, status: int) -> bool:
    job = await stub.GetJob(pb.GetJobRequest(id=job_id))
    return all(t.status == status for t in job.tasks)


def _condition(job: pb.Job, kind: str) -> pb.Condition | None:
    return next((c for c in job.status.conditions if c.type == kind and c.status == "True"), None)


# -- a job that breaks a cycle is quarantined --------------------------------------------------


def _options(tmp_path: Path, **overrides: Any) -> ServerOptions:
    """As the ``server`` fixture's (cycles only when woken), with a state file that outlives it."""
    return ServerOptions(
        listen="127.0.0.1:0", state=str(tmp_path / "muster.db"), cycle_period=3600.0, **overrides
    )


async def test_a_stored_job_beyond_todays_bounds_is_quarantined_not_a_failed_cycle(
    tmp_path: Path,
) -> None:
    """A job stored (by an earlier version) with a request today's bound refuses: the server
    starts, leaves it out of scheduling with a condition saying why, and places the others."""
    opts = _options(tmp_path)
    first = await start_server(opts)
    async with grpc.aio.insecure_channel(first.address) as ch:
        await pb_grpc.SchedulerStub(ch).SubmitJob(
            pb.SubmitJobRequest(job=gang("big", replicas=1, cpu="100"))
        )
    await first.stop()
    with sqlite3.connect(tmp_path / "muster.db") as db:  # as an older version would have stored it
        (blob,) = db.execute("SELECT spec FROM jobs WHERE id = 'big'").fetchone()
        spec = pb.JobSpec.FromString(blob)
        spec.task_groups[0].request.quantities["cpu"] = "1e308"
        db.execute(
            "UPDATE jobs SET spec = ? WHERE id = 'big'",
            (spec.SerializeToString(deterministic=True),),
        )
    db.close()

    second = await start_server(opts)
    try:
        async with grpc.aio.insecure_channel(second.address) as ch:
            stub = pb_grpc.SchedulerStub(ch)
            await register(stub, nodes=[node("n0")])
            await stub.SubmitJob(pb.SubmitJobRequest(job=gang("small", replicas=2, cpu="1")))
            await wait_for(
                lambda: _task_status(stub, "small", pb.TASK_STATUS_BINDING), "small placed"
            )
            big = await stub.GetJob(pb.GetJobRequest(id="big"))
            cond = _condition(big, "Quarantined")
            assert cond is not None
            assert cond.reason == "InvalidSpec"
            assert cond.message.startswith(
                "left out of scheduling: job.task_groups[0].request.cpu: '1e308' is more "
                "than the largest quantity allowed"
            ), cond.message
            assert [t.status for t in big.tasks] == [pb.TASK_STATUS_PENDING]
            explained = await stub.Explain(pb.ExplainRequest(job_id="big"))
            assert explained.gate == "quarantined"
            assert second.loop.failures == 0
            # Cancelling it ends it as any job.
            cancelled = await stub.CancelJob(pb.CancelJobRequest(id="big"))
            assert cancelled.job.status.phase == pb.JOB_PHASE_CANCELLED
    finally:
        await second.stop()


class _Explode(Plugin):
    """Raises in job_valid for the jobs named in ``ON`` (counting the calls per job)."""

    name: ClassVar[str] = "explode"
    ON: ClassVar[set[str]] = set()
    calls: ClassVar[dict[str, int]] = {}

    def on_session_open(self, ssn: Any) -> None:
        def valid(job: Any) -> None:
            self.calls[job.uid] = self.calls.get(job.uid, 0) + 1
            if job.uid in self.ON:
                raise RuntimeError(f"plugin bug on {job.uid}")

        ssn.register("job_valid", self.name, valid)


EXPLODING_CONFIG = """
actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
  - name: explode
- plugins:
  - name: drf
  - name: predicates
  - name: proportion
  - name: nodeorder
"""


async def test_a_job_that_makes_a_plugin_raise_is_quarantined_and_skipped_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(PLUGINS, "explode", _Explode)
    monkeypatch.setattr(_Explode, "ON", {"bad"})
    monkeypatch.setattr(_Explode, "calls", {})
    handle = await start_server(_options(tmp_path, cycle_worker="thread"))  # the plugin lives here
    try:
        async with grpc.aio.insecure_channel(handle.address) as ch:
            stub = pb_grpc.SchedulerStub(ch)
            await stub.UpdateConfig(pb.UpdateConfigRequest(yaml=EXPLODING_CONFIG))
            await register(stub, nodes=[node("n0", cpu="16")])
            await stub.SubmitJobs(
                pb.SubmitJobsRequest(jobs=[gang(j, replicas=1, cpu="1") for j in ("a", "bad", "c")])
            )
            for j in ("a", "c"):
                await wait_for(
                    lambda j=j: _task_status(stub, j, pb.TASK_STATUS_BINDING), f"{j} placed"
                )
            bad = await stub.GetJob(pb.GetJobRequest(id="bad"))
            cond = _condition(bad, "Quarantined")
            assert cond is not None
            assert cond.reason == "CycleFailed"
            assert "RuntimeError: plugin bug on bad" in cond.message
            assert [t.status for t in bad.tasks] == [pb.TASK_STATUS_PENDING]
            assert handle.loop.failures == 0
            asked = _Explode.calls["bad"]
            # Later cycles leave it out: the plugin is never asked about it again.
            await stub.SubmitJob(pb.SubmitJobRequest(job=gang("d", replicas=1, cpu="1")))
            await wait_for(lambda: _task_status(stub, "d", pb.TASK_STATUS_BINDING), "d placed")
            assert _Explode.calls["bad"] == asked
    finally:
        await handle.stop()


@pytest.mark.parametrize(
    ("node_yaml", "field"),
    [
        ("{name: a, cpu: 4, gpus: 1000000000000}", "nodes[0].gpus: 1000000000000 devices are more"),
        (
            "{name: a, cpu: 4, resources: {huawei.com/Ascend910: '1e12'}}",
            "nodes[0].resources.huawei.com/Ascend910: 1000000000000 devices are more",
        ),
        (
            "{name: a, cpu: 4, resources: {huawei.com/Ascend910: '1e30'}}",
            "nodes[0].resources.huawei.com/Ascend910: '1e30' is more than the largest quantity allowed",
        ),
        (
            "{name: a, cpu: '1e308'}",
            "nodes[0].cpu: '1e308' is more than the largest quantity allowed",
        ),
        ("{name: a, cpu: .nan}", "nodes[0].cpu: nan is not a finite quantity"),
    ],
)
def test_the_agent_inventory_holds_nodes_to_the_bounds(node_yaml: str, field: str) -> None:
    from adapters.agent.inventory import InventoryError, parse_inventory

    started = time.perf_counter()
    with pytest.raises(InventoryError) as err:
        parse_inventory(f"nodes:\n- {node_yaml}\n")
    assert str(err.value).startswith(field), str(err.value)
    assert time.perf_counter() - started < 2


@pytest.mark.parametrize("cpu", ['"1e308"', '"1e999999999"', ".inf"])
def test_a_job_file_holds_quantities_to_the_bound(cpu: str) -> None:
    from clients.jobfile import JobFileError, parse_jobs

    with pytest.raises(JobFileError) as err:
        parse_jobs(f"id: j\ntasks:\n- role: w\n  replicas: 1\n  request: {{cpu: {cpu}}}\n")
    assert "request.cpu: " in str(err.value), str(err.value)
