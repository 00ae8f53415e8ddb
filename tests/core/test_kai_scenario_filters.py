"""KAI's accumulated scenario filters (server/actions/kai/scenario_filters.py) and the victim
search's budgets (``queueDepthPerAction``, ``simulationBudgetPerAction``).

* each filter on its own: what it accepts and refuses, on rooms written by hand;
* the accumulated room: a victim counts once, a releasing one not at all, a shared GPU once;
* consolidation's whole-search bound (``room_for_moves``);
* the filters never refuse a scenario that would have succeeded: random contended clusters run
  through ``muster simulate`` with ``scenarioFilters`` on and off give the same output, and a
  cluster written so that they refuse scenarios gives the same placements with fewer simulations;
* ``pop_until`` pops the jobs ``pop`` would, in the same order;
* the budgets.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest
import yaml
from core_helpers import job, node, queue, res, session, snapshot, task
from hypothesis import given, note, settings
from hypothesis import strategies as st
from test_properties import KAI_DEFAULT, PROFILE

from muster.devices import UNIT
from muster.quantity import MIN_RESOURCE
from server.actions.kai import solver as solver_module
from server.actions.kai.job_queue import Filters, JobsByQueue, per_action, queue_depth
from server.actions.kai.scenario_filters import (
    AccumulatedRoom,
    IdleResourcesFilter,
    NodeAffinityFilter,
    PendingNeed,
    ScenarioFilters,
    room_for_moves,
)
from server.config import ConfigError, load_config
from server.model import TaskStatus
from server.simulate import simulate_text

EVERYWHERE = np.ones(3, dtype=bool)


def need(*requests: list[float], masks: list[np.ndarray] | None = None) -> PendingNeed:
    return PendingNeed(np.array(requests, dtype=float), masks or [EVERYWHERE] * len(requests))


def room(*rows: list[float]) -> np.ndarray:
    return np.array(rows, dtype=float)


# -- node-affinity --------------------------------------------------------------------------------


def test_node_affinity_wants_one_node_with_room_for_the_whole_request() -> None:
    f = NodeAffinityFilter()
    # 2 cpu and 1 GPU: no node has both, though the cluster has both.
    nodes = room([4, 0], [1, 8], [0, 0])
    assert not f.accepts(need([2, 1]), nodes)
    assert f.accepts(need([1, 1]), nodes)
    assert f.accepts(need([2, 0], [1, 8]), nodes)


def test_node_affinity_looks_only_at_the_nodes_a_task_may_use() -> None:
    f = NodeAffinityFilter()
    nodes = room([4, 4], [1, 1], [1, 1])
    zone_b = np.array([False, True, True])
    assert not f.accepts(need([2, 2], masks=[zone_b]), nodes)
    assert f.accepts(need([1, 1], masks=[zone_b]), nodes)
    assert f.accepts(need([2, 2], masks=[EVERYWHERE]), nodes)


def test_node_affinity_allows_the_epsilon_a_fit_allows() -> None:
    assert NodeAffinityFilter().accepts(need([1.05]), room([1.0], [0], [0]))
    assert not NodeAffinityFilter().accepts(need([1.2]), room([1.0], [0], [0]))


# -- idle resources ----------------------------------------------------------------------------


def test_idle_resources_accepts_what_kai_greedy_match_would_refuse() -> None:
    # 3, 2 and 2 GPUs on nodes with 4 and 3 free: 3 + 2 -> no; 3 on the 3, 2 + 2 on the 4 fits.
    # KAI's greedy match puts 3 on the 4 first and refuses; a bound must not.
    f = IdleResourcesFilter()
    assert f.accepts(need([3], [2], [2]), room([4], [3], [0]))


def test_idle_resources_refuses_when_the_large_requests_do_not_fit_the_large_nodes() -> None:
    f = IdleResourcesFilter()
    assert not f.accepts(need([4], [4]), room([4], [3], [3]))  # 8 asked, one node of 4 or more
    assert not f.accepts(need([2], [2], [2], [2]), room([4], [3], [0]))  # 8 asked, 7 free
    assert f.accepts(need([2], [2], [2]), room([4], [3], [0]))


def test_idle_resources_counts_only_nodes_the_tasks_may_use() -> None:
    f = IdleResourcesFilter()
    only_first = np.array([True, False, False])
    assert not f.accepts(need([2], [2], masks=[only_first, only_first]), room([3], [4], [4]))
    assert f.accepts(need([2], [2], masks=[only_first, EVERYWHERE]), room([3], [4], [4]))


def test_idle_resources_per_resource() -> None:
    f = IdleResourcesFilter()
    nodes = room([8, 1], [8, 1], [0, 0])
    assert not f.accepts(need([1, 1], [1, 1], [1, 1]), nodes)  # 3 GPUs, 2 free
    assert f.accepts(need([1, 1], [1, 1], [1, 0]), nodes)


def idle_resources_bound(need: PendingNeed, room: np.ndarray) -> bool:
    """The idle-resources bound computed from the tasks at every call: what ``PendingNeed``'s
    sizes, found once, must give."""
    for d in need.asked:
        asks, column = need.requests[:, d], room[:, d]
        for t in sorted({float(a) for a in asks if a > MIN_RESOURCE}, reverse=True):
            chosen = [k for k in range(len(need)) if asks[k] >= t]
            allowed = np.any([need.masks[k] for k in chosen], axis=0)
            holders = allowed & (column >= t - MIN_RESOURCE)
            if asks[chosen].sum() > column[holders].sum() + MIN_RESOURCE * len(chosen):
                return False
    return True


def test_idle_resources_sizes_found_once_give_the_bound() -> None:
    rng = np.random.default_rng(7)
    f = IdleResourcesFilter()
    refused = 0
    for _ in range(300):
        n_tasks, n_nodes = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        requests = rng.integers(0, 4, size=(n_tasks, 2)).astype(float)
        shared = [rng.random(n_nodes) < 0.7 for _ in range(2)]
        masks = [shared[int(rng.integers(0, 2))] for _ in range(n_tasks)]
        nodes = rng.integers(0, 6, size=(n_nodes, 2)).astype(float)
        pending = PendingNeed(requests, masks)
        expected = idle_resources_bound(pending, nodes)
        assert f.accepts(pending, nodes) == expected
        refused += not expected
    assert 30 < refused < 270


# -- the room: victims counted once ----------------------------------------------------------------

KAI = copy.deepcopy(KAI_DEFAULT)


def gpu_cluster() -> Any:
    """Two 8-cpu / 4-GPU nodes; on n0 a job of two running tasks (1 GPU each) and a releasing
    one; on n1 two shares of one shared GPU; pending tasks of 4, 6 and 7 GPUs."""
    gpus: dict[str, Any] = {"nvidia.com/gpu": 4, "pods": 110}
    nodes = [node(n, "8", "32Gi", **gpus) for n in ("n0", "n1")]
    running = job(
        "r",
        tasks=[
            task("r-0", "r", res("1", "1Gi", nvidia_com__gpu=1), "n0"),
            task("r-1", "r", res("1", "1Gi", nvidia_com__gpu=1), "n0"),
            task("r-2", "r", res("1", "1Gi", nvidia_com__gpu=1), "n0", status=TaskStatus.RELEASING),
        ],
        min_member=1,
    )
    shares = job(
        "s",
        tasks=[
            task("s-0", "s", res("1", "1Gi"), "n1", gpu_fraction=0.5, gpu_groups=["g"]),
            task("s-1", "s", res("1", "1Gi"), "n1", gpu_fraction=0.25, gpu_groups=["g"]),
        ],
        min_member=1,
    )
    pending = [
        job(f"p{n}", tasks=[task(f"p{n}-0", f"p{n}", res("1", "1Gi", nvidia_com__gpu=n))])
        for n in (4, 6, 7)
    ]
    return snapshot(nodes, [running, shares, *pending])


def test_the_room_counts_each_victim_once_and_a_releasing_one_not_again() -> None:
    ssn = session(gpu_cluster(), KAI)
    gpu = ssn.nodes.gpu_dim
    assert gpu is not None
    r = ssn.jobs["ns/r"].tasks
    acc = AccumulatedRoom(ssn.nodes)
    start = acc.room[:, gpu].copy()
    acc.add([r["ns/r-0"], r["ns/r-2"]])
    acc.add([r["ns/r-0"]])  # again: no more room
    assert (acc.room[:, gpu] - start).tolist() == [UNIT, 0]
    # ``plus`` leaves the room as it is.
    assert (acc.plus([r["ns/r-1"]])[:, gpu] - start).tolist() == [2 * UNIT, 0]
    assert (acc.room[:, gpu] - start).tolist() == [UNIT, 0]


def test_a_shared_gpu_gives_back_one_whole_gpu_however_many_shares_leave_it() -> None:
    ssn = session(gpu_cluster(), KAI)
    gpu = ssn.nodes.gpu_dim
    assert gpu is not None
    s = ssn.jobs["ns/s"].tasks
    acc = AccumulatedRoom(ssn.nodes)
    start = acc.room[:, gpu].copy()
    acc.add(s.values())
    assert (acc.room[:, gpu] - start).tolist() == [0, UNIT]


def test_scenario_filters_accumulate_the_victims_of_a_step() -> None:
    ssn = session(gpu_cluster(), KAI)
    r = ssn.jobs["ns/r"].tasks
    # 4 GPUs: n0 has 1 free and 1 being released, n1 3 free (one GPU is shared).
    filters = ScenarioFilters(ssn, list(ssn.jobs["ns/p4"].tasks.values()))
    assert not filters.accepts()
    assert not filters.accepts_with([r["ns/r-0"]])
    assert filters.accepts_with([r["ns/r-0"], r["ns/r-1"]])
    filters.add_victims([r["ns/r-0"]])
    assert not filters.accepts()
    filters.add_victims([r["ns/r-1"]])
    assert filters.accepts()
    assert filters.rejected == {"node-affinity": 3}


def test_room_for_moves_is_the_cluster_room_in_all() -> None:
    ssn = session(gpu_cluster(), KAI)
    # 8 GPUs: 3 held whole (one of them being released), one shared: 5 free once the releasing
    # task is gone, and the shared one if its shares all move away.
    p4, p6, p7 = (ssn.jobs[f"ns/p{n}"].tasks[f"ns/p{n}-0"] for n in (4, 6, 7))
    assert room_for_moves(ssn, [p4])
    assert room_for_moves(ssn, [p6])
    assert not room_for_moves(ssn, [p7])
    assert not room_for_moves(ssn, [p4, p4])


# -- the filters never refuse what would have succeeded ---------------------------------------------


def kai_config(filters: bool, **session_params: Any) -> dict[str, Any]:
    config: dict[str, Any] = copy.deepcopy(KAI_DEFAULT)
    config["session"] = {**config["session"], "scenarioFilters": filters, **session_params}
    return config


@st.composite
def contended(draw: st.DrawFn) -> dict[str, Any]:
    """A small contended KAI cluster: 2-5 nodes (some with GPUs, zones a / b), 2-3 queues with
    GPU quotas (under a department now and then), running jobs of 1-3 tasks (whole GPUs, shares of
    a GPU, cpu only; priorities 0-150) and pending ones (some asking zone a, some shares)."""
    nodes: list[dict[str, Any]] = []
    cpu_left: dict[str, int] = {}
    gpu_ids: dict[str, list[int]] = {}
    for i in range(draw(st.integers(2, 5))):
        gpus = draw(st.sampled_from([0, 2, 4, 8]))
        cpu = draw(st.sampled_from([4, 8]))
        alloc: dict[str, Any] = {"cpu": str(cpu), "memory": "32Gi", "pods": 110}
        if gpus:
            alloc["nvidia.com/gpu"] = gpus
        zone = draw(st.sampled_from(["a", "b"]))
        nodes.append({"name": f"n{i}", "allocatable": alloc, "labels": {"zone": zone}})
        cpu_left[f"n{i}"], gpu_ids[f"n{i}"] = cpu, list(range(gpus))
    department = draw(st.booleans())
    queues: list[dict[str, Any]] = [{"name": "dept"}] if department else []
    names = [f"q{i}" for i in range(draw(st.integers(2, 3)))]
    for q in names:
        spec: dict[str, Any] = {
            "name": q,
            "guarantee": {"nvidia.com/gpu": draw(st.integers(0, 4))},
            "weight": draw(st.integers(1, 3)),
        }
        if department:
            spec["parent"] = "dept"
        queues.append(spec)
    jobs = []
    for j in range(draw(st.integers(3, 9))):
        running = j < 4 and draw(st.integers(0, 3)) > 0
        size = draw(st.integers(1, 3))
        kind = draw(st.sampled_from(["gpu", "gpu", "share", "cpu"]))
        tasks = []
        placed = running
        for k in range(size):
            cpu = draw(st.integers(1, 3))
            t: dict[str, Any] = {"name": f"j{j}-{k}", "request": {"cpu": str(cpu), "memory": "1Gi"}}
            gpus = draw(st.integers(1, 2)) if kind == "gpu" else 0
            if gpus:
                t["request"]["nvidia.com/gpu"] = gpus
            if kind == "share":
                t["gpu_fraction"] = draw(st.sampled_from([0.25, 0.5]))
            if running and placed:
                where = draw(st.sampled_from(sorted(cpu_left)))
                ids = gpu_ids[where]
                need = gpus or (1 if kind == "share" else 0)
                if cpu_left[where] >= cpu and len(ids) >= need:
                    cpu_left[where] -= cpu
                    taken, gpu_ids[where] = ids[:need], ids[need:]
                    t.update(status="Running", node=where)
                    if kind == "share":
                        t["gpu_groups"] = [str(taken[0])]
                    elif gpus:
                        t["devices"] = [str(d) for d in taken]
                else:
                    placed = False
            elif not running and draw(st.integers(0, 3)) == 0:
                t["nodeSelector"] = {"zone": "a"}
            tasks.append(t)
        if running and not placed:  # no room for all of it: it waits, whole
            for t in tasks:
                for key in ("status", "node", "gpu_groups", "devices"):
                    t.pop(key, None)
            running = False
        jobs.append(
            {
                "name": f"j{j}",
                "namespace": "ns",
                "queue": draw(st.sampled_from(names)),
                "priority": draw(st.sampled_from([0, 50, 150]))
                if running
                else draw(st.sampled_from([0, 50, 100])),
                "minMember": draw(st.integers(1, size)),
                "phase": "Running" if running else "Inqueue",
                "tasks": tasks,
            }
        )
    return {"nodes": nodes, "queues": queues, "jobs": jobs}


def run(doc: dict[str, Any], config: dict[str, Any], cycles: int = 1) -> dict[str, Any]:
    out: dict[str, Any] = simulate_text(json.dumps({**doc, "config": {**config, "cycles": cycles}}))
    return out


@settings(PROFILE, max_examples=120)
@given(doc=contended(), cycles=st.integers(1, 2))
def test_the_filters_never_refuse_a_scenario_that_would_have_succeeded(
    doc: dict[str, Any], cycles: int
) -> None:
    note(json.dumps(doc))
    assert run(doc, kai_config(True), cycles) == run(doc, kai_config(False), cycles)


def reclaim_cluster() -> dict[str, Any]:
    """Four 4-GPU nodes held by queue q1's jobs (one GPU each), q0 below its quota with a pending
    job of 2 GPUs on one node that only zone a (n0) may hold, and one of 5 GPUs."""
    nodes = [
        {
            "name": f"n{i}",
            "allocatable": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": 4, "pods": 110},
            "labels": {"zone": "a" if i == 0 else "b"},
        }
        for i in range(4)
    ]
    jobs: list[dict[str, Any]] = []
    for i in range(16):
        where = f"n{i % 4}"
        jobs.append(
            {
                "name": f"r{i}",
                "namespace": "ns",
                "queue": "q1",
                "priority": 0,
                "phase": "Running",
                "tasks": [
                    {
                        "name": f"r{i}-0",
                        "status": "Running",
                        "node": where,
                        "devices": [str(i // 4)],
                        "request": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": 1},
                    }
                ],
            }
        )
    pending = [
        ("p0", 2, {"zone": "a"}),
        ("p1", 5, {}),
    ]
    for name, gpus, selector in pending:
        jobs.append(
            {
                "name": name,
                "namespace": "ns",
                "queue": "q0",
                "priority": 50,
                "phase": "Inqueue",
                "tasks": [
                    {
                        "name": f"{name}-0",
                        "request": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": gpus},
                        "nodeSelector": selector,
                    }
                ],
            }
        )
    queues = [
        {"name": "q0", "guarantee": {"nvidia.com/gpu": 8}},
        {"name": "q1", "guarantee": {"nvidia.com/gpu": 8}},
    ]
    return {"nodes": nodes, "queues": queues, "jobs": jobs}


def test_the_filters_refuse_scenarios_and_keep_the_placements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    simulated = {True: 0, False: 0}
    flag = {"on": True}
    real = solver_module.JobSolver._simulate

    def counting(self: solver_module.JobSolver, *args: Any) -> Any:
        simulated[flag["on"]] += 1
        return real(self, *args)

    monkeypatch.setattr(solver_module.JobSolver, "_simulate", counting)
    doc = reclaim_cluster()
    on = run(doc, kai_config(True))
    flag["on"] = False
    off = run(doc, kai_config(False))
    assert on == off
    assert on["pipelined"] == {"ns/p0-0": "n0"}  # the 2-GPU job reclaims on n0, the 5-GPU one no
    assert 0 < simulated[True] < simulated[False]


# -- pop_until -------------------------------------------------------------------------------------


def test_pop_until_pops_what_pop_would() -> None:
    queues = [queue("dept"), queue("a", parent="dept"), queue("b", parent="dept"), queue("c")]
    jobs = [
        job(f"j{i}", cpu=str(1 + i % 3), queue="abc"[i % 3], priority=i % 2, index=i)
        for i in range(12)
    ]
    ssn = session(snapshot([node("n0", "64", "64Gi")], jobs, queues), KAI)
    full = JobsByQueue(ssn).fill(ssn.jobs.values(), Filters())
    order = []
    q = full.copy()
    while not q.empty():
        order.append(q.pop().uid)
    wanted = {order[3], order[7], order[11]}
    q = full.copy()
    got = []
    while (j := q.pop_until(wanted)) is not None:
        got.append(j.uid)
    assert got == [order[3], order[7], order[11]]
    assert full.copy().pop_until(set()) is None


def test_a_victim_queue_pops_the_same_with_remembered_answers() -> None:
    """``pop`` and ``pop_unchanged`` share one walk (``_pop``): with nothing changed between pops,
    remembering the queue comparisons gives the same victims in the same order."""
    queues = [queue("dept"), queue("a", parent="dept"), queue("b", parent="dept"), queue("c")]
    jobs = [
        job(
            f"j{i}",
            cpu=str(1 + i % 3),
            queue="abc"[i % 3],
            priority=i % 2,
            index=i,
            status=TaskStatus.RUNNING,
            nodes="n0",
        )
        for i in range(12)
    ]
    ssn = session(snapshot([node("n0", "64", "64Gi")], jobs, queues), KAI)
    full = JobsByQueue(ssn, victims=True).fill(ssn.jobs.values(), Filters(non_active=True))
    assert len(full) == 12
    plain, remembered = full.copy(), full.copy()
    popped = [plain.pop().uid for _ in range(12)]
    assert [remembered.pop_unchanged().uid for _ in range(12)] == popped
    assert remembered._answers  # the comparisons were remembered
    assert len(set(popped)) == 12
    assert plain.empty()


# -- budgets ---------------------------------------------------------------------------------------


def test_per_action_parameters_are_checked() -> None:
    for bad in ([1], {"reclaim": "2"}, {"reclaim": True}, 3):
        with pytest.raises(ConfigError, match="mapping of action names to integers"):
            load_config(
                yaml.safe_dump({**kai_config(True), "session": {"queueDepthPerAction": bad}})
            )
    cfg = load_config(
        yaml.safe_dump(
            {**kai_config(True), "session": {"simulationBudgetPerAction": {"reclaim": 5}}}
        )
    )
    assert cfg.session["simulationBudgetPerAction"] == {"reclaim": 5}


def test_per_action_reads_one_action_and_a_negative_value_is_no_bound() -> None:
    config = kai_config(True, queueDepthPerAction={"allocate": 2, "reclaim": -1})
    ssn = session(snapshot([node("n0")], []), config)
    assert queue_depth(ssn, "allocate") == 2
    assert queue_depth(ssn, "reclaim") is None
    assert queue_depth(ssn, "preempt") is None
    assert per_action(ssn, "simulationBudgetPerAction", "reclaim") is None


def test_queue_depth_keeps_the_first_jobs_of_each_queue() -> None:
    jobs = [job(f"j{i}", queue="ab"[i % 2], priority=i, index=i) for i in range(6)]
    ssn = session(snapshot([node("n0", "64", "64Gi")], jobs, [queue("a"), queue("b")]), KAI)
    q = JobsByQueue(ssn, depth=2).fill(ssn.jobs.values(), Filters())
    assert {leaf: [j.uid for j in js] for leaf, js in q.jobs.items()} == {
        "a": ["ns/j4", "ns/j2"],
        "b": ["ns/j5", "ns/j3"],
    }


def test_queue_depth_bounds_what_kai_allocate_tries() -> None:
    doc = {
        "nodes": [{"name": "n0", "allocatable": {"cpu": "8", "memory": "8Gi", "pods": 110}}],
        "queues": [{"name": "q"}],
        "jobs": [
            {
                "name": f"j{i}",
                "namespace": "ns",
                "queue": "q",
                "priority": 10 - i,
                "phase": "Inqueue",
                "tasks": [{"name": f"j{i}-0", "request": {"cpu": "1", "memory": "1Gi"}}],
            }
            for i in range(4)
        ],
    }
    assert len(run(doc, kai_config(True))["binds"]) == 4
    out = run(doc, kai_config(True, queueDepthPerAction={"allocate": 2}))
    assert sorted(out["binds"]) == ["ns/j0-0", "ns/j1-0"]


def test_a_simulation_budget_bounds_each_job_search() -> None:
    doc = reclaim_cluster()
    assert run(doc, kai_config(True))["pipelined"] == {"ns/p0-0": "n0"}
    spent = run(doc, kai_config(True, simulationBudgetPerAction={"reclaim": 0}))
    assert spent["pipelined"] == {}
    assert spent["evictions"] == []
    assert run(doc, kai_config(True, simulationBudgetPerAction={"reclaim": 50}))["pipelined"] == {
        "ns/p0-0": "n0"
    }
