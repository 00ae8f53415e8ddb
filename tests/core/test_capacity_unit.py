"""capacity plugin, method by method: the per-session queue arithmetic (real capability, deserved,
share), each registered function called directly on the plugin, and the module's helpers. The
whole-cycle behaviour is in test_capacity.py and tests/scenarios/volcano/capacity/."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from core_helpers import job, node, queue, res, session, snapshot, task

from server.model import JobSpec, PodGroupPhase, QueueSpec
from server.plugins.volcano.capacity import (
    CapacityPlugin,
    common_level,
    short_dims,
    under_deserved,
    within,
)
from server.session.extension_points import PERMIT, REJECT
from server.session.session import Session

FLAT = "tiers: [{plugins: [{name: capacity}]}]"
HIER = "tiers: [{plugins: [{name: capacity, enableHierarchy: true}]}]"
CPU = 1000.0  # one cpu in millicores
GI = 2.0**30


def plugin_of(ssn: Session) -> CapacityPlugin:
    return next(p for p in ssn.plugins if isinstance(p, CapacityPlugin))


def running(name: str, q: str, *cpus: str, **fields: Any) -> JobSpec:
    """A Running job of one task per entry of ``cpus`` (each with 1Gi), all on n1."""
    tasks = [task(f"{name}{i}", name, res(c, "1Gi"), "n1") for i, c in enumerate(cpus)]
    return job(name, queue=q, tasks=tasks, phase=PodGroupPhase.RUNNING, **fields)


def pending(name: str, q: str, cpu: str, memory: str | None = None, **fields: Any) -> JobSpec:
    """A Pending (not yet admitted) job of one task."""
    tasks = [task(f"{name}0", name, res(cpu, memory))]
    return job(name, queue=q, tasks=tasks, phase=PodGroupPhase.PENDING, index=1, **fields)


# -- flat ---------------------------------------------------------------------------------------

# An 8 cpu / 16Gi cluster. Guarantees sum to 4 cpu (qc's counts although it has no job).
FLAT_QUEUES = [
    queue("qa", res("4", "8Gi"), res("6"), guarantee=res("1")),
    queue("qb", res("10"), guarantee=res("2")),
    queue("qc", guarantee=res("1")),
    queue("qn"),
    queue("qp", priority=5),
    queue("qx", state="Closed"),
]


def flat_session() -> Session:
    jobs = [
        # qa: 2 cpu / 2Gi allocated, minResources 1 cpu / 1Gi: 1 cpu / 1Gi elastic.
        running("ra", "qa", "1", "1", min_resources=res("1", "1Gi")),
        running("rb", "qb", "2"),
        running("rn", "qn", "1"),
        running("rp", "qp", "1"),
        pending("pa", "qa", "3"),
        pending("pb", "qa", "4"),
        pending("pc", "qa", "2"),
        pending("pm", "qa", "0", "1Gi"),
        pending("px", "qx", "1"),
    ]
    return session(snapshot([node("n1", "8", "16Gi")], jobs, FLAT_QUEUES), FLAT)


def test_flat_real_capability_and_deserved() -> None:
    """real = min(total - all guarantees + own guarantee, capability); deserved is capped by it
    and raised to the guarantee; only queues with jobs get an entry."""
    attrs = plugin_of(flat_session()).attrs
    qa, qb = attrs["qa"], attrs["qb"]
    assert list(qa.real_capability) == [5 * CPU, 16 * GI]  # min(8 - 4 + 1, 6) cpu
    assert list(qb.real_capability) == [6 * CPU, 16 * GI]  # 8 - 4 + 2, no capability
    assert list(qa.deserved) == [4 * CPU, 8 * GI]
    assert list(qb.deserved) == [6 * CPU, 0.0]  # 10 cpu capped by the real capability 6
    assert "qc" not in attrs
    assert list(qa.allocated) == [2 * CPU, 2 * GI]
    assert list(qa.request) == [(2 + 3 + 4 + 2) * CPU, 3 * GI]
    assert list(qa.elastic) == [1 * CPU, 1 * GI]
    assert qa.share == pytest.approx(0.5)  # max(2/4 cpu, 2Gi/8Gi)
    assert qb.share == pytest.approx(2 / 6)
    assert attrs["qn"].share == 1.0  # nothing deserved: share 1


def test_flat_queue_order() -> None:
    ssn = flat_session()
    p, q, t = plugin_of(ssn), ssn.queues, ssn.tasks
    assert p.queue_order(q["qa"], q["qb"]) == 1  # share 0.5 after 1/3
    assert p.queue_order(q["qb"], q["qa"]) == -1
    assert p.queue_order(q["qa"], q["qp"]) > 0  # higher priority first, before any share
    assert p.queue_order(q["qp"], q["qb"]) < 0
    assert p.queue_order(q["qb"], q["qc"]) == 0  # qc has no entry
    # The share follows the allocation events.
    p.on_allocate(t["ns/pa0"])
    assert p.attrs["qa"].share == pytest.approx(5 / 4)
    assert p.queue_order(q["qa"], q["qn"]) == 1
    p.on_deallocate(t["ns/pa0"])
    p.on_allocate(t["ns/pc0"])
    # Both at share 1: the queue that deserves something first (qn deserves nothing).
    assert p.attrs["qa"].share == pytest.approx(1.0)
    assert p.queue_order(q["qa"], q["qn"]) == -1
    assert p.queue_order(q["qn"], q["qa"]) == 1


def test_flat_allocatable_checks_only_requested_dimensions() -> None:
    ssn = flat_session()
    p, q, t = plugin_of(ssn), ssn.queues, ssn.tasks
    assert p.allocatable(q["qa"], t["ns/pa0"])  # 2 + 3 <= 5 cpu
    assert not p.allocatable(q["qa"], t["ns/pb0"])  # 2 + 4 > 5 cpu
    p.on_allocate(t["ns/pa0"])
    assert list(p.attrs["qa"].allocated) == [5 * CPU, 2 * GI]
    assert not p.allocatable(q["qa"], t["ns/rb0"])  # another cpu: over
    assert p.allocatable(q["qa"], t["ns/pm0"])  # memory only: cpu is not looked at
    p.on_deallocate(t["ns/pa0"])
    assert list(p.attrs["qa"].allocated) == [2 * CPU, 2 * GI]
    assert not p.allocatable(q["qx"], t["ns/px0"])  # a closed queue
    assert not p.allocatable(q["qc"], t["ns/pa0"])  # a queue without an entry


def test_flat_preemptive_needs_one_requested_dimension_under_deserved() -> None:
    ssn = flat_session()
    p, q, t = plugin_of(ssn), ssn.queues, ssn.tasks
    # 2 + 3 = 5 cpu > 4 deserved, and the task asks nothing else.
    assert not p.preemptive(q["qa"], t["ns/pa0"])
    assert p.preemptive(q["qa"], t["ns/rb0"])  # 3 cpu <= 4, 3Gi <= 8Gi
    assert not p.preemptive(q["qa"], t["ns/pb0"])  # beyond the real capability
    assert p.preemptive(q["qa"], t["ns/pm0"])  # memory 3Gi <= 8Gi


def test_flat_enqueue_counts_allocated_inqueue_and_elastic() -> None:
    """need = minResources + allocated + inqueue - elastic, within the real capability."""
    jobs = [
        running("ra", "qa", "1", "1", min_resources=res("1", "1Gi")),
        pending("big", "qa", "4", min_resources=res("4")),
        pending("small", "qa", "1", min_resources=res("1")),
        pending("loose", "qa", "1"),
        pending("shut", "qx", "1", min_resources=res("1")),
    ]
    ssn = session(snapshot([node("n1", "8", "16Gi")], jobs, FLAT_QUEUES), FLAT)
    p, j = plugin_of(ssn), ssn.jobs
    # 4 + 2 + 0 - 1 = 5 cpu: exactly the real capability (without the elastic cpu: 6).
    assert p.enqueueable(j["ns/big"]) == PERMIT
    assert p.enqueueable(j["ns/small"]) == PERMIT
    p.enqueued(j["ns/big"])
    assert list(p.attrs["qa"].inqueue) == [4 * CPU, 0.0]
    assert p.enqueueable(j["ns/small"]) == REJECT  # 1 + 2 + 4 - 1 = 6 > 5
    assert p.enqueueable(j["ns/loose"]) == PERMIT  # no minResources: nothing to check
    assert p.enqueueable(j["ns/shut"]) == REJECT  # closed queue


def test_flat_reclaimable_keeps_the_guarantee_and_leaves_live_allocations() -> None:
    """The victim queue deserves 1 cpu but guarantees 3Gi: after one 1 cpu / 1Gi victim it holds
    3 cpu / 3Gi, and taking another would leave 2Gi, under the guarantee."""
    jobs = [
        running("v", "qv", "1", "1", "1", "1"),
        pending("r", "qr", "1", "1Gi"),
    ]
    queues = [queue("qv", res("1"), guarantee=res(memory="3Gi")), queue("qr", res("4", "4Gi"))]
    ssn = session(snapshot([node("n1", "8", "16Gi")], jobs, queues), FLAT)
    p = plugin_of(ssn)
    victims = [ssn.tasks[f"ns/v{i}"] for i in range(4)]
    chosen, verdict = p.reclaimable(ssn.tasks["ns/r0"], victims)
    assert verdict == PERMIT
    assert len(chosen) == 1
    assert list(p.attrs["qv"].allocated) == [4 * CPU, 4 * GI]


@pytest.mark.parametrize(("memory", "taken"), [("8Gi", 2), ("1Gi", 3)])
def test_flat_reclaimable_stops_at_deserved(memory: str, taken: int) -> None:
    """Victims while the queue is above deserved on some dimension both ask for, the allocation
    deducted victim by victim: 4 -> 3 -> 2 cpu reaches the 2 cpu deserved, but with 1Gi deserved
    memory 2Gi is still above it, so a third goes."""
    jobs = [running("v", "qv", "1", "1", "1", "1"), pending("r", "qr", "1", "1Gi")]
    queues = [queue("qv", res("2", memory)), queue("qr", res("4", "4Gi"))]
    ssn = session(snapshot([node("n1", "8", "16Gi")], jobs, queues), FLAT)
    victims = [ssn.tasks[f"ns/v{i}"] for i in range(4)]
    chosen, _ = plugin_of(ssn).reclaimable(ssn.tasks["ns/r0"], victims)
    assert len(chosen) == taken


# -- hierarchical -------------------------------------------------------------------------------

# root (implicit) -> d1 (capability 4 cpu, guarantee 2) -> d1a (guarantee 1, deserved 3), d1b
# (capability 5); root -> d2 (guarantee 1) -> d2a.
HIER_QUEUES = [
    queue("d1", capability=res("4"), guarantee=res("2")),
    queue("d2", guarantee=res("1")),
    queue("d1a", res("3"), guarantee=res("1"), parent="d1"),
    queue("d1b", capability=res("5"), parent="d1"),
    queue("d2a", parent="d2"),
]


def hier_session() -> Session:
    jobs = [
        running("a", "d1a", "1", "1"),
        running("c", "d2a", "500m"),
        pending("b2", "d1b", "2"),
        pending("b3", "d1b", "3"),
    ]
    return session(snapshot([node("n1", "8", "16Gi")], jobs, HIER_QUEUES), HIER)


def test_hierarchy_building() -> None:
    """Children inherit an unset capability; real = parent's real - sibling guarantees + own
    guarantee, capped by the capability; the root sums its children's guarantee and deserved;
    allocations add up the tree."""
    p = plugin_of(hier_session())
    a = p.attrs
    assert p.ready
    assert a["d1a"].ancestors == ["root", "d1"]
    assert set(a["root"].children) == {"d1", "d2"}
    assert set(a["d1"].children) == {"d1a", "d1b"}
    assert a["d1a"].capability[0] == 4 * CPU  # inherited from d1
    assert a["d1a"].real_capability[0] == 4 * CPU  # min(4 - 1 + 1, 4)
    assert a["d1b"].real_capability[0] == 3 * CPU  # min(4 - 1 + 0, 5): d1a's guarantee reserved
    assert a["d1"].real_capability[0] == 4 * CPU
    assert a["d2"].real_capability[0] == np.inf
    assert a["root"].guarantee[0] == 3 * CPU
    assert a["root"].deserved[0] == 3 * CPU  # d1 deserves its guarantee 2, d2 its 1
    assert [a[n].allocated[0] for n in ("d1a", "d1", "d2a", "d2", "root")] == [
        2 * CPU,
        2 * CPU,
        500.0,
        500.0,
        2500.0,
    ]


def test_hierarchy_allocatable_checks_every_ancestor() -> None:
    ssn = hier_session()
    p, q, t = plugin_of(ssn), ssn.queues, ssn.tasks
    assert p.allocatable(q["d1b"], t["ns/b20"])  # d1b 2 <= 3, d1 2 + 2 <= 4
    assert not p.allocatable(q["d1b"], t["ns/b30"])  # d1b 3 <= 3, but d1 2 + 3 > 4
    assert not p.allocatable(q["d1"], t["ns/b20"])  # not a leaf


def test_hierarchy_events_reach_the_ancestors() -> None:
    ssn = hier_session()
    p, t = plugin_of(ssn), ssn.tasks["ns/b20"]
    p.on_allocate(t)
    assert [p.attrs[n].allocated[0] for n in ("d1b", "d1", "root", "d2")] == [
        2 * CPU,
        4 * CPU,
        4500.0,
        500.0,
    ]
    p.on_deallocate(t)
    assert [p.attrs[n].allocated[0] for n in ("d1b", "d1", "root")] == [0.0, 2 * CPU, 2500.0]


def test_hierarchy_queue_order_compares_subtrees() -> None:
    """d1a's own share (2/3) is below d2a's (nothing deserved: 1), but their subtrees decide:
    d1 uses 2 of its 2 deserved, d2 0.5 of 1."""
    ssn = hier_session()
    p, q = plugin_of(ssn), ssn.queues
    assert p.attrs["d1a"].share < p.attrs["d2a"].share
    assert p.queue_order(q["d1a"], q["d2a"]) == 1
    assert p.queue_order(q["d2a"], q["d1a"]) == -1
    assert p.queue_order(q["d1a"], q["d1"]) == -1  # a leaf before an inner queue
    assert p.queue_order(q["d1"], q["d1b"]) == 1


def test_hierarchy_victim_queue_order_prefers_the_closer_queue() -> None:
    ssn = hier_session()
    p, q = plugin_of(ssn), ssn.queues
    assert p.victim_queue_order(q["d1b"], q["d2a"], q["d1a"]) == -1
    assert p.victim_queue_order(q["d2a"], q["d1b"], q["d1a"]) == 1
    assert p.victim_queue_order(q["d2a"], q["d1b"], None) == 0
    a = p.attrs
    assert common_level(a["d1a"], a["d1b"]) == 1
    assert common_level(a["d1a"], a["d2a"]) == 0


def test_hierarchy_enqueue_checks_ancestors_and_leaves() -> None:
    jobs = [
        running("a", "d1a", "1", "1"),
        pending("fits", "d1b", "2", min_resources=res("2")),
        pending("over", "d1b", "3", min_resources=res("3")),  # d1b 3 <= 3, d1 5 > 4
    ]
    ssn = session(snapshot([node("n1", "8", "16Gi")], jobs, HIER_QUEUES), HIER)
    p, j = plugin_of(ssn), ssn.jobs
    assert p.enqueueable(j["ns/fits"]) == PERMIT
    assert p.enqueueable(j["ns/over"]) == REJECT
    p.enqueued(j["ns/fits"])
    assert [p.attrs[n].inqueue[0] for n in ("d1b", "d1", "root")] == [2 * CPU] * 3


def test_hierarchy_cycle_makes_the_plugin_refuse_everything() -> None:
    queues = [QueueSpec("x", parent="y"), QueueSpec("y", parent="x")]
    jobs = [pending("p", "x", "1", min_resources=res("1"))]
    ssn = session(snapshot([node("n1", "8", "16Gi")], jobs, queues), HIER)
    p, t = plugin_of(ssn), ssn.tasks["ns/p0"]
    assert not p.ready
    assert p.enqueueable(ssn.jobs["ns/p"]) == REJECT
    assert not p.allocatable(ssn.queues["x"], t)
    assert not p.preemptive(ssn.queues["x"], t)
    assert p.reclaimable(t, []) == ([], REJECT)


# -- helpers ------------------------------------------------------------------------------------


def test_within_and_short_dims_look_only_at_requested_dimensions() -> None:
    used, limit = np.array([5.0, 1.0, 3.0]), np.array([4.0, 2.0, 3.0])
    assert not within(used, limit, np.array([1.0, 0.0, 0.0]))
    assert within(used, limit, np.array([0.0, 1.0, 1.0]))
    assert list(short_dims(used, limit, np.array([1.0, 1.0, 1.0]))) == [True, False, False]
    assert not short_dims(used, limit, np.array([0.0, 1.0, 1.0])).any()


def test_under_deserved_is_partly_and_ignores_zero_on_both_sides() -> None:
    req = np.array([1.0, 1.0])
    assert under_deserved(np.array([5.0, 1.0]), np.array([4.0, 2.0]), req)  # memory is under
    assert not under_deserved(np.array([5.0, 3.0]), np.array([4.0, 2.0]), req)
    # A dimension zero in both future and deserved does not count as "under".
    assert not under_deserved(np.array([5.0, 0.0]), np.array([4.0, 0.0]), req)
    assert not under_deserved(np.array([1.0, 1.0]), np.array([4.0, 4.0]), np.zeros(2))
