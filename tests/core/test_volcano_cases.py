"""Volcano's own test cases, as scenarios (tests/scenarios/volcano/, see its README): each runs
through ``muster simulate`` and must give what the Volcano test expects. Cases Muster does not pass
yet are listed, with why, in tests/scenarios/volcano/known-failures.txt: they are strict xfails, so
a case that starts passing must leave the list.

Beside the ``x-expect`` keys of tests/core/test_scenarios.py, these files may use the checks
Volcano's test helper makes that the shared checker has no key for:

  bindCount               how many tasks were bound (Volcano's ``ExpectBindsNum`` / MinimalBindCheck)
  boundTasks              which tasks were bound, whatever their nodes
  bindsPerTier1HyperNode  binds counted per tier-1 hypernode, sorted
  hardTopologyConfined    true: every job in hard network-topology mode was placed inside one
                          hypernode of a tier its highestTierAllowed permits

Whatever the file says, the output may hold no job and no task the scenario does not have, so a
``phases`` or ``tasks`` map that lists every job or task of the scenario is an exact check.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_scenarios import KNOWN as SHARED_KEYS
from test_scenarios import check

from server.simulate import simulate_text

ROOT = Path(__file__).resolve().parents[2] / "tests" / "scenarios" / "volcano"
CASES = sorted(ROOT.glob("*/*.yaml"))
EXTRA_KEYS = {"bindCount", "boundTasks", "bindsPerTier1HyperNode", "hardTopologyConfined"}


def known_failures() -> dict[str, str]:
    path = ROOT / "known-failures.txt"
    out: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                case, _, why = line.partition(" ")
                out[case] = why.strip()
    return out


KNOWN = known_failures()


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def hypernode_nodes(hypernodes: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Every hypernode's set of real nodes."""
    by_name = {h["name"]: h for h in hypernodes}

    def nodes_of(name: str) -> set[str]:
        members = by_name[name]["members"]
        out = set(members.get("nodes", []))
        for child in members.get("hypernodes", []):
            out |= nodes_of(child)
        return out

    return {name: nodes_of(name) for name in by_name}


def check_volcano(
    expect: dict[str, Any], scenario: dict[str, Any], out: dict[str, Any]
) -> list[str]:
    """The checks of EXTRA_KEYS, and that the output names only the scenario's jobs and tasks."""
    problems: list[str] = []
    binds: dict[str, str] = out["binds"]
    jobs = scenario.get("jobs") or []
    job_uids = {f"{j.get('namespace', 'default')}/{j['name']}" for j in jobs}
    task_uids = {
        f"{j.get('namespace', 'default')}/{t['name']}" for j in jobs for t in j.get("tasks") or []
    }
    if extra := sorted(set(out["jobs"]) - job_uids):
        problems.append(f"output jobs not in the scenario: {extra}")
    if extra := sorted(set(out["tasks"]) - task_uids):
        problems.append(f"output tasks not in the scenario: {extra}")
    if "bindCount" in expect and len(binds) != expect["bindCount"]:
        problems.append(f"bindCount: expected {expect['bindCount']}, got {len(binds)} ({binds})")
    if "boundTasks" in expect and sorted(binds) != sorted(expect["boundTasks"]):
        problems.append(f"boundTasks: expected {sorted(expect['boundTasks'])}, got {sorted(binds)}")
    hypernodes = scenario.get("hypernodes") or []
    members = hypernode_nodes(hypernodes)
    tiers = {h["name"]: h["tier"] for h in hypernodes}
    if "bindsPerTier1HyperNode" in expect:
        tier1 = {n: h for h, nodes in members.items() if tiers[h] == 1 for n in nodes}
        got = sorted(Counter(tier1[n] for n in binds.values()).values())
        if got != expect["bindsPerTier1HyperNode"]:
            problems.append(
                f"bindsPerTier1HyperNode: expected {expect['bindsPerTier1HyperNode']}, got {got}"
            )
    if expect.get("hardTopologyConfined"):
        for job in jobs:
            topology = job.get("networkTopology") or {}
            if topology.get("mode") != "hard":
                continue
            ns = job.get("namespace", "default")
            names = {t["name"] for t in job.get("tasks") or []}
            placed = {
                node
                for task, node in binds.items()
                if task.startswith(f"{ns}/") and task.split("/", 1)[1] in names
            }
            if placed and not any(
                tiers[h] <= topology["highestTierAllowed"] and placed <= nodes
                for h, nodes in members.items()
            ):
                problems.append(
                    f"hardTopologyConfined: {ns}/{job['name']} spans {sorted(placed)}, in no "
                    f"hypernode of tier <= {topology['highestTierAllowed']}"
                )
    return problems


@pytest.mark.parametrize("path", CASES, ids=[_id(p) for p in CASES])
def test_volcano_case(path: Path, request: pytest.FixtureRequest) -> None:
    case = _id(path)
    if case in KNOWN:
        request.applymarker(pytest.mark.xfail(strict=True, reason=KNOWN[case]))
    text = path.read_text()
    scenario = yaml.safe_load(text)
    expect = scenario["x-expect"]
    unknown = set(expect) - SHARED_KEYS - EXTRA_KEYS
    assert not unknown, f"{case}: x-expect: unknown keys {sorted(unknown)}"
    out = simulate_text(text, expect.get("cycles"))
    problems = check(expect, out) + check_volcano(expect, scenario, out)
    assert not problems, f"{case} ({expect.get('source', '')}):\n" + "\n".join(problems)


def test_known_failures_name_existing_cases() -> None:
    cases = {_id(p) for p in CASES}
    assert sorted(set(KNOWN) - cases) == []


def test_extra_checks_can_fail() -> None:
    """The Volcano-only checks must be able to fail."""
    scenario = {
        "hypernodes": [
            {"name": "s0", "tier": 1, "members": {"nodes": ["a"]}},
            {"name": "s1", "tier": 1, "members": {"nodes": ["b"]}},
            {"name": "s2", "tier": 2, "members": {"hypernodes": ["s0", "s1"]}},
        ],
        "jobs": [
            {
                "name": "j",
                "namespace": "ns",
                "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
                "tasks": [{"name": "t0"}, {"name": "t1"}],
            }
        ],
    }
    out = {"binds": {"ns/t0": "a", "ns/t1": "b"}, "jobs": {"ns/other": {}}, "tasks": {}}
    expect = {
        "bindCount": 1,
        "boundTasks": ["ns/t0"],
        "bindsPerTier1HyperNode": [2],
        "hardTopologyConfined": True,
    }
    assert len(check_volcano(expect, scenario, out)) == 5
