"""Peer input conventions in scenarios: KAI's ``-1`` (unlimited) where KAI's queue docs allow it
(quota, limit: not the over-quota weight), and Kubernetes-form mappings (affinity, topology) whose
unknown keys are refused by name instead of silently dropped."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from server.simulate import simulate_text
from server.simulate.run import run_scenario
from server.simulate.scenario import ScenarioError, parse_scenario_text

ROOT = Path(__file__).resolve().parents[2]
# A KAI tier (the one of KAI's preempt tests).
KAI_CONFIG: dict[str, Any] = yaml.safe_load(
    (ROOT / "tests/scenarios/kai/preempt/preempt_elastic_test-08.yaml").read_text()
)["config"]
GPU = "nvidia.com/gpu"


def _kai_preempt(queue: dict[str, Any]) -> dict[str, Any]:
    """A non-preemptible job (KAI: may not preempt beyond its queue's quota) asking 2 GPUs of a
    node a preemptible job of its queue holds."""
    return {
        "config": copy.deepcopy(KAI_CONFIG),
        "nodes": [{"name": "n1", "allocatable": {"cpu": "8", "memory": "8Gi", GPU: 2}}],
        "queues": [{"name": "default"}, {"parent": "default", **queue}],
        "jobs": [
            {
                "name": "low",
                "queue": queue["name"],
                "priority": 50,
                "minMember": 1,
                "tasks": [
                    {"name": "low-0", "status": "Running", "node": "n1", "request": {GPU: 2}}
                ],
            },
            {
                "name": "serve",
                "queue": queue["name"],
                "priority": 125,
                "preemptible": False,
                "minMember": 1,
                "tasks": [{"name": "serve-0", "request": {GPU: 2}}],
            },
        ],
    }


@pytest.mark.parametrize(
    ("quota", "preempts"),
    [(None, False), (1, False), (2, True), (-1, True)],
    ids=["no quota", "quota 1", "quota 2", "quota -1"],
)
def test_kai_quota_minus_one_is_an_unlimited_quota(quota: int | None, preempts: bool) -> None:
    queue: dict[str, Any] = {"name": "q1", "capability": {GPU: -1}}  # limit -1: no limit
    if quota is not None:
        queue["guarantee"] = {GPU: quota}
    out = simulate_text(json.dumps(_kai_preempt(queue)))
    assert out["evictions"] == (["default/low-0"] if preempts else [])
    assert out["pipelined"] == ({"default/serve-0": "n1"} if preempts else {})


def test_an_unlimited_deserved_without_guarantee_is_kais_unlimited_quota() -> None:
    # The Kubernetes adapter writes KAI's quota -1 as deserved -1 (a guarantee cannot be
    # unlimited there); the KAI profile reads it as the unlimited quota KAI means.
    def evictions(deserved: dict[str, float]) -> list[str]:
        scenario = parse_scenario_text(json.dumps(_kai_preempt({"name": "q1"})))
        (q1,) = [q for q in scenario.snapshot.queues if q.name == "q1"]
        q1.deserved = deserved
        out: list[str] = run_scenario(scenario)["evictions"]
        return out

    assert evictions({}) == []
    assert evictions({GPU: math.inf}) == ["default/low-0"]


@pytest.mark.parametrize("weight", [-1, -0.5])
def test_a_negative_over_quota_weight_is_refused_saying_where_minus_one_belongs(
    weight: float,
) -> None:
    doc = _kai_preempt({"name": "q1", "weight": weight})
    with pytest.raises(ScenarioError) as err:
        simulate_text(json.dumps(doc))
    (problem,) = err.value.problems
    assert problem.startswith(f"queues[1].weight: {weight} must not be negative")
    assert "quota (guarantee) or a limit (capability)" in problem


def _with_affinity(affinity: dict[str, Any], **job: Any) -> str:
    task = {"name": "t", "request": {"cpu": "1"}, "affinity": affinity}
    return json.dumps(
        {
            "nodes": [{"name": "n1", "allocatable": {"cpu": "4"}, "labels": {"zone": "a"}}],
            "jobs": [{"name": "j", "tasks": [task], **job}],
        }
    )


TERMS = {
    "nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}
    ]
}


@pytest.mark.parametrize(
    ("affinity", "problem"),
    [
        (
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecutio": TERMS}},
            "jobs[0].tasks[0].affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecutio:"
            " unknown field (known: requiredDuringSchedulingIgnoredDuringExecution,"
            " preferredDuringSchedulingIgnoredDuringExecution)",
        ),
        (
            {"nodeAfinity": {}},
            "jobs[0].tasks[0].affinity.nodeAfinity: unknown field"
            " (known: nodeAffinity, podAffinity, podAntiAffinity)",
        ),
        (
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpression": []}]
                    }
                }
            },
            "jobs[0].tasks[0].affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpression: unknown field"
            " (known: matchExpressions, matchFields)",
        ),
    ],
    ids=["required typo", "nodeAffinity typo", "term typo"],
)
def test_an_unknown_affinity_key_is_refused_with_its_path(
    affinity: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ScenarioError) as err:
        simulate_text(_with_affinity(affinity))
    assert err.value.problems == [problem]


def test_the_spelled_right_affinity_still_applies() -> None:
    # The same rule without the typo: the node (zone a) does not match, the task stays pending.
    out = simulate_text(
        _with_affinity({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": TERMS}})
    )
    assert out["binds"] == {}


def test_an_unknown_topology_key_is_refused_too() -> None:
    doc = json.loads(_with_affinity({}))
    doc["jobs"][0]["topology"] = {"topology": "default", "requiredLevle": "zone"}
    with pytest.raises(ScenarioError) as err:
        simulate_text(json.dumps(doc))
    assert err.value.problems == [
        "jobs[0].topology.requiredLevle: unknown field (known: topology, requiredLevel, preferredLevel)"
    ]
