"""reclaim action: the checks Volcano's reclaim loop makes (overused queues skipped, only Running
preemptable tasks of other reclaimable queues, commit only when the reclaiming job is pipelined),
with the tier of ``actions/reclaim/reclaim_test.go``. The cases of ``TestReclaim`` themselves are
scenario files under tests/scenarios/volcano/reclaim/, run by test_volcano_cases.py."""

from __future__ import annotations

from core_helpers import (
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

from server.model import PodGroupPhase, TaskStatus

# Volcano TestReclaim's tier (the capacity entry is omitted: Muster's capacity plugin is tested on
# its own); every switch it does not set is off.
TIERS = [
    [
        plugin("conformance", "enableReclaimable"),
        plugin("gang", "enableReclaimable", "enableJobStarving"),
        plugin("proportion", "enableReclaimable", "enableQueueOrder", "enablePreemptive"),
        plugin("priority", "enableReclaimable", "enableJobOrder", "enableTaskOrder"),
    ]
]
CLASSES = [
    {"name": "low-priority", "value": 100},
    {"name": "mid-priority", "value": 500},
    {"name": "high-priority", "value": 1000},
]


def reclaim(nodes, queues, jobs, *, tiers=None, priority_classes=None):
    tiers = tiers or TIERS
    # Muster reads minMember 0 as "every task"; Volcano's gang lets every task of a minMember-0
    # victim job go, which is what gang's reclaimable switched off gives here.
    if any(j["minMember"] == 0 for j in jobs):
        tiers = [
            [plugin("gang", "enableJobStarving") if p["name"] == "gang" else p for p in t]
            for t in tiers
        ]
    return simulate(
        config(["reclaim"], tiers),
        nodes,
        queues,
        jobs,
        priority_classes=priority_classes or CLASSES,
    )


# -- the loop's own checks ----------------------------------------------------------------------------


def _two_queue_case(**victim_queue: object) -> list[list[dict]]:
    return [
        [scenario_node("n1", res("2", "2G"))],
        [scenario_queue("q1", **victim_queue), scenario_queue("q2")],
        [
            pg(
                "pg1",
                "q1",
                1,
                [pod("victim-1", res("1", "1G"), "n1"), pod("victim-2", res("1", "1G"), "n1")],
            ),
            pg("pg2", "q2", 1, [pod("reclaimer", res("1", "1G"))]),
        ],
    ]


def test_baseline_two_queue_case_reclaims() -> None:
    out = reclaim(*_two_queue_case())
    assert len(evicted(out)) == 1


def test_unreclaimable_queue_keeps_its_tasks() -> None:
    """A queue with reclaimable: false is never a source of reclaimees."""
    out = reclaim(*_two_queue_case(reclaimable=False))
    assert evicted(out) == set()
    assert out["pipelined"] == {}


def test_same_queue_tasks_are_not_reclaimed() -> None:
    """Reclaim works across queues only (preempt handles the preemptor's own queue)."""
    out = reclaim(
        [scenario_node("n1", res("2", "2G"))],
        [scenario_queue("q1"), scenario_queue("q2")],
        [
            pg(
                "pg1",
                "q1",
                1,
                [pod("victim-1", res("1", "1G"), "n1"), pod("victim-2", res("1", "1G"), "n1")],
                priority_class="low-priority",
            ),
            pg("pg2", "q1", 1, [pod("reclaimer", res("1", "1G"))], priority_class="high-priority"),
        ],
    )
    assert evicted(out) == set()


def test_only_running_tasks_are_reclaimees() -> None:
    """Volcano's reclaim takes Running tasks only (Bound ones are not yet running)."""
    nodes, queues, jobs = _two_queue_case()
    for t in jobs[0]["tasks"]:
        t["status"] = "Bound"
    out = reclaim(nodes, queues, jobs)
    assert evicted(out) == set()


def test_overused_queue_does_not_reclaim(monkeypatch) -> None:
    """A queue the overused functions call overused is skipped: same case as the baseline, with a
    plugin that calls q2 overused."""
    from server.plugins import PLUGINS
    from server.plugins.base import Plugin

    class Overuse(Plugin):
        name = "test-overuse"

        def on_session_open(self, ssn) -> None:
            ssn.register("overused", self.name, lambda q: q.name == "q2")

    monkeypatch.setitem(PLUGINS, Overuse.name, Overuse)
    tiers = [[*TIERS[0], plugin("test-overuse", "enabledOverused")]]
    assert evicted(reclaim(*_two_queue_case(), tiers=TIERS)) != set()
    assert evicted(reclaim(*_two_queue_case(), tiers=tiers)) == set()


def test_discards_when_gang_cannot_be_pipelined() -> None:
    """With gang's job_pipelined on, a reclaimer gang of 3 that finds room for only 2 tasks is
    discarded: no eviction is committed."""
    tiers = [
        [
            TIERS[0][0],
            plugin("gang", "enableReclaimable", "enableJobStarving", "enableJobPipelined"),
            *TIERS[0][2:],
        ]
    ]
    out = reclaim(
        [scenario_node("n1", res("3", "3G"))],
        [scenario_queue("q1"), scenario_queue("q2", weight=2)],
        [
            pg("pg1", "q1", 1, [pod(f"victim-{i}", res("1", "1G"), "n1") for i in range(3)]),
            pg("pg2", "q2", 3, [pod(f"gang-{i}", res("1", "1G")) for i in range(3)]),
        ],
        tiers=tiers,
    )
    assert evicted(out) == set()
    assert out["pipelined"] == {}
    assert all(out["tasks"][uid(f"victim-{i}")]["status"] == "Running" for i in range(3))


def test_commits_when_gang_is_pipelined() -> None:
    """A gang of 2 (q2 deserves 2 of the 3 cpus) fits after two evictions and is committed: both
    tasks are pipelined."""
    tiers = [
        [
            TIERS[0][0],
            plugin("gang", "enableReclaimable", "enableJobStarving", "enableJobPipelined"),
            *TIERS[0][2:],
        ]
    ]
    out = reclaim(
        [scenario_node("n1", res("3", "3G"))],
        [scenario_queue("q1"), scenario_queue("q2", weight=2)],
        [
            pg("pg1", "q1", 1, [pod(f"victim-{i}", res("1", "1G"), "n1") for i in range(3)]),
            pg("pg2", "q2", 2, [pod(f"gang-{i}", res("1", "1G")) for i in range(2)]),
        ],
        tiers=tiers,
    )
    assert len(evicted(out)) == 2
    assert set(out["pipelined"]) == {uid("gang-0"), uid("gang-1")}


def test_reclaim_result_reason() -> None:
    holder = job(
        "a",
        2,
        queue="qa",
        status=TaskStatus.RUNNING,
        nodes="n1",
        min_member=1,
        phase=PodGroupPhase.RUNNING,
    )
    starving = job("b", queue="qb", min_member=1, index=1, task_index=0)
    snap = snapshot(
        [node("n1", "2", "4Gi", pods="10")], [holder, starving], [queue("qa"), queue("qb")]
    )
    result = cycle(
        snap,
        (
            'actions: "enqueue, reclaim, allocate, backfill"\ntiers:\n- plugins:\n  - name: priority\n  - name: gang\n'
            "  - name: conformance\n- plugins:\n  - name: drf\n  - name: predicates\n  - name: proportion\n  - name: nodeorder\n"
        ),
    )
    assert list(result.evictions.values()) == ["reclaim"]
    assert result.pipelined == {"ns/b-0": "n1"}
