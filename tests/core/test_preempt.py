"""preempt action: cases re-expressed from Volcano's ``actions/preempt/preempt_test.go`` (normal and
topology-aware preemption) plus the behaviours its code implies (intra-job phase, gang protection
of victims, commit only when the preemptor job is pipelined)."""

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


def _without_gang_victims(tiers):  # noqa: ANN001, ANN202
    return [
        [
            plugin("gang", "enableJobPipelined", "enableJobStarving") if p["name"] == "gang" else p
            for p in t
        ]
        for t in tiers
    ]


def preempt(nodes, queues, jobs, *, topology_aware: bool = False, tiers=None, **arguments):  # noqa: ANN001, ANN003, ANN202
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


MODES = pytest.mark.parametrize("topology_aware", [False, True], ids=["normal", "topology-aware"])


@MODES
def test_no_preemption_when_idle_resources_suffice(topology_aware: bool) -> None:
    """'do not preempt if there are enough idle resources'."""
    out = preempt(
        [scenario_node("n1", res("10", "10G"))],
        [scenario_queue("q1")],
        [
            pg(
                "pg1",
                "q1",
                3,
                [
                    pod("preemptee1", res("1", "1G"), "n1"),
                    pod("preemptee2", res("1", "1G"), "n1"),
                    pod("preemptor1", res("1", "1G")),
                ],
            )
        ],
        topology_aware=topology_aware,
    )
    assert evicted(out) == set()
    if not topology_aware:
        # Normal preemption pipelines the starving task onto the node without evicting anyone.
        assert out["pipelined"] == {uid("preemptor1"): "n1"}


@MODES
def test_no_preemption_when_job_is_pipelined(topology_aware: bool) -> None:
    """'do not preempt if job is pipelined': pg2 has minMember 1 running, so it is not starving."""
    out = preempt(
        [scenario_node("n1", res("3", "3G"))],
        [scenario_queue("q1")],
        [
            pg(
                "pg1",
                "q1",
                1,
                [pod("preemptee1", res("1", "1G"), "n1"), pod("preemptee2", res("1", "1G"), "n1")],
            ),
            pg(
                "pg2",
                "q1",
                1,
                [pod("preemptee3", res("1", "1G"), "n1"), pod("preemptor2", res("1", "1G"))],
            ),
        ],
        topology_aware=topology_aware,
    )
    assert evicted(out) == set()
    assert out["pipelined"] == {}


@MODES
def test_preempts_one_task_of_another_job(topology_aware: bool) -> None:
    """'preempt one task of different job to fit both jobs on one node': only the preemptable
    victim goes, and the high-priority job ends up pipelined (gang of 1 of 2 tasks)."""
    out = preempt(
        [scenario_node("n1", res("2", "2G"))],
        [scenario_queue("q1")],
        [
            pg(
                "pg1",
                "q1",
                1,
                [
                    pod("preemptee1", res("1", "1G"), "n1"),
                    pod("preemptee2", res("1", "1G"), "n1", preemptable=False),
                ],
                priority_class="low-priority",
            ),
            pg(
                "pg2",
                "q1",
                1,
                [pod("preemptor1", res("1", "1G")), pod("preemptor2", res("1", "1G"))],
                priority_class="high-priority",
            ),
        ],
        topology_aware=topology_aware,
    )
    assert evicted(out) == {uid("preemptee1")}
    assert out["pipelined"] == {uid("preemptor1"): "n1"}
    assert out["tasks"][uid("preemptee1")]["status"] == "Releasing"


@MODES
def test_preempts_just_enough_for_a_large_task(topology_aware: bool) -> None:
    """'preempt enough tasks to fit large task of different job': 5 cpu needed, 3 idle, two of
    the three 1-cpu victims (the third is not preemptable)."""
    out = preempt(
        [scenario_node("n1", res("6", "6G"))],
        [scenario_queue("q1")],
        [
            pg(
                "pg1",
                "q1",
                1,
                [
                    pod("preemptee1", res("1", "1G"), "n1"),
                    pod("preemptee2", res("1", "1G"), "n1"),
                    pod("preemptee3", res("1", "1G"), "n1", preemptable=False),
                ],
                priority_class="low-priority",
            ),
            pg("pg2", "q1", 1, [pod("preemptor1", res("5", "5G"))], priority_class="high-priority"),
        ],
        topology_aware=topology_aware,
    )
    assert evicted(out) == {uid("preemptee1"), uid("preemptee2")}
    assert out["pipelined"] == {uid("preemptor1"): "n1"}


@MODES
def test_preempts_low_priority_job_when_queue_capability_is_reached(topology_aware: bool) -> None:
    """Volcano #3161, 'preempt low priority job in same queue': the node has room but the queue's
    capability (4 cpu) does not, so the 3-cpu victim must go."""
    out = preempt(
        [scenario_node("n1", res("12", "12G"))],
        [scenario_queue("q1", capability={"cpu": "4", "memory": "4G"})],
        [
            pg(
                "pg1",
                "q1",
                NO_GANG_MINIMUM,
                [pod("preemptee1", res("3", "3G"), "n1")],
                priority_class="low-priority",
            ),
            pg("pg2", "q1", 1, [pod("preemptor1", res("3", "3G"))], priority_class="high-priority"),
        ],
        topology_aware=topology_aware,
    )
    assert evicted(out) == {uid("preemptee1")}


@MODES
def test_no_preemption_when_queue_and_node_have_room(topology_aware: bool) -> None:
    """Volcano #3161, 'allocatable and has enough resource, don't preempt'."""
    out = preempt(
        [scenario_node("n1", res("12", "12G"))],
        [scenario_queue("q1", capability={"cpu": "6", "memory": "6G"})],
        [
            pg(
                "pg1",
                "q1",
                1,
                [pod("preemptee1", res("3", "3G"), "n1")],
                priority_class="low-priority",
            ),
            pg("pg2", "q1", 1, [pod("preemptor1", res("3", "3G"))], priority_class="high-priority"),
        ],
        topology_aware=topology_aware,
    )
    assert evicted(out) == set()


@MODES
def test_skips_unpreemptable_and_higher_priority_pods(topology_aware: bool) -> None:
    """Volcano #2232: of a low-priority job, the preemptable=false pod is never a victim and the
    lowest-priority pod goes first, so the high-priority pod stays."""
    out = preempt(
        [scenario_node("n1", res("12", "12G"))],
        [scenario_queue("q1", capability={"cpu": "3", "memory": "3G"})],
        [
            pg(
                "pg1",
                "q1",
                1,
                [
                    pod("preemptee1", res("1", "1G"), "n1", preemptable=False),
                    pod("preemptee2", res("1", "1G"), "n1"),
                    pod("preemptee3", res("1", "1G"), "n1", priority=100000),
                ],
                priority_class="low-priority",
            ),
            pg("pg2", "q1", 1, [pod("preemptor1", res("1", "1G"))], priority_class="high-priority"),
        ],
        topology_aware=topology_aware,
    )
    assert evicted(out) == {uid("preemptee2")}


def test_besteffort_victim_frees_the_pod_slot() -> None:
    """Volcano #3335, 'unBestEffort high-priority pod preempt BestEffort low-priority pod': the node
    allows one pod; evicting the best-effort pod frees the slot (predicates' pod count no longer
    counts the victim)."""
    out = preempt(
        [scenario_node("n1", res("12", "12G"), pods=1)],
        [scenario_queue("q1", capability={"cpu": "6", "memory": "6G"})],
        [
            pg(
                "pg1",
                "q1",
                NO_GANG_MINIMUM,
                [pod("preemptee1", None, "n1")],
                priority_class="low-priority",
            ),
            pg("pg2", "q1", 1, [pod("preemptor1", res("3", "3G"))], priority_class="high-priority"),
        ],
        topology_aware=True,
    )
    assert evicted(out) == {uid("preemptee1")}
    assert out["pipelined"] == {uid("preemptor1"): "n1"}


@MODES
def test_besteffort_preemptor_evicts_besteffort_pod(topology_aware: bool) -> None:
    """Volcano #3335, 'BestEffort high-priority pod preempt BestEffort low-priority pod'."""
    out = preempt(
        [scenario_node("n1", res("12", "12G"), pods=1)],
        [scenario_queue("q1", capability={"cpu": "6", "memory": "6G"})],
        [
            pg(
                "pg1",
                "q1",
                NO_GANG_MINIMUM,
                [pod("preemptee1", None, "n1")],
                priority_class="low-priority",
            ),
            pg("pg2", "q1", 1, [pod("preemptor1", None)], priority_class="high-priority"),
        ],
        topology_aware=True,
    )
    assert evicted(out) == {uid("preemptee1")}


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


@MODES
def test_preemption_policy_never_does_not_preempt(topology_aware: bool) -> None:
    """Volcano #3642: a preemptor whose preemptionPolicy is Never evicts nothing."""
    out = preempt(
        [scenario_node("n1", res("1", "1Gi"), pods=1)],
        [scenario_queue("q1")],
        [
            pg(
                "pg1",
                "q1",
                NO_GANG_MINIMUM,
                [pod("preemptee1", res("1", "1G"), "n1")],
                priority_class="low-priority",
            ),
            pg(
                "pg2",
                "q1",
                1,
                [pod("preemptor1", res("1", "1G"), preemptionPolicy="Never")],
                priority_class="high-priority",
            ),
        ],
        topology_aware=topology_aware,
    )
    assert evicted(out) == set()
    assert out["pipelined"] == {}


def test_rolls_back_evictions_when_queue_capability_still_exceeded() -> None:
    """'rollback evictions when preemptor exceeds queue capacity after evicting victims': both
    victims are tried on the node, the queue (capability 3) still cannot take 4 cpu, so the
    node's statement is discarded and nothing is evicted."""
    out = preempt(
        [scenario_node("n1", res("10", "10G"))],
        [scenario_queue("q1", capability={"cpu": "3", "memory": "3G"})],
        [
            pg(
                "pg1",
                "q1",
                1,
                [pod("preemptee1", res("1", "1G"), "n1"), pod("preemptee2", res("1", "1G"), "n1")],
                priority_class="low-priority",
            ),
            pg("pg2", "q1", 1, [pod("preemptor1", res("4", "4G"))], priority_class="high-priority"),
        ],
    )
    assert evicted(out) == set()
    assert out["tasks"][uid("preemptee1")]["status"] == "Running"
    assert out["pipelined"] == {}


def test_only_the_winning_nodes_evictions_are_committed() -> None:
    """'only commit evictions on the node where preemption succeeds': the 1-cpu victim on n1 does
    not bring the queue under its capability (discarded); the 4-cpu victim on n2 does."""
    out = preempt(
        [scenario_node("n1", res("3", "3G")), scenario_node("n2", res("4", "4G"))],
        [scenario_queue("q1", capability={"cpu": "6", "memory": "6G"})],
        [
            pg(
                "pg1",
                "q1",
                NO_GANG_MINIMUM,
                [pod("preemptee1", res("1", "1G"), "n1")],
                priority_class="low-priority",
            ),
            pg("pg2", "q1", 1, [pod("preemptor1", res("3", "3G"))], priority_class="high-priority"),
            pg(
                "pg3",
                "q1",
                NO_GANG_MINIMUM,
                [pod("preemptee2", res("4", "4G"), "n2")],
                priority_class="low-priority",
            ),
        ],
    )
    assert evicted(out) == {uid("preemptee2")}
    assert out["pipelined"] == {uid("preemptor1"): "n2"}


def test_preemptors_of_every_queue_are_served() -> None:
    """'multi-queue: preemptorTasks must not be overwritten by intra-job preemption of another
    queue': q2's starving high-priority job still preempts after q1 is processed."""
    out = preempt(
        [scenario_node("n1", res("2", "2G"))],
        [scenario_queue("q1"), scenario_queue("q2", capability={"cpu": "4", "memory": "4G"})],
        [
            pg("pg1", "q1", 1, [pod("q1-runner1", res("1", "1G"), "n1")]),
            pg(
                "pg2",
                "q2",
                NO_GANG_MINIMUM,
                [pod("q2-preemptee1", res("1", "1G"), "n1")],
                priority_class="low-priority",
            ),
            pg(
                "pg3",
                "q2",
                1,
                [pod("q2-preemptor1", res("1", "1G"))],
                priority_class="high-priority",
            ),
        ],
    )
    assert evicted(out) == {uid("q2-preemptee1")}


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


def test_pod_anti_affinity_conflict_is_resolved_by_eviction() -> None:
    """'preempt low-priority pod when high-priority pod has PodAntiAffinity conflict'
    (topology-aware): the pod carrying the conflicting label is the one evicted."""
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"test": "test"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    out = preempt(
        [scenario_node("n1", res("2", "2Gi"), pods=2, labels={"kubernetes.io/hostname": "n1"})],
        [scenario_queue("q1", capability={"cpu": "2", "memory": "2G"})],
        [
            pg(
                "pg1",
                "q1",
                NO_GANG_MINIMUM,
                [pod("preemptee2", res("1", "1G"), "n1", labels={"test": "test"}, affinity=anti)],
                priority_class="low-priority",
            ),
            pg(
                "pg2",
                "q1",
                NO_GANG_MINIMUM,
                [pod("preemptee1", res("1", "1G"), "n1")],
                priority_class="low-priority",
            ),
            pg(
                "pg3",
                "q1",
                1,
                [pod("preemptor1", res("1", "1G"), labels={"test": "test"}, affinity=anti)],
                priority_class="high-priority",
            ),
        ],
        topology_aware=True,
    )
    assert evicted(out) == {uid("preemptee2")}


@pytest.mark.parametrize("candidates, chosen", [(1, "n1"), (2, "n2")])
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
