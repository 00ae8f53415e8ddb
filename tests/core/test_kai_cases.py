"""KAI Scheduler's own action test cases, as scenarios (tests/scenarios/kai/, see its README):
each runs through ``muster simulate`` and must give what KAI's test expects. Cases Muster does not
pass yet are listed, with why, in tests/scenarios/kai/known-failures.txt: they are strict xfails,
so a case that starts passing must leave the list (and the count in the closing note is honest)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_scenarios import check

from server.simulate import simulate_text

ROOT = Path(__file__).resolve().parents[2] / "tests" / "scenarios" / "kai"
CASES = sorted(ROOT.glob("*/*.yaml"))


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


@pytest.mark.parametrize("path", CASES, ids=[_id(p) for p in CASES])
def test_kai_case(path: Path, request: pytest.FixtureRequest) -> None:
    case = _id(path)
    if case in KNOWN:
        request.applymarker(pytest.mark.xfail(strict=True, reason=KNOWN[case]))
    text = path.read_text()
    expect = yaml.safe_load(text)["x-expect"]
    out = simulate_text(text, expect.get("cycles"))
    problems = check(expect, out)
    assert not problems, f"{case} ({expect.get('source', '')}):\n" + "\n".join(problems)


def test_known_failures_name_existing_cases() -> None:
    cases = {_id(p) for p in CASES}
    assert sorted(set(KNOWN) - cases) == []
