"""capacity plugin: behaviour of Volcano's plugins/capacity (capacity.go, capacity_test.go)."""

from __future__ import annotations

import numpy as np
import pytest

from server.config import load_config
from server.model import (
    ClusterSnapshot,
    JobSpec,
    NodeSpec,
    PodGroupPhase,
    QueueSpec,
    TaskSpec,
    TaskStatus,
)
from server.scheduler import SchedulerCore
from server.session.session import Session

GI = 2**30
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
HIER = FLAT.replace("    enableQueueOrder: true\n", "    enableQueueOrder: true\n    enableHierarchy: true\n")


def res(cpu: float, mem_gi: float = 0, **extra: float) -> dict[str, float]:
    out = {"cpu": cpu * 1000, "memory": mem_gi * GI}
    out.update({k.replace("_", "/"): v * 1000 for k, v in extra.items()})
    return out


def node(name: str, cpu: float = 2, mem_gi: float = 4) -> NodeSpec:
    return NodeSpec(name, {**res(cpu, mem_gi), "pods": 10})


def pod(name: str, job: str, req: dict[str, float], node_name: str | None = None, preemptable: bool = True) -> TaskSpec:
    return TaskSpec(uid=f"ns1/{name}", name=name, namespace="ns1", job=f"ns1/{job}", request=req, node=node_name,
                    status=TaskStatus.RUNNING if node_name else TaskStatus.PENDING, preemptable=preemptable)


def group(name: str, queue: str, tasks: list[TaskSpec], phase: PodGroupPhase, index: int = 0,
          min_resources: dict[str, float] | None = None) -> JobSpec:
    return JobSpec(uid=f"ns1/{name}", name=name, namespace="ns1", queue=queue, tasks=tasks, min_member=1,
                   phase=phase, creation_index=index, min_resources=min_resources)


def queue(name: str, deserved: dict[str, float] | None = None, capability: dict[str, float] | None = None, *,
          guarantee: dict[str, float] | None = None, parent: str | None = None, priority: int = 0) -> QueueSpec:
    return QueueSpec(name, parent=parent, deserved=deserved or {}, capability=capability or {},
                     guarantee=guarantee or {}, priority=priority)


def run(config: str, nodes: list[NodeSpec], queues: list[QueueSpec], jobs: list[JobSpec]):  # noqa: ANN201
    snap = ClusterSnapshot(nodes=nodes, queues=queues, jobs=jobs)
    return SchedulerCore(load_config(config)).run_cycle(snap, 1)


def test_case0_allocatable_within_capability() -> None:
    """capacity_test.go case0: q1 capability 2 cpu / 2Gi holds 1 cpu; a 1 cpu pod is placed."""
    r = run(FLAT, [node("n1"), node("n2")], [queue("q1", capability=res(2, 2))],
            [group("pg1", "q1", [pod("p1", "pg1", res(1, 1), "n1")], PodGroupPhase.RUNNING),
             group("pg2", "q1", [pod("p2", "pg2", res(1, 1))], PodGroupPhase.INQUEUE, 1)])
    assert list(r.binds) == ["ns1/p2"]


def test_case1_not_allocatable_beyond_capability() -> None:
    """capacity_test.go case1: capability 1.5 cpu, 1 used: another 1 cpu pod is refused."""
    r = run(FLAT, [node("n1"), node("n2")], [queue("q2", capability=res(1.5, 1.5))],
            [group("pg3", "q2", [pod("p3", "pg3", res(1, 1), "n1")], PodGroupPhase.RUNNING),
             group("pg4", "q2", [pod("p4", "pg4", res(1, 1))], PodGroupPhase.INQUEUE, 1)])
    assert r.binds == {}


def test_case2_reclaim_from_queue_above_deserved() -> None:
    """capacity_test.go case2: q3 (deserved 2 cpu / 4Gi) holds both nodes; q4's pending pod
    reclaims the preemptable p6 and is pipelined onto n2; p5 (not preemptable) stays."""
    r = run(FLAT, [node("n1"), node("n2")], [queue("q3", res(2, 4)), queue("q4", res(2, 4))],
            [group("pg5", "q3", [pod("p5", "pg5", res(2, 4), "n1", preemptable=False),
                                 pod("p6", "pg5", res(2, 4), "n2")], PodGroupPhase.RUNNING),
             group("pg6", "q4", [pod("p7", "pg6", res(2, 4))], PodGroupPhase.INQUEUE, 1)])
    assert list(r.evictions) == ["ns1/p6"]
    assert r.pipelined == {"ns1/p7": "n2"}


def flat_session(queues: list[QueueSpec], jobs: list[JobSpec], nodes: list[NodeSpec] | None = None,
                 config: str = FLAT) -> Session:
    snap = ClusterSnapshot(nodes=nodes or [node("n1", 4, 8), node("n2", 4, 8)], queues=queues, jobs=jobs)
    return Session(snap, load_config(config))


def test_queue_order_by_priority_then_share_then_having_deserved() -> None:
    """Queue order: priority first; then allocated / deserved; equal shares: a queue with deserved
    goes before one without (whose share is 1)."""
    jobs = [group("a", "qa", [pod("a0", "a", res(1), "n1")], PodGroupPhase.RUNNING),
            group("b", "qb", [pod("b0", "b", res(2), "n1")], PodGroupPhase.RUNNING, 1),
            group("c", "qc", [pod("c0", "c", res(1))], PodGroupPhase.INQUEUE, 2),
            group("d", "qd", [pod("d0", "d", res(1))], PodGroupPhase.INQUEUE, 3)]
    ssn = flat_session([queue("qa", res(4)), queue("qb", res(4)), queue("qc"), queue("qd", priority=5)], jobs)
    q = ssn.queues
    assert ssn.queue_order_fn(q["qd"], q["qa"]) is True  # priority wins
    assert ssn.queue_order_fn(q["qa"], q["qb"]) is True  # 0.25 < 0.5
    assert ssn.queue_order_fn(q["qb"], q["qc"]) is True  # 0.5 < 1 (no deserved)


def test_preemptive_needs_room_under_deserved_on_some_requested_dimension() -> None:
    """PreemptiveFn: allocated + request within the real capability, and <= deserved on at least
    one requested dimension (zero-on-both dimensions ignored)."""
    jobs = [group("a", "qa", [pod("a0", "a", res(2, 1), "n1"), pod("a1", "a", res(1, 1))], PodGroupPhase.RUNNING)]
    ssn = flat_session([queue("qa", res(2, 4), res(3, 8))], jobs)
    qa, t = ssn.queues["qa"], ssn.tasks["ns1/a1"]
    # cpu 3 > deserved 2, memory 2Gi <= 4Gi: preemptive on memory.
    assert ssn.preemptive(qa, t) is True
    ssn = flat_session([queue("qa", res(2, 1), res(3, 8))], jobs)
    assert ssn.preemptive(ssn.queues["qa"], ssn.tasks["ns1/a1"]) is False
    ssn = flat_session([queue("qa", res(4, 4), res(2.5, 8))], jobs)  # beyond capability
    assert ssn.preemptive(ssn.queues["qa"], ssn.tasks["ns1/a1"]) is False


def reclaim_fn(ssn: Session):  # noqa: ANN201
    return dict(ssn.chain("reclaimable")[0])["capacity"]


def test_reclaimable_stops_at_deserved_and_respects_guarantee() -> None:
    """reclaimFn: victims while the victim queue is above deserved (allocation deducted as victims
    are taken); never below the queue's guarantee."""
    victims = [pod(f"v{i}", "v", res(1, 1), "n1") for i in range(4)]
    jobs = [group("v", "qv", victims, PodGroupPhase.RUNNING),
            group("r", "qr", [pod("r0", "r", res(1, 1))], PodGroupPhase.INQUEUE, 1)]
    ssn = flat_session([queue("qv", res(2, 2)), queue("qr", res(2, 2))], jobs)
    chosen, verdict = reclaim_fn(ssn)(ssn.tasks["ns1/r0"], [ssn.tasks[f"ns1/v{i}"] for i in range(4)])
    assert verdict == 1 and len(chosen) == 2  # 4 -> 3 -> 2 == deserved: stop
    ssn = flat_session([queue("qv", res(2, 2), guarantee=res(3, 3)), queue("qr", res(2, 2))], jobs)
    chosen, _ = reclaim_fn(ssn)(ssn.tasks["ns1/r0"], [ssn.tasks[f"ns1/v{i}"] for i in range(4)])
    assert len(chosen) == 1  # 4 -> 3 == guarantee: stop


def test_reclaimee_without_deserved_resources_is_an_immediate_victim() -> None:
    """isImmediateVictim: the victim's queue deserves none of the victim's resources; and a victim
    with no resource in common with the reclaimer is skipped (shouldSkipReclaimee)."""
    jobs = [group("v", "qv", [pod("v0", "v", res(0, 0, nvidia_com_gpu=1), "n1"), pod("v1", "v", res(1), "n1")],
                  PodGroupPhase.RUNNING),
            group("r", "qr", [pod("r0", "r", res(0, 0, nvidia_com_gpu=1))], PodGroupPhase.INQUEUE, 1)]
    nodes = [NodeSpec("n1", {**res(4, 8), "nvidia.com/gpu": 4000})]
    ssn = flat_session([queue("qv", res(4, 8)), queue("qr", {"nvidia.com/gpu": 4000})], jobs, nodes)
    chosen, _ = reclaim_fn(ssn)(ssn.tasks["ns1/r0"], [ssn.tasks["ns1/v0"], ssn.tasks["ns1/v1"]])
    assert [t.name for t in chosen] == ["v0"]


def test_enqueue_respects_real_capability_and_other_queues_guarantee() -> None:
    """jobEnqueueable: minResources + allocated + inqueue - elastic within the real capability,
    which is the cluster minus every queue's guarantee plus the queue's own."""
    cfg = FLAT.replace('actions: "allocate, reclaim"', 'actions: "enqueue"')
    nodes = [node("n1", 4, 8)]
    big = group("big", "qa", [pod("b0", "big", res(3))], PodGroupPhase.PENDING, 0, min_resources=res(3))
    r = run(cfg, nodes, [queue("qa"), queue("qb", guarantee=res(2))], [big])
    assert r.jobs["ns1/big"].phase == PodGroupPhase.PENDING
    r = run(cfg, nodes, [queue("qa"), queue("qb", guarantee=res(1))], [big])
    assert r.jobs["ns1/big"].phase == PodGroupPhase.INQUEUE


def test_enqueued_jobs_count_as_inqueue() -> None:
    """JobEnqueuedFn: an admitted job's minResources count against the next job of the queue."""
    cfg = FLAT.replace('actions: "allocate, reclaim"', 'actions: "enqueue"')
    jobs = [group(f"j{i}", "qa", [pod(f"p{i}", f"j{i}", res(2))], PodGroupPhase.PENDING, i, min_resources=res(2))
            for i in range(3)]
    r = run(cfg, [node("n1", 4, 8)], [queue("qa")], jobs)
    phases = [r.jobs[f"ns1/j{i}"].phase for i in range(3)]
    assert phases == [PodGroupPhase.INQUEUE, PodGroupPhase.INQUEUE, PodGroupPhase.PENDING]


# -- hierarchical ------------------------------------------------------------------------------

def test_hierarchy_parent_capability_caps_children() -> None:
    """checkHierarchicalQueue / checkQueueAllocatableHierarchically: a child without capability
    inherits its parent's; a placement must fit the child and every ancestor."""
    queues = [queue("root"), queue("dept", capability=res(3, 100)), queue("team1", parent="dept"),
              queue("team2", parent="dept")]
    jobs = [group("a", "team1", [pod(f"a{i}", "a", res(1)) for i in range(2)], PodGroupPhase.INQUEUE, 0),
            group("b", "team2", [pod(f"b{i}", "b", res(1)) for i in range(2)], PodGroupPhase.INQUEUE, 1)]
    r = run(HIER, [node("n1", 8, 16)], queues, jobs)
    assert len(r.binds) == 3  # dept's capability (3 cpu) stops the fourth


def test_hierarchy_real_capability_subtracts_sibling_guarantees() -> None:
    """realCapability of a child = parent's real capability - all children's guarantees + its own
    (the root's capability, infinite when unset, is the start: here 8 cpu)."""
    queues = [queue("root", capability=res(8, 100)), queue("a", guarantee=res(3)), queue("b")]
    jobs = [group("x", "b", [pod(f"x{i}", "x", res(1)) for i in range(8)], PodGroupPhase.INQUEUE)]
    r = run(HIER, [node("n1", 8, 16)], queues, jobs)
    assert len(r.binds) == 5


def test_hierarchy_job_in_inner_queue_blocks_the_session() -> None:
    """buildHierarchicalQueueAttrs: a job in a queue that has children makes the plugin refuse
    every allocation this session."""
    queues = [queue("root"), queue("dept"), queue("team", parent="dept")]
    jobs = [group("bad", "dept", [pod("p0", "bad", res(1))], PodGroupPhase.INQUEUE),
            group("ok", "team", [pod("p1", "ok", res(1))], PodGroupPhase.INQUEUE, 1)]
    assert run(HIER, [node("n1", 8, 16)], queues, jobs).binds == {}
    assert len(run(HIER, [node("n1", 8, 16)], queues, jobs[1:]).binds) == 1


def test_hierarchy_unknown_parent_blocks_the_session() -> None:
    queues = [queue("team", parent="nope")]
    jobs = [group("j", "team", [pod("p0", "j", res(1))], PodGroupPhase.INQUEUE)]
    assert run(HIER, [node("n1", 8, 16)], queues, jobs).binds == {}


def test_hierarchy_implicit_root() -> None:
    """Without a queue named root in the snapshot, top-level queues hang under an implicit root."""
    queues = [queue("team", capability=res(1, 100))]
    jobs = [group("j", "team", [pod(f"p{i}", "j", res(1)) for i in range(2)], PodGroupPhase.INQUEUE)]
    assert len(run(HIER, [node("n1", 8, 16)], queues, jobs).binds) == 1


def test_hierarchy_queue_order_compares_subtrees() -> None:
    """Hierarchical queue order: leaves compare by their ancestors just below the deepest common
    ancestor; a leaf in a lightly used department goes first even if the leaf itself is busier."""
    queues = [queue("root"), queue("d1", res(4)), queue("d2", res(4)),
              queue("d1a", res(1), parent="d1"), queue("d1b", res(3), parent="d1"),
              queue("d2a", res(4), parent="d2")]
    jobs = [group("x", "d1b", [pod(f"x{i}", "x", res(1), "n1") for i in range(3)], PodGroupPhase.RUNNING),
            group("y", "d2a", [pod("y0", "y", res(1), "n1"), pod("y1", "y", res(1))], PodGroupPhase.RUNNING, 1),
            group("z", "d1a", [pod("z0", "z", res(1))], PodGroupPhase.INQUEUE, 2)]
    ssn = flat_session(queues, jobs, [node("n1", 8, 16)], HIER)
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
    queues = [queue("root"), queue("d1"), queue("d2"), queue("d1a", parent="d1"), queue("d1b", parent="d1"),
              queue("d2a", parent="d2")]
    jobs = [group(n, q, [pod(f"{n}0", n, res(1))], PodGroupPhase.INQUEUE, i)
            for i, (n, q) in enumerate([("a", "d1a"), ("b", "d1b"), ("c", "d2a")])]
    ssn = flat_session(queues, jobs, [node("n1", 8, 16)], HIER)
    q = ssn.queues
    assert ssn.victim_queue_order_fn(q["d1b"], q["d2a"], q["d1a"]) is True
    assert ssn.victim_queue_order_fn(q["d2a"], q["d1b"], q["d1a"]) is False


def test_hierarchy_enqueue_checks_ancestors() -> None:
    """checkJobEnqueueableHierarchically: minResources must fit every ancestor's real capability."""
    cfg = HIER.replace('actions: "allocate, reclaim"', 'actions: "enqueue"')
    queues = [queue("root"), queue("dept", capability=res(2, 100)), queue("team", parent="dept")]
    jobs = [group("j", "team", [pod("p0", "j", res(3))], PodGroupPhase.PENDING, min_resources=res(3))]
    assert run(cfg, [node("n1", 8, 16)], queues, jobs).jobs["ns1/j"].phase == PodGroupPhase.PENDING
    queues[1] = queue("dept", capability=res(4, 100))
    assert run(cfg, [node("n1", 8, 16)], queues, jobs).jobs["ns1/j"].phase == PodGroupPhase.INQUEUE


@pytest.mark.parametrize("level", [0, 1])
def test_ancestor_reclaim_level(level: int) -> None:
    """ancestorReclaimLevel: with level 1 the victim's department (not shared with the reclaimer)
    must itself be above its deserved; d2 is under deserved, so its over-deserved leaf keeps its
    task."""
    cfg = HIER.replace("    enableHierarchy: true\n", f"    enableHierarchy: true\n    arguments: {{ancestorReclaimLevel: {level}}}\n")
    queues = [queue("root"), queue("d1", res(4)), queue("d2", res(6)),
              queue("d1a", res(4), parent="d1"), queue("d2a", res(1), parent="d2")]
    jobs = [group("v", "d2a", [pod(f"v{i}", "v", res(1), "n1") for i in range(3)], PodGroupPhase.RUNNING),
            group("r", "d1a", [pod("r0", "r", res(1))], PodGroupPhase.INQUEUE, 1)]
    ssn = flat_session(queues, jobs, [node("n1", 8, 16)], cfg)
    chosen, _ = reclaim_fn(ssn)(ssn.tasks["ns1/r0"], [ssn.tasks["ns1/v0"]])
    assert (len(chosen) == 1) is (level == 0)
    assert np.isfinite(ssn.space.zeros()).all()
