"""capacity plugin: Volcano's plugins/capacity/capacity_test.go cases, as scenarios.

tests/core/test_capacity.py ports cases 0-2 of ``Test_capacityPlugin_OnSessionOpenWithoutHierarchy``
and checks the plugin's functions directly; this file ports the rest of that function,
``TestEnqueueAndAllocatable``, ``Test_capacityPlugin_OnSessionOpenWithHierarchy``,
``Test_capacityPlugin_AncestorReclaimScenarios`` and ``TestNoDoubleCountingForInqueueJobWithBindingTasks``,
run through ``muster simulate``. Each test cites its Volcano case. Volcano's tiers switch on only
the extension points they list (``extension_points_not_listed: disabled``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import core_helpers
import pytest
from core_helpers import config, plugin, res, scenario_node, scenario_queue, simulate

Res = dict[str, Any]

# capacity_test.go's pods carry no priority (the job's applies); its pod groups live in ns1.
pod = partial(core_helpers.pod, priority=None)
pg = partial(core_helpers.pg, ns="ns1")

CAPACITY_SWITCHES = (
    "enabledAllocatable",
    "enablePreemptive",
    "enableReclaimable",
    "enableQueueOrder",
)
PREDICATES_GANG = [plugin("predicates", "enablePredicate"), plugin("gang", "enableJobStarving")]


def hierarchy_config(*more_plugins: dict, **capacity_arguments: Any) -> dict:
    """The hierarchical tests' configuration: enqueue, reclaim, allocate."""
    capacity = plugin(
        "capacity",
        *CAPACITY_SWITCHES,
        "enableJobEnqueued",
        "enableHierarchy",
        arguments=capacity_arguments,
    )
    return config(["enqueue", "reclaim", "allocate"], [[capacity, *PREDICATES_GANG, *more_plugins]])


FLAT = config(["allocate", "reclaim"], [[plugin("capacity", *CAPACITY_SWITCHES), *PREDICATES_GANG]])
N1 = scenario_node("n1", res("2", "4Gi"), labels={"selector": "worker"})
N2 = scenario_node("n2", res("2", "4Gi"))


def assert_outcome(
    out: dict,
    binds: dict[str, str] | None = None,
    pipelined: dict[str, str] | None = None,
    evicted: list[str] | None = None,
) -> None:
    assert out["binds"] == (binds or {})
    assert out["pipelined"] == (pipelined or {})
    assert sorted(out["evictions"]) == sorted(evicted or [])


# --- Test_capacityPlugin_OnSessionOpenWithoutHierarchy -------------------------------------------------


def test_flat_case0_selector_pins_the_pod_to_n1() -> None:
    """case0 with its node selector: the pending pod may only go to n1 (labelled selector=worker)."""
    out = simulate(
        FLAT,
        [N1, N2],
        [scenario_queue("q1", capability=res("2", "2Gi"))],
        [
            pg("pg1", "q1", 1, [pod("p1", res("1", "1Gi"), "n1")], phase="Running"),
            pg("pg2", "q1", 1, [pod("p2", res("1", "1Gi"), selector={"selector": "worker"})]),
        ],
    )
    assert_outcome(out, binds={"ns1/p2": "n1"})


def test_flat_case3_reclaim_of_scalar_only_request_when_cpu_memory_overused() -> None:
    """case3: q6 is over deserved on cpu/memory but not on A100; a pending pod asking only A100
    reclaims the preemptable A100 pod of q5 (p9 on n4) and is pipelined there."""
    n3 = scenario_node("n3", res("2", "4Gi", nvidia_com__A100=10), labels={"selector": "worker"})
    n4 = scenario_node("n4", res("2", "4Gi", nvidia_com__A100=10))
    a100 = res("0", "0Gi", nvidia_com__A100=10)
    out = simulate(
        FLAT,
        [n3, n4],
        [
            scenario_queue("q5", res("2", "4Gi", nvidia_com__A100=10)),
            scenario_queue("q6", res("2", "4Gi", nvidia_com__A100=10)),
        ],
        [
            pg(
                "pg7",
                "q5",
                1,
                [pod("p8", a100, "n3", preemptable=False), pod("p9", a100, "n4")],
                phase="Running",
            ),
            pg(
                "pg8",
                "q6",
                1,
                [pod("p10", res("2", "4Gi"), "n3"), pod("p11", res("2", "4Gi"), "n4")],
                phase="Running",
            ),
            pg("pg9", "q6", 1, [pod("p12", a100)]),
        ],
    )
    assert_outcome(out, pipelined={"ns1/p12": "n4"}, evicted=["ns1/p9"])


def test_flat_case4_queues_served_by_priority() -> None:
    """case4: q9 (priority 10) is served before q8 (priority 1); only one node is free."""
    out = simulate(
        FLAT,
        [scenario_node("n5", res("2", "4Gi")), scenario_node("n6", res("2", "4Gi"))],
        [
            scenario_queue("q7", capability=res("2", "4Gi"), priority=5),
            scenario_queue("q8", capability=res("2", "4Gi"), priority=1),
            scenario_queue("q9", capability=res("2", "4Gi"), priority=10),
        ],
        [
            pg("pg10", "q7", 1, [pod("p13", res("2", "4Gi"), "n5")], phase="Running"),
            pg("pg11", "q8", 1, [pod("p14", res("2", "4Gi"))]),
            pg("pg12", "q9", 1, [pod("p15", res("2", "4Gi"))]),
        ],
    )
    assert_outcome(out, binds={"ns1/p15": "n6"})


def test_flat_case5_reclaim_when_within_deserved_on_one_dimension() -> None:
    """case5: allocated + request stays within q10's deserved on cpu: q11's p18 is reclaimed."""
    out = simulate(
        FLAT,
        [N1],
        [
            scenario_queue("q10", res("2", "2Gi"), res("4", "4Gi")),
            scenario_queue("q11", res("0", "0Gi"), res("2", "2Gi")),
        ],
        [
            pg("pg16", "q10", 1, [pod("p16", res("1", "3Gi"), "n1")], phase="Running"),
            pg("pg17", "q10", 1, [pod("p17", res("1", "1Gi"))]),
            pg("pg18", "q11", 1, [pod("p18", res("1", "1Gi"), "n1")], phase="Running"),
        ],
    )
    assert_outcome(out, pipelined={"ns1/p17": "n1"}, evicted=["ns1/p18"])


def test_flat_case6_no_reclaim_beyond_deserved() -> None:
    """case6: allocated + request exceeds q12's deserved on every dimension: nothing happens."""
    out = simulate(
        FLAT,
        [N1],
        [
            scenario_queue("q12", res("1", "2Gi"), res("4", "4Gi")),
            scenario_queue("q13", res("0", "0Gi"), res("2", "2Gi")),
        ],
        [
            pg("pg19", "q12", 1, [pod("p19", res("1", "1Gi"), "n1")], phase="Running"),
            pg("pg20", "q12", 1, [pod("p20", res("1", "2Gi"))]),
            pg("pg21", "q13", 1, [pod("p21", res("1", "1Gi"), "n1")], phase="Running"),
        ],
    )
    assert_outcome(out)


def test_flat_case7_reclaimee_without_the_scalar_its_queue_deserves_is_not_reclaimed() -> None:
    """case7 (volcano#4918 bug 2): queue14 deserves GPUs but p22 holds none; nothing is reclaimed."""
    n7 = scenario_node("n7", res("4", "8Gi", nvidia_com__gpu=4))
    out = simulate(
        FLAT,
        [n7],
        [
            scenario_queue("queue14", res("2", "4Gi", nvidia_com__gpu=2)),
            scenario_queue("queue15"),
            scenario_queue("queue16", res("2", "4Gi", nvidia_com__gpu=2)),
        ],
        [
            pg("pg22", "queue14", 1, [pod("p22", res("2", "4Gi"), "n7")], phase="Running"),
            pg(
                "pg23",
                "queue15",
                1,
                [pod("p23", res("0", "0Gi", nvidia_com__gpu=1), "n7")],
                phase="Running",
            ),
            pg(
                "pg24",
                "queue16",
                1,
                [pod("p24", res("2", "1Gi", nvidia_com__gpu=1), "n7")],
                phase="Running",
            ),
            pg("pg25", "queue16", 1, [pod("p25", res("2", "3Gi", nvidia_com__gpu=1))]),
        ],
    )
    assert_outcome(out)


N8 = scenario_node("n8", res("4", "8Gi", nvidia_com__gpu=1))


def test_flat_case8_only_victims_on_the_reclaimers_dimensions() -> None:
    """case8 (volcano#4918 bug 1): p30 needs 1 cpu + the only GPU; only p28 (the GPU holder) is evicted."""
    out = simulate(
        FLAT,
        [N8],
        [
            scenario_queue("queue17", res("2", "2Gi")),
            scenario_queue("queue18", res("2", "4Gi", nvidia_com__gpu=1)),
        ],
        [
            pg("pg26", "queue17", 1, [pod("p26", res("0", "4Gi"), "n8")], phase="Running"),
            pg("pg27", "queue17", 1, [pod("p27", res("1", "0Gi"), "n8")], phase="Running"),
            pg(
                "pg28",
                "queue17",
                1,
                [pod("p28", res("0", "0Gi", nvidia_com__gpu=1), "n8")],
                phase="Running",
            ),
            pg("pg29", "queue18", 1, [pod("p29", res("2", "4Gi"), "n8")], phase="Running"),
            pg("pg30", "queue18", 1, [pod("p30", res("1", "0Gi", nvidia_com__gpu=1))]),
        ],
    )
    assert_outcome(out, pipelined={"ns1/p30": "n8"}, evicted=["ns1/p28"])


def test_flat_case9_scalar_only_queue_below_deserved_is_not_reclaimed() -> None:
    """case9 (volcano#4918 bug 3): queue19 deserves only a GPU and uses no more; p31 is safe."""
    out = simulate(
        FLAT,
        [N8],
        [
            scenario_queue("queue19", res(nvidia_com__gpu=1)),
            scenario_queue("queue20", res("2", "2Gi")),
        ],
        [
            pg(
                "pg31",
                "queue19",
                1,
                [pod("p31", res("4", "4Gi", nvidia_com__gpu=1), "n8")],
                phase="Running",
            ),
            pg("pg32", "queue20", 1, [pod("p32", res("1", "1Gi"))]),
        ],
    )
    assert_outcome(out)


def test_flat_case10_preemptive_respects_capability() -> None:
    """case10 (volcano#5048): queue21 would exceed its capability on cpu: no reclaim."""
    out = simulate(
        FLAT,
        [scenario_node("n9", res("8", "100Gi")), scenario_node("n10", res("8", "100Gi"))],
        [
            scenario_queue("queue21", res("8", "100Gi"), res("8", "100Gi")),
            scenario_queue("queue22", None, res("2", "5Gi")),
        ],
        [
            pg("pg33", "queue21", 1, [pod("p33", res("7", "90Gi"), "n9")], phase="Running"),
            pg("pg34", "queue21", 1, [pod("p34", res("2", "5Gi"))]),
            pg("pg35", "queue22", 1, [pod("p35", res("2", "5Gi"), "n10")], phase="Running"),
        ],
    )
    assert_outcome(out)


# --- TestEnqueueAndAllocatable ------------------------------------------------------------------------

ENQUEUE_ALLOCATABLE = config(
    ["enqueue", "allocate"],
    [
        [
            plugin(
                "capacity",
                "enabledAllocatable",
                "enablePreemptive",
                "enabledOverused",
                "enableJobEnqueued",
            )
        ]
    ],
)
RES_1C3G, RES_3C1G = res("1", "3G"), res("3", "1G")
ENQ_NODES = [scenario_node("n1", res("3", "3G")), scenario_node("n2", res("3", "3G"))]
ENQ_QUEUES = [
    scenario_queue("q1", res("2", "2G"), res("2", "2G")),
    scenario_queue("q2", res("2", "2G"), res("3", "3G")),
]
ENQ_RUNNING = [
    pg("pg1", "q1", 1, [pod("pod1", RES_1C3G, "n1")], phase="Running", min_resources=RES_1C3G),
    pg("pg2", "q2", 1, [pod("pod2", RES_3C1G, "n2")], phase="Running", min_resources=RES_3C1G),
]


@pytest.mark.parametrize(
    ("name", "q", "req", "expected"),
    [
        # case0: q1's memory is above deserved; a job asking only cpu is still enqueued and placed on n1.
        ("pg3", "q1", res("1", "0G"), {"ns1/pg3-0": "n1"}),
        # case1: q2's cpu is above deserved; a job asking only memory is still enqueued and placed on n2.
        ("pg4", "q2", res("0", "1G"), {"ns1/pg4-0": "n2"}),
        # case2: 1 cpu + 1G more would exceed q1's capability: not enqueued.
        ("pg5", "q1", res("1", "1G"), {}),
    ],
)
def test_enqueue_and_allocatable(name: str, q: str, req: Res, expected: dict[str, str]) -> None:
    """TestEnqueueAndAllocatable cases 0-2."""
    job = pg(name, q, 1, [pod(f"{name}-0", req)], phase="Pending", min_resources=req)
    out = simulate(ENQUEUE_ALLOCATABLE, ENQ_NODES, ENQ_QUEUES, [*ENQ_RUNNING, job])
    assert out["binds"] == expected
    assert out["jobs"][f"ns1/{name}"]["phase"] == ("Running" if expected else "Pending")


def test_enqueue_and_allocatable_closed_queue() -> None:
    """TestEnqueueAndAllocatable case4: a job of a Closed queue is not enqueued."""
    out = simulate(
        ENQUEUE_ALLOCATABLE,
        ENQ_NODES,
        [scenario_queue("q3", capability=res("3", "3G"), state="Closed")],
        [
            pg(
                "pg6",
                "q3",
                1,
                [pod("pod6", res("1", "1G"))],
                phase="Pending",
                min_resources=res("1", "1G"),
            )
        ],
    )
    assert out["binds"] == {}
    assert out["jobs"]["ns1/pg6"]["phase"] == "Pending"


# --- Test_capacityPlugin_OnSessionOpenWithHierarchy ----------------------------------------------------

HIER = hierarchy_config()
H_N1 = scenario_node("n1", res("8", "8Gi"))
ROOT = scenario_queue("root")
TREE0 = [
    ROOT,
    scenario_queue("q1", capability=res("4", "4Gi"), parent="root"),
    scenario_queue("q2", capability=res("4", "4Gi"), parent="root"),
    scenario_queue("q11", capability=res("1", "1Gi"), parent="q1"),
    scenario_queue("q12", capability=res("3", "3Gi"), parent="q1"),
]


def q3_tree(*leaves: str) -> list[dict]:
    pods = {"pods": 10}
    tree = [
        ROOT,
        scenario_queue("q3", res("4", "4Gi", **pods), res("4", "4Gi", **pods), parent="root"),
        scenario_queue("q4", res("2", "2Gi", pods=1), res("4", "4Gi", pods=4), parent="root"),
    ]
    deserved = {
        "q31": res("2", "2Gi", pods=2),
        "q32": res("2", "2Gi", pods=2),
        "q33": res("0", "0Gi", pods=2),
    }
    return tree + [
        scenario_queue(leaf, deserved[leaf], res("4", "4Gi", pods=4), parent="q3")
        for leaf in leaves
    ]


def test_hier_case0_leaf_queue_job_is_placed() -> None:
    """case0: a job in leaf queue q11 is placed."""
    out = simulate(HIER, [H_N1], TREE0, [pg("pg1", "q11", 1, [pod("p1", res("1", "1Gi"))])])
    assert_outcome(out, binds={"ns1/p1": "n1"})


def test_hier_case1_job_in_inner_queue_is_not_placed() -> None:
    """case1: a job in q1, which has children, is not placed."""
    out = simulate(
        HIER, [H_N1], TREE0, [pg("pg2", "q1", 1, [pod("p2", res("1", "1Gi"))], phase="Pending")]
    )
    assert_outcome(out)


def test_hier_case2_gang_within_capability() -> None:
    """case2: a 2-pod gang in q31 fits its and q3's capability."""
    out = simulate(
        HIER,
        [H_N1],
        q3_tree("q31", "q32"),
        [pg("pg3", "q31", 2, [pod("p3", res("2", "2Gi")), pod("p4", res("2", "2Gi"))])],
    )
    assert_outcome(out, binds={"ns1/p3": "n1", "ns1/p4": "n1"})


def test_hier_case3_reclaim_within_the_parent() -> None:
    """case3: q32 (below deserved) reclaims the preemptable p7 from its over-deserved sibling q31."""
    out = simulate(
        HIER,
        [H_N1],
        q3_tree("q31", "q32"),
        [
            pg("pg4", "q4", 1, [pod("p5", res("4", "4Gi"), "n1")], phase="Running"),
            pg(
                "pg5",
                "q31",
                1,
                [
                    pod("p6", res("2", "2Gi"), "n1", preemptable=False),
                    pod("p7", res("2", "2Gi"), "n1"),
                ],
                phase="Running",
            ),
            pg("pg6", "q32", 1, [pod("p8", res("2", "2Gi"))]),
        ],
    )
    assert_outcome(out, pipelined={"ns1/p8": "n1"}, evicted=["ns1/p7"])


def test_hier_case4_ancestor_real_capability_not_enough() -> None:
    """case4: q3 has 4 cpu of capability, 4 used: q33's 3 cpu job is not placed."""
    out = simulate(
        HIER,
        [H_N1],
        q3_tree("q31", "q32", "q33"),
        [
            pg(
                "pg5",
                "q31",
                1,
                [pod("p6", res("2", "2Gi"), "n1", preemptable=False)],
                phase="Running",
            ),
            pg("pg7", "q32", 1, [pod("p9", res("2", "2Gi"), "n1")], phase="Running"),
            pg("pg8", "q33", 1, [pod("p10", res("3", "3Gi"))]),
        ],
    )
    assert_outcome(out)


def test_hier_case5_unset_capability_dimension_inherited() -> None:
    """case5: q51's capability sets memory only; cpu is inherited from the parent chain."""
    out = simulate(
        HIER,
        [H_N1],
        [
            ROOT,
            scenario_queue("q5", None, res(None, "4Gi"), parent="root"),
            scenario_queue("q51", None, res(None, "2Gi"), parent="q5"),
        ],
        [pg("pg9", "q51", 1, [pod("p11", res("1"))], phase="Running")],
    )
    assert_outcome(out, binds={"ns1/p11": "n1"})


def test_hier_case6_enqueue_checks_ancestor_capability() -> None:
    """case6: q61 and q62 inherit q6's capability (2 cpu, 4Gi); only the first of two jobs
    with minResources 2 cpu / 4Gi is enqueued."""
    minres = res("2", "4Gi")
    out = simulate(
        HIER,
        [H_N1],
        [
            ROOT,
            scenario_queue("q6", None, res("2", "4Gi"), parent="root"),
            scenario_queue("q61", parent="q6"),
            scenario_queue("q62", parent="q6"),
        ],
        [
            pg("pg10", "q61", 1, [], phase="Pending", min_resources=minres),
            pg("pg11", "q62", 1, [], phase="Pending", min_resources=minres),
        ],
    )
    assert out["jobs"]["ns1/pg10"]["phase"] == "Inqueue"
    assert out["jobs"]["ns1/pg11"]["phase"] == "Pending"


def test_hier_case7_children_guarantees_exceeding_parent_do_not_crash() -> None:
    """case7: q71 + q72 guarantee more than q7's capability; the session still runs."""
    out = simulate(
        HIER,
        [H_N1],
        [
            ROOT,
            scenario_queue("q7", None, res("6", "4Gi"), parent="root"),
            scenario_queue("q71", None, res("6", "4Gi"), parent="q7", guarantee=res("4", "3Gi")),
            scenario_queue("q72", None, res("6", "4Gi"), parent="q7", guarantee=res("4", "3Gi")),
        ],
        [],
    )
    assert_outcome(out)


def test_hier_case8_scalar_in_deserved_passes() -> None:
    """case8: deserved with GPUs set at every level; a 1-GPU pod is placed."""
    gpu_node = scenario_node("n-gpu", res("8", "8Gi", nvidia_com__gpu=8))
    out = simulate(
        HIER,
        [gpu_node],
        [
            ROOT,
            scenario_queue("q8", res("4", "4Gi", nvidia_com__gpu=8), parent="root"),
            scenario_queue("q81", res("2", "2Gi", nvidia_com__gpu=4), parent="q8"),
            scenario_queue("q82", res("2", "2Gi", nvidia_com__gpu=4), parent="q8"),
        ],
        [pg("pg12", "q81", 1, [pod("p12", res("2", "2Gi", nvidia_com__gpu=1))])],
    )
    assert_outcome(out, binds={"ns1/p12": "n-gpu"})


def test_hier_case9_zero_scalar_in_deserved_passes() -> None:
    """case9: deserved lists hugepages-1Gi: 0; the GPU pod is still placed."""
    n2 = scenario_node("n2", res("8", "8Gi", nvidia_com__gpu=8, **{"hugepages-1Gi": 0}))
    out = simulate(
        HIER,
        [n2],
        [
            ROOT,
            scenario_queue(
                "q9", res("2", "2Gi", nvidia_com__gpu=8, **{"hugepages-1Gi": 0}), parent="root"
            ),
            scenario_queue(
                "q91", res("2", "2Gi", nvidia_com__gpu=4, **{"hugepages-1Gi": 0}), parent="q9"
            ),
        ],
        [pg("pg13", "q91", 1, [pod("p13", res("2", "2Gi", nvidia_com__gpu=1))])],
    )
    assert_outcome(out, binds={"ns1/p13": "n2"})


def test_hier_case10_root_capability_above_cluster_does_not_crash() -> None:
    """case10: root's capability exceeds the cluster; the session still runs."""
    out = simulate(
        HIER,
        [H_N1],
        [
            scenario_queue("root", None, res("16", "16Gi")),
            scenario_queue("q10", None, res("10", "4Gi"), parent="root"),
        ],
        [],
    )
    assert_outcome(out)


def test_hier_case11_unset_scalar_capability_inherited() -> None:
    """case11: case11_queue1 has no capability; its children cap GPUs at 4 each: both 4-GPU pods go."""
    n2 = scenario_node("n2", res("8", "8Gi", nvidia_com__gpu=8, **{"hugepages-1Gi": 0}))
    cap = res("4", "4Gi", nvidia_com__gpu=4)
    out = simulate(
        HIER,
        [n2],
        [
            ROOT,
            scenario_queue("case11_queue1", parent="root"),
            scenario_queue("case11_queue11", None, cap, parent="case11_queue1"),
            scenario_queue("case11_queue12", None, cap, parent="case11_queue1"),
        ],
        [
            pg("pg14", "case11_queue11", 1, [pod("p14", res("1", "1Gi", nvidia_com__gpu=4))]),
            pg("pg15", "case11_queue12", 1, [pod("p15", res("1", "1Gi", nvidia_com__gpu=4))]),
        ],
    )
    assert_outcome(out, binds={"ns1/p14": "n2", "ns1/p15": "n2"})


A100_POD = res("1", "1Gi", nvidia_com__a100=2, rdma__hca=1)
ROOT2 = scenario_queue("root", res("16", "16Gi", nvidia_com__a100=4, rdma=1000))


def test_hier_case12_reclaim_on_a_single_scalar_dimension() -> None:
    """case12: case12_queue11 deserves 2 A100 and holds none; it reclaims the preemptable p17
    of case12_queue12 (no deserved)."""
    n3 = scenario_node("n3", res("16", "16Gi", nvidia_com__a100=5, rdma__hca=1001), pods=11)
    out = simulate(
        HIER,
        [n3],
        [
            ROOT2,
            scenario_queue("case12_queue1", res(nvidia_com__a100=2), parent="root"),
            scenario_queue("case12_queue11", res(nvidia_com__a100=2), parent="case12_queue1"),
            scenario_queue("case12_queue12", parent="case12_queue1"),
        ],
        [
            pg("pg16", "case12_queue11", 1, [pod("p16", A100_POD)]),
            pg("pg17", "case12_queue12", 1, [pod("p17", A100_POD, "n3")], phase="Running"),
            pg(
                "pg18",
                "case12_queue12",
                1,
                [pod("p18", A100_POD, "n3", preemptable=False)],
                phase="Running",
            ),
        ],
    )
    assert_outcome(out, pipelined={"ns1/p16": "n3"}, evicted=["ns1/p17"])


# --- Test_capacityPlugin_AncestorReclaimScenarios -----------------------------------------------------


def ancestor_config(level: int, with_priority: bool) -> dict:
    priority = [plugin("priority", "enableJobOrder", "enableTaskOrder")] if with_priority else []
    return hierarchy_config(*priority, ancestorReclaimLevel=level)


BIG_N1 = scenario_node("n1", res("16", "16Gi", nvidia_com__a100=4, rdma__hca=1001), pods=11)
A1 = res("1", "1Gi", nvidia_com__a100=1, rdma__hca=1)


def a100(n: int) -> Res:
    return res(nvidia_com__a100=n)


def project_tree() -> list[dict]:
    return [
        ROOT2,
        scenario_queue("project1_root", a100(1), a100(2), parent="root"),
        scenario_queue("project1_non-preemptable", a100(1), a100(1), parent="project1_root"),
        scenario_queue("project1_preemptable", parent="project1_root"),
        scenario_queue("project2_root", a100(3), a100(4), parent="root"),
        scenario_queue("project2_non-preemptable", a100(3), a100(3), parent="project2_root"),
        scenario_queue("project2_preemptable", parent="project2_root"),
    ]


def test_ancestor_case1_reclaim_on_parent_deserved_at_level1() -> None:
    """case1: case1_queue11 has no deserved, its parent deserves 1 A100: with level 1 it reclaims
    p1 (4 A100) of case1_queue2."""
    out = simulate(
        ancestor_config(1, True),
        [BIG_N1],
        [
            ROOT2,
            scenario_queue("case1_queue1", a100(1), parent="root"),
            scenario_queue("case1_queue11", parent="case1_queue1"),
            scenario_queue("case1_queue2", parent="root"),
        ],
        [
            pg(
                "pg1",
                "case1_queue2",
                1,
                [pod("p1", res("1", "1Gi", nvidia_com__a100=4, rdma__hca=1), "n1")],
                phase="Running",
            ),
            pg("pg2", "case1_queue11", 1, [pod("p2", A1)]),
        ],
    )
    assert_outcome(out, pipelined={"ns1/p2": "n1"}, evicted=["ns1/p1"])


def test_ancestor_case2_cross_parent_reclaim_takes_the_lowest_priority_victim() -> None:
    """case2: project2 (child and parent over deserved) holds all 4 A100; project1's pending job
    (enqueued this cycle) reclaims p4, the lowest-priority pod."""
    out = simulate(
        ancestor_config(1, True),
        [BIG_N1],
        project_tree(),
        [
            *(
                pg(
                    f"pg{i}",
                    "project2_preemptable",
                    1,
                    [pod(f"p{i}", A1, "n1", priority=2 if i < 4 else 1)],
                    phase="Running",
                )
                for i in range(1, 5)
            ),
            pg("pg5", "project1_preemptable", 1, [pod("p5", A1)], phase="Pending"),
        ],
    )
    assert_outcome(out, pipelined={"ns1/p5": "n1"}, evicted=["ns1/p4"])


def test_ancestor_case3_cross_parent_reclaim_can_take_a_sibling_queue_victim() -> None:
    """case3: project2_non-preemptable's pending job reclaims p3 from its sibling
    project2_preemptable (p4 there is still pending)."""
    out = simulate(
        ancestor_config(1, True),
        [BIG_N1],
        project_tree(),
        [
            *(
                pg(
                    f"pg{i}",
                    "project2_preemptable",
                    1,
                    [pod(f"p{i}", A1, "n1", priority=2)],
                    phase="Running",
                )
                for i in range(1, 4)
            ),
            pg("pg4_reclaimed", "project2_preemptable", 1, [pod("p4", A1)]),
            pg("pg5_pipelined", "project1_preemptable", 1, [pod("p5", A1, "n1")], phase="Running"),
            pg("pg6", "project2_non-preemptable", 1, [pod("p6", A1)], phase="Pending"),
        ],
    )
    assert_outcome(out, pipelined={"ns1/p6": "n1"}, evicted=["ns1/p3"])


def test_ancestor_case4_blocked_when_victim_child_not_over_deserved() -> None:
    """case4: the only A100 is held by case4_child1 at its deserved (and a non-preemptable
    sibling pod): case4_child2 cannot reclaim."""
    n1 = scenario_node("n1", res("8", "8Gi", nvidia_com__a100=1, rdma__hca=1001), pods=11)
    out = simulate(
        ancestor_config(1, True),
        [n1],
        [
            ROOT2,
            scenario_queue("case4_parent1", a100(1), parent="root"),
            scenario_queue("case4_child1", a100(1), parent="case4_parent1"),
            scenario_queue("case4_child1_sibling", parent="case4_parent1"),
            scenario_queue("case4_parent2", a100(1), parent="root"),
            scenario_queue("case4_child2", a100(1), parent="case4_parent2"),
        ],
        [
            pg("pg1", "case4_child1", 1, [pod("p1", A1, "n1")], phase="Running"),
            pg("pg2", "case4_child2", 1, [pod("p2", A1)], phase="Pending"),
            pg(
                "pg3",
                "case4_child1_sibling",
                1,
                [pod("p3", A1, "n1", preemptable=False)],
                phase="Running",
            ),
        ],
    )
    assert_outcome(out)


def level_tree() -> list[dict]:
    return [
        ROOT,
        scenario_queue("grand-a", res("2", "2Gi"), res("4", "4Gi"), parent="root"),
        scenario_queue("parent-a", res("2", "2Gi"), res("2", "2Gi"), parent="grand-a"),
        scenario_queue("queue-a", res("2", "2Gi"), res("2", "2Gi"), parent="parent-a"),
        scenario_queue("grand-b", res("3", "3Gi"), res("4", "4Gi"), parent="root"),
        scenario_queue("parent-b", res("1", "1Gi"), res("2", "2Gi"), parent="grand-b"),
        scenario_queue("queue-b", res("1", "1Gi"), res("2", "2Gi"), parent="parent-b"),
    ]


def victim_and_reclaimer(
    victim_queue: str,
    reclaimer_queue: str,
    req: Res | None = None,
    reclaimer_req: Res | None = None,
) -> list[dict]:
    return [
        pg(
            "pg-victim",
            victim_queue,
            1,
            [pod("p-victim", req or res("2", "2Gi"), "n1")],
            phase="Running",
        ),
        pg(
            "pg-reclaimer",
            reclaimer_queue,
            1,
            [pod("p-reclaimer", reclaimer_req or req or res("2", "2Gi"))],
        ),
    ]


SMALL_N1 = scenario_node("n1", res("2", "2Gi"))


@pytest.mark.parametrize(("level", "reclaims"), [(0, True), (1, True), (2, False)])
def test_ancestor_cases5_to_7_level_semantics(level: int, reclaims: bool) -> None:
    """cases 5-7: queue-b and parent-b are over deserved, grand-b is not. Level 0 (leaf) and 1
    (parent) allow the reclaim; level 2 (grandparent) blocks it."""
    out = simulate(
        ancestor_config(level, False),
        [SMALL_N1],
        level_tree(),
        victim_and_reclaimer("queue-b", "queue-a"),
    )
    if reclaims:
        assert_outcome(out, pipelined={"ns1/p-reclaimer": "n1"}, evicted=["ns1/p-victim"])
    else:
        assert_outcome(out)


def test_ancestor_case8_level1_sibling_without_leaf_deserved() -> None:
    """case8: siblings without deserved under one parent: level 1 blocks the reclaim."""
    out = simulate(
        ancestor_config(1, False),
        [SMALL_N1],
        [
            ROOT,
            scenario_queue("parent", res("4", "4Gi"), res("4", "4Gi"), parent="root"),
            scenario_queue("queue-a", parent="parent"),
            scenario_queue("queue-b", parent="parent"),
        ],
        victim_and_reclaimer("queue-b", "queue-a"),
    )
    assert_outcome(out)


def test_ancestor_case9_level2_shared_grandparent_without_leaf_deserved() -> None:
    """case9: leaves without deserved sharing a grandparent: level 2 blocks the reclaim."""
    out = simulate(
        ancestor_config(2, False),
        [SMALL_N1],
        [
            ROOT,
            scenario_queue("grand", res("2", "2Gi"), res("2", "2Gi"), parent="root"),
            scenario_queue("parent-a", parent="grand"),
            scenario_queue("queue-a", parent="parent-a"),
            scenario_queue("parent-b", parent="grand"),
            scenario_queue("queue-b", parent="parent-b"),
        ],
        victim_and_reclaimer("queue-b", "queue-a"),
    )
    assert_outcome(out)


def test_ancestor_case10_level2_unbalanced_shared_grandparent() -> None:
    """case10: an unbalanced tree under one grandparent, leaves without deserved: level 2 blocks."""
    out = simulate(
        ancestor_config(2, False),
        [SMALL_N1],
        [
            ROOT,
            scenario_queue("grand", res("1", "1Gi"), res("2", "2Gi"), parent="root"),
            scenario_queue("parent-deep", res("1", "1Gi"), res("2", "2Gi"), parent="grand"),
            scenario_queue("queue-deep", parent="parent-deep"),
            scenario_queue("queue-shallow", parent="grand"),
        ],
        victim_and_reclaimer("queue-deep", "queue-shallow"),
    )
    assert_outcome(out)


def test_ancestor_case11_level2_depth2_ancestor_not_over_deserved() -> None:
    """case11: the victim's depth-2 ancestor (deep-grand, 2 A100 deserved) is not over deserved:
    level 2 blocks the reclaim."""
    n1 = scenario_node("n1", res("4", "4Gi", nvidia_com__a100=2))
    out = simulate(
        ancestor_config(2, False),
        [n1],
        [
            ROOT,
            scenario_queue("shallow-parent", a100(1), parent="root"),
            scenario_queue("queue-shallow", a100(1), parent="shallow-parent"),
            scenario_queue("deep-grand", a100(2), parent="root"),
            scenario_queue("deep-parent", a100(1), parent="deep-grand"),
            scenario_queue("queue-deep", a100(1), parent="deep-parent"),
        ],
        victim_and_reclaimer(
            "queue-deep",
            "queue-shallow",
            res("1", "1Gi", nvidia_com__a100=2),
            res("1", "1Gi", nvidia_com__a100=1),
        ),
    )
    assert_outcome(out)


# --- TestNoDoubleCountingForInqueueJobWithBindingTasks ------------------------------------------------


def test_inqueue_job_with_binding_tasks_is_not_counted_twice() -> None:
    """TestNoDoubleCountingForInqueueJobWithBindingTasks, second cycle: pgA (Inqueue, minResources
    3 cpu) has its 3 tasks Binding; q1's 4 cpu capability still admits and places pgB's 1 cpu."""
    tiers = config(
        ["enqueue", "allocate"],
        [[plugin("capacity", "enabledAllocatable", "enabledOverused", "enableJobEnqueued")]],
    )
    binding = [pod(f"pA{i}", res("1", "1Gi"), "n1", status="Binding") for i in (1, 2, 3)]
    out = simulate(
        tiers,
        [scenario_node("n1", res("4", "8Gi"))],
        [scenario_queue("q1", None, res("4", "8Gi"))],
        [
            pg("pgA", "q1", 3, binding, phase="Inqueue", min_resources=res("3", "3Gi")),
            pg(
                "pgB",
                "q1",
                1,
                [pod("pB1", res("1", "1Gi"))],
                phase="Pending",
                min_resources=res("1", "1Gi"),
            ),
        ],
    )
    assert out["binds"] == {"ns1/pB1": "n1"}
