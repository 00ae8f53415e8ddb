"""The victim search's shortcuts (server/actions/kai/solver.py, session parameter
``solverPruning``) leave every placement as it is: KAI profile cycles on contended bench
clusters (bench/cycle.py ``build``) and on random small clusters give the same binds, pipelined
tasks, evictions and moves with the shortcuts on as with them off (the search as KAI runs it),
with the scenario filters on and off and under a simulation budget -- and with them on, fewer
scenarios are simulated.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from typing import Any

import numpy as np
import pytest
import yaml
from core_helpers import job, load_bench, node, res, session, snapshot, task
from hypothesis import given, note, settings
from hypothesis import strategies as st
from test_kai_scenario_filters import KAI, contended, gpu_cluster, kai_config, run
from test_properties import PROFILE

from server.actions.kai import solver as solver_module
from server.actions.kai.scenario_filters import PendingNeed, ScenarioFilters
from server.config import load_config
from server.scheduler import SchedulerCore

bench = load_bench("cycle")

# (nodes, tasks, seed): clusters where reclaim (and preempt) search many scenarios, some with
# victims evicted.
CLUSTERS = [(40, 200, 2), (60, 300, 1), (60, 300, 3), (60, 300, 4), (100, 500, 1)]


def cycle(
    nodes: int, tasks: int, seed: int, pruning: bool, **session: Any
) -> tuple[dict[str, Any], Counter[str]]:
    """One KAI cycle on bench cluster ``build(nodes, tasks, seed)``: what it decided, and how many
    scenarios each action simulated (and, as "retaken", how many the retaken-room shortcut gave
    up)."""
    raw = yaml.safe_load(bench.KAI_CONFIG.read_text())
    raw["session"] = {**raw.get("session", {}), **session, "solverPruning": pruning}
    core = SchedulerCore(load_config(yaml.safe_dump(raw)))
    simulated: Counter[str] = Counter()
    simulate = solver_module.JobSolver._simulate

    def counting(solver: solver_module.JobSolver, *args: Any) -> Any:
        simulated[solver.action] += 1
        return simulate(solver, *args)

    retakes = solver_module.JobSolver._retakes_room

    def counting_retaken(
        solver: solver_module.JobSolver, victim: Any, tasks: Any, within: Any
    ) -> bool:
        answer = retakes(solver, victim, tasks, within)
        simulated["retaken"] += answer
        return answer

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(solver_module.JobSolver, "_simulate", counting)
        mp.setattr(solver_module.JobSolver, "_retakes_room", counting_retaken)
        result = core.run_cycle(bench.build(nodes, tasks, seed), 1)
    decided = {
        "binds": result.binds,
        "bind_devices": result.bind_devices,
        "bind_gpu_groups": result.bind_gpu_groups,
        "pipelined": result.pipelined,
        "evictions": result.evictions,
        "moved": result.moved,
        "task_status": result.task_status,
    }
    return decided, simulated


@pytest.mark.parametrize("filters", [True, False])
@pytest.mark.parametrize(("nodes", "tasks", "seed"), CLUSTERS)
def test_the_shortcuts_leave_the_placements_as_they_are(
    nodes: int, tasks: int, seed: int, filters: bool
) -> None:
    reference, searched = cycle(nodes, tasks, seed, False, scenarioFilters=filters)
    decided, pruned = cycle(nodes, tasks, seed, True, scenarioFilters=filters)
    assert decided == reference
    assert pruned["reclaim"] <= searched["reclaim"]


def test_the_clusters_are_contended_and_the_shortcuts_save_simulations() -> None:
    """The identity above is worth something: these clusters evict, and the shortcuts skip
    simulations on them."""
    evicting = saved = retaken = 0
    for nodes, tasks, seed in CLUSTERS:
        reference, searched = cycle(nodes, tasks, seed, False)
        _, pruned = cycle(nodes, tasks, seed, True)
        evicting += bool(reference["evictions"])
        saved += searched["reclaim"] - pruned["reclaim"]
        retaken += pruned["retaken"]
        assert searched["retaken"] == 0
    assert evicting >= 2
    assert saved >= 50
    assert retaken >= 100


@pytest.mark.parametrize("budget", [0, 7, 30])
@pytest.mark.parametrize(("nodes", "tasks", "seed"), [(60, 300, 1), (60, 300, 3)])
def test_a_budget_is_spent_as_without_the_shortcuts(
    nodes: int, tasks: int, seed: int, budget: int
) -> None:
    """A scenario the shortcuts skip is charged as if it had been simulated, so a search gives up
    at the same scenario either way."""
    per_action = {"reclaim": budget, "preempt": budget}
    reference, _ = cycle(nodes, tasks, seed, False, simulationBudgetPerAction=per_action)
    decided, _ = cycle(nodes, tasks, seed, True, simulationBudgetPerAction=per_action)
    assert decided == reference


@settings(PROFILE, max_examples=200)
@given(
    doc=contended(),
    cycles=st.integers(1, 2),
    filters=st.booleans(),
    budget=st.sampled_from([None, 1, 2, 3]),
)
def test_the_shortcuts_change_nothing_on_random_clusters(
    doc: dict[str, Any], cycles: int, filters: bool, budget: int | None
) -> None:
    note(json.dumps(doc))
    params: dict[str, Any] = {}
    if budget is not None:
        params["simulationBudgetPerAction"] = dict.fromkeys(("reclaim", "preempt"), budget)
    on = copy.deepcopy(kai_config(filters, **params))
    off = copy.deepcopy(kai_config(filters, **params))
    on["session"]["solverPruning"] = True
    off["session"]["solverPruning"] = False
    assert run(doc, on, cycles) == run(doc, off, cycles)


def repeated_scenario_cluster() -> dict[str, Any]:
    """Three 4-GPU nodes, full: q1's gang A (2 GPUs on each of n0 and n1, priority 0), beside a
    non-preemptible job on each, and q1's B (4 GPUs on n2, priority 50). q0, below its quota of 4
    GPUs, waits with a job of 4 GPUs on one node. Reclaim takes A first (lowest priority): evicting
    it on n0 or on n1 is the same scenario, which fails (2 GPUs free on a node); then B makes room."""
    nodes = [
        {
            "name": f"n{i}",
            "allocatable": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": 4, "pods": 110},
        }
        for i in range(3)
    ]

    def running(name: str, priority: int, where: list[str], gpus: int) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": "ns",
            "queue": "q1",
            "priority": priority,
            "minMember": len(where),
            "phase": "Running",
            "tasks": [
                {
                    "name": f"{name}-{k}",
                    "status": "Running",
                    "node": n,
                    "devices": [
                        str(d + (2 if name.startswith("keep") else 0)) for d in range(gpus)
                    ],
                    "request": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": gpus},
                }
                for k, n in enumerate(where)
            ],
        }

    jobs = [
        running("a", 0, ["n0", "n1"], 2),
        running("keep0", 100, ["n0"], 2),
        running("keep1", 100, ["n1"], 2),
        running("b", 50, ["n2"], 4),
        {
            "name": "p",
            "namespace": "ns",
            "queue": "q0",
            "priority": 0,
            "minMember": 1,
            "phase": "Inqueue",
            "tasks": [
                {"name": "p-0", "request": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": 4}}
            ],
        },
    ]
    queues = [
        {"name": "q0", "guarantee": {"nvidia.com/gpu": 4}, "weight": 1},
        {"name": "q1", "weight": 1},
    ]
    return {"nodes": nodes, "queues": queues, "jobs": jobs}


@pytest.mark.parametrize("budget", [1, 2, 3, None])
def test_a_repeated_scenario_is_charged_to_the_budget(budget: int | None) -> None:
    """Without the filters every scenario is simulated: A's on n0, A's again on n1 (skipped by the
    shortcuts, but charged), B's. With a budget of 2 the search gives up before B either way."""
    doc = repeated_scenario_cluster()
    params: dict[str, Any] = {}
    if budget is not None:
        params["simulationBudgetPerAction"] = {"reclaim": budget}
    results = []
    for pruning in (False, True):
        config = copy.deepcopy(kai_config(False, **params))
        config["session"]["solverPruning"] = pruning
        results.append(run(doc, config))
    assert results[0] == results[1]
    made_room = budget is None or budget >= 3
    assert results[0]["evictions"] == (["ns/b-0"] if made_room else [])
    assert results[0]["pipelined"] == ({"ns/p-0": "n2"} if made_room else {})


def moved_elsewhere_cluster() -> dict[str, Any]:
    """n0 (zone a, 4 GPUs) holds q1's A (2 GPUs) and a non-preemptible job (1 GPU); n1 (zone b, 8
    GPUs) has 2 free. q0's pending job asks 2 GPUs in zone a. q1 goes first (queue priority), so a
    simulation places A again before the pending job: on n1, the fuller node, which leaves n0 the
    room. A shortcut that counted A's placement against zone a's room would give that up."""

    def one(name: str, q: str, priority: int, node: str | None, gpus: int) -> dict[str, Any]:
        t: dict[str, Any] = {
            "name": f"{name}-0",
            "request": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": gpus},
        }
        if node is not None:
            first = 2 if name == "keep" else 0
            t.update(status="Running", node=node, devices=[str(first + d) for d in range(gpus)])
        else:
            t["nodeSelector"] = {"zone": "a"}
        return {
            "name": name,
            "namespace": "ns",
            "queue": q,
            "priority": priority,
            "minMember": 1,
            "phase": "Running" if node is not None else "Inqueue",
            "tasks": [t],
        }

    nodes = [
        {
            "name": f"n{i}",
            "allocatable": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": gpus, "pods": 110},
            "labels": {"zone": zone},
        }
        for i, (gpus, zone) in enumerate([(4, "a"), (8, "b")])
    ]
    jobs = [
        one("a", "q1", 0, "n0", 2),
        one("keep", "q1", 100, "n0", 1),
        one("fill", "q1", 100, "n1", 6),
        one("p", "q0", 0, None, 2),
    ]
    queues = [{"name": "q0", "weight": 1}, {"name": "q1", "weight": 1, "priority": 1}]
    return {"nodes": nodes, "queues": queues, "jobs": jobs}


def test_a_victim_placed_where_the_pending_job_may_not_go_leaves_its_room() -> None:
    results = []
    for pruning in (False, True):
        config = copy.deepcopy(kai_config(True))
        config["session"]["solverPruning"] = pruning
        results.append(run(moved_elsewhere_cluster(), config))
    assert results[0] == results[1]
    assert results[0]["moved"] == {"ns/a-0": {"from": "n0", "to": "n1"}}
    assert results[0]["pipelined"] == {"ns/a-0": "n1", "ns/p-0": "n0"}


# -- the retaken-room shortcut's two bounds, on a session written by hand -------------------------


def test_the_room_for_alike_tasks_counts_resources_and_pods() -> None:
    """gpu_cluster: 2 GPUs free on n0 once its releasing task is gone, 3 on n1 (one shared)."""
    ssn = session(gpu_cluster(), KAI)
    one = ssn.jobs["ns/r"].tasks["ns/r-0"].resreq  # 1 cpu, 1Gi, 1 GPU
    both, n0 = np.array([True, True]), np.array([True, False])
    assert solver_module._room_for(ssn, one, both) == 5
    assert solver_module._room_for(ssn, one, n0) == 2
    assert solver_module._room_for(ssn, 2 * one, n0) == 1
    assert solver_module._room_for(ssn, 3 * one, n0) == 0
    assert solver_module._room_for(ssn, one, np.array([False, False])) == 0
    # Room for 4 one-GPU tasks, pods for one more (3 held, a releasing one among them).
    few_pods = snapshot(
        [node("n0", "8", "32Gi", **{"nvidia.com/gpu": 8, "pods": 4})],
        [
            job(
                "r",
                tasks=[
                    task(f"r-{k}", "r", res("1", "1Gi", nvidia_com__gpu=1), "n0") for k in range(3)
                ],
                min_member=1,
            )
        ],
    )
    ssn = session(few_pods, KAI)
    assert solver_module._room_for(ssn, one, np.array([True])) == 1


def test_the_pending_tasks_are_refused_once_alike_tasks_take_their_room() -> None:
    """p4 asks 4 GPUs; 5 are free in all: after one more GPU taken the bound still allows 4, after
    two it cannot -- unless the tasks may go where p4 may not."""
    ssn = session(gpu_cluster(), KAI)
    p4 = ssn.jobs["ns/p4"].tasks["ns/p4-0"]
    one = ssn.jobs["ns/r"].tasks["ns/r-0"].resreq
    both = np.array([True, True])
    filters = ScenarioFilters(ssn, [p4])
    assert [filters.refuses_after(one, k, both) for k in range(4)] == [False, False, True, True]
    everywhere = ssn.evaluator.static_mask(p4)
    filters.need = PendingNeed(filters.need.requests, [np.array([True, False]) & everywhere])  # n0
    assert not filters.refuses_after(one, 3, both)  # the tasks may go to n1
    assert filters.refuses_after(one, 1, np.array([True, False]))
