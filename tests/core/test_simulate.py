"""`muster simulate` scenario loading and running (docs/simulate.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.simulate import ScenarioError, simulate_text

ROOT = Path(__file__).resolve().parents[2]

BASE = """
config:
  actions: "enqueue, allocate, backfill"
  tiers:
  - plugins: [{name: priority}, {name: gang}]
  - plugins: [{name: predicates}, {name: nodeorder}]
nodes:
- {name: n1, allocatable: {cpu: "4", memory: 8Gi}}
- {name: n2, allocatable: {cpu: "4", memory: 8Gi}}
queues: [{name: q1}]
jobs:
- name: pg1
  namespace: ns1
  queue: q1
  minMember: 2
  tasks:
  - {name: p1, request: {cpu: "3"}}
  - {name: p2, request: {cpu: "3"}}
"""


def test_gang_fits_and_binds_all_members() -> None:
    out = simulate_text(BASE)
    assert set(out["binds"]) == {"ns1/p1", "ns1/p2"}
    assert set(out["binds"].values()) == {"n1", "n2"}
    assert out["jobs"]["ns1/pg1"]["phase"] == "Running"
    assert out["tasks"]["ns1/p1"]["status"] == "Binding"
    assert set(out) == {"binds", "pipelined", "evictions", "moved", "tasks", "jobs"}


def test_gang_that_does_not_fit_binds_nothing() -> None:
    out = simulate_text(
        BASE.replace("minMember: 2", "minMember: 3").replace(
            '  - {name: p2, request: {cpu: "3"}}',
            '  - {name: p2, request: {cpu: "3"}}\n  - {name: p3, request: {cpu: "3"}}',
        )
    )
    assert out["binds"] == {}
    cond = out["jobs"]["ns1/pg1"]["conditions"][0]
    assert cond["type"] == "Unschedulable"
    assert "Insufficient cpu" in cond["message"]


def test_every_problem_is_reported_with_its_path() -> None:
    bad = (
        BASE.replace('{cpu: "3"}}\n  - {name: p2', '{cpu: "2x"}}\n  - {name: p2')
        + """
- name: pg2
  tasks:
  - {name: q1, status: Running, node: n9, request: {cpu: "1"}}
  - {name: q2, reqest: {cpu: "1"}}
"""
    )
    with pytest.raises(ScenarioError) as err:
        simulate_text(bad)
    problems = err.value.problems
    assert "jobs[0].tasks[0].request.cpu: '2x' is not a quantity" in problems
    assert "jobs[1].tasks[0].node: node 'n9' does not exist" in problems
    assert "jobs[1].tasks[1].reqest: unknown field" in problems


def test_unknown_plugin_in_scenario_config() -> None:
    with pytest.raises(ScenarioError) as err:
        simulate_text(BASE.replace("{name: nodeorder}", "{name: nodeordr}"))
    assert any(
        "config.tiers[1].plugins[1].name: unknown plugin 'nodeordr'" in p
        for p in err.value.problems
    )


def test_cycles_run_bound_tasks_and_release_evicted_ones() -> None:
    text = BASE.replace("minMember: 2", "minMember: 1").replace(
        '{cpu: "3"}}\n  - {name: p2, request: {cpu: "3"}}',
        '{cpu: "3"}}\n  - {name: p2, request: {cpu: "3"}}\n  - {name: p3, request: {cpu: "3"}}',
    )
    one = simulate_text(text, cycles=1)
    assert len(one["binds"]) == 2
    assert one["tasks"]["ns1/p3"]["status"] == "Pending"
    two = simulate_text(text, cycles=2)
    # In cycle 2 the bound tasks run; p3 still has no room.
    assert two["tasks"]["ns1/p1"]["status"] == "Running"
    assert two["tasks"]["ns1/p3"]["status"] == "Pending"


def test_x_keys_are_ignored_and_json_is_accepted() -> None:
    import json

    import yaml

    doc = yaml.safe_load(BASE)
    doc["x-comment"] = "ignored"
    out = simulate_text(json.dumps(doc))
    assert len(out["binds"]) == 2


@pytest.mark.parametrize(
    "path", sorted((ROOT / "examples" / "scenarios").glob("*.yaml")), ids=lambda p: p.name
)
def test_shipped_example_scenarios_run(path: Path) -> None:
    out = simulate_text(path.read_text())
    assert out["tasks"], path


def test_wrong_types_anywhere_are_problems_not_crashes() -> None:
    """Every field replaced by a value of the wrong type yields ScenarioError, never a crash."""
    import copy

    import yaml

    doc = {
        "nodes": [
            {
                "name": "n1",
                "allocatable": {"cpu": "4"},
                "labels": {"a": "b"},
                "taints": [{"key": "k"}],
                "devices": {"0": {"healthy": True}},
            }
        ],
        "queues": [{"name": "q", "capability": {"cpu": "8"}}],
        "jobs": [
            {
                "name": "j",
                "queue": "q",
                "minTaskMember": {"w": 1},
                "tasks": [
                    {
                        "name": "t",
                        "role": "w",
                        "request": {"cpu": "1"},
                        "tolerations": [{"key": "k"}],
                        "affinity": {},
                    }
                ],
            }
        ],
        "hypernodes": [{"name": "h", "tier": 1, "members": {"nodes": ["n1"]}}],
    }

    def paths(obj, prefix=()):
        yield prefix
        items = (
            obj.items()
            if isinstance(obj, dict)
            else enumerate(obj)
            if isinstance(obj, list)
            else ()
        )
        for k, v in items:
            yield from paths(v, (*prefix, k))

    rejected = 0
    unexplained = []  # rejections that do not say what is wrong
    for path in list(paths(doc))[1:]:
        for wrong in (5, "x", [1], {"a": 1}, True, -1):
            bad = copy.deepcopy(doc)
            target = bad
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = wrong
            try:
                simulate_text(yaml.safe_dump(bad))
            except ScenarioError as err:
                if not err.problems:
                    unexplained.append((path, wrong))
                rejected += 1
    assert unexplained == []
    # The wrong values reach the loader's checks: most of them are rejected as problems.
    assert rejected > 150


def test_job_of_a_missing_queue_is_not_scheduled_but_still_holds_its_nodes() -> None:
    """Volcano's snapshot leaves out jobs whose queue does not exist; their pods still use nodes."""
    text = """
nodes: [{name: n1, allocatable: {cpu: "4", memory: 8Gi}}]
queues: [{name: q1}]
jobs:
- {name: ghost, queue: nope, phase: Running, tasks: [{name: g0, status: Running, node: n1, request: {cpu: "3"}}]}
- {name: ghost2, queue: nope, phase: Inqueue, tasks: [{name: h0, request: {cpu: "1"}}]}
- {name: real, queue: q1, phase: Inqueue, tasks: [{name: r0, request: {cpu: "2"}}]}
"""
    out = simulate_text(text)
    assert out["binds"] == {}  # 1 cpu left: r0 does not fit; h0 is never considered
    assert out["tasks"]["default/h0"]["status"] == "Pending"
    assert out["tasks"]["default/g0"]["status"] == "Running"


def test_hypernode_cycles_are_problems() -> None:
    text = """
nodes: [{name: n1, allocatable: {cpu: "1"}}]
hypernodes:
- {name: a, tier: 2, members: {hypernodes: [b]}}
- {name: b, tier: 1, members: {hypernodes: [a], nodes: [n1]}}
- {name: c, tier: 1, members: {hypernodes: [c]}}
"""
    with pytest.raises(ScenarioError) as err:
        simulate_text(text)
    assert "hypernodes[0].members: hypernode 'a' contains itself" in err.value.problems
    assert "hypernodes[2].members: hypernode 'c' contains itself" in err.value.problems


def test_a_cycle_without_nodes_leaves_admitted_jobs_pending() -> None:
    """A restarted server cycles before any backend synced its nodes: admitted jobs stay pending
    (found as a crash: argmax over no nodes)."""
    out = simulate_text(
        "config: {actions: allocate, tiers: [{plugins: [{name: gang}, {name: predicates}]}]}\n"
        "nodes: []\njobs:\n  - {name: a, phase: Inqueue, tasks: [{name: a0, request: {cpu: '1'}}]}\n"
    )
    assert out["binds"] == {}
    assert out["tasks"]["default/a0"]["status"] == "Pending"


def test_a_job_that_can_never_fit_says_so_apart_from_waiting_for_room() -> None:
    out = simulate_text("""
config: {actions: "enqueue, allocate", tiers: [{plugins: [{name: gang}, {name: predicates}]}]}
nodes: [{name: n1, allocatable: {cpu: "8", memory: 16Gi}}, {name: n2, allocatable: {cpu: "8", memory: 16Gi}}]
jobs:
  - {name: busy, tasks: [{name: b0, status: Running, node: n1, request: {cpu: "8"}},
                         {name: b1, status: Running, node: n2, request: {cpu: "8"}}]}
  - {name: huge, phase: Inqueue, tasks: [{name: h0, request: {cpu: "64"}}]}
  - {name: waits, phase: Inqueue, tasks: [{name: w0, request: {cpu: "4"}}]}
""")
    huge = out["jobs"]["default/huge"]["conditions"][0]["message"]
    assert (
        "task h0 can never run on this cluster: it asks cpu 64 (largest eligible node: 8)" in huge
    )
    waits = out["jobs"]["default/waits"]["conditions"][0]["message"]
    assert "can never run" not in waits
    assert "Insufficient cpu" in waits
    assert ".." not in huge + waits


PRIORITY_CLASS_SCENARIO = """
config: {profile: PROFILE, actions: [allocate], tiers: [{plugins: [{name: priority}]}]}
nodes: [{name: n1, allocatable: {cpu: "2", memory: 2Gi}}]
queues: [{name: q}]
jobs:
- {name: ghost, queue: q, priorityClass: no-such-class, tasks: [{name: g, request: {cpu: "2"}}]}
- {name: known, queue: q, priority: 1, tasks: [{name: k, request: {cpu: "2"}}]}
"""


def test_an_unknown_priority_class_is_priority_zero_in_volcano_and_an_error_in_kai() -> None:
    """Volcano gives a PodGroup whose class does not exist priority 0 (so the priority-1 job goes
    first); under profile kai the scenario names the problem."""
    out = simulate_text(PRIORITY_CLASS_SCENARIO.replace("PROFILE", "volcano"))
    assert out["binds"] == {"default/k": "n1"}
    with pytest.raises(
        ScenarioError, match=r"jobs\[0\].priorityClass: unknown priority class 'no-such-class'"
    ):
        simulate_text(PRIORITY_CLASS_SCENARIO.replace("PROFILE", "kai"))


RESERVING = """
now: 1800000  # a whole minute: ends are rounded up to the minute
config:
  actions: "enqueue, allocate, backfill, reserve"
  tiers:
  - plugins: [{name: priority}, {name: gang}]
  - plugins: [{name: predicates}, {name: proportion}, {name: nodeorder}, {name: reservation}]
nodes:
  - {name: n1, allocatable: {cpu: "4", memory: 8Gi}}
  - {name: n2, allocatable: {cpu: "4", memory: 8Gi}}
jobs:
  - name: long
    phase: Running
    timeLimit: 2h
    runningFor: 30m
    tasks: [{name: l0, request: {cpu: "4"}, status: Running, node: n1}]
  - name: big
    phase: Inqueue
    priority: 10
    minMember: 2
    tasks:
      - {name: b0, request: {cpu: "4"}}
      - {name: b1, request: {cpu: "4"}}
  - name: short
    phase: Inqueue
    timeLimit: 1h
    tasks: [{name: s0, request: {cpu: "4"}}]
  - name: too-long
    phase: Inqueue
    timeLimit: 2h
    tasks: [{name: t0, request: {cpu: "4"}}]
"""


def test_time_limits_and_running_times_give_reservations_and_estimates() -> None:
    """``now``, ``timeLimit`` and ``runningFor``: long ends 90 minutes from now, so big is
    reserved both nodes from then; short (1h) ends before and starts now on n2; too-long (2h)
    would delay big and waits."""
    out = simulate_text(RESERVING)
    assert out["jobs"]["default/big"]["estimate"] == {
        "start": 5400.0,
        "nodes": ["n1", "n2"],
        "reserved": True,
        "note": "",
    }
    assert out["binds"] == {"default/s0": "n2"}
    assert "default/t0" not in out["binds"]


def test_running_for_and_time_limit_are_durations() -> None:
    bad = RESERVING.replace("runningFor: 30m", "runningFor: soon").replace("now: 1800000", "now: x")
    with pytest.raises(ScenarioError) as err:
        simulate_text(bad)
    assert any(p.startswith("jobs[0].runningFor:") for p in err.value.problems)
    assert any(p.startswith("now:") for p in err.value.problems)
