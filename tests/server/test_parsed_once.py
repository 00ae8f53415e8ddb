"""Each quantity that arrives is parsed once: validation returns the parsed quantities (jobs,
queues, nodes, backend tasks) and the conversion to the core's model uses them; only what is read
back from the store is parsed again (no network)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from server_test_helpers import node, rl

from muster import quantity
from muster.v1 import muster_pb2 as pb
from server.service import commands, convert, ingest, validate
from server.service.decisions import DecisionLog
from server.service.errors import DomainError
from server.service.state import ClusterState


def job() -> pb.JobSpec:
    gpus = pb.ResourceList(quantities={"cpu": "2", "nvidia.com/gpu": "1"})
    return pb.JobSpec(
        id="j",
        task_groups=[
            pb.TaskGroup(role="ps", replicas=1, request=rl(cpu="500m", memory="1Gi")),
            pb.TaskGroup(role="w", replicas=3, request=gpus),
        ],
        min_resources=rl(cpu="3"),
    )


def queue() -> pb.Queue:
    return pb.Queue(
        name="q", guarantee=rl(cpu="1"), deserved=rl(cpu="-1"), capability=rl(memory="8Gi")
    )


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often validation and conversion call ``parse_resources``."""
    calls: Counter[str] = Counter()

    def counting(where: str) -> Callable[..., dict[str, float]]:
        def parse(*args: Any, **kwargs: Any) -> dict[str, float]:
            calls[where] += 1
            return quantity.parse_resources(*args, **kwargs)

        return parse

    monkeypatch.setattr(validate, "parse_resources", counting("validate"))
    monkeypatch.setattr(convert, "parse_resources", counting("convert"))
    return calls


def test_validation_returns_the_quantities_the_model_is_built_from() -> None:
    valid = validate.normalize_job(job())
    assert valid.requests == (
        {"cpu": 500.0, "memory": 1024.0**3},
        {"cpu": 2000.0, "nvidia.com/gpu": 1000.0},
    )
    assert valid.min_resources == {"cpu": 3000.0}
    # The same model as a job read back from the store (which parses its spec again).
    assert convert.valid_job_to_model(valid, 7) == convert.job_to_model(valid.spec, 7)
    q = validate.normalize_queue(queue())
    assert (q.guarantee, q.deserved, q.capability) == (
        {"cpu": 1000.0},
        {"cpu": float("inf")},
        {"memory": 8 * 1024.0**3},
    )
    assert convert.valid_queue_to_model(q) == convert.queue_to_model(q.spec)


def test_quantities_that_arrive_are_parsed_once(parses: Counter[str]) -> None:
    state = ClusterState(DecisionLog(bind_timeout=30))
    parses.clear()  # (the built-in queues)
    commands.submit_job(state, job())
    assert parses == {"validate": 3}  # two task groups' requests and min_resources
    assert state.jobs["j"].template.tasks[1].request == {"cpu": 2000.0, "nvidia.com/gpu": 1000.0}
    parses.clear()
    commands.create_queue(state, queue())
    assert parses == {"validate": 3}  # guarantee, deserved, capability
    assert state.queues["q"].spec.deserved == {"cpu": float("inf")}
    parses.clear()
    ingest.register_backend(state, pb.RegisterBackendRequest(name="a", kind="fake-agent"))
    foreign = pb.BackendTask(task_id="x", node="n0", request=rl(cpu="1"), foreign_task=True)
    ingest.sync_snapshot(
        state, pb.SyncSnapshotRequest(backend="a", nodes=[node("n0")], tasks=[foreign])
    )
    assert parses == {"validate": 2}  # the node's allocatable, the task's request
    assert state.nodes["n0"].spec.allocatable == {"cpu": 4000.0, "memory": 16 * 1024.0**3}
    parses.clear()
    ingest.send_deltas(
        state,
        pb.SendDeltasRequest(backend="a", deltas=[pb.Delta(node_upserted=node("n1", cpu="8"))]),
    )
    assert parses == {"validate": 1}
    assert state.nodes["n1"].spec.allocatable["cpu"] == 8000.0


def test_refusals_still_name_the_field() -> None:
    bad = job()
    bad.task_groups[1].request.quantities["cpu"] = "2x"
    with pytest.raises(DomainError, match=r"^job\.task_groups\[1\]\.request\.cpu: '2x'"):
        validate.normalize_job(bad)
    with pytest.raises(DomainError, match=r"^queue\.capability\.memory: "):
        validate.normalize_queue(pb.Queue(name="q", capability=rl(memory="lots")))
