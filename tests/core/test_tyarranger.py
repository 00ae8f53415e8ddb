"""tyarranger: TY-Arranger's job queue policies, pod policies, TYJob validation, schedule states and
stages; each pod policy with a case where a wrong formula would pick another node."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from server.simulate.run import simulate_text
from server.simulate.scenario import ScenarioError

CONFIG: dict[str, Any] = {
    "actions": "enqueue, allocate",
    "tiers": [
        {"plugins": [{"name": "gang"}, {"name": "tyarranger"}]},
        # nodeorder spreads (leastrequested): the pod policy must win over it.
        {"plugins": [{"name": "predicates"}, {"name": "nodeorder"}]},
    ],
}


def node(name: str, cpu: str = "8", memory: str = "32Gi", gpus: int = 0) -> dict[str, Any]:
    alloc: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus:
        alloc["nvidia.com/gpu"] = gpus
    return {"name": name, "allocatable": alloc}


def load(name: str, on: str, status: str = "Running", **request: Any) -> dict[str, Any]:
    """A plain job holding ``request`` on node ``on``."""
    req = {k.replace("_", "/").replace("nvidia/com", "nvidia.com"): v for k, v in request.items()}
    return {
        "name": name,
        "tasks": [{"name": f"{name}-0", "node": on, "status": status, "request": req}],
    }


def tyjob(
    name: str,
    policy: str = "Gang",
    queue_policy: str = "Priority",
    *,
    leader: dict[str, Any] | None = None,
    workers: list[dict[str, Any]] | None = None,
    min_workers: int = 1,
    **fields: Any,
) -> dict[str, Any]:
    tasks = [{"name": f"{name}-leader", "role": "leader", "request": leader or {"cpu": "1"}}]
    tasks += [
        {"name": f"{name}-w{i}", "role": "actor", "request": r} for i, r in enumerate(workers or [])
    ]
    for t in tasks:
        t.update(t["request"].pop("x", {}))
    return {
        "name": name,
        "minWorkersNum": min_workers,
        "schedulerPolicy": {"jobQueuePolicy": queue_policy, "basicPolicy": policy},
        "tasks": tasks,
        **fields,
    }


def run(
    nodes: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    config: dict[str, Any] | None = None,
    cycles: int = 1,
) -> dict[str, Any]:
    cfg = {**(config or CONFIG), "cycles": cycles}
    return simulate_text(yaml.safe_dump({"config": cfg, "nodes": nodes, "jobs": jobs}))


def placed(out: dict[str, Any], name: str) -> str | None:
    return out["tasks"][f"default/{name}"]["node"]


# -- pod policies ------------------------------------------------------------------------------
def test_binpack_fills_the_fuller_node() -> None:
    out = run(
        [node("n1"), node("n2")],
        [load("a", "n1", cpu="6"), load("b", "n2", cpu="2"), tyjob("j", "BinPack", min_workers=0)],
    )
    assert placed(out, "j-leader") == "n1"  # a spreading formula (or nodeorder alone) picks n2


def test_leader_first_sends_the_leader_low_with_gpu_weight_raised_and_workers_high() -> None:
    # n1: CPU busy, GPUs idle; n2: CPU idle, half its GPUs busy. With the GPU weight raised the
    # Leader's least-loaded node is n1 (equal weights would say n2); the worker then goes to the
    # busiest node by CPU, n1 (a worker sent low would go to n2).
    nodes = [node("n1", gpus=2), node("n2", gpus=2)]
    jobs = [
        load("a", "n1", cpu="6"),
        load("b", "n2", cpu="1", nvidia_com_gpu=1),
        tyjob("j", "LeaderFirst", leader={"cpu": "1", "nvidia.com/gpu": 1}, workers=[{"cpu": "1"}]),
    ]
    out = run(nodes, jobs)
    assert placed(out, "j-leader") == "n1"
    assert placed(out, "j-w0") == "n1"
    # The same with the raised weight set to 1 (equal weights): the Leader goes to n2.
    cfg = {
        **CONFIG,
        "tiers": [
            {
                "plugins": [
                    {"name": "gang"},
                    {"name": "tyarranger", "arguments": {"tyarranger.leaderFirst.raisedWeight": 1}},
                ]
            },
            CONFIG["tiers"][1],
        ],
    }
    assert placed(run(nodes, jobs, cfg), "j-leader") == "n2"


def test_min_fragment_prefers_balanced_cpu_and_memory_use() -> None:
    # After placing 2 CPU / 2 GiB: n1 would be 37.5 % CPU, 100 % memory (fragmented); n2 75 % / 50 %.
    # Binpack's mean prefers n1 (68.75 against 62.5); MinFragment picks n2 (75 against 37.5).
    nodes = [node("n1", memory="8Gi"), node("n2", memory="8Gi")]
    jobs = [
        load("a", "n1", cpu="1", memory="6Gi"),
        load("b", "n2", cpu="4", memory="2Gi"),
        tyjob("j", "MinFragment", leader={"cpu": "2", "memory": "2Gi"}, min_workers=0),
    ]
    assert placed(run(nodes, jobs), "j-leader") == "n2"
    jobs[-1]["schedulerPolicy"]["basicPolicy"] = "BinPack"
    assert placed(run(nodes, jobs), "j-leader") == "n1"


def test_job_affinity_packs_and_anti_affinity_spreads_a_jobs_pods() -> None:
    nodes = [node("n1"), node("n2"), node("n3")]
    workers = [{"cpu": "1"}, {"cpu": "1"}]
    out = run(nodes, [tyjob("j", "JobAffinity", workers=workers, min_workers=2)])
    assert {placed(out, n) for n in ("j-leader", "j-w0", "j-w1")} == {"n1"}
    out = run(nodes, [tyjob("j", "JobAntiAffinity", workers=workers, min_workers=2)])
    assert {placed(out, n) for n in ("j-leader", "j-w0", "j-w1")} == {"n1", "n2", "n3"}
    # Anti-affinity counts only the job's own pods: a node busy with another job is no worse.
    out = run(
        nodes[:2], [load("x", "n1", cpu="1"), tyjob("j", "JobAntiAffinity", workers=[{"cpu": "1"}])]
    )
    assert {placed(out, "j-leader"), placed(out, "j-w0")} == {"n1", "n2"}


# -- job queue policies ------------------------------------------------------------------------
def test_priority_policy_orders_by_ty_priority() -> None:
    # Room for one job; the later, higher-priority one goes first (no priority plugin configured).
    jobs = [
        tyjob("low", min_workers=0, priority=3, leader={"cpu": "8"}),
        tyjob("high", min_workers=0, priority=9, leader={"cpu": "8"}),
    ]
    out = run([node("n1")], jobs)
    assert placed(out, "high-leader") == "n1"
    assert placed(out, "low-leader") is None


def test_drf_policy_orders_by_dominant_share() -> None:
    # "first" already holds 4 CPUs; "second" holds nothing: second goes first for the last 2 CPUs.
    first = tyjob(
        "first",
        "Gang",
        "DRF",
        min_workers=0,
        leader={"cpu": "2"},
        workers=[{"cpu": "4", "x": {"status": "Running", "node": "n1"}}],
    )
    second = tyjob("second", "Gang", "DRF", min_workers=0, leader={"cpu": "2"})
    out = run([node("n1", cpu="8"), node("n2", cpu="2")], [first, second])
    assert placed(out, "second-leader") is not None
    assert placed(out, "first-leader") is not None  # n1 still has room for it
    out = run([node("n1", cpu="6")], [first, second])
    assert placed(out, "second-leader") == "n1"
    assert placed(out, "first-leader") is None


def test_ty_priorities_default_to_five_and_stay_within_one_to_ten() -> None:
    out = run(
        [node("n1")],
        [
            tyjob("five", min_workers=0, leader={"cpu": "8"}),
            tyjob("six", min_workers=0, priority=6, leader={"cpu": "8"}),
        ],
    )
    assert placed(out, "six-leader") == "n1"
    with pytest.raises(ScenarioError, match=r"jobs\[0\]\.priority: 11 is not a TYJob priority"):
        run([node("n1")], [tyjob("j", priority=11)])
    with pytest.raises(
        ScenarioError, match=r"jobs\[0\]\.schedulerPolicy\.basicPolicy: 'Binpack' is not one of"
    ):
        run([node("n1")], [tyjob("j", "Binpack")])


# -- gang, elastic workers, states -------------------------------------------------------------
def test_the_gang_is_the_leader_and_min_workers_and_more_workers_come_later() -> None:
    nodes = [node("n1", cpu="4")]
    jobs = [
        load("old", "n1", "Releasing", cpu="2"),
        tyjob("j", workers=[{"cpu": "1"}, {"cpu": "1"}, {"cpu": "1"}], min_workers=1),
    ]
    out = run(nodes, jobs)
    assert sorted(k for k in out["binds"]) == ["default/j-leader", "default/j-w0"]
    assert out["jobs"]["default/j"]["scheduleState"] == "ScheduledPartly"
    assert out["jobs"]["default/j"]["stage"] == "Starting"
    out = run(nodes, jobs, cycles=2)  # the releasing pod is gone: the other workers follow
    assert out["jobs"]["default/j"]["scheduleState"] == "ScheduledSucceed"
    assert (
        sum(
            1
            for uid, t in out["tasks"].items()
            if uid.startswith("default/j-") and t["node"] == "n1"
        )
        == 4
    )
    # Not even the gang fits (the Leader and one worker): nothing is bound, the job waits.
    out = run([node("n1", cpu="1")], [tyjob("k", workers=[{"cpu": "1"}])])
    assert out["binds"] == {}
    assert out["jobs"]["default/k"]["scheduleState"] == "Unscheduled"
    assert out["jobs"]["default/k"]["stage"] == "Pending"


def test_jobs_that_can_never_be_scheduled_fail() -> None:
    out = run(
        [node("n1")],
        [
            tyjob("big", leader={"cpu": "64"}, workers=[{"cpu": "1"}]),
            tyjob("few", workers=[{"cpu": "1"}], min_workers=2),
            {**tyjob("noleader", workers=[{"cpu": "1"}]), "leaderRole": "learner"},
        ],
    )
    for name in ("big", "few", "noleader"):
        assert out["jobs"][f"default/{name}"]["scheduleState"] == "ScheduledFailed", name
        assert out["jobs"][f"default/{name}"]["stage"] == "Failed"
    assert (
        "minWorkersNum is 2 but the job has 1 workers"
        in str(out["jobs"]["default/few"]["conditions"])
        or out["jobs"]["default/few"]["conditions"][0]["reason"] == "NotEnoughTasks"
    )


@pytest.mark.parametrize(
    ("leader", "worker", "stage"),
    [
        ("Running", "Running", "Running"),
        ("Running", "Binding", "Starting"),
        ("Succeeded", "Running", "Succeeded"),
        ("Failed", "Running", "Rescheduling"),
    ],
)
def test_stages_follow_the_leader_and_workers(leader: str, worker: str, stage: str) -> None:
    job = tyjob("j", workers=[{"cpu": "1"}])
    job["tasks"][0].update(status=leader, node=None if leader in ("Succeeded", "Failed") else "n1")
    job["tasks"][1].update(status=worker, node="n1")
    out = run([node("n1")], [job])
    assert out["jobs"]["default/j"]["stage"] == stage


def test_jobs_without_a_scheduler_policy_are_left_to_the_other_plugins() -> None:
    plain = {"name": "p", "tasks": [{"name": "p-0", "request": {"cpu": "1"}}]}
    out = run([node("n1"), node("n2")], [load("a", "n1", cpu="6"), plain])
    assert placed(out, "p-0") == "n2"  # nodeorder's spreading, untouched
    assert "scheduleState" not in out["jobs"]["default/p"]
