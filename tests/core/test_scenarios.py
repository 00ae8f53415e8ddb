"""Scenario files with expected results: every tests/scenarios/*.yaml and every
examples/scenarios/*.yaml is run through ``muster simulate`` and must produce what its
``x-expect`` block says (keys under ``x-`` are ignored by the scenario loader).

``x-expect`` keys (each optional; present ones are checked exactly):
  source      where the expected result comes from (a Volcano test case, a rule ...)
  cycles      cycles to run (default: the scenario's config.cycles)
  binds       task -> node, the whole bind map of the run
  pipelined   task -> node, tasks left Pipelined at the end
  evictions   the victims (as a set)
  phases      job -> PodGroup phase after the run
  conditions  job -> list of condition types
  tasks       task -> status after the run
  devices     task -> the device ids it holds after the run
  scheduleStates  TYJob -> TY-Arranger schedule state
  nodes       task -> the node it is on after the run
  gpuGroups   task -> its shared GPU groups, up to renaming per node (KAI's test matcher)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from server.simulate import simulate_text

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "tests" / "scenarios").glob("*.yaml")) + sorted(
    (ROOT / "examples" / "scenarios").glob("*.yaml")
)
KNOWN = {
    "source",
    "cycles",
    "binds",
    "pipelined",
    "evictions",
    "phases",
    "conditions",
    "tasks",
    "devices",
    "scheduleStates",
    "nodes",
    "gpuGroups",
}


def check(expect: dict[str, Any], out: dict[str, Any]) -> list[str]:
    """Every mismatch between the expectation and the simulate output, one line each."""
    problems: list[str] = []

    def same(key: str, want: Any, got: Any) -> None:
        if want != got:
            problems.append(f"{key}: expected {want!r}, got {got!r}")

    if "binds" in expect:
        same("binds", expect["binds"] or {}, out["binds"])
    if "pipelined" in expect:
        same("pipelined", expect["pipelined"] or {}, out["pipelined"])
    if "evictions" in expect:
        same("evictions", sorted(expect["evictions"] or []), sorted(out["evictions"]))
    for job, phase in (expect.get("phases") or {}).items():
        same(f"phases[{job}]", phase, out["jobs"].get(job, {}).get("phase"))
    for job, types in (expect.get("conditions") or {}).items():
        same(
            f"conditions[{job}]",
            types,
            [c["type"] for c in out["jobs"].get(job, {}).get("conditions", [])],
        )
    for task, status in (expect.get("tasks") or {}).items():
        same(f"tasks[{task}]", status, out["tasks"].get(task, {}).get("status"))
    for task, devices in (expect.get("devices") or {}).items():
        same(f"devices[{task}]", devices, out["tasks"].get(task, {}).get("devices"))
    for job, state in (expect.get("scheduleStates") or {}).items():
        same(f"scheduleStates[{job}]", state, out["jobs"].get(job, {}).get("scheduleState"))
    for task, node in (expect.get("nodes") or {}).items():
        same(f"nodes[{task}]", node, out["tasks"].get(task, {}).get("node"))
    # Expected group names are labels: per node, each must stand for one actual group throughout.
    seen: dict[tuple[str | None, str], str] = {}
    for task, groups in (expect.get("gpuGroups") or {}).items():
        got = out["tasks"].get(task, {})
        actual = got.get("gpu_groups") or []
        if len(actual) != len(groups):
            problems.append(
                f"gpuGroups[{task}]: expected {len(groups)} group(s) {groups!r}, got {actual!r}"
            )
            continue
        for label, name in zip(groups, actual, strict=True):
            key = (got.get("node"), str(label))
            if seen.setdefault(key, name) != name:
                problems.append(
                    f"gpuGroups[{task}]: group {label!r} on {key[0]} is {seen[key]!r} elsewhere, {name!r} here"
                )
    return problems


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name}" for p in FILES])
def test_scenario_produces_its_expected_result(path: Path) -> None:
    text = path.read_text()
    expect = (yaml.safe_load(text) or {}).get("x-expect")
    if expect is None:
        # An example without expectations must at least load and run.
        simulate_text(text)
        return
    unknown = set(expect) - KNOWN
    assert not unknown, f"x-expect: unknown keys {sorted(unknown)}"
    out = simulate_text(text, expect.get("cycles"))
    problems = check(expect, out)
    assert not problems, f"{path.name} ({expect.get('source', '')}):\n" + "\n".join(problems)


def test_scenario_files_exist() -> None:
    assert len(FILES) >= 5


def test_checker_reports_each_kind_of_mismatch() -> None:
    """The checker itself must be able to fail: a wrong bind, phase, condition and status are
    each reported."""
    out = {
        "binds": {"a": "n1"},
        "pipelined": {},
        "evictions": [],
        "tasks": {"a": {"status": "Binding"}},
        "jobs": {"j": {"phase": "Running", "conditions": [{"type": "Scheduled"}]}},
    }
    assert check({"binds": {"a": "n1"}, "phases": {"j": "Running"}}, out) == []
    problems = check(
        {
            "binds": {"a": "n2"},
            "phases": {"j": "Pending"},
            "conditions": {"j": ["Unschedulable"]},
            "tasks": {"a": "Running"},
            "evictions": ["x"],
            "devices": {"a": ["0"]},
            "scheduleStates": {"j": "Unscheduled"},
        },
        out,
    )
    assert len(problems) == 7
