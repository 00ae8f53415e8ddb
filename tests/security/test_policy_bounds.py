"""An auth policy is parsed by muster/yamldoc.py like every user document: an alias bomb is a
PolicyError, quickly."""

from __future__ import annotations

import time

import pytest

from server.service.auth import PolicyError, parse_policy


def test_a_policy_alias_bomb_is_refused_quickly() -> None:
    lines = ["x-0: &l0 [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"x-{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)]
    text = "\n".join(lines) + "\nrules:\n  - {subjects: *l8, verbs: [read]}\n"
    started = time.perf_counter()
    with pytest.raises(PolicyError, match="aliases expand to more than"):
        parse_policy(text, "policy.yaml")
    assert time.perf_counter() - started < 1.0
