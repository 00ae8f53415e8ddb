"""capacity plugin: more cases of Volcano's plugins/capacity/capacity_test.go as scenarios.

tests/core/test_capacity.py ports cases 0-2 of ``Test_capacityPlugin_OnSessionOpenWithoutHierarchy``;
this file ports the rest of that function, ``TestEnqueueAndAllocatable``,
``Test_capacityPlugin_OnSessionOpenWithHierarchy`` and ``Test_capacityPlugin_AncestorReclaimScenarios``,
run through ``server.simulate.simulate_text``. Each test cites its Volcano case. Volcano's tiers
switch on only the extension points they list (``extension_points_not_listed: disabled``).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from server.simulate import simulate_text

Res = dict[str, Any]


def r(cpu: str | None = None, mem: str | None = None, **scalars: Any) -> Res:
    """A resource list like Volcano's BuildResourceList (empty strings mean "not set")."""
    out: Res = {}
    if cpu:
        out["cpu"] = cpu
    if mem:
        out["memory"] = mem
    out.update({k.replace("__", "/").replace("_", "."): v for k, v in scalars.items()})
    return out


def node(name: str, alloc: Res, labels: dict[str, str] | None = None) -> dict:
    return {"name": name, "allocatable": {"pods": 10, **alloc}, "labels": labels or {}}


def queue(name: str, deserved: Res | None = None, capability: Res | None = None, *, parent: str | None = None,
          guarantee: Res | None = None, priority: int = 0, state: str = "Open") -> dict:
    q: dict = {"name": name, "deserved": deserved or {}, "capability": capability or {}, "guarantee": guarantee or {},
               "priority": priority, "state": state}
    if parent:
        q["parent"] = parent
    return q


def pod(name: str, req: Res, node_name: str | None = None, *, preemptable: bool = True,
        selector: dict[str, str] | None = None) -> dict:
    t: dict = {"name": name, "request": req, "preemptable": preemptable}
    if node_name:
        t.update(status="Running", node=node_name)
    if selector:
        t["nodeSelector"] = selector
    return t


def pg(name: str, q: str, phase: str, pods: list[dict], min_member: int = 1, min_resources: Res | None = None) -> dict:
    j: dict = {"name": name, "namespace": "ns1", "queue": q, "phase": phase, "minMember": min_member, "tasks": pods}
    if min_resources is not None:
        j["minResources"] = min_resources
    return j


def simulate(config: dict, nodes: list[dict], queues: list[dict], jobs: list[dict]) -> dict:
    scenario = {"config": config, "nodes": nodes, "queues": queues, "jobs": jobs}
    return simulate_text(yaml.safe_dump(scenario, sort_keys=False))


def capacity_config(actions: list[str], hierarchy: bool = False, **extra_switches: bool) -> dict:
    cap: dict = {"name": "capacity", "enabledAllocatable": True, "enablePreemptive": True, "enableReclaimable": True,
                 "enableQueueOrder": True, **extra_switches}
    if hierarchy:
        cap["enableHierarchy"] = True
    return {"actions": actions, "extension_points_not_listed": "disabled",
            "tiers": [{"plugins": [cap, {"name": "predicates", "enablePredicate": True},
                                   {"name": "gang", "enableJobStarving": True}]}]}


FLAT = capacity_config(["allocate", "reclaim"])
N1 = node("n1", r("2", "4Gi"), {"selector": "worker"})
N2 = node("n2", r("2", "4Gi"))


def assert_outcome(out: dict, binds: dict[str, str] | None = None, pipelined: dict[str, str] | None = None,
                   evicted: list[str] | None = None) -> None:
    assert out["binds"] == (binds or {})
    assert out["pipelined"] == (pipelined or {})
    assert sorted(out["evictions"]) == sorted(evicted or [])


# --- Test_capacityPlugin_OnSessionOpenWithoutHierarchy -------------------------------------------------

def test_flat_case0_selector_pins_the_pod_to_n1() -> None:
    """case0 with its node selector: the pending pod may only go to n1 (labelled selector=worker)."""
    out = simulate(FLAT, [N1, N2], [queue("q1", capability=r("2", "2Gi"))],
                   [pg("pg1", "q1", "Running", [pod("p1", r("1", "1Gi"), "n1")]),
                    pg("pg2", "q1", "Inqueue", [pod("p2", r("1", "1Gi"), selector={"selector": "worker"})])])
    assert_outcome(out, binds={"ns1/p2": "n1"})


def test_flat_case3_reclaim_of_scalar_only_request_when_cpu_memory_overused() -> None:
    """case3: q6 is over deserved on cpu/memory but not on A100; a pending pod asking only A100
    reclaims the preemptable A100 pod of q5 (p9 on n4) and is pipelined there."""
    n3 = node("n3", r("2", "4Gi", nvidia_com__A100=10), {"selector": "worker"})
    n4 = node("n4", r("2", "4Gi", nvidia_com__A100=10))
    a100 = r("0", "0Gi", nvidia_com__A100=10)
    out = simulate(FLAT, [n3, n4],
                   [queue("q5", r("2", "4Gi", nvidia_com__A100=10)), queue("q6", r("2", "4Gi", nvidia_com__A100=10))],
                   [pg("pg7", "q5", "Running", [pod("p8", a100, "n3", preemptable=False), pod("p9", a100, "n4")]),
                    pg("pg8", "q6", "Running", [pod("p10", r("2", "4Gi"), "n3"), pod("p11", r("2", "4Gi"), "n4")]),
                    pg("pg9", "q6", "Inqueue", [pod("p12", a100)])])
    assert_outcome(out, pipelined={"ns1/p12": "n4"}, evicted=["ns1/p9"])


def test_flat_case4_queues_served_by_priority() -> None:
    """case4: q9 (priority 10) is served before q8 (priority 1); only one node is free."""
    out = simulate(FLAT, [node("n5", r("2", "4Gi")), node("n6", r("2", "4Gi"))],
                   [queue("q7", capability=r("2", "4Gi"), priority=5), queue("q8", capability=r("2", "4Gi"), priority=1),
                    queue("q9", capability=r("2", "4Gi"), priority=10)],
                   [pg("pg10", "q7", "Running", [pod("p13", r("2", "4Gi"), "n5")]),
                    pg("pg11", "q8", "Inqueue", [pod("p14", r("2", "4Gi"))]),
                    pg("pg12", "q9", "Inqueue", [pod("p15", r("2", "4Gi"))])])
    assert_outcome(out, binds={"ns1/p15": "n6"})


def test_flat_case5_reclaim_when_within_deserved_on_one_dimension() -> None:
    """case5: allocated + request stays within q10's deserved on cpu: q11's p18 is reclaimed."""
    out = simulate(FLAT, [N1], [queue("q10", r("2", "2Gi"), r("4", "4Gi")), queue("q11", r("0", "0Gi"), r("2", "2Gi"))],
                   [pg("pg16", "q10", "Running", [pod("p16", r("1", "3Gi"), "n1")]),
                    pg("pg17", "q10", "Inqueue", [pod("p17", r("1", "1Gi"))]),
                    pg("pg18", "q11", "Running", [pod("p18", r("1", "1Gi"), "n1")])])
    assert_outcome(out, pipelined={"ns1/p17": "n1"}, evicted=["ns1/p18"])


def test_flat_case6_no_reclaim_beyond_deserved() -> None:
    """case6: allocated + request exceeds q12's deserved on every dimension: nothing happens."""
    out = simulate(FLAT, [N1], [queue("q12", r("1", "2Gi"), r("4", "4Gi")), queue("q13", r("0", "0Gi"), r("2", "2Gi"))],
                   [pg("pg19", "q12", "Running", [pod("p19", r("1", "1Gi"), "n1")]),
                    pg("pg20", "q12", "Inqueue", [pod("p20", r("1", "2Gi"))]),
                    pg("pg21", "q13", "Running", [pod("p21", r("1", "1Gi"), "n1")])])
    assert_outcome(out)


def test_flat_case7_reclaimee_without_the_scalar_its_queue_deserves_is_not_reclaimed() -> None:
    """case7 (volcano#4918 bug 2): queue14 deserves GPUs but p22 holds none; nothing is reclaimed."""
    n7 = node("n7", r("4", "8Gi", nvidia_com__gpu=4))
    out = simulate(FLAT, [n7],
                   [queue("queue14", r("2", "4Gi", nvidia_com__gpu=2)), queue("queue15"),
                    queue("queue16", r("2", "4Gi", nvidia_com__gpu=2))],
                   [pg("pg22", "queue14", "Running", [pod("p22", r("2", "4Gi"), "n7")]),
                    pg("pg23", "queue15", "Running", [pod("p23", r("0", "0Gi", nvidia_com__gpu=1), "n7")]),
                    pg("pg24", "queue16", "Running", [pod("p24", r("2", "1Gi", nvidia_com__gpu=1), "n7")]),
                    pg("pg25", "queue16", "Inqueue", [pod("p25", r("2", "3Gi", nvidia_com__gpu=1))])])
    assert_outcome(out)


N8 = node("n8", r("4", "8Gi", nvidia_com__gpu=1))


def test_flat_case8_only_victims_on_the_reclaimers_dimensions() -> None:
    """case8 (volcano#4918 bug 1): p30 needs 1 cpu + the only GPU; only p28 (the GPU holder) is evicted."""
    out = simulate(FLAT, [N8],
                   [queue("queue17", r("2", "2Gi")), queue("queue18", r("2", "4Gi", nvidia_com__gpu=1))],
                   [pg("pg26", "queue17", "Running", [pod("p26", r("0", "4Gi"), "n8")]),
                    pg("pg27", "queue17", "Running", [pod("p27", r("1", "0Gi"), "n8")]),
                    pg("pg28", "queue17", "Running", [pod("p28", r("0", "0Gi", nvidia_com__gpu=1), "n8")]),
                    pg("pg29", "queue18", "Running", [pod("p29", r("2", "4Gi"), "n8")]),
                    pg("pg30", "queue18", "Inqueue", [pod("p30", r("1", "0Gi", nvidia_com__gpu=1))])])
    assert_outcome(out, pipelined={"ns1/p30": "n8"}, evicted=["ns1/p28"])


def test_flat_case9_scalar_only_queue_below_deserved_is_not_reclaimed() -> None:
    """case9 (volcano#4918 bug 3): queue19 deserves only a GPU and uses no more; p31 is safe."""
    out = simulate(FLAT, [N8], [queue("queue19", r(nvidia_com__gpu=1)), queue("queue20", r("2", "2Gi"))],
                   [pg("pg31", "queue19", "Running", [pod("p31", r("4", "4Gi", nvidia_com__gpu=1), "n8")]),
                    pg("pg32", "queue20", "Inqueue", [pod("p32", r("1", "1Gi"))])])
    assert_outcome(out)


def test_flat_case10_preemptive_respects_capability() -> None:
    """case10 (volcano#5048): queue21 would exceed its capability on cpu: no reclaim."""
    out = simulate(FLAT, [node("n9", r("8", "100Gi")), node("n10", r("8", "100Gi"))],
                   [queue("queue21", r("8", "100Gi"), r("8", "100Gi")), queue("queue22", None, r("2", "5Gi"))],
                   [pg("pg33", "queue21", "Running", [pod("p33", r("7", "90Gi"), "n9")]),
                    pg("pg34", "queue21", "Inqueue", [pod("p34", r("2", "5Gi"))]),
                    pg("pg35", "queue22", "Running", [pod("p35", r("2", "5Gi"), "n10")])])
    assert_outcome(out)


# --- TestEnqueueAndAllocatable ------------------------------------------------------------------------

ENQUEUE_ALLOCATABLE = {
    "actions": ["enqueue", "allocate"], "extension_points_not_listed": "disabled",
    "tiers": [{"plugins": [{"name": "capacity", "enabledAllocatable": True, "enablePreemptive": True,
                            "enabledOverused": True, "enableJobEnqueued": True}]}]}
RES_1C3G, RES_3C1G = r("1", "3G"), r("3", "1G")
ENQ_NODES = [node("n1", r("3", "3G")), node("n2", r("3", "3G"))]
ENQ_QUEUES = [queue("q1", r("2", "2G"), r("2", "2G")), queue("q2", r("2", "2G"), r("3", "3G"))]
ENQ_RUNNING = [pg("pg1", "q1", "Running", [pod("pod1", RES_1C3G, "n1")], min_resources=RES_1C3G),
               pg("pg2", "q2", "Running", [pod("pod2", RES_3C1G, "n2")], min_resources=RES_3C1G)]


@pytest.mark.parametrize(("name", "q", "req", "expected"), [
    # case0: q1's memory is above deserved; a job asking only cpu is still enqueued and placed on n1.
    ("pg3", "q1", r("1", "0G"), {"ns1/pg3-0": "n1"}),
    # case1: q2's cpu is above deserved; a job asking only memory is still enqueued and placed on n2.
    ("pg4", "q2", r("0", "1G"), {"ns1/pg4-0": "n2"}),
    # case2: 1 cpu + 1G more would exceed q1's capability: not enqueued.
    ("pg5", "q1", r("1", "1G"), {}),
])
def test_enqueue_and_allocatable(name: str, q: str, req: Res, expected: dict[str, str]) -> None:
    """TestEnqueueAndAllocatable cases 0-2."""
    job = pg(name, q, "Pending", [pod(f"{name}-0", req)], min_resources=req)
    out = simulate(ENQUEUE_ALLOCATABLE, ENQ_NODES, ENQ_QUEUES, [*ENQ_RUNNING, job])
    assert out["binds"] == expected
    assert out["jobs"][f"ns1/{name}"]["phase"] == ("Running" if expected else "Pending")


def test_enqueue_and_allocatable_closed_queue() -> None:
    """TestEnqueueAndAllocatable case4: a job of a Closed queue is not enqueued."""
    out = simulate(ENQUEUE_ALLOCATABLE, ENQ_NODES, [queue("q3", capability=r("3", "3G"), state="Closed")],
                   [pg("pg6", "q3", "Pending", [pod("pod6", r("1", "1G"))], min_resources=r("1", "1G"))])
    assert out["binds"] == {}
    assert out["jobs"]["ns1/pg6"]["phase"] == "Pending"


# --- Test_capacityPlugin_OnSessionOpenWithHierarchy ----------------------------------------------------

HIER = capacity_config(["enqueue", "reclaim", "allocate"], hierarchy=True, enableJobEnqueued=True)
H_N1 = node("n1", r("8", "8Gi"))
ROOT = queue("root")
TREE0 = [ROOT, queue("q1", capability=r("4", "4Gi"), parent="root"), queue("q2", capability=r("4", "4Gi"), parent="root"),
         queue("q11", capability=r("1", "1Gi"), parent="q1"), queue("q12", capability=r("3", "3Gi"), parent="q1")]


def q3_tree(*leaves: str) -> list[dict]:
    pods = {"pods": 10}
    tree = [ROOT, queue("q3", r("4", "4Gi", **pods), r("4", "4Gi", **pods), parent="root"),
            queue("q4", r("2", "2Gi", pods=1), r("4", "4Gi", pods=4), parent="root")]
    deserved = {"q31": r("2", "2Gi", pods=2), "q32": r("2", "2Gi", pods=2), "q33": r("0", "0Gi", pods=2)}
    return tree + [queue(leaf, deserved[leaf], r("4", "4Gi", pods=4), parent="q3") for leaf in leaves]


def test_hier_case0_leaf_queue_job_is_placed() -> None:
    """case0: a job in leaf queue q11 is placed."""
    out = simulate(HIER, [H_N1], TREE0, [pg("pg1", "q11", "Inqueue", [pod("p1", r("1", "1Gi"))])])
    assert_outcome(out, binds={"ns1/p1": "n1"})


def test_hier_case1_job_in_inner_queue_is_not_placed() -> None:
    """case1: a job in q1, which has children, is not placed."""
    out = simulate(HIER, [H_N1], TREE0, [pg("pg2", "q1", "Pending", [pod("p2", r("1", "1Gi"))])])
    assert_outcome(out)


def test_hier_case2_gang_within_capability() -> None:
    """case2: a 2-pod gang in q31 fits its and q3's capability."""
    out = simulate(HIER, [H_N1], q3_tree("q31", "q32"),
                   [pg("pg3", "q31", "Inqueue", [pod("p3", r("2", "2Gi")), pod("p4", r("2", "2Gi"))], min_member=2)])
    assert_outcome(out, binds={"ns1/p3": "n1", "ns1/p4": "n1"})


def test_hier_case3_reclaim_within_the_parent() -> None:
    """case3: q32 (below deserved) reclaims the preemptable p7 from its over-deserved sibling q31."""
    out = simulate(HIER, [H_N1], q3_tree("q31", "q32"),
                   [pg("pg4", "q4", "Running", [pod("p5", r("4", "4Gi"), "n1")]),
                    pg("pg5", "q31", "Running", [pod("p6", r("2", "2Gi"), "n1", preemptable=False),
                                                 pod("p7", r("2", "2Gi"), "n1")]),
                    pg("pg6", "q32", "Inqueue", [pod("p8", r("2", "2Gi"))])])
    assert_outcome(out, pipelined={"ns1/p8": "n1"}, evicted=["ns1/p7"])


def test_hier_case4_ancestor_real_capability_not_enough() -> None:
    """case4: q3 has 4 cpu of capability, 4 used: q33's 3 cpu job is not placed."""
    out = simulate(HIER, [H_N1], q3_tree("q31", "q32", "q33"),
                   [pg("pg5", "q31", "Running", [pod("p6", r("2", "2Gi"), "n1", preemptable=False)]),
                    pg("pg7", "q32", "Running", [pod("p9", r("2", "2Gi"), "n1")]),
                    pg("pg8", "q33", "Inqueue", [pod("p10", r("3", "3Gi"))])])
    assert_outcome(out)


def test_hier_case5_unset_capability_dimension_inherited() -> None:
    """case5: q51's capability sets memory only; cpu is inherited from the parent chain."""
    out = simulate(HIER, [H_N1], [ROOT, queue("q5", None, r(None, "4Gi"), parent="root"),
                                  queue("q51", None, r(None, "2Gi"), parent="q5")],
                   [pg("pg9", "q51", "Running", [pod("p11", r("1"))])])
    assert_outcome(out, binds={"ns1/p11": "n1"})


def test_hier_case6_enqueue_checks_ancestor_capability() -> None:
    """case6: q61 and q62 inherit q6's capability (2 cpu, 4Gi); only the first of two jobs
    with minResources 2 cpu / 4Gi is enqueued."""
    minres = r("2", "4Gi")
    out = simulate(HIER, [H_N1], [ROOT, queue("q6", None, r("2", "4Gi"), parent="root"),
                                  queue("q61", parent="q6"), queue("q62", parent="q6")],
                   [pg("pg10", "q61", "Pending", [], min_resources=minres),
                    pg("pg11", "q62", "Pending", [], min_resources=minres)])
    assert out["jobs"]["ns1/pg10"]["phase"] == "Inqueue"
    assert out["jobs"]["ns1/pg11"]["phase"] == "Pending"


def test_hier_case7_children_guarantees_exceeding_parent_do_not_crash() -> None:
    """case7: q71 + q72 guarantee more than q7's capability; the session still runs."""
    out = simulate(HIER, [H_N1], [ROOT, queue("q7", None, r("6", "4Gi"), parent="root"),
                                  queue("q71", None, r("6", "4Gi"), parent="q7", guarantee=r("4", "3Gi")),
                                  queue("q72", None, r("6", "4Gi"), parent="q7", guarantee=r("4", "3Gi"))], [])
    assert_outcome(out)


def test_hier_case8_scalar_in_deserved_passes() -> None:
    """case8: deserved with GPUs set at every level; a 1-GPU pod is placed."""
    gpu_node = node("n-gpu", r("8", "8Gi", nvidia_com__gpu=8))
    out = simulate(HIER, [gpu_node], [ROOT, queue("q8", r("4", "4Gi", nvidia_com__gpu=8), parent="root"),
                                      queue("q81", r("2", "2Gi", nvidia_com__gpu=4), parent="q8"),
                                      queue("q82", r("2", "2Gi", nvidia_com__gpu=4), parent="q8")],
                   [pg("pg12", "q81", "Inqueue", [pod("p12", r("2", "2Gi", nvidia_com__gpu=1))])])
    assert_outcome(out, binds={"ns1/p12": "n-gpu"})


def test_hier_case9_zero_scalar_in_deserved_passes() -> None:
    """case9: deserved lists hugepages-1Gi: 0; the GPU pod is still placed."""
    n2 = node("n2", r("8", "8Gi", nvidia_com__gpu=8, **{"hugepages-1Gi": 0}))
    out = simulate(HIER, [n2], [ROOT, queue("q9", r("2", "2Gi", nvidia_com__gpu=8, **{"hugepages-1Gi": 0}), parent="root"),
                                queue("q91", r("2", "2Gi", nvidia_com__gpu=4, **{"hugepages-1Gi": 0}), parent="q9")],
                   [pg("pg13", "q91", "Inqueue", [pod("p13", r("2", "2Gi", nvidia_com__gpu=1))])])
    assert_outcome(out, binds={"ns1/p13": "n2"})


def test_hier_case10_root_capability_above_cluster_does_not_crash() -> None:
    """case10: root's capability exceeds the cluster; the session still runs."""
    out = simulate(HIER, [H_N1], [queue("root", None, r("16", "16Gi")),
                                  queue("q10", None, r("10", "4Gi"), parent="root")], [])
    assert_outcome(out)


def test_hier_case11_unset_scalar_capability_inherited() -> None:
    """case11: case11_queue1 has no capability; its children cap GPUs at 4 each: both 4-GPU pods go."""
    n2 = node("n2", r("8", "8Gi", nvidia_com__gpu=8, **{"hugepages-1Gi": 0}))
    cap = r("4", "4Gi", nvidia_com__gpu=4)
    out = simulate(HIER, [n2], [ROOT, queue("case11_queue1", parent="root"),
                                queue("case11_queue11", None, cap, parent="case11_queue1"),
                                queue("case11_queue12", None, cap, parent="case11_queue1")],
                   [pg("pg14", "case11_queue11", "Inqueue", [pod("p14", r("1", "1Gi", nvidia_com__gpu=4))]),
                    pg("pg15", "case11_queue12", "Inqueue", [pod("p15", r("1", "1Gi", nvidia_com__gpu=4))])])
    assert_outcome(out, binds={"ns1/p14": "n2", "ns1/p15": "n2"})


A100_POD = r("1", "1Gi", nvidia_com__a100=2, rdma__hca=1)
ROOT2 = queue("root", r("16", "16Gi", nvidia_com__a100=4, rdma=1000))


def test_hier_case12_reclaim_on_a_single_scalar_dimension() -> None:
    """case12: case12_queue11 deserves 2 A100 and holds none; it reclaims the preemptable p17
    of case12_queue12 (no deserved)."""
    n3 = {"name": "n3", "allocatable": {"pods": 11, **r("16", "16Gi", nvidia_com__a100=5, rdma__hca=1001)}}
    out = simulate(HIER, [n3], [ROOT2, queue("case12_queue1", r(nvidia_com__a100=2), parent="root"),
                                queue("case12_queue11", r(nvidia_com__a100=2), parent="case12_queue1"),
                                queue("case12_queue12", parent="case12_queue1")],
                   [pg("pg16", "case12_queue11", "Inqueue", [pod("p16", A100_POD)]),
                    pg("pg17", "case12_queue12", "Running", [pod("p17", A100_POD, "n3")]),
                    pg("pg18", "case12_queue12", "Running", [pod("p18", A100_POD, "n3", preemptable=False)])])
    assert_outcome(out, pipelined={"ns1/p16": "n3"}, evicted=["ns1/p17"])


# --- Test_capacityPlugin_AncestorReclaimScenarios -----------------------------------------------------

def ancestor_config(level: int, with_priority: bool) -> dict:
    config = capacity_config(["enqueue", "reclaim", "allocate"], hierarchy=True, enableJobEnqueued=True)
    config["tiers"][0]["plugins"][0]["arguments"] = {"ancestorReclaimLevel": level}
    if with_priority:
        config["tiers"][0]["plugins"].append({"name": "priority", "enableJobOrder": True, "enableTaskOrder": True})
    return config


BIG_N1 = {"name": "n1", "allocatable": {"pods": 11, **r("16", "16Gi", nvidia_com__a100=4, rdma__hca=1001)}}
A1 = r("1", "1Gi", nvidia_com__a100=1, rdma__hca=1)


def a100(n: int) -> Res:
    return r(nvidia_com__a100=n)


def project_tree() -> list[dict]:
    return [ROOT2,
            queue("project1_root", a100(1), a100(2), parent="root"),
            queue("project1_non-preemptable", a100(1), a100(1), parent="project1_root"),
            queue("project1_preemptable", parent="project1_root"),
            queue("project2_root", a100(3), a100(4), parent="root"),
            queue("project2_non-preemptable", a100(3), a100(3), parent="project2_root"),
            queue("project2_preemptable", parent="project2_root")]


def prio_pod(name: str, node_name: str | None, priority: int | None = None) -> dict:
    p = pod(name, A1, node_name)
    if priority is not None:
        p["priority"] = priority
    return p


def test_ancestor_case1_reclaim_on_parent_deserved_at_level1() -> None:
    """case1: case1_queue11 has no deserved, its parent deserves 1 A100: with level 1 it reclaims
    p1 (4 A100) of case1_queue2."""
    out = simulate(ancestor_config(1, True), [BIG_N1],
                   [ROOT2, queue("case1_queue1", a100(1), parent="root"),
                    queue("case1_queue11", parent="case1_queue1"), queue("case1_queue2", parent="root")],
                   [pg("pg1", "case1_queue2", "Running", [pod("p1", r("1", "1Gi", nvidia_com__a100=4, rdma__hca=1), "n1")]),
                    pg("pg2", "case1_queue11", "Inqueue", [pod("p2", A1)])])
    assert_outcome(out, pipelined={"ns1/p2": "n1"}, evicted=["ns1/p1"])


def test_ancestor_case2_cross_parent_reclaim_takes_the_lowest_priority_victim() -> None:
    """case2: project2 (child and parent over deserved) holds all 4 A100; project1's pending job
    (enqueued this cycle) reclaims p4, the lowest-priority pod."""
    out = simulate(ancestor_config(1, True), [BIG_N1], project_tree(),
                   [*(pg(f"pg{i}", "project2_preemptable", "Running", [prio_pod(f"p{i}", "n1", 2 if i < 4 else 1)])
                      for i in range(1, 5)),
                    pg("pg5", "project1_preemptable", "Pending", [prio_pod("p5", None)])])
    assert_outcome(out, pipelined={"ns1/p5": "n1"}, evicted=["ns1/p4"])


def test_ancestor_case3_cross_parent_reclaim_can_take_a_sibling_queue_victim() -> None:
    """case3: project2_non-preemptable's pending job reclaims p3 from its sibling
    project2_preemptable (p4 there is still pending)."""
    out = simulate(ancestor_config(1, True), [BIG_N1], project_tree(),
                   [*(pg(f"pg{i}", "project2_preemptable", "Running", [prio_pod(f"p{i}", "n1", 2)]) for i in range(1, 4)),
                    pg("pg4_reclaimed", "project2_preemptable", "Inqueue", [prio_pod("p4", None)]),
                    pg("pg5_pipelined", "project1_preemptable", "Running", [prio_pod("p5", "n1")]),
                    pg("pg6", "project2_non-preemptable", "Pending", [prio_pod("p6", None)])])
    assert_outcome(out, pipelined={"ns1/p6": "n1"}, evicted=["ns1/p3"])


def test_ancestor_case4_blocked_when_victim_child_not_over_deserved() -> None:
    """case4: the only A100 is held by case4_child1 at its deserved (and a non-preemptable
    sibling pod): case4_child2 cannot reclaim."""
    n1 = {"name": "n1", "allocatable": {"pods": 11, **r("8", "8Gi", nvidia_com__a100=1, rdma__hca=1001)}}
    out = simulate(ancestor_config(1, True), [n1],
                   [ROOT2, queue("case4_parent1", a100(1), parent="root"),
                    queue("case4_child1", a100(1), parent="case4_parent1"),
                    queue("case4_child1_sibling", parent="case4_parent1"),
                    queue("case4_parent2", a100(1), parent="root"),
                    queue("case4_child2", a100(1), parent="case4_parent2")],
                   [pg("pg1", "case4_child1", "Running", [pod("p1", A1, "n1")]),
                    pg("pg2", "case4_child2", "Pending", [pod("p2", A1)]),
                    pg("pg3", "case4_child1_sibling", "Running", [pod("p3", A1, "n1", preemptable=False)])])
    assert_outcome(out)


def level_tree() -> list[dict]:
    return [ROOT,
            queue("grand-a", r("2", "2Gi"), r("4", "4Gi"), parent="root"),
            queue("parent-a", r("2", "2Gi"), r("2", "2Gi"), parent="grand-a"),
            queue("queue-a", r("2", "2Gi"), r("2", "2Gi"), parent="parent-a"),
            queue("grand-b", r("3", "3Gi"), r("4", "4Gi"), parent="root"),
            queue("parent-b", r("1", "1Gi"), r("2", "2Gi"), parent="grand-b"),
            queue("queue-b", r("1", "1Gi"), r("2", "2Gi"), parent="parent-b")]


def victim_and_reclaimer(victim_queue: str, reclaimer_queue: str, req: Res | None = None,
                         reclaimer_req: Res | None = None) -> list[dict]:
    return [pg("pg-victim", victim_queue, "Running", [pod("p-victim", req or r("2", "2Gi"), "n1")]),
            pg("pg-reclaimer", reclaimer_queue, "Inqueue", [pod("p-reclaimer", reclaimer_req or req or r("2", "2Gi"))])]


SMALL_N1 = node("n1", r("2", "2Gi"))


@pytest.mark.parametrize(("level", "reclaims"), [(0, True), (1, True), (2, False)])
def test_ancestor_cases5_to_7_level_semantics(level: int, reclaims: bool) -> None:
    """cases 5-7: queue-b and parent-b are over deserved, grand-b is not. Level 0 (leaf) and 1
    (parent) allow the reclaim; level 2 (grandparent) blocks it."""
    out = simulate(ancestor_config(level, False), [SMALL_N1], level_tree(), victim_and_reclaimer("queue-b", "queue-a"))
    if reclaims:
        assert_outcome(out, pipelined={"ns1/p-reclaimer": "n1"}, evicted=["ns1/p-victim"])
    else:
        assert_outcome(out)


def test_ancestor_case8_level1_sibling_without_leaf_deserved() -> None:
    """case8: siblings without deserved under one parent: level 1 blocks the reclaim."""
    out = simulate(ancestor_config(1, False), [SMALL_N1],
                   [ROOT, queue("parent", r("4", "4Gi"), r("4", "4Gi"), parent="root"),
                    queue("queue-a", parent="parent"), queue("queue-b", parent="parent")],
                   victim_and_reclaimer("queue-b", "queue-a"))
    assert_outcome(out)


def test_ancestor_case9_level2_shared_grandparent_without_leaf_deserved() -> None:
    """case9: leaves without deserved sharing a grandparent: level 2 blocks the reclaim."""
    out = simulate(ancestor_config(2, False), [SMALL_N1],
                   [ROOT, queue("grand", r("2", "2Gi"), r("2", "2Gi"), parent="root"),
                    queue("parent-a", parent="grand"), queue("queue-a", parent="parent-a"),
                    queue("parent-b", parent="grand"), queue("queue-b", parent="parent-b")],
                   victim_and_reclaimer("queue-b", "queue-a"))
    assert_outcome(out)


def test_ancestor_case10_level2_unbalanced_shared_grandparent() -> None:
    """case10: an unbalanced tree under one grandparent, leaves without deserved: level 2 blocks."""
    out = simulate(ancestor_config(2, False), [SMALL_N1],
                   [ROOT, queue("grand", r("1", "1Gi"), r("2", "2Gi"), parent="root"),
                    queue("parent-deep", r("1", "1Gi"), r("2", "2Gi"), parent="grand"),
                    queue("queue-deep", parent="parent-deep"), queue("queue-shallow", parent="grand")],
                   victim_and_reclaimer("queue-deep", "queue-shallow"))
    assert_outcome(out)


def test_ancestor_case11_level2_depth2_ancestor_not_over_deserved() -> None:
    """case11: the victim's depth-2 ancestor (deep-grand, 2 A100 deserved) is not over deserved:
    level 2 blocks the reclaim."""
    n1 = node("n1", r("4", "4Gi", nvidia_com__a100=2))
    out = simulate(ancestor_config(2, False), [n1],
                   [ROOT, queue("shallow-parent", a100(1), parent="root"),
                    queue("queue-shallow", a100(1), parent="shallow-parent"),
                    queue("deep-grand", a100(2), parent="root"),
                    queue("deep-parent", a100(1), parent="deep-grand"),
                    queue("queue-deep", a100(1), parent="deep-parent")],
                   victim_and_reclaimer("queue-deep", "queue-shallow", r("1", "1Gi", nvidia_com__a100=2),
                                        r("1", "1Gi", nvidia_com__a100=1)))
    assert_outcome(out)


# --- TestNoDoubleCountingForInqueueJobWithBindingTasks ------------------------------------------------

def test_inqueue_job_with_binding_tasks_is_not_counted_twice() -> None:
    """TestNoDoubleCountingForInqueueJobWithBindingTasks, second cycle: pgA (Inqueue, minResources
    3 cpu) has its 3 tasks Binding; q1's 4 cpu capability still admits and places pgB's 1 cpu."""
    config = {"actions": ["enqueue", "allocate"], "extension_points_not_listed": "disabled",
              "tiers": [{"plugins": [{"name": "capacity", "enabledAllocatable": True, "enabledOverused": True,
                                      "enableJobEnqueued": True}]}]}
    binding = [{"name": f"pA{i}", "request": r("1", "1Gi"), "status": "Binding", "node": "n1"} for i in (1, 2, 3)]
    out = simulate(config, [node("n1", r("4", "8Gi"))], [queue("q1", None, r("4", "8Gi"))],
                   [pg("pgA", "q1", "Inqueue", binding, min_member=3, min_resources=r("3", "3Gi")),
                    pg("pgB", "q1", "Pending", [pod("pB1", r("1", "1Gi"))], min_resources=r("1", "1Gi"))])
    assert out["binds"] == {"ns1/pB1": "n1"}
