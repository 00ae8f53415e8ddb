"""Reservations and device topology: a gang is planned when its tasks' device ids fit, as the
``device_choice`` point (an Ascend 910's HCCS rings, huaweiNPU) would choose them, not only when
the node's device count does (server/session/reservations.py, docs/plugins/reservation.md)."""

from __future__ import annotations

import pytest
from test_reservation import VOLCANO

from muster.devices import ASCEND910, NVIDIA_GPU, UNIT
from server.config import load_config
from server.model import (
    ClusterSnapshot,
    CycleResult,
    JobSpec,
    NodeSpec,
    PodGroupPhase,
    QueueSpec,
    TaskSpec,
    TaskStatus,
)
from server.scheduler import SchedulerCore

NOW = 1_700_000_000.0
H = 3600.0

# Volcano's default tiers with the reservation plugin (test_reservation's), and huaweiNPU beside.
WITHOUT_NPU = VOLCANO
WITH_NPU = VOLCANO.replace(
    "  - name: reservation\n", "  - name: huaweiNPU\n  - name: reservation\n"
)


def eight_device_node(resource: str) -> NodeSpec:
    """One node of 8 devices in two rings of 4 (ids <prefix>-0 .. -7, groups "0" and "1")."""
    prefix = "Ascend910" if resource == ASCEND910 else "gpu"
    return NodeSpec(
        "n1",
        {"cpu": 64_000.0, "memory": 512.0 * 2**30, resource: 8 * UNIT, "pods": 110.0},
        devices=[{"id": f"{prefix}-{i}", "type": resource, "group": str(i // 4)} for i in range(8)],
    )


def job(
    uid: str, resource: str, chips: list[int] | int, limit: float, index: int, held: bool = True
) -> JobSpec:
    """A one-task job: running on n1 since NOW holding ``chips``, or waiting for ``chips`` of
    them."""
    prefix = "Ascend910" if resource == ASCEND910 else "gpu"
    count = len(chips) if isinstance(chips, list) else chips
    task = TaskSpec(
        uid=f"{uid}-0",
        name=f"{uid}-0",
        namespace="ns",
        job=uid,
        request={"cpu": 1000.0, resource: count * UNIT},
        status=TaskStatus.RUNNING if held else TaskStatus.PENDING,
        node="n1" if held else None,
        devices=[f"{prefix}-{c}" for c in chips] if isinstance(chips, list) else [],
    )
    return JobSpec(
        uid,
        uid,
        "ns",
        "default",
        [task],
        min_member=1,
        phase=PodGroupPhase.RUNNING if held else PodGroupPhase.INQUEUE,
        time_limit_seconds=limit,
        started_at=NOW if held else None,
        creation_index=index,
    )


def plan(config_text: str, resource: str) -> CycleResult:
    """At +1h two devices of each ring free up (4 by count, no ring of 4); at +2h ring 0 is whole
    (the last two of ring 1 at +3h). A job waits for 4 devices."""
    jobs = [
        job("a", resource, [0, 1], H, 0),
        job("b", resource, [4, 5], H, 1),
        job("c", resource, [2, 3], 2 * H, 2),
        job("d", resource, [6, 7], 3 * H, 3),
        job("w", resource, 4, H, 4, held=False),
    ]
    snapshot = ClusterSnapshot(
        nodes=[eight_device_node(resource)], queues=[QueueSpec("default")], jobs=jobs, now=NOW
    )
    return SchedulerCore(load_config(config_text)).run_cycle(snapshot, 1)


def test_an_ascend_job_is_planned_when_a_whole_ring_is_free() -> None:
    """4 chips free by count at +1h, but no HCCS ring of 4 before +2h: reserved at +2h."""
    result = plan(WITH_NPU, ASCEND910)
    estimate = result.estimates["w"]
    assert estimate.reserved
    assert estimate.start is not None
    assert NOW + 2 * H <= estimate.start < NOW + 2 * H + 120
    assert estimate.nodes == ["n1"]


@pytest.mark.parametrize(
    "config_text", [WITHOUT_NPU, WITH_NPU], ids=["no-chooser", "chooser-for-npus-only"]
)
def test_gpus_without_a_topology_chooser_are_planned_by_count(config_text: str) -> None:
    """The same layout of GPUs: no chooser places them, so 4 free at +1h is enough."""
    result = plan(config_text, NVIDIA_GPU)
    estimate = result.estimates["w"]
    assert estimate.reserved
    assert estimate.start is not None
    assert NOW + H <= estimate.start < NOW + H + 120
