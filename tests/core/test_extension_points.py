"""Combination rules of the extension points (Volcano framework/session_plugins.go).

Each test registers stub functions from fake plugins in chosen tiers and checks how the session
combines their answers; a wrong rule (e.g. "last wins" or "any passes") fails them.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from core_helpers import job, node, session, snapshot

from server.plugins import PLUGINS
from server.plugins.base import Plugin
from server.session.extension_points import ABSTAIN, PERMIT, POINTS, REJECT

# Fake plugins whose registrations each test sets.
REGISTRATIONS: dict[str, dict[str, Any]] = {}


def _fake(plugin_name: str) -> type[Plugin]:
    class Fake(Plugin):
        name: ClassVar[str] = plugin_name

        def on_session_open(self, ssn: Any) -> None:
            for point, fn in REGISTRATIONS.get(self.name, {}).items():
                ssn.register(point, self.name, fn)

    return Fake


@pytest.fixture(autouse=True)
def fake_plugins(monkeypatch: pytest.MonkeyPatch):
    for name in ("a", "b", "c", "d"):
        monkeypatch.setitem(PLUGINS, name, _fake(name))
    REGISTRATIONS.clear()
    yield
    REGISTRATIONS.clear()


TWO_TIERS = """
actions: "allocate"
tiers:
- plugins: [{name: a}, {name: b}]
- plugins: [{name: c}, {name: d}]
"""


def open_session(config: str = TWO_TIERS):
    snap = snapshot([node("n1")], [job("j1", 1, index=0), job("j2", 1, index=1)])
    return session(snap, config)


def test_every_point_declares_a_rule() -> None:
    assert {"job_order", "predicate", "node_order", "job_pipelined", "job_starving", "preemptable"} <= set(POINTS)
    assert all(p.rule for p in POINTS.values())


def test_order_first_non_zero_answer_in_tier_order_wins() -> None:
    REGISTRATIONS.update(
        a={"job_order": lambda a, b: 0},  # abstains
        b={"job_order": lambda a, b: 1 if a.name == "j1" else -1},  # prefers j2
        c={"job_order": lambda a, b: -1 if a.name == "j1" else 1},  # would prefer j1: never asked
    )
    ssn = open_session()
    j1, j2 = ssn.jobs["ns/j1"], ssn.jobs["ns/j2"]
    assert ssn.job_order_fn(j2, j1) is True
    assert ssn.job_order_fn(j1, j2) is False


def test_order_ties_fall_back_to_creation_order() -> None:
    REGISTRATIONS.update(a={"job_order": lambda a, b: 0})
    ssn = open_session()
    j1, j2 = ssn.jobs["ns/j1"], ssn.jobs["ns/j2"]
    assert ssn.job_order_fn(j1, j2) is True and ssn.job_order_fn(j2, j1) is False


def test_job_ready_every_enabled_plugin_must_pass() -> None:
    REGISTRATIONS.update(a={"job_ready": lambda j: True}, d={"job_ready": lambda j: False})
    assert open_session().job_ready(open_session().jobs["ns/j1"]) is False
    REGISTRATIONS.update(d={"job_ready": lambda j: True})
    ssn = open_session()
    assert ssn.job_ready(ssn.jobs["ns/j1"]) is True


def test_a_disabled_switch_removes_the_plugin_from_the_chain() -> None:
    REGISTRATIONS.update(a={"job_ready": lambda j: False})
    cfg = TWO_TIERS.replace("{name: a}", "{name: a, enableJobReady: false}")
    ssn = open_session(cfg)
    assert ssn.job_ready(ssn.jobs["ns/j1"]) is True


def test_disabled_mode_turns_on_only_switches_written_true() -> None:
    REGISTRATIONS.update(a={"job_ready": lambda j: False}, b={"job_ready": lambda j: False})
    cfg = TWO_TIERS.replace("{name: a}", "{name: a, enableJobReady: true}") + "extension_points_not_listed: disabled\n"
    ssn = open_session(cfg)
    # a is on and fails; b's switch is not written, so b is off.
    assert ssn.job_ready(ssn.jobs["ns/j1"]) is False
    assert [name for name, _ in ssn.chain("job_ready")[0]] == ["a"]


@pytest.mark.parametrize(
    ("votes", "expected"),
    [
        ({"a": PERMIT, "c": REJECT}, True),  # a permit ends the check at the end of its tier
        ({"a": PERMIT, "b": REJECT}, False),  # a reject in the same tier still wins
        ({"c": REJECT}, False),
        ({"a": ABSTAIN, "d": ABSTAIN}, True),  # nobody decides: permit
    ],
)
def test_pipelined_and_enqueueable_votes(votes: dict[str, int], expected: bool) -> None:
    for plugin, vote in votes.items():
        REGISTRATIONS[plugin] = {"job_pipelined": lambda j, v=vote: v, "job_enqueueable": lambda j, v=vote: v}
    ssn = open_session()
    j = ssn.jobs["ns/j1"]
    assert ssn.job_pipelined(j) is expected
    assert ssn.job_enqueueable(j) is expected


def test_starving_first_tier_with_a_function_decides() -> None:
    REGISTRATIONS.update(c={"job_starving": lambda j: True}, d={"job_starving": lambda j: True})
    ssn = open_session()
    assert ssn.job_starving(ssn.jobs["ns/j1"]) is True
    REGISTRATIONS.update(a={"job_starving": lambda j: False})
    ssn = open_session()
    assert ssn.job_starving(ssn.jobs["ns/j1"]) is False  # tier 1 decides; tier 2 never asked


def test_starving_without_functions_is_false() -> None:
    ssn = open_session()
    assert ssn.job_starving(ssn.jobs["ns/j1"]) is False


def test_overused_any_true_wins() -> None:
    REGISTRATIONS.update(a={"overused": lambda q: False}, d={"overused": lambda q: True})
    ssn = open_session()
    assert ssn.overused(ssn.queues["default"]) is True


def test_job_valid_first_failure_decides() -> None:
    from server.session.session import ValidateResult

    REGISTRATIONS.update(
        c={"job_valid": lambda j: ValidateResult(False, "second", "")},
        a={"job_valid": lambda j: ValidateResult(False, "first", "")},
    )
    ssn = open_session()
    # Both jobs are invalid: recorded at session open with the first tier's reason.
    assert set(ssn.invalid_jobs) == {"ns/j1", "ns/j2"}
    assert ssn.close().jobs["ns/j1"].conditions[0].reason == "first"


def _victims(ssn, point: str):
    j1 = ssn.jobs["ns/j1"]
    t1 = next(iter(j1.tasks.values()))
    cands = list(ssn.jobs["ns/j2"].tasks.values()) + [t1]
    fn = ssn.preemptable if point == "preemptable" else ssn.reclaimable
    return {v.uid for v in fn(t1, cands)}


@pytest.mark.parametrize("point", ["preemptable", "reclaimable"])
def test_victims_intersect_within_a_tier_first_tier_with_victims_decides(point: str) -> None:
    REGISTRATIONS.update(
        a={point: lambda p, c: (c, PERMIT)},
        b={point: lambda p, c: ([c[0]], PERMIT)},
        c={point: lambda p, c: (c, PERMIT)},
    )
    assert _victims(open_session(), point) == {"ns/j2-0"}


@pytest.mark.parametrize("point", ["preemptable", "reclaimable"])
def test_victims_empty_answer_empties_the_tier_and_next_tier_decides(point: str) -> None:
    REGISTRATIONS.update(
        a={point: lambda p, c: (c, PERMIT)},
        b={point: lambda p, c: ([], PERMIT)},
        d={point: lambda p, c: ([c[1]], PERMIT)},
    )
    assert _victims(open_session(), point) == {"ns/j1-0"}


@pytest.mark.parametrize("point", ["preemptable", "reclaimable"])
def test_victims_abstaining_plugin_is_skipped(point: str) -> None:
    REGISTRATIONS.update(a={point: lambda p, c: ([], ABSTAIN)}, b={point: lambda p, c: ([c[1]], PERMIT)})
    assert _victims(open_session(), point) == {"ns/j1-0"}


def test_node_scores_add_up_across_plugins_and_tiers() -> None:
    import numpy as np

    from server.session.evaluator import Scorer

    REGISTRATIONS.update(
        a={"node_order": Scorer("shape", lambda t, rows: np.where(rows == 0, 10.0, 0.0))},
        c={"node_order": Scorer("shape", lambda t, rows: np.where(rows == 1, 15.0, 0.0))},
        d={"node_order": Scorer("static", lambda t, rows: np.where(rows == 0, 6.0, 0.0))},
    )
    snap = snapshot([node("n1"), node("n2")], [job("j1", 1)])
    ssn = session(snap, TWO_TIERS)
    task = next(iter(ssn.jobs["ns/j1"].tasks.values()))
    scores = ssn.evaluator.scores(task, np.array([0, 1]))
    assert list(scores) == [16.0, 15.0]
    assert ssn.evaluator.select(task) == (0, True)


def test_predicates_all_must_pass() -> None:
    import numpy as np

    from server.session.evaluator import Predicate

    REGISTRATIONS.update(
        a={"predicate": Predicate("static", lambda t, rows: rows != 0, reason="not n1")},
        d={"predicate": Predicate("shape", lambda t, rows: rows != 1, reason="not n2")},
    )
    snap = snapshot([node("n1"), node("n2"), node("n3")], [job("j1", 1)])
    ssn = session(snap, TWO_TIERS)
    task = next(iter(ssn.jobs["ns/j1"].tasks.values()))
    future_ok, _ = ssn.evaluator.feasible(task)
    assert list(np.nonzero(future_ok)[0]) == [2]
    restrict = np.array([True, True, False])
    assert ssn.evaluator.select(task, restrict) is None
    fe = ssn.evaluator.fit_errors(task, restrict)
    assert fe.reasons == {"not n1": 1, "not n2": 1}
