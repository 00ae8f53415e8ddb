"""capacity plugin: behaviour of Volcano's plugins/capacity (capacity.go) through sessions and
cycles. The cases of capacity_test.go are scenario files under tests/scenarios/volcano/capacity/,
run by test_volcano_cases.py; test_capacity_unit.py calls the plugin's functions one by one."""

from __future__ import annotations

from functools import partial

import core_helpers
import pytest
from core_helpers import cycle, node, queue, res, session, snapshot

from server.model import PodGroupPhase
from server.session.session import Session

FLAT = """
extension_points_not_listed: disabled
actions: "allocate, reclaim"
tiers:
- plugins:
  - name: capacity
    enabledAllocatable: true
    enablePreemptive: true
    enableReclaimable: true
    enableQueueOrder: true
    enableJobEnqueued: true
  - name: predicates
    enablePredicate: true
  - name: gang
    enableJobStarving: true
"""
HIER = FLAT.replace(
    "    enableQueueOrder: true\n", "    enableQueueOrder: true\n    enableHierarchy: true\n"
)

# capacity_test.go's pods and pod groups live in namespace ns1; every group has minMember 1.
task = partial(core_helpers.task, ns="ns1")
job = partial(core_helpers.job, ns="ns1", min_member=1)
SMALL_NODES = [node("n1", "2", "4Gi", pods=10), node("n2", "2", "4Gi", pods=10)]
TWO_NODES = [node("n1", "4", "8Gi", pods=10), node("n2", "4", "8Gi", pods=10)]
BIG_NODE = node("n1", "8", "16Gi", pods=10)


def test_queue_order_by_priority_then_share_then_having_deserved() -> None:
    """Queue order: priority first; then allocated / deserved; equal shares: a queue with deserved
    goes before one without (whose share is 1)."""
    jobs = [
        job(
            "a", queue="qa", tasks=[task("a0", "a", res("1", 0), "n1")], phase=PodGroupPhase.RUNNING
        ),
        job(
            "b",
            queue="qb",
            tasks=[task("b0", "b", res("2", 0), "n1")],
            phase=PodGroupPhase.RUNNING,
            index=1,
        ),
        job(
            "c",
            queue="qc",
            tasks=[task("c0", "c", res("1", 0))],
            phase=PodGroupPhase.INQUEUE,
            index=2,
        ),
        job(
            "d",
            queue="qd",
            tasks=[task("d0", "d", res("1", 0))],
            phase=PodGroupPhase.INQUEUE,
            index=3,
        ),
    ]
    ssn = session(
        snapshot(
            TWO_NODES,
            jobs,
            [
                queue("qa", res("4", 0)),
                queue("qb", res("4", 0)),
                queue("qc"),
                queue("qd", priority=5),
            ],
        ),
        FLAT,
    )
    q = ssn.queues
    assert ssn.queue_order_fn(q["qd"], q["qa"]) is True  # priority wins
    assert ssn.queue_order_fn(q["qa"], q["qb"]) is True  # 0.25 < 0.5
    assert ssn.queue_order_fn(q["qb"], q["qc"]) is True  # 0.5 < 1 (no deserved)


def test_preemptive_needs_room_under_deserved_on_some_requested_dimension() -> None:
    """PreemptiveFn: allocated + request within the real capability, and <= deserved on at least
    one requested dimension (zero-on-both dimensions ignored)."""
    jobs = [
        job(
            "a",
            queue="qa",
            tasks=[task("a0", "a", res("2", "1Gi"), "n1"), task("a1", "a", res("1", "1Gi"))],
            phase=PodGroupPhase.RUNNING,
        )
    ]
    ssn = session(snapshot(TWO_NODES, jobs, [queue("qa", res("2", "4Gi"), res("3", "8Gi"))]), FLAT)
    qa, t = ssn.queues["qa"], ssn.tasks["ns1/a1"]
    # cpu 3 > deserved 2, memory 2Gi <= 4Gi: preemptive on memory.
    assert ssn.preemptive(qa, t) is True
    ssn = session(snapshot(TWO_NODES, jobs, [queue("qa", res("2", "1Gi"), res("3", "8Gi"))]), FLAT)
    assert ssn.preemptive(ssn.queues["qa"], ssn.tasks["ns1/a1"]) is False
    ssn = session(
        snapshot(TWO_NODES, jobs, [queue("qa", res("4", "4Gi"), res("2.5", "8Gi"))]), FLAT
    )  # beyond capability
    assert ssn.preemptive(ssn.queues["qa"], ssn.tasks["ns1/a1"]) is False


def reclaim_fn(ssn: Session):
    return dict(ssn.chain("reclaimable")[0])["capacity"]


def test_reclaimable_stops_at_deserved_and_respects_guarantee() -> None:
    """reclaimFn: victims while the victim queue is above deserved (allocation deducted as victims
    are taken); never below the queue's guarantee."""
    victims = [task(f"v{i}", "v", res("1", "1Gi"), "n1") for i in range(4)]
    jobs = [
        job("v", queue="qv", tasks=victims, phase=PodGroupPhase.RUNNING),
        job(
            "r",
            queue="qr",
            tasks=[task("r0", "r", res("1", "1Gi"))],
            phase=PodGroupPhase.INQUEUE,
            index=1,
        ),
    ]
    ssn = session(
        snapshot(TWO_NODES, jobs, [queue("qv", res("2", "2Gi")), queue("qr", res("2", "2Gi"))]),
        FLAT,
    )
    chosen, verdict = reclaim_fn(ssn)(
        ssn.tasks["ns1/r0"], [ssn.tasks[f"ns1/v{i}"] for i in range(4)]
    )
    assert verdict == 1
    assert len(chosen) == 2
    ssn = session(
        snapshot(
            TWO_NODES,
            jobs,
            [queue("qv", res("2", "2Gi"), guarantee=res("3", "3Gi")), queue("qr", res("2", "2Gi"))],
        ),
        FLAT,
    )
    chosen, _ = reclaim_fn(ssn)(ssn.tasks["ns1/r0"], [ssn.tasks[f"ns1/v{i}"] for i in range(4)])
    assert len(chosen) == 1  # 4 -> 3 == guarantee: stop


def test_reclaimee_without_deserved_resources_is_an_immediate_victim() -> None:
    """isImmediateVictim: the victim's queue deserves none of the victim's resources; and a victim
    with no resource in common with the reclaimer is skipped (shouldSkipReclaimee)."""
    jobs = [
        job(
            "v",
            queue="qv",
            tasks=[
                task("v0", "v", res(0, 0, nvidia_com__gpu=1), "n1"),
                task("v1", "v", res("1", 0), "n1"),
            ],
            phase=PodGroupPhase.RUNNING,
        ),
        job(
            "r",
            queue="qr",
            tasks=[task("r0", "r", res(0, 0, nvidia_com__gpu=1))],
            phase=PodGroupPhase.INQUEUE,
            index=1,
        ),
    ]
    nodes = [node("n1", "4", "8Gi", **{"nvidia.com/gpu": 4})]
    ssn = session(
        snapshot(nodes, jobs, [queue("qv", res("4", "8Gi")), queue("qr", res(nvidia_com__gpu=4))]),
        FLAT,
    )
    chosen, _ = reclaim_fn(ssn)(ssn.tasks["ns1/r0"], [ssn.tasks["ns1/v0"], ssn.tasks["ns1/v1"]])
    assert [t.name for t in chosen] == ["v0"]


def test_enqueue_respects_real_capability_and_other_queues_guarantee() -> None:
    """jobEnqueueable: minResources + allocated + inqueue - elastic within the real capability,
    which is the cluster minus every queue's guarantee plus the queue's own."""
    cfg = FLAT.replace('actions: "allocate, reclaim"', 'actions: "enqueue"')
    nodes = [TWO_NODES[0]]
    big = job(
        "big",
        queue="qa",
        tasks=[task("b0", "big", res("3", 0))],
        phase=PodGroupPhase.PENDING,
        index=0,
        min_resources=res("3", 0),
    )
    r = cycle(snapshot(nodes, [big], [queue("qa"), queue("qb", guarantee=res("2", 0))]), cfg)
    assert r.jobs["ns1/big"].phase == PodGroupPhase.PENDING
    r = cycle(snapshot(nodes, [big], [queue("qa"), queue("qb", guarantee=res("1", 0))]), cfg)
    assert r.jobs["ns1/big"].phase == PodGroupPhase.INQUEUE


def test_enqueued_jobs_count_as_inqueue() -> None:
    """JobEnqueuedFn: an admitted job's minResources count against the next job of the queue."""
    cfg = FLAT.replace('actions: "allocate, reclaim"', 'actions: "enqueue"')
    jobs = [
        job(
            f"j{i}",
            queue="qa",
            tasks=[task(f"p{i}", f"j{i}", res("2", 0))],
            phase=PodGroupPhase.PENDING,
            index=i,
            min_resources=res("2", 0),
        )
        for i in range(3)
    ]
    r = cycle(snapshot([TWO_NODES[0]], jobs, [queue("qa")]), cfg)
    phases = [r.jobs[f"ns1/j{i}"].phase for i in range(3)]
    assert phases == [PodGroupPhase.INQUEUE, PodGroupPhase.INQUEUE, PodGroupPhase.PENDING]


# -- hierarchical ------------------------------------------------------------------------------


def test_hierarchy_parent_capability_caps_children() -> None:
    """checkHierarchicalQueue / checkQueueAllocatableHierarchically: a child without capability
    inherits its parent's; a placement must fit the child and every ancestor."""
    queues = [
        queue("root"),
        queue("dept", capability=res("3", "100Gi")),
        queue("team1", parent="dept"),
        queue("team2", parent="dept"),
    ]
    jobs = [
        job(
            "a",
            queue="team1",
            tasks=[task(f"a{i}", "a", res("1", 0)) for i in range(2)],
            phase=PodGroupPhase.INQUEUE,
            index=0,
        ),
        job(
            "b",
            queue="team2",
            tasks=[task(f"b{i}", "b", res("1", 0)) for i in range(2)],
            phase=PodGroupPhase.INQUEUE,
            index=1,
        ),
    ]
    r = cycle(snapshot([BIG_NODE], jobs, queues), HIER)
    assert len(r.binds) == 3  # dept's capability (3 cpu) stops the fourth


def test_hierarchy_real_capability_subtracts_sibling_guarantees() -> None:
    """realCapability of a child = parent's real capability - all children's guarantees + its own
    (the root's capability, infinite when unset, is the start: here 8 cpu)."""
    queues = [
        queue("root", capability=res("8", "100Gi")),
        queue("a", guarantee=res("3", 0)),
        queue("b"),
    ]
    jobs = [
        job(
            "x",
            queue="b",
            tasks=[task(f"x{i}", "x", res("1", 0)) for i in range(8)],
            phase=PodGroupPhase.INQUEUE,
        )
    ]
    r = cycle(snapshot([BIG_NODE], jobs, queues), HIER)
    assert len(r.binds) == 5


def test_hierarchy_job_in_inner_queue_blocks_the_session() -> None:
    """buildHierarchicalQueueAttrs: a job in a queue that has children makes the plugin refuse
    every allocation this session."""
    queues = [queue("root"), queue("dept"), queue("team", parent="dept")]
    jobs = [
        job(
            "bad", queue="dept", tasks=[task("p0", "bad", res("1", 0))], phase=PodGroupPhase.INQUEUE
        ),
        job(
            "ok",
            queue="team",
            tasks=[task("p1", "ok", res("1", 0))],
            phase=PodGroupPhase.INQUEUE,
            index=1,
        ),
    ]
    assert cycle(snapshot([BIG_NODE], jobs, queues), HIER).binds == {}
    assert len(cycle(snapshot([BIG_NODE], jobs[1:], queues), HIER).binds) == 1


def test_hierarchy_unknown_parent_blocks_the_session() -> None:
    queues = [queue("team", parent="nope")]
    jobs = [
        job("j", queue="team", tasks=[task("p0", "j", res("1", 0))], phase=PodGroupPhase.INQUEUE)
    ]
    assert cycle(snapshot([BIG_NODE], jobs, queues), HIER).binds == {}


def test_hierarchy_implicit_root() -> None:
    """Without a queue named root in the snapshot, top-level queues hang under an implicit root."""
    queues = [queue("team", capability=res("1", "100Gi"))]
    jobs = [
        job(
            "j",
            queue="team",
            tasks=[task(f"p{i}", "j", res("1", 0)) for i in range(2)],
            phase=PodGroupPhase.INQUEUE,
        )
    ]
    assert len(cycle(snapshot([BIG_NODE], jobs, queues), HIER).binds) == 1


def test_hierarchy_queue_order_compares_subtrees() -> None:
    """Hierarchical queue order: leaves compare by their ancestors just below the deepest common
    ancestor; a leaf in a lightly used department goes first even if the leaf itself is busier."""
    queues = [
        queue("root"),
        queue("d1", res("4", 0)),
        queue("d2", res("4", 0)),
        queue("d1a", res("1", 0), parent="d1"),
        queue("d1b", res("3", 0), parent="d1"),
        queue("d2a", res("4", 0), parent="d2"),
    ]
    jobs = [
        job(
            "x",
            queue="d1b",
            tasks=[task(f"x{i}", "x", res("1", 0), "n1") for i in range(3)],
            phase=PodGroupPhase.RUNNING,
        ),
        job(
            "y",
            queue="d2a",
            tasks=[task("y0", "y", res("1", 0), "n1"), task("y1", "y", res("1", 0))],
            phase=PodGroupPhase.RUNNING,
            index=1,
        ),
        job(
            "z",
            queue="d1a",
            tasks=[task("z0", "z", res("1", 0))],
            phase=PodGroupPhase.INQUEUE,
            index=2,
        ),
    ]
    ssn = session(snapshot([BIG_NODE], jobs, queues), HIER)
    q = ssn.queues
    # d1 share 3/4 > d2 share 1/4: d2a before d1a although d1a's own share (0) is lower.
    assert ssn.queue_order_fn(q["d2a"], q["d1a"]) is True
    assert ssn.queue_order_fn(q["d1a"], q["d2a"]) is False
    # Same parent: d1a (0/1) before d1b (3/3).
    assert ssn.queue_order_fn(q["d1a"], q["d1b"]) is True
    # Leaves before inner queues.
    assert ssn.queue_order_fn(q["d1b"], q["d2"]) is True


def test_hierarchy_victim_queue_order_prefers_close_queues() -> None:
    """VictimQueueOrderFn: victims first from the queue sharing the deepest ancestor with the
    preemptor's queue."""
    queues = [
        queue("root"),
        queue("d1"),
        queue("d2"),
        queue("d1a", parent="d1"),
        queue("d1b", parent="d1"),
        queue("d2a", parent="d2"),
    ]
    jobs = [
        job(n, queue=q, tasks=[task(f"{n}0", n, res("1", 0))], phase=PodGroupPhase.INQUEUE, index=i)
        for i, (n, q) in enumerate([("a", "d1a"), ("b", "d1b"), ("c", "d2a")])
    ]
    ssn = session(snapshot([BIG_NODE], jobs, queues), HIER)
    q = ssn.queues
    assert ssn.victim_queue_order_fn(q["d1b"], q["d2a"], q["d1a"]) is True
    assert ssn.victim_queue_order_fn(q["d2a"], q["d1b"], q["d1a"]) is False


def test_hierarchy_enqueue_checks_ancestors() -> None:
    """checkJobEnqueueableHierarchically: minResources must fit every ancestor's real capability."""
    cfg = HIER.replace('actions: "allocate, reclaim"', 'actions: "enqueue"')
    queues = [
        queue("root"),
        queue("dept", capability=res("2", "100Gi")),
        queue("team", parent="dept"),
    ]
    jobs = [
        job(
            "j",
            queue="team",
            tasks=[task("p0", "j", res("3", 0))],
            phase=PodGroupPhase.PENDING,
            min_resources=res("3", 0),
        )
    ]
    assert (
        cycle(snapshot([BIG_NODE], jobs, queues), cfg).jobs["ns1/j"].phase == PodGroupPhase.PENDING
    )
    queues[1] = queue("dept", capability=res("4", "100Gi"))
    assert (
        cycle(snapshot([BIG_NODE], jobs, queues), cfg).jobs["ns1/j"].phase == PodGroupPhase.INQUEUE
    )


@pytest.mark.parametrize("level", [0, 1])
def test_ancestor_reclaim_level(level: int) -> None:
    """ancestorReclaimLevel: with level 1 the victim's department (not shared with the reclaimer)
    must itself be above its deserved; d2 is under deserved, so its over-deserved leaf keeps its
    task."""
    cfg = HIER.replace(
        "    enableHierarchy: true\n",
        f"    enableHierarchy: true\n    arguments: {{ancestorReclaimLevel: {level}}}\n",
    )
    queues = [
        queue("root"),
        queue("d1", res("4", 0)),
        queue("d2", res("6", 0)),
        queue("d1a", res("4", 0), parent="d1"),
        queue("d2a", res("1", 0), parent="d2"),
    ]
    jobs = [
        job(
            "v",
            queue="d2a",
            tasks=[task(f"v{i}", "v", res("1", 0), "n1") for i in range(3)],
            phase=PodGroupPhase.RUNNING,
        ),
        job(
            "r",
            queue="d1a",
            tasks=[task("r0", "r", res("1", 0))],
            phase=PodGroupPhase.INQUEUE,
            index=1,
        ),
    ]
    ssn = session(snapshot([BIG_NODE], jobs, queues), cfg)
    chosen, _ = reclaim_fn(ssn)(ssn.tasks["ns1/r0"], [ssn.tasks["ns1/v0"]])
    assert (len(chosen) == 1) is (level == 0)
    # The check is a what-if: the live allocations of d2a and its department are untouched.
    attrs = next(p for p in ssn.plugins if p.name == "capacity").attrs
    assert [attrs[q].allocated[0] for q in ("d2a", "d2")] == [3000.0, 3000.0]
