"""preempt action: the behaviours Volcano's preempt.go implies beyond the cases of its
``actions/preempt/preempt_test.go`` (intra-job phase, gang protection of victims, commit only when
the preemptor job is pipelined, the victim filters), with that test's tiers. The cases of
``TestPreempt`` and ``TestTopologyAwarePreempt`` themselves are scenario files under
tests/scenarios/volcano/preempt/, run by test_volcano_cases.py."""

from __future__ import annotations

import pytest
from core_helpers import (
    PRIORITY_CLASSES,
    config,
    cycle,
    evicted,
    job,
    node,
    pg,
    plugin,
    pod,
    queue,
    res,
    scenario_node,
    scenario_queue,
    simulate,
    snapshot,
    uid,
)

from muster.gang import NO_GANG_MINIMUM
from server.config import ConfigError, load_config
from server.model import PodGroupPhase, TaskStatus

# Volcano TestPreempt's tier: every switch it does not set is off.
TIERS = [
    [
        plugin("conformance", "enablePreemptable"),
        plugin("gang", "enablePreemptable", "enableJobPipelined", "enableJobStarving"),
        plugin(
            "priority",
            "enableTaskOrder",
            "enableJobOrder",
            "enablePreemptable",
            "enableJobPipelined",
            "enableJobStarving",
        ),
        plugin("proportion", "enabledOverused", "enabledAllocatable", "enableQueueOrder"),
    ]
]
# TestTopologyAwarePreempt adds the predicates plugin (pod count, pod anti-affinity).
TOPOLOGY_TIERS = [
    [
        *TIERS[0][:3],
        plugin(
            "proportion",
            "enabledOverused",
            "enabledAllocatable",
            "enableQueueOrder",
            "enablePredicate",
        ),
        plugin("predicates", "enablePreemptable", "enablePredicate"),
    ]
]

# Muster reads minMember 0 as "every task" (the model's convention), where Volcano's gang reads it
# as 0 and so lets every task of such a victim job go. Cases whose Volcano victim jobs have
# minMember 0 therefore run with gang's preemptable off, which gives the same victims.


def _without_gang_victims(tiers):
    return [
        [
            plugin("gang", "enableJobPipelined", "enableJobStarving") if p["name"] == "gang" else p
            for p in t
        ]
        for t in tiers
    ]


def preempt(nodes, queues, jobs, *, topology_aware: bool = False, tiers=None, **arguments):
    tiers = tiers or (TOPOLOGY_TIERS if topology_aware else TIERS)
    if any(j["minMember"] == 0 for j in jobs):
        tiers = _without_gang_victims(tiers)
    preempt_arguments = {"preempt": {"enableTopologyAwarePreemption": topology_aware, **arguments}}
    return simulate(
        config(["preempt"], tiers, action_arguments=preempt_arguments),
        nodes,
        queues,
        jobs,
        priority_classes=PRIORITY_CLASSES,
    )


def test_besteffort_preemptor_never_evicts_a_resource_pod() -> None:
    """Volcano's victim filter: a BestEffort preemptor may only evict BestEffort pods."""
    out = preempt(
        [scenario_node("n1", res("12", "12G"), pods=1)],
        [scenario_queue("q1")],
        [
            pg(
                "pg1",
                "q1",
                NO_GANG_MINIMUM,
                [pod("preemptee1", res("1", "1G"), "n1")],
                priority_class="low-priority",
            ),
            pg("pg2", "q1", 1, [pod("preemptor1", None)], priority_class="high-priority"),
        ],
        topology_aware=True,
    )
    assert evicted(out) == set()


@pytest.mark.parametrize("free_slots", [0, 1])
def test_normal_preempt_counts_the_pod_slot(free_slots: int) -> None:
    """Volcano #3335 without topology-aware preemption: every pod asks ``pods: 1``, so a node whose
    pod slots are all taken needs a victim evicted (one is enough), while a free slot needs none."""
    # Best-effort victims: only the pod slot each holds is in the way.
    victims = [pod(f"preemptee{i}", None, "n1", priority=None) for i in range(1, 3)]
    out = preempt(
        [scenario_node("n1", res("12", "12G"), pods=len(victims) + free_slots)],
        [scenario_queue("q1")],
        [
            pg("pg1", "q1", NO_GANG_MINIMUM, victims, priority_class="low-priority"),
            pg("pg2", "q1", 1, [pod("preemptor1", res("3", "3G"))], priority_class="high-priority"),
        ],
    )
    assert out["pipelined"] == {uid("preemptor1"): "n1"}
    assert len(evicted(out)) == (0 if free_slots else 1)


def test_never_preempts_across_queues() -> None:
    """Preempt stays inside the preemptor's queue (reclaim is the cross-queue action)."""
    out = preempt(
        [scenario_node("n1", res("2", "2G"))],
        [scenario_queue("q1"), scenario_queue("q2")],
        [
            pg(
                "pg1",
                "q1",
                NO_GANG_MINIMUM,
                [
                    pod("other-queue-1", res("1", "1G"), "n1"),
                    pod("other-queue-2", res("1", "1G"), "n1"),
                ],
                priority_class="low-priority",
            ),
            pg("pg2", "q2", 1, [pod("preemptor1", res("1", "1G"))], priority_class="high-priority"),
        ],
    )
    assert evicted(out) == set()


def test_gang_keeps_victim_job_at_min_available() -> None:
    """Gang's preemptable: a victim job keeps minAvailable ready tasks, so of a gang of 3 with
    minMember 2 only one task can go; the preemptor needing two slots gets nothing, and the
    discarded statement leaves every victim running."""
    out = preempt(
        [scenario_node("n1", res("3", "3G"))],
        [scenario_queue("q1")],
        [
            pg(
                "low",
                "q1",
                2,
                [pod(f"low-{i}", res("1", "1G"), "n1") for i in range(3)],
                priority_class="low-priority",
            ),
            pg(
                "high",
                "q1",
                2,
                [pod("high-0", res("1", "1G")), pod("high-1", res("1", "1G"))],
                priority_class="high-priority",
            ),
        ],
    )
    assert evicted(out) == set()
    assert out["pipelined"] == {}


def test_gang_preemptor_commits_when_whole_gang_is_pipelined() -> None:
    """A starving gang evicts enough for all its minMember tasks; the statement is committed
    because the job is pipelined, and each preemptor is pipelined on a node."""
    out = preempt(
        [scenario_node("n1", res("2", "2G")), scenario_node("n2", res("2", "2G"))],
        [scenario_queue("q1")],
        [
            pg(
                "low",
                "q1",
                1,
                [pod(f"low-{i}", res("1", "1G"), f"n{1 + i // 2}") for i in range(4)],
                priority_class="low-priority",
            ),
            pg(
                "high",
                "q1",
                3,
                [pod(f"high-{i}", res("1", "1G")) for i in range(3)],
                priority_class="high-priority",
            ),
        ],
    )
    assert len(evicted(out)) == 3
    assert set(out["pipelined"]) == {uid("high-0"), uid("high-1"), uid("high-2")}
    assert out["jobs"][uid("high")]["phase"] != "Running"


def test_equal_priority_jobs_do_not_preempt_each_other() -> None:
    """Priority's preemptable: a victim job must have a strictly lower priority."""
    out = preempt(
        [scenario_node("n1", res("1", "1G"))],
        [scenario_queue("q1")],
        [
            pg(
                "pg1",
                "q1",
                NO_GANG_MINIMUM,
                [pod("running", res("1", "1G"), "n1")],
                priority_class="high-priority",
            ),
            pg("pg2", "q1", 1, [pod("waiting", res("1", "1G"))], priority_class="high-priority"),
        ],
    )
    assert evicted(out) == set()


def test_within_job_higher_priority_task_evicts_lower_one() -> None:
    """Volcano's second phase, preemption between tasks of one job: a pending high-priority task
    evicts a running lower-priority task of the same job (priority compares task priorities)."""
    out = preempt(
        [scenario_node("n1", res("2", "2G"))],
        [scenario_queue("q1")],
        [
            pg(
                "pg1",
                "q1",
                1,
                [
                    pod("worker-0", res("1", "1G"), "n1", priority=1),
                    pod("worker-1", res("1", "1G"), "n1", priority=1),
                    pod("master", res("2", "2G"), priority=100),
                ],
            )
        ],
        tiers=[
            [
                plugin(
                    "priority",
                    "enableTaskOrder",
                    "enableJobOrder",
                    "enablePreemptable",
                    "enableJobStarving",
                ),
            ]
        ],
    )
    assert evicted(out) == {uid("worker-0"), uid("worker-1")}
    assert out["pipelined"] == {uid("master"): "n1"}


@pytest.mark.parametrize(("candidates", "chosen"), [(1, "n1"), (2, "n2")])
def test_topology_aware_prefers_node_with_lowest_priority_victims(
    candidates: int, chosen: str
) -> None:
    """kube-scheduler's candidate choice: the dry run stops after minCandidateNodesAbsolute
    candidates (10% of 2 nodes rounds down, so 1 by default: the first node); with 2 candidates
    the node whose highest-priority victim is lowest wins."""
    out = preempt(
        [scenario_node("n1", res("1", "1G")), scenario_node("n2", res("1", "1G"))],
        [scenario_queue("q1")],
        [
            pg(
                "mid",
                "q1",
                NO_GANG_MINIMUM,
                [pod("on-n1", res("1", "1G"), "n1", priority=50)],
                priority_class="low-priority",
            ),
            pg(
                "low",
                "q1",
                NO_GANG_MINIMUM,
                [pod("on-n2", res("1", "1G"), "n2", priority=5)],
                priority_class="low-priority",
            ),
            pg("high", "q1", 1, [pod("preemptor", res("1", "1G"))], priority_class="high-priority"),
        ],
        topology_aware=True,
        minCandidateNodesAbsolute=candidates,
    )
    assert evicted(out) == {uid(f"on-{chosen}")}
    assert out["pipelined"] == {uid("preemptor"): chosen}


def test_network_topology_jobs_do_not_preempt() -> None:
    """Volcano skips preemption for jobs with a network topology (volcano#4374)."""
    out = preempt(
        [scenario_node("n1", res("1", "1G"))],
        [scenario_queue("q1")],
        [
            pg(
                "pg1",
                "q1",
                NO_GANG_MINIMUM,
                [pod("victim", res("1", "1G"), "n1")],
                priority_class="low-priority",
            ),
            pg(
                "pg2",
                "q1",
                1,
                [pod("preemptor", res("1", "1G"))],
                priority_class="high-priority",
                networkTopology={"mode": "hard", "highestTierAllowed": 1},
            ),
        ],
    )
    assert evicted(out) == set()


def test_pending_phase_jobs_do_not_preempt() -> None:
    """A job not yet admitted (PodGroup phase Pending) is no preemptor."""
    out = preempt(
        [scenario_node("n1", res("1", "1G"))],
        [scenario_queue("q1")],
        [
            pg(
                "pg1",
                "q1",
                NO_GANG_MINIMUM,
                [pod("victim", res("1", "1G"), "n1")],
                priority_class="low-priority",
            ),
            pg(
                "pg2",
                "q1",
                1,
                [pod("preemptor", res("1", "1G"))],
                priority_class="high-priority",
                phase="Pending",
            ),
        ],
    )
    assert evicted(out) == set()


def test_preempt_arguments_are_validated() -> None:
    load_config(
        'actions: "allocate, preempt"\nconfigurations:\n- name: preempt\n  arguments: {enableTopologyAwarePreemption: true, minCandidateNodesPercentage: 20}\n'
    )
    with pytest.raises(ConfigError, match="enableTopologyAwarePreemptio"):
        load_config(
            'actions: "preempt"\nconfigurations:\n- name: preempt\n  arguments: {enableTopologyAwarePreemptio: true}\n'
        )


def test_default_tiers_preempt_after_allocate() -> None:
    """Volcano's usual order with its default tiers (all switches on): allocate places what fits,
    preempt evicts for the starving high-priority gang; the victim is reported with its reason."""
    low = job(
        "low",
        2,
        queue="q1",
        status=TaskStatus.RUNNING,
        nodes="n1",
        min_member=1,
        priority=1,
        phase=PodGroupPhase.RUNNING,
    )
    high = job("high", queue="q1", min_member=1, priority=100, index=1, task_index=0)
    snap = snapshot([node("n1", "2", "4Gi", pods="10")], [low, high], [queue("q1")])
    result = cycle(
        snap,
        (
            'actions: "enqueue, allocate, preempt, backfill"\ntiers:\n- plugins:\n  - name: priority\n  - name: gang\n'
            "  - name: conformance\n- plugins:\n  - name: drf\n  - name: predicates\n  - name: proportion\n  - name: nodeorder\n"
        ),
    )
    # The gang keeps one of low's two tasks (which one follows the node's task order, a Go map
    # order in Volcano).
    assert len(result.evictions) == 1
    assert set(result.evictions.values()) == {"preempt"}
    assert next(iter(result.evictions)).startswith("ns/low-")
    assert result.pipelined == {"ns/high-0": "n1"}
    assert result.binds == {}
