"""KAI proportion: fair shares divided top-down (deserved first, then the rest by over-quota weight
to queues still asking, whole GPUs first), queue limits and non-preemptible quota at allocation."""

from __future__ import annotations

import math

import yaml

from server.plugins.kai.proportion import INF, QueueShares, Share, divide
from server.simulate import simulate_text


def queue(
    name: str,
    deserved: float,
    request: float,
    weight: float = 1.0,
    priority: int = 0,
    limit: float = INF,
    creation: int = 0,
) -> QueueShares:
    q = QueueShares(name, None, priority, creation)
    q.by_resource["nvidia.com/gpu"] = Share(
        deserved=deserved, limit=limit, weight=weight, request=request
    )
    return q


def fair(queues: list[QueueShares]) -> dict[str, float]:
    return {q.name: q.by_resource["nvidia.com/gpu"].fair for q in queues}


def test_deserved_first_then_the_rest_by_weight() -> None:
    qs = [queue("a", 2, 10, weight=3), queue("b", 2, 10, weight=1)]
    divide(12, qs, "nvidia.com/gpu")
    assert fair(qs) == {"a": 8, "b": 4}  # 2 + 2, then 8 split 3:1


def test_a_queue_never_gets_more_than_it_asks_and_the_rest_goes_on() -> None:
    qs = [queue("a", 0, 1, weight=1), queue("b", 0, 10, weight=1)]
    divide(8, qs, "nvidia.com/gpu")
    assert fair(qs) == {"a": 1, "b": 7}


def test_weight_zero_takes_nothing_over_quota_and_higher_priority_goes_first() -> None:
    qs = [queue("a", 1, 10, weight=0), queue("b", 1, 10, weight=1)]
    divide(6, qs, "nvidia.com/gpu")
    assert fair(qs) == {"a": 1, "b": 5}
    qs = [queue("low", 0, 10, weight=5), queue("high", 0, 3, weight=1, priority=1)]
    divide(4, qs, "nvidia.com/gpu")
    assert fair(qs) == {"low": 1, "high": 3}


def test_leftover_fractions_go_one_unit_at_a_time_to_the_largest_remainder() -> None:
    qs = [
        queue("a", 0, 10, weight=1, creation=0),
        queue("b", 0, 10, weight=1, creation=1),
        queue("c", 0, 10, weight=1, creation=2),
    ]
    divide(4, qs, "nvidia.com/gpu")
    shares = fair(qs)
    assert sum(shares.values()) == 4
    assert sorted(shares.values()) == [1, 1, 2]
    assert all(math.isclose(v, round(v)) for v in shares.values())  # whole GPUs only


SCENARIO = """
config:
  profile: kai
  actions: [allocate]
  tiers: [{plugins: [{name: predicates}, {name: proportion}, {name: priority}, {name: elastic},
                     {name: nodeplacement}]}]
nodes: [{name: n, allocatable: {cpu: "64", memory: 256Gi, nvidia.com/gpu: 8}}]
queues:
- {name: dept}
- {name: q, parent: dept, guarantee: {nvidia.com/gpu: 2}, capability: {nvidia.com/gpu: 3}}
jobs: []
"""


def run(jobs: list[dict]) -> dict:
    doc = yaml.safe_load(SCENARIO)
    doc["jobs"] = jobs
    return simulate_text(yaml.safe_dump(doc))


def test_a_queue_limit_refuses_the_job_that_would_pass_it_and_says_why() -> None:
    out = run(
        [
            {
                "name": "a",
                "queue": "q",
                "tasks": [{"name": "a0", "request": {"cpu": "1", "nvidia.com/gpu": 2}}],
            },
            {
                "name": "b",
                "queue": "q",
                "tasks": [{"name": "b0", "request": {"cpu": "1", "nvidia.com/gpu": 2}}],
            },
        ]
    )
    assert out["tasks"]["default/a0"]["status"] == "Binding"
    assert out["tasks"]["default/b0"]["status"] == "Pending"
    message = out["jobs"]["default/b"]["conditions"][0]["message"]
    assert (
        "queue q would exceed its nvidia.com/gpu limit: 3 GPUs allowed, 2 GPUs allocated, 2 GPUs requested"
        in message
    )


def test_a_non_preemptible_job_stays_within_deserved_quota() -> None:
    out = run(
        [
            {
                "name": "build",
                "queue": "q",
                "priority": 100,
                "tasks": [{"name": "b0", "request": {"cpu": "1", "nvidia.com/gpu": 3}}],
            },
            {
                "name": "train",
                "queue": "q",
                "priority": 50,
                "tasks": [{"name": "t0", "request": {"cpu": "1", "nvidia.com/gpu": 3}}],
            },
        ]
    )
    assert (
        out["tasks"]["default/b0"]["status"] == "Pending"
    )  # 3 > deserved 2 for non-preemptible work
    assert "non-preemptible" in out["jobs"]["default/build"]["conditions"][0]["message"]
    assert (
        out["tasks"]["default/t0"]["status"] == "Binding"
    )  # preemptible: may go over quota, up to the limit
