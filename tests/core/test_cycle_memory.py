"""A cycle frees its own objects: none is left for the cycle collector, and no collection runs
inside it (server/scheduler.py, Session.release)."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterator

import pytest

from server.actions import ACTIONS
from server.actions.allocate import AllocateAction
from server.config import default_config
from server.model import ClusterSnapshot, TaskStatus
from server.scheduler import SchedulerCore, collector_paused
from server.session.session import Session
from tests.core.core_helpers import job, node, snapshot


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


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
    gc.collect()
    gc.disable()
    try:
        result = core.run_cycle(snap, 2)
        # Everything the cycle made and dropped went with reference counting: the session (its
        # plugins' closures hold it) did not wait for a collection.
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert result.binds and "ns/too-big" in result.jobs  # the cycle did its work
    assert gc.isenabled()


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
    assert seen == [False] and result.binds
    assert gc.isenabled()
    assert ACTIONS["allocate"] is AllocateAction


def test_collector_paused_restores_the_state_it_found(collector_on: None) -> None:
    with pytest.raises(RuntimeError), collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("a failing cycle")
    assert gc.isenabled()
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()  # a caller that had it off keeps it off
