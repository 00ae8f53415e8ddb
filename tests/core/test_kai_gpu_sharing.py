"""KAI GPU sharing in the core: a shared GPU takes one whole GPU of its node whatever the number of
tasks on it; shares never pass one GPU; a new share takes a free GPU's device id as its name; a GPU
whose tasks are all releasing is offered as a whole GPU to pipelined work; allocate packs shares onto
the most used GPU (gpupack)."""

from __future__ import annotations

import yaml

from server.simulate import simulate_text

BASE = {
    "config": {
        "profile": "kai",
        "actions": ["allocate"],
        "tiers": [
            {
                "plugins": [
                    {"name": "predicates"},
                    {"name": "proportion"},
                    {"name": "gpusharingorder"},
                    {"name": "gpupack"},
                    {"name": "nodeavailability"},
                    {"name": "nodeplacement"},
                ]
            }
        ],
    },
    "nodes": [{"name": "n", "allocatable": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": 2}}],
    "queues": [{"name": "q"}],
}


def run(tasks: list[dict]) -> dict[str, dict]:
    doc = dict(BASE)
    doc["jobs"] = [{"name": t["name"], "queue": "q", "tasks": [t]} for t in tasks]
    return simulate_text(yaml.safe_dump(doc))["tasks"]


def frac(name: str, f: float, **extra: object) -> dict:
    return {"name": name, "gpu_fraction": f, "request": {"cpu": "1"}, **extra}


def test_shares_pack_onto_the_most_used_gpu_and_never_pass_one_gpu() -> None:
    out = run([frac("a", 0.5), frac("b", 0.25), frac("c", 0.5), frac("d", 0.25)])
    groups = {k.split("/")[1]: (v["status"], tuple(v["gpu_groups"])) for k, v in out.items()}
    assert groups["a"] == ("Binding", ("0",))  # the first share takes GPU "0"
    assert groups["b"] == ("Binding", ("0",))  # packed onto the used GPU
    assert groups["c"] == ("Binding", ("1",))  # 0.75 + 0.5 > 1: the next GPU
    assert groups["d"] == ("Binding", ("0",))  # the most used GPU it fits on


def test_a_whole_gpu_task_cannot_take_a_shared_gpu() -> None:
    out = run([frac("a", 0.1), {"name": "w", "request": {"cpu": "1", "nvidia.com/gpu": 2}}])
    assert out["default/a"]["status"] == "Binding"
    assert out["default/w"]["status"] == "Pending"  # one GPU is shared: one whole GPU left


def test_running_shares_count_and_a_fully_releasing_gpu_is_a_whole_gpu_for_pipelined_work() -> None:
    out = run(
        [
            frac("r", 0.6, status="Running", node="n", gpu_groups=["g1"]),
            frac("x", 0.5, status="Releasing", node="n", gpu_groups=["g2"]),
            {"name": "w", "request": {"cpu": "1", "nvidia.com/gpu": 1}},
            frac("p", 0.5),
        ]
    )
    assert out["default/w"]["status"] == "Pipelined"  # waits for g2's GPU, being released
    assert out["default/p"]["status"] == "Pending"  # g1 has 0.4 left, g2 is no longer shared
