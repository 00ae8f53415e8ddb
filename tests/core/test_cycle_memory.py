"""A cycle frees its own objects: none is left for the cycle collector, and no collection runs
inside it (server/scheduler.py, Session.release), under Volcano's default configuration and under
KAI's (examples/config-kai.yaml), topology-aware placement included."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from server.actions import ACTIONS
from server.actions.volcano.allocate import AllocateAction
from server.config import default_config, load_config
from server.model import ClusterSnapshot, TaskStatus
from server.scheduler import SchedulerCore, collector_paused
from server.session.session import Session
from server.simulate import simulate_text
from tests.core.core_helpers import job, node, snapshot

KAI_CONFIG = (Path(__file__).resolve().parents[2] / "examples" / "config-kai.yaml").read_text()


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


@contextmanager
def collector_off() -> Iterator[None]:
    """Nothing left to collect, then the collector off until the block ends (whatever the block
    leaves in cycles stays for its own ``gc.collect()`` to count)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def busy_cluster() -> ClusterSnapshot:
    """Placed gangs, a gang that fits nowhere (fit errors, explanations) and a running job."""
    nodes = [node(f"n{i}", cpu="8", memory="16Gi") for i in range(6)]
    jobs = [
        job("running", 2, cpu="2", status=TaskStatus.RUNNING, nodes=["n0", "n1"], index=0),
        job("gang", 4, cpu="2", index=1),
        job("too-big", 2, cpu="64", index=2),
        job("single", 1, cpu="1", index=3),
    ]
    return snapshot(nodes, jobs)


def test_a_cycle_leaves_no_cyclic_garbage(collector_on: None) -> None:
    core = SchedulerCore(default_config())
    core.run_cycle(busy_cluster(), 1)  # first use: lazy module state, caches
    snap = busy_cluster()
    with collector_off():
        result = core.run_cycle(snap, 2)
        # Everything the cycle made and dropped went with reference counting: the session (its
        # plugins' closures hold it) did not wait for a collection.
        assert gc.collect() == 0
    assert result.binds
    assert "ns/too-big" in result.jobs
    assert gc.isenabled()


def test_a_kai_cycle_leaves_no_cyclic_garbage(collector_on: None) -> None:
    core = SchedulerCore(load_config(KAI_CONFIG))
    core.run_cycle(busy_cluster(), 1)
    snap = busy_cluster()
    with collector_off():
        result = core.run_cycle(snap, 2)
        # KAI's proportion divides the queues' fair shares level by level without a recursive
        # closure, which would hold the plugin and so the session.
        assert gc.collect() == 0
    assert result.binds
    assert result.jobs["ns/too-big"].explanation is not None
    assert result.jobs["ns/too-big"].explanation.gate == "unsatisfiable"


def _topology_scenario(config: str) -> str:
    """Two zones of two racks; a job kept to the rack of its running task (required level), one
    that prefers a rack, one that fits no rack."""

    def rack(i: int) -> dict[str, Any]:
        labels = {"zone": f"z{i // 2}", "rack": f"r{i}"}
        return {"name": f"n{i}", "allocatable": {"cpu": "4", "memory": "8Gi"}, "labels": labels}

    def job_doc(name: str, n: int, topology: dict[str, str], running: bool = False) -> Any:
        tasks: list[dict[str, Any]] = [
            {"name": f"{name}-{i}", "request": {"cpu": "1", "memory": "1Gi"}} for i in range(n)
        ]
        if running:
            tasks[0].update(status="Running", node="n1")
        topo = {"topology": "t", **topology}
        return {"name": name, "namespace": "ns", "minMember": 1, "topology": topo, "tasks": tasks}

    doc = {
        "name": "topology memory",
        "config": yaml.safe_load(config),
        "topologies": [{"name": "t", "levels": ["zone", "rack"]}],
        "nodes": [rack(i) for i in range(4)],
        "queues": [{"name": "default"}],
        "jobs": [
            job_doc("kept", 3, {"requiredLevel": "rack"}, running=True),
            job_doc("near", 2, {"preferredLevel": "rack", "requiredLevel": "zone"}),
            job_doc("wide", 12, {"requiredLevel": "rack"}),
        ],
    }
    return yaml.safe_dump(doc)


def test_a_kai_topology_cycle_leaves_no_cyclic_garbage(collector_on: None) -> None:
    text = _topology_scenario(KAI_CONFIG)
    simulate_text(text)  # first use: lazy module state, caches
    with collector_off():
        out = simulate_text(text)
        # The domain tree is walked with loops: recursive closures would be cycles.
        assert gc.collect() == 0
    assert out["tasks"]["ns/kept-1"]["node"] == "n1"  # kept to the rack of its running task
    assert {out["tasks"][f"ns/near-{i}"]["node"] for i in range(2)} <= {"n0", "n1"}  # one zone


def test_the_collector_is_paused_inside_a_cycle_and_restored_after(collector_on: None) -> None:
    seen: list[bool] = []

    class Probe(AllocateAction):
        def execute(self, ssn: Session) -> None:
            seen.append(gc.isenabled())
            super().execute(ssn)

    config = default_config()
    config = dataclasses.replace(
        config, action_classes={**config.action_classes, "allocate": Probe}
    )
    result = SchedulerCore(config).run_cycle(busy_cluster(), 1)
    assert seen == [False]
    assert result.binds
    assert gc.isenabled()
    assert ACTIONS["allocate"] is AllocateAction


def test_collector_paused_restores_the_state_it_found(collector_on: None) -> None:
    def failing_cycle() -> None:
        assert not gc.isenabled()
        raise RuntimeError("a failing cycle")

    with pytest.raises(RuntimeError, match="a failing cycle"), collector_paused():
        failing_cycle()
    assert gc.isenabled()
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()  # a caller that had it off keeps it off
