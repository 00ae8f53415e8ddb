"""proportion plugin, method by method: the per-session queue attributes, the deserved
water-filling, and each registered function called directly on the plugin. The scenarios ported
from Volcano are in test_proportion.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from core_helpers import job, node, queue, res, session, snapshot, task

from server.model import JobSpec, PodGroupPhase
from server.plugins.volcano.proportion import ProportionPlugin, QueueAttr, water_fill
from server.session.extension_points import PERMIT, REJECT
from server.session.session import Session

CONFIG = "tiers: [{plugins: [{name: proportion}]}]"
CPU = 1000.0  # one cpu in millicores
GI = 2.0**30
INF = np.inf


def plugin_of(ssn: Session) -> ProportionPlugin:
    return next(p for p in ssn.plugins if isinstance(p, ProportionPlugin))


def running(name: str, q: str, *cpus: str, memory: str | None = "1Gi", **fields: Any) -> JobSpec:
    """A Running job of one task per entry of ``cpus``, all on n1."""
    tasks = [task(f"{name}{i}", name, res(c, memory), "n1") for i, c in enumerate(cpus)]
    return job(name, queue=q, tasks=tasks, phase=PodGroupPhase.RUNNING, **fields)


def pending(name: str, q: str, cpu: str, memory: str | None = None, **fields: Any) -> JobSpec:
    """A Pending (not yet admitted) job of one task."""
    tasks = [task(f"{name}0", name, res(cpu, memory))]
    fields.setdefault("phase", PodGroupPhase.PENDING)
    return job(name, queue=q, tasks=tasks, index=1, **fields)


# An 8 cpu / 16Gi cluster; qg's guarantee (2 cpu) is reserved although it has no job. Only
# queues with jobs (qa, qb) take part in the water-filling.
QUEUES = [
    queue("qa", capability=res("6"), guarantee=res("1")),
    queue("qb", weight=3),
    queue("qg", guarantee=res("2")),
    queue("qp", priority=5),
    queue("qx", state="Closed"),
]


def cluster(*extra: JobSpec) -> Session:
    jobs = [
        # qa: 2 cpu / 2Gi allocated over minResources 1 cpu / 1Gi: 1 cpu / 1Gi elastic.
        running("ra", "qa", "1", "1", min_resources=res("1", "1Gi")),
        pending("pa", "qa", "3"),
        pending("pm", "qa", "0", "1Gi"),
        running("rb", "qb", "1"),
        pending("pb", "qb", "10"),
        *extra,
    ]
    return session(snapshot([node("n1", "8", "16Gi")], jobs, QUEUES), CONFIG)


def test_queue_attributes() -> None:
    """real capability = min(total - every queue's guarantee + own guarantee, capability), an
    unset (zero) cpu or memory capability being unlimited; request = allocated + pending."""
    ssn = cluster()
    attrs = plugin_of(ssn).attrs
    qa, qb = attrs["qa"], attrs["qb"]
    assert set(attrs) == {"qa", "qb"}  # queues with jobs only
    assert list(qa.real_capability) == [6 * CPU, 16 * GI]  # min(8 - 3 + 1, 6)
    assert list(qb.real_capability) == [5 * CPU, 16 * GI]  # 8 - 3, no capability
    assert list(qa.allocated) == [2 * CPU, 2 * GI]
    assert list(qa.request) == [5 * CPU, 3 * GI]
    assert list(qa.elastic) == [1 * CPU, 1 * GI]
    assert list(qa.inqueue) == [0.0, 0.0]  # running with minResources covered
    assert list(qb.request) == [11 * CPU, 1 * GI]
    assert qb.weight == 3.0
    # The deserved shares go to the cycle's result (Volcano's queue-deserved metric).
    assert ssn.result.queue_deserved["qa"] == ssn.space.to_dict(qa.deserved)


def test_zero_cpu_or_memory_capability_is_unlimited() -> None:
    """Volcano: a queue capability of 0 cpu or 0 memory means no limit on it."""
    queues = [queue("qz", capability={"cpu": 0, "memory": "4Gi"})]
    ssn = session(snapshot([node("n1", "8", "16Gi")], [running("z", "qz", "1")], queues), CONFIG)
    assert list(plugin_of(ssn).attrs["qz"].real_capability) == [8 * CPU, 4 * GI]


def test_inqueue_counts_admitted_jobs_not_yet_covered() -> None:
    """An Inqueue job adds its minResources less what it holds; a Pending one nothing."""
    ssn = cluster(
        pending("admitted", "qa", "2", min_resources=res("2", "1Gi"), phase=PodGroupPhase.INQUEUE),
        pending("waiting", "qa", "2", min_resources=res("2")),
    )
    assert list(plugin_of(ssn).attrs["qa"].inqueue) == [2 * CPU, 1 * GI]


def test_deserved_of_the_session() -> None:
    """Water-filling 8 cpu / 16Gi by weight 1:3, capped by request and real capability: qb
    stops at 5 cpu (its real capability) and 1Gi (its request), and the rest goes to qa, up to
    its 3Gi request; the memory nobody asks for stays unshared."""
    attrs = plugin_of(cluster()).attrs
    assert list(attrs["qb"].deserved) == pytest.approx([5 * CPU, 1 * GI])
    assert list(attrs["qa"].deserved) == pytest.approx([3 * CPU, 3 * GI])


def attr(name: str, weight: float, request: list[float], **vectors: list[float]) -> QueueAttr:
    """A queue attribute over ``len(request)`` resources for water_fill."""
    size = len(request)
    zeros = [0.0] * size
    return QueueAttr(
        name,
        weight,
        np.zeros(size),
        np.zeros(size),
        np.array(request),
        np.zeros(size),
        np.zeros(size),
        np.array(vectors.get("guarantee", zeros)),
        np.array(vectors.get("real", [INF] * size)),
    )


def test_water_fill_shares_by_weight_and_redistributes_what_is_not_taken() -> None:
    """Round 1: 12 by 1:1:2 gives 3, 3, 6, but q1 asks only 2; round 2 shares its 1 by 1:2."""
    queues = [attr("q1", 1, [2.0]), attr("q2", 1, [10.0]), attr("q3", 2, [10.0])]
    water_fill(queues, np.array([12.0]))
    assert [q.deserved[0] for q in queues] == pytest.approx([2.0, 10 / 3, 20 / 3])


def test_water_fill_caps_by_real_capability_and_raises_to_guarantee() -> None:
    queues = [
        attr("capped", 1, [10.0, 1.0], real=[2.0, INF]),
        attr("guaranteed", 1, [1.0, 1.0], guarantee=[3.0, 0.0]),
        attr("rest", 1, [10.0, 1.0]),
    ]
    water_fill(queues, np.array([12.0, 3.0]))
    capped, guaranteed, rest = (list(q.deserved) for q in queues)
    assert capped == pytest.approx([2.0, 1.0])
    assert guaranteed == pytest.approx([3.0, 1.0])  # above its 1 request: the guarantee
    assert rest == pytest.approx([7.0, 1.0])  # 12 - 2 - 3


def test_water_fill_without_weight_gives_nothing() -> None:
    """All weights zero: the loop never runs (not even the guarantee is applied), as in Volcano."""
    queues = [attr("q", 0, [4.0], guarantee=[1.0])]
    water_fill(queues, np.array([8.0]))
    assert list(queues[0].deserved) == [0.0]


def test_queue_order_and_key_follow_the_share() -> None:
    ssn = cluster()
    p, q, t = plugin_of(ssn), ssn.queues, ssn.tasks
    # qa: max(2/3 cpu, 2Gi/3Gi); qb: max(1/5 cpu, 1Gi/1Gi).
    assert p.attrs["qa"].share == pytest.approx(2 / 3)
    assert p.attrs["qb"].share == pytest.approx(1.0)
    assert p.queue_order(q["qa"], q["qb"]) == -1
    assert p.queue_key(q["qa"]) < p.queue_key(q["qb"])
    assert p.queue_order(q["qb"], q["qp"]) > 0  # priority before share
    assert p.queue_key(q["qp"]) < p.queue_key(q["qb"])
    p.on_allocate(t["ns/pa0"])  # qa: 5/3 cpu; the cached share must be dropped
    assert p.attrs["qa"].share == pytest.approx(5 / 3)
    assert p.queue_order(q["qa"], q["qb"]) == 1
    assert p.queue_key(q["qa"]) > p.queue_key(q["qb"])
    p.on_deallocate(t["ns/pa0"])
    assert p.queue_order(q["qa"], q["qb"]) == -1
    assert p.queue_key(q["qg"]) == (0, 0.0)  # no entry: share 0


def test_allocatable_and_overused() -> None:
    ssn = cluster()
    p, q, t = plugin_of(ssn), ssn.queues, ssn.tasks
    assert list(p.attrs["qa"].deserved) == pytest.approx([3 * CPU, 3 * GI])
    assert not p.allocatable(q["qa"], t["ns/pa0"])  # 2 + 3 > 3 cpu
    assert p.allocatable(q["qa"], t["ns/ra0"])  # 3 cpu / 3Gi: exactly deserved
    assert p.allocatable(q["qa"], t["ns/pm0"])  # memory only: 3Gi
    assert not p.allocatable(q["qx"], t["ns/pa0"])  # closed
    assert p.allocatable(q["qg"], t["ns/pa0"])  # no entry: no limit
    p.on_allocate(t["ns/pa0"])  # qa: 5 cpu, above its 3 deserved
    assert not p.allocatable(q["qa"], t["ns/ra0"])
    assert p.allocatable(q["qa"], t["ns/pm0"])  # cpu is not looked at: it asks for none
    p.on_deallocate(t["ns/pa0"])
    assert not p.overused(q["qb"])  # 1 of 5 cpu
    p.on_allocate(t["ns/pb0"])
    assert p.overused(q["qb"])  # 11 cpu, 1Gi: at or above deserved everywhere
    assert not p.allocatable(q["qb"], t["ns/rb0"])
    p.on_deallocate(t["ns/pb0"])
    assert not p.overused(q["qb"])
    assert not p.overused(q["qg"])


def test_enqueue_counts_allocated_inqueue_and_elastic() -> None:
    """need = minResources + allocated + inqueue - elastic, within the real capability."""
    ssn = cluster(
        pending("big", "qa", "4", min_resources=res("5")),
        pending("small", "qa", "1", min_resources=res("1")),
        pending("loose", "qa", "1"),
        pending("shut", "qx", "1", min_resources=res("1")),
    )
    p, j = plugin_of(ssn), ssn.jobs
    # 5 + 2 + 0 - 1 = 6 cpu: exactly qa's real capability (without the elastic cpu: 7).
    assert p.enqueueable(j["ns/big"]) == PERMIT
    p.enqueued(j["ns/big"])
    assert list(p.attrs["qa"].inqueue) == [5 * CPU, 0.0]
    assert p.enqueueable(j["ns/small"]) == REJECT  # 1 + 2 + 5 - 1 = 7 > 6
    assert p.enqueueable(j["ns/loose"]) == PERMIT  # no minResources
    assert p.enqueueable(j["ns/shut"]) == REJECT  # closed queue


def test_reclaimable_takes_victims_while_above_deserved() -> None:
    """qv deserves 2 of the 4 cpu (1:1 with qr) but holds 4: two victims bring it down to its
    deserved; the allocation is deducted on a copy."""
    jobs = [
        running("v", "qv", "1", "1", "1", "1", memory=None),
        pending("w", "qv", "4"),
        pending("r", "qr", "4"),
        running("o", "qo", "0", memory=None),
    ]
    queues = [queue("qv"), queue("qr"), queue("qo", weight=0)]
    ssn = session(snapshot([node("n1", "4", "8Gi")], jobs, queues), CONFIG)
    p = plugin_of(ssn)
    assert p.attrs["qv"].deserved[0] == pytest.approx(2 * CPU)
    victims = [ssn.tasks[f"ns/v{i}"] for i in range(4)]
    chosen, verdict = p.reclaimable(ssn.tasks["ns/r0"], victims)
    assert verdict == PERMIT
    assert [v.uid for v in chosen] == ["ns/v0", "ns/v1"]
    assert p.attrs["qv"].allocated[0] == 4 * CPU
    # A victim of a queue at its deserved share (qo: 0 of 0) is not taken.
    assert p.reclaimable(ssn.tasks["ns/r0"], [ssn.tasks["ns/o0"]]) == ([], PERMIT)
