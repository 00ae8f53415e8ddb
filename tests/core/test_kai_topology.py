"""KAI topology plugin: a job with a required level lands inside one domain of that level, the
fullest domain that can hold it first; a preferred level is tried before the required one; a
running job stays in the domain of its running tasks; an unknown topology leaves the job pending."""

from __future__ import annotations

from server.simulate import simulate_text

HEAD = """
config:
  profile: kai
  actions: [allocate]
  tiers: [{plugins: [{name: predicates}, {name: proportion}, {name: priority}, {name: topology},
                     {name: nodeplacement}, {name: nodeavailability}]}]
topologies: [{name: dc, levels: [zone, rack]}]
nodes:
- {name: a1, allocatable: {cpu: "16", memory: 64Gi, nvidia.com/gpu: 4}, labels: {zone: z1, rack: r1}}
- {name: a2, allocatable: {cpu: "16", memory: 64Gi, nvidia.com/gpu: 4}, labels: {zone: z1, rack: r1}}
- {name: b1, allocatable: {cpu: "16", memory: 64Gi, nvidia.com/gpu: 4}, labels: {zone: z1, rack: r2}}
- {name: b2, allocatable: {cpu: "16", memory: 64Gi, nvidia.com/gpu: 4}, labels: {zone: z1, rack: r2}}
- {name: c1, allocatable: {cpu: "16", memory: 64Gi, nvidia.com/gpu: 4}, labels: {zone: z2, rack: r3}}
queues: [{name: q}]
jobs:
- {name: filler, queue: q, tasks: [{name: f0, status: Running, node: b1, request: {cpu: "1", nvidia.com/gpu: 2}}]}
"""


def run(job: str) -> dict[str, str]:
    out = simulate_text(HEAD + job)
    return {
        uid.split("/")[1]: v["node"] for uid, v in out["tasks"].items() if v["status"] == "Binding"
    }


def gang(n: int, gpus: int, topology: str) -> str:
    tasks = ", ".join(
        f'{{name: t{i}, request: {{cpu: "1", nvidia.com/gpu: {gpus}}}}}' for i in range(n)
    )
    return f"- {{name: g, queue: q, minMember: {n}, topology: {topology}, tasks: [{tasks}]}}\n"


def test_required_rack_keeps_the_gang_in_one_rack_the_fullest_that_fits() -> None:
    # 3 x 2 GPUs: rack r2 (6 free, fuller) holds them; r1 (8 free) would too but is emptier.
    placed = run(gang(3, 2, "{topology: dc, requiredLevel: rack}"))
    assert len(placed) == 3
    assert set(placed.values()) <= {"b1", "b2"}
    # 4 x 2 GPUs no longer fit r2 (6 free): r1 takes them.
    placed = run(gang(4, 2, "{topology: dc, requiredLevel: rack}"))
    assert len(placed) == 4
    assert set(placed.values()) <= {"a1", "a2"}


def test_a_gang_no_domain_can_hold_stays_pending() -> None:
    assert run(gang(5, 2, "{topology: dc, requiredLevel: rack}")) == {}  # 10 GPUs: no rack has them
    placed = run(gang(5, 2, "{topology: dc, requiredLevel: zone}"))  # zone z1 has 14 free
    assert len(placed) == 5
    assert all(n[0] in "ab" for n in placed.values())


def test_preferred_rack_then_required_zone() -> None:
    placed = run(gang(4, 2, "{topology: dc, preferredLevel: rack, requiredLevel: zone}"))
    assert set(placed.values()) <= {"a1", "a2"}  # one rack can hold it: that rack
    placed = run(gang(6, 2, "{topology: dc, preferredLevel: rack, requiredLevel: zone}"))
    assert len(placed) == 6
    assert all(n[0] in "ab" for n in placed.values())


def test_unknown_topology_is_not_scheduled_and_says_so() -> None:
    out = simulate_text(HEAD + gang(1, 1, "{topology: nowhere, requiredLevel: rack}"))
    assert out["tasks"]["default/t0"]["status"] == "Pending"
    assert any("nowhere" in c["message"] for c in out["jobs"]["default/g"]["conditions"])
