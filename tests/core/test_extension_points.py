"""The extension point table (``server/session/extension_points.py``): one rule test per point.

Fake plugins a and b form tier 1, c and d tier 2. Each test registers stub functions for a point
in chosen tiers and asks the session, checking the point's combining rule: tier order and tier
semantics, a plugin whose switch is off, abstentions. ``covers`` records which points a test
checks; ``test_every_point_has_a_rule_test`` fails when a point is added to the table without one.
The documentation tables of docs/config.md must equal what the table renders.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, get_args, get_origin, get_type_hints

import numpy as np
import pytest
from core_helpers import NS, job, node, snapshot

from server.config import SWITCHES, load_config
from server.model import QueueSpec
from server.plugins import PLUGINS
from server.plugins.base import Plugin
from server.session.evaluator import Predicate, Scope, Scorer
from server.session.extension_points import (
    ABSTAIN,
    ALL_SWITCHES,
    ALLOWED,
    COMPATIBILITY_SWITCHES,
    JOB_READY,
    PERMIT,
    PLUGIN_SWITCHES,
    POINTS,
    REJECT,
    Point,
    ValidateResult,
    Verdict,
    markdown_table,
    refuse,
    render_docs,
    switches_markdown_table,
)
from server.session.session import Session

DOCS = Path(__file__).resolve().parents[2] / "docs" / "config.md"

# Fake plugins whose registrations each test sets: plugin -> point -> function.
REGISTRATIONS: dict[str, dict[str, Any]] = {}
# point -> the tests that check its rule.
COVERED: dict[str, list[str]] = {}


def covers(*points: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def mark(test: Callable[..., None]) -> Callable[..., None]:
        for p in points:
            COVERED.setdefault(p, []).append(test.__name__)
        return test

    return mark


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


def switched_off(point: str, *plugins: str, config: str = TWO_TIERS) -> str:
    """``config`` with ``point``'s YAML switch (from the table) written false for ``plugins``."""
    switch = POINTS[point].switch
    assert switch is not None, point
    for p in plugins:
        config = config.replace(f"{{name: {p}}}", f"{{name: {p}, {switch.key}: false}}")
    return config


def open_session(config: str = TWO_TIERS, nodes: int = 1) -> Session:
    """Queues q1, q2; job j1 (q1, created first, one task) and j2 (q2, one task of priority 5)."""
    snap = snapshot(
        [node(f"n{i + 1}") for i in range(nodes)],
        [job("j1", 1, index=0, queue="q1"), job("j2", 1, index=1, queue="q2", priority=5)],
        [QueueSpec("q1"), QueueSpec("q2")],
    )
    return Session(snap, load_config(config), 1)


def register(**per_plugin: Any) -> None:
    """register(a={"job_ready": fn}, ...)"""
    REGISTRATIONS.update(per_plugin)


# -- order points: first non-zero in tier order ---------------------------------------------------
def _j(ssn: Session) -> tuple[Any, Any]:
    return ssn.jobs["ns/j1"], ssn.jobs["ns/j2"]


def _t(ssn: Session) -> tuple[Any, Any]:
    return ssn.tasks["ns/j1-0"], ssn.tasks["ns/j2-0"]


def _q(ssn: Session) -> tuple[Any, Any]:
    return ssn.queues["q1"], ssn.queues["q2"]


# point -> (the two objects compared, "is left first?" asked of the session, the tie-break answer)
ORDERS: dict[
    str, tuple[Callable[[Session], tuple[Any, Any]], Callable[[Session, Any, Any], bool], bool]
] = {
    "job_order": (_j, lambda ssn, x, y: ssn.job_order_fn(x, y), True),  # creation order
    "queue_order": (_q, lambda ssn, x, y: ssn.queue_order_fn(x, y), True),  # creation order
    "task_order": (
        _t,
        lambda ssn, x, y: ssn.task_order_fn(x, y),
        False,
    ),  # j2-0 has the higher priority
    # the reverse of the queue order
    "victim_queue_order": (_q, lambda ssn, x, y: ssn.victim_queue_order_fn(x, y, None), False),
}


class prefers:  # lower case: reads as a function in the tests
    """A compare fn preferring the left (0) or the right (1) object of ``ORDERS``' pair."""

    def __init__(self, which: int) -> None:
        self.which = which
        self.pair: tuple[Any, Any] = (None, None)

    def __call__(self, left: Any, right: Any, *_: Any) -> int:
        first = self.pair[self.which]
        return -1 if left is first else (1 if right is first else 0)


def _order_session(
    point: str, config: str = TWO_TIERS, **fns: Callable[..., int]
) -> tuple[Session, Any, Any]:
    register(**{plugin: {point: fn} for plugin, fn in fns.items()})
    ssn = open_session(config)
    left, right = ORDERS[point][0](ssn)
    for fn in fns.values():
        if isinstance(fn, prefers):
            fn.pair = (left, right)
    return ssn, left, right


@covers(*ORDERS)
@pytest.mark.parametrize("point", list(ORDERS))
def test_order_first_non_zero_answer_in_tier_order_wins(point: str) -> None:
    ask, left_by_default = ORDERS[point][1], ORDERS[point][2]
    zero = lambda *_: 0  # noqa: E731
    # a abstains (0), b prefers the right one, c (tier 2) would prefer the left one: never asked.
    ssn, left, right = _order_session(point, a=zero, b=prefers(1), c=prefers(0))
    assert ask(ssn, right, left) is True
    assert ask(ssn, left, right) is False
    # Within a tier the first plugin decides.
    REGISTRATIONS.clear()
    ssn, left, right = _order_session(point, a=prefers(0), b=prefers(1))
    assert ask(ssn, left, right) is True
    # A tie in tier 1 goes to tier 2 (d prefers what the tie-break would put last).
    REGISTRATIONS.clear()
    ssn, left, right = _order_session(point, a=zero, b=zero, d=prefers(1 if left_by_default else 0))
    assert ask(ssn, left, right) is not left_by_default


@covers(*ORDERS)
@pytest.mark.parametrize("point", list(ORDERS))
def test_order_ties_fall_back_to_the_default_order(point: str) -> None:
    pair, ask, left_first = ORDERS[point]
    ssn, left, right = _order_session(point, a=lambda *_: 0)
    assert ask(ssn, left, right) is left_first
    assert ask(ssn, right, left) is not left_first
    REGISTRATIONS.clear()
    ssn = open_session()  # nobody registered
    left, right = pair(ssn)
    assert ask(ssn, left, right) is left_first


@covers(*ORDERS)
@pytest.mark.parametrize("point", list(ORDERS))
def test_order_switch(point: str) -> None:
    ask = ORDERS[point][1]
    if POINTS[point].switch is None:
        # Always on (as in Volcano): even with every switch off, a's answer counts.
        cfg = TWO_TIERS + "extension_points_not_listed: disabled\n"
        ssn, left, right = _order_session(point, cfg, a=prefers(1))
        assert ask(ssn, right, left) is True
        assert ask(ssn, left, right) is False
        return
    # b's switch is off: c decides.
    ssn, left, right = _order_session(point, switched_off(point, "b"), b=prefers(1), c=prefers(0))
    assert ask(ssn, left, right) is True
    assert ask(ssn, right, left) is False
    assert [name for row in ssn.chain(point) for name, _ in row] == ["c"]


def test_job_order_compare_is_the_raw_combination() -> None:
    ssn, left, right = _order_session("job_order", a=lambda *_: 0, c=lambda *_: 7)
    assert ssn.job_order_compare(left, right) == 7
    REGISTRATIONS.clear()
    ssn = open_session()
    assert ssn.job_order_compare(*_j(ssn)) == 0


# -- order keys: the same order, computed once per item -----------------------------------------------
KEYED = {
    "job_order_key": ("job_order", _j, "job_order_key", "job_order_fn"),
    "task_order_key": ("task_order", _t, "task_order_key", "task_order_fn"),
    "queue_order_key": ("queue_order", _q, "queue_order_key", "queue_order_fn"),
}


@covers(*KEYED)
@pytest.mark.parametrize("point", list(KEYED))
def test_order_keys_in_tier_order_give_the_comparators_order(point: str) -> None:
    order, pair, key_of, less_of = KEYED[point]
    # a: no opinion; b (tier 1) ranks by a number; c (tier 2) by another: b decides where it differs.
    rank_b = {0: 2, 1: 1}  # b puts the right object first
    rank_c = {0: 0, 1: 9}

    def compare(rank: dict[int, int]) -> Callable[[Any, Any], int]:
        def fn(x: Any, y: Any) -> int:
            kx, ky = rank[objects.index(x)], rank[objects.index(y)]
            return (kx > ky) - (kx < ky)

        return fn

    objects: list[Any] = []
    register(
        a={order: lambda *_: 0, point: lambda _: 0},
        b={order: compare(rank_b), point: lambda x: rank_b[objects.index(x)]},
        c={order: compare(rank_c), point: lambda x: rank_c[objects.index(x)]},
    )
    ssn = open_session()
    objects.extend(pair(ssn))
    key, less = getattr(ssn, key_of)(), getattr(ssn, less_of)
    assert key is not None
    left, right = objects
    assert (key(right) < key(left)) is less(right, left) is True
    # Equal keys in every plugin: the same tie-break as the comparator.
    REGISTRATIONS.clear()
    register(a={order: lambda *_: 0, point: lambda _: 0})
    ssn = open_session()
    key, less = getattr(ssn, key_of)(), getattr(ssn, less_of)
    left, right = pair(ssn)
    assert key is not None
    assert (key(left) < key(right)) is less(left, right)
    # A plugin of the order without a key: no key (the comparators are used), whatever the others give.
    REGISTRATIONS.clear()
    register(a={order: lambda *_: 0, point: lambda _: 0}, c={order: lambda *_: 0})
    assert getattr(open_session(), key_of)() is None
    # The key's switch is the order's: a plugin switched off leaves both chains.
    REGISTRATIONS.clear()
    register(
        a={order: lambda *_: 0, point: lambda _: 0}, b={order: lambda *_: 0, point: lambda _: 0}
    )
    ssn = open_session(switched_off(point, "b"))
    assert [n for row in ssn.chain(point) for n, _ in row] == ["a"]
    assert getattr(ssn, key_of)() is not None


# -- every enabled plugin must pass -----------------------------------------------------------------
CHECKS: dict[str, Callable[[Session], bool]] = {
    "job_ready": lambda ssn: ssn.job_ready(ssn.jobs["ns/j1"]),
    "preemptive": lambda ssn: ssn.preemptive(ssn.queues["q1"], ssn.tasks["ns/j1-0"]),
}


@covers(*CHECKS)
@pytest.mark.parametrize("point", list(CHECKS))
def test_every_enabled_plugin_must_pass(point: str) -> None:
    ask = CHECKS[point]
    yes, no = (lambda *_: True), (lambda *_: False)
    assert ask(open_session()) is True  # no function: true
    register(a={point: yes}, d={point: no})
    assert ask(open_session()) is False  # a failure in a later tier still fails
    register(d={point: yes}, b={point: yes})
    assert ask(open_session()) is True
    register(b={point: no})
    assert ask(open_session()) is False
    assert ask(open_session(switched_off(point, "b"))) is True  # b's switch off: b is not asked


@covers("allocatable")
def test_allocatable_first_refusal_decides_and_says_why() -> None:
    def ask(ssn: Session) -> Verdict:
        return ssn.allocatable(ssn.queues["q1"], ssn.tasks["ns/j1-0"])

    yes = lambda *_: ALLOWED  # noqa: E731
    assert ask(open_session()) is ALLOWED  # no function: allowed
    register(a={"allocatable": yes}, d={"allocatable": lambda *_: refuse("d", "q1 is full")})
    verdict = ask(open_session())  # a refusal in a later tier still refuses
    assert not verdict
    assert verdict == REJECT
    assert (verdict.reason, verdict.plugin) == ("q1 is full", "d")
    register(d={"allocatable": yes}, b={"allocatable": yes})
    assert ask(open_session()).ok
    register(
        b={"allocatable": lambda *_: refuse("b", "first")},
        c={"allocatable": lambda *_: refuse("c", "later")},
    )
    assert ask(open_session()).reason == "first"  # the first refusal in tier order decides
    assert ask(open_session(switched_off("allocatable", "b"))).reason == "later"  # b is not asked
    REGISTRATIONS.clear()
    register(a={"allocatable": lambda *_: refuse("a", "only")})  # one plugin: its own verdict
    assert ask(open_session()).reason == "only"


@covers("job_satisfiable")
def test_job_satisfiable_first_refusal_decides_under_the_allocatable_switch() -> None:
    def ask(ssn: Session) -> Verdict:
        return ssn.job_satisfiable(ssn.jobs["ns/j1"])

    assert ask(open_session()) is ALLOWED  # no function: satisfiable
    register(
        a={"job_satisfiable": lambda j: ALLOWED},
        b={"job_satisfiable": lambda j: refuse("b", "over q1's capability")},
        c={"job_satisfiable": lambda j: refuse("c", "never asked")},
    )
    verdict = ask(open_session())
    assert not verdict
    assert (verdict.reason, verdict.plugin) == ("over q1's capability", "b")
    # The limit it speaks for is allocatable's: with that switch off, b is not asked.
    assert POINTS["job_satisfiable"].switch == POINTS["allocatable"].switch
    assert ask(open_session(switched_off("job_satisfiable", "b"))).reason == "never asked"


@covers("predicate")
def test_predicates_all_must_pass() -> None:
    register(
        a={"predicate": Predicate("static", lambda t, rows: rows != 0, reason="not n1")},
        d={"predicate": [Predicate("shape", lambda t, rows: rows != 1, reason="not n2")]},
    )
    ssn = open_session(nodes=3)
    task = ssn.tasks["ns/j1-0"]
    future_ok, _ = ssn.evaluator.feasible(task)
    assert list(np.nonzero(future_ok)[0]) == [2]
    restrict = np.array([True, True, False])
    assert ssn.evaluator.select(task, restrict) is None
    fe = ssn.evaluator.fit_errors(task, restrict)
    assert fe.reasons == {"not n1": 1, "not n2": 1}
    # d's switch off: only a's predicate filters.
    ssn = open_session(switched_off("predicate", "d"), nodes=3)
    future_ok, _ = ssn.evaluator.feasible(ssn.tasks["ns/j1-0"])
    assert list(np.nonzero(future_ok)[0]) == [1, 2]
    # Two plugins' predicates of the same scope, in different tiers: both must pass.
    scopes: tuple[Scope, ...] = ("static", "shape", "task")
    for scope in scopes:
        REGISTRATIONS.clear()
        register(
            b={"predicate": Predicate(scope, lambda t, rows: rows != 0)},
            c={"predicate": Predicate(scope, lambda t, rows: rows != 1)},
        )
        ssn = open_session(nodes=3)
        future_ok, _ = ssn.evaluator.feasible(ssn.tasks["ns/j1-0"])
        assert list(np.nonzero(future_ok)[0]) == [2], scope


@covers("node_order")
def test_node_scores_add_up_across_plugins_and_tiers() -> None:
    register(
        a={"node_order": Scorer("shape", lambda t, rows: np.where(rows == 0, 10.0, 0.0))},
        c={"node_order": [Scorer("shape", lambda t, rows: np.where(rows == 1, 15.0, 0.0))]},
        d={"node_order": Scorer("static", lambda t, rows: np.where(rows == 0, 6.0, 0.0))},
    )
    ssn = open_session(nodes=2)
    task = ssn.tasks["ns/j1-0"]
    assert list(ssn.evaluator.scores(task, np.array([0, 1]))) == [16.0, 15.0]
    assert ssn.evaluator.select(task) == (0, True)
    # d's switch off: n2 scores best.
    ssn = open_session(switched_off("node_order", "d"), nodes=2)
    task = ssn.tasks["ns/j1-0"]
    assert list(ssn.evaluator.scores(task, np.array([0, 1]))) == [10.0, 15.0]
    assert ssn.evaluator.select(task) == (1, True)


# -- job valid: the first failure decides ---------------------------------------------------------------
@covers("job_valid")
def test_job_valid_first_failure_decides() -> None:
    register(
        a={"job_valid": lambda j: None},  # no opinion
        b={"job_valid": lambda j: ValidateResult(True, "passed", "")},  # a pass is no failure
        c={"job_valid": lambda j: ValidateResult(False, "second", "")},
        d={"job_valid": lambda j: ValidateResult(False, "third", "")},
    )
    ssn = open_session()
    vr = ssn.job_valid(ssn.jobs["ns/j1"])
    assert vr is not None
    assert vr.reason == "second"
    register(b={"job_valid": lambda j: ValidateResult(False, "first", "")})
    ssn = open_session()
    # Both jobs are invalid: recorded at session open with the first tier's reason.
    assert set(ssn.invalid_jobs) == {"ns/j1", "ns/j2"}
    assert ssn.close().jobs["ns/j1"].conditions[0].reason == "first"


@covers("job_valid")
def test_job_valid_has_no_switch_and_no_failure_is_valid() -> None:
    assert POINTS["job_valid"].switch is None
    ssn = open_session()
    assert ssn.job_valid(ssn.jobs["ns/j1"]) is None
    assert not ssn.invalid_jobs
    register(c={"job_valid": lambda j: ValidateResult(False, "c", "")})
    ssn = open_session(TWO_TIERS + "extension_points_not_listed: disabled\n")
    vr = ssn.job_valid(ssn.jobs["ns/j1"])
    assert vr is not None
    assert vr.reason == "c"


# -- votes ----------------------------------------------------------------------------------------------
VOTES = ("job_pipelined", "job_enqueueable")


def _vote(ssn: Session, point: str) -> bool:
    j = ssn.jobs["ns/j1"]
    return ssn.job_pipelined(j) if point == "job_pipelined" else ssn.job_enqueueable(j)


@covers(*VOTES)
@pytest.mark.parametrize("point", VOTES)
@pytest.mark.parametrize(
    ("votes", "expected"),
    [
        ({"a": PERMIT, "c": REJECT}, True),  # a permit ends the check at the end of its tier
        ({"a": PERMIT, "b": REJECT}, False),  # a reject in the same tier still wins
        ({"b": REJECT, "a": PERMIT}, False),
        ({"a": ABSTAIN, "c": REJECT}, False),  # abstentions do not end the check
        ({"c": REJECT}, False),
        ({"a": ABSTAIN, "d": ABSTAIN}, True),  # nobody decides: permit
        ({}, True),  # no function: permit
        ({"a": ABSTAIN, "c": PERMIT, "d": REJECT}, False),
    ],
)
def test_votes(point: str, votes: dict[str, int], expected: bool) -> None:
    for plugin, v in votes.items():
        REGISTRATIONS[plugin] = {point: lambda j, v=v: v}
    assert _vote(open_session(), point) is expected


def test_a_rejection_says_why_and_who() -> None:
    register(a={"job_enqueueable": lambda j: ABSTAIN}, b={"job_enqueueable": lambda j: REJECT})
    ssn = open_session()
    j = ssn.jobs["ns/j1"]
    assert ssn._job_enqueueable(j).plugin == "b"  # a plain REJECT: the rule names its plugin
    assert not ssn.job_enqueueable(j)
    assert ssn.outcomes.found(j).enqueue == REJECT
    REGISTRATIONS.clear()
    register(c={"job_enqueueable": lambda j: refuse("c", "queue q1 is full")})
    ssn = open_session()
    j = ssn.jobs["ns/j1"]
    assert not ssn.job_enqueueable(j)
    assert ssn.outcomes.found(j).enqueue.reason == "queue q1 is full"  # kept for the report


@covers(*VOTES)
@pytest.mark.parametrize("point", VOTES)
def test_a_switched_off_vote_does_not_count(point: str) -> None:
    register(a={point: lambda j: REJECT}, c={point: lambda j: PERMIT})
    assert _vote(open_session(), point) is False
    assert _vote(open_session(switched_off(point, "a")), point) is True


@covers("job_enqueued")
def test_job_enqueued_calls_every_enabled_plugin_in_tier_order() -> None:
    calls: list[str] = []
    for p in ("d", "c", "b", "a"):
        REGISTRATIONS[p] = {"job_enqueued": lambda j, p=p: calls.append(p)}
    ssn = open_session()
    ssn.job_enqueued(ssn.jobs["ns/j1"])
    assert calls == ["a", "b", "c", "d"]
    calls.clear()
    ssn = open_session(switched_off("job_enqueued", "b", "c"))
    ssn.job_enqueued(ssn.jobs["ns/j1"])
    assert calls == ["a", "d"]


def test_enqueueable_and_enqueued_share_volcanos_switch() -> None:
    assert POINTS["job_enqueueable"].switch == POINTS["job_enqueued"].switch
    assert POINTS["job_enqueued"].switch is not None
    assert POINTS["job_enqueued"].switch.key == "enableJobEnqueued"


# -- starving: the first tier with a function decides ----------------------------------------------------
@covers("job_starving")
def test_starving_first_tier_with_a_function_decides() -> None:
    register(c={"job_starving": lambda j: True}, d={"job_starving": lambda j: True})
    ssn = open_session()
    assert ssn.job_starving(ssn.jobs["ns/j1"]) is True
    register(a={"job_starving": lambda j: False})
    ssn = open_session()
    assert ssn.job_starving(ssn.jobs["ns/j1"]) is False  # tier 1 decides; tier 2 never asked
    register(a={"job_starving": lambda j: True}, b={"job_starving": lambda j: False})
    ssn = open_session()
    assert ssn.job_starving(ssn.jobs["ns/j1"]) is False  # all of the deciding tier must agree
    register(b={"job_starving": lambda j: True}, c={"job_starving": lambda j: False})
    ssn = open_session()
    assert ssn.job_starving(ssn.jobs["ns/j1"]) is True  # tier 1 agrees: tier 2 never asked
    # Switched off, tier 1 has no function: tier 2 decides.
    ssn = open_session(switched_off("job_starving", "a", "b"))
    assert ssn.job_starving(ssn.jobs["ns/j1"]) is False  # c answers false
    register(c={"job_starving": lambda j: True})
    ssn = open_session(switched_off("job_starving", "a", "b"))
    assert ssn.job_starving(ssn.jobs["ns/j1"]) is True


@covers("job_starving")
def test_starving_without_functions_is_false() -> None:
    ssn = open_session()
    assert ssn.job_starving(ssn.jobs["ns/j1"]) is False


# -- overused: any true -----------------------------------------------------------------------------------
@covers("overused")
def test_overused_any_true_wins() -> None:
    ssn = open_session()
    assert ssn.overused(ssn.queues["q1"]) is False  # no function: false
    register(a={"overused": lambda q: False}, d={"overused": lambda q: q.name == "q1"})
    ssn = open_session()
    assert ssn.overused(ssn.queues["q1"]) is True
    assert ssn.overused(ssn.queues["q2"]) is False
    ssn = open_session(switched_off("overused", "d"))
    assert ssn.overused(ssn.queues["q1"]) is False


# -- preemptable / reclaimable: intersect within a tier -----------------------------------------------
EVICTIONS = ("preemptable", "reclaimable")


def _victims(ssn: Session, point: str) -> set[str]:
    t1 = ssn.tasks["ns/j1-0"]
    cands = [ssn.tasks["ns/j2-0"], t1]
    fn = ssn.preemptable if point == "preemptable" else ssn.reclaimable
    return {v.uid for v in fn(t1, cands)}


@covers(*EVICTIONS)
@pytest.mark.parametrize("point", EVICTIONS)
def test_victims_intersect_within_a_tier_first_tier_with_victims_decides(point: str) -> None:
    register(
        a={point: lambda p, c: (c, PERMIT)},
        b={point: lambda p, c: ([c[0]], PERMIT)},
        c={point: lambda p, c: (c, PERMIT)},
    )
    assert _victims(open_session(), point) == {"ns/j2-0"}
    # b switched off: a's victims stand.
    assert _victims(open_session(switched_off(point, "b")), point) == {"ns/j2-0", "ns/j1-0"}


@covers(*EVICTIONS)
@pytest.mark.parametrize("point", EVICTIONS)
def test_victims_empty_answer_empties_the_tier_and_next_tier_decides(point: str) -> None:
    register(
        a={point: lambda p, c: (c, PERMIT)},
        b={point: lambda p, c: ([], PERMIT)},
        d={point: lambda p, c: ([c[1]], PERMIT)},
    )
    assert _victims(open_session(), point) == {"ns/j1-0"}
    # Disjoint answers intersect to nothing: the next tier decides too.
    register(b={point: lambda p, c: ([c[1]], PERMIT)}, a={point: lambda p, c: ([c[0]], PERMIT)})
    assert _victims(open_session(), point) == {"ns/j1-0"}


@covers(*EVICTIONS)
@pytest.mark.parametrize("point", EVICTIONS)
def test_victims_abstaining_plugin_is_skipped(point: str) -> None:
    register(a={point: lambda p, c: ([], ABSTAIN)}, b={point: lambda p, c: ([c[1]], PERMIT)})
    assert _victims(open_session(), point) == {"ns/j1-0"}
    REGISTRATIONS.clear()
    register(a={point: lambda p, c: (c, ABSTAIN)})
    assert _victims(open_session(), point) == set()  # only abstentions: no victims


# -- victim tasks: union within a tier ---------------------------------------------------------------------
def _victim_tasks(ssn: Session) -> set[str]:
    return {v.uid for v in ssn.victim_tasks([ssn.tasks["ns/j1-0"], ssn.tasks["ns/j2-0"]])}


@covers("victim")
def test_victim_tasks_union_within_a_tier_first_tier_with_victims_decides() -> None:
    first, second = (lambda ts: [ts[0]]), (lambda ts: [ts[1]])
    register(a={"victim": [first]}, b={"victim": second}, c={"victim": [first, second]})
    assert _victim_tasks(open_session()) == {"ns/j1-0", "ns/j2-0"}  # a's and b's, united
    REGISTRATIONS.clear()
    register(a={"victim": [first]}, c={"victim": [second]})
    assert _victim_tasks(open_session()) == {"ns/j1-0"}  # tier 1 found victims: tier 2 never asked
    REGISTRATIONS.clear()
    register(a={"victim": [lambda ts: []]}, c={"victim": [second]}, d={"victim": first})
    assert _victim_tasks(open_session()) == {"ns/j1-0", "ns/j2-0"}  # tier 1 found none: tier 2
    assert _victim_tasks(open_session(switched_off("victim", "d"))) == {"ns/j2-0"}
    REGISTRATIONS.clear()
    assert _victim_tasks(open_session()) == set()


# -- hypernodes -------------------------------------------------------------------------------------------
@covers("hypernode_gradient")
def test_hypernode_gradient_first_plugin_with_a_function_answers() -> None:
    ssn = open_session()
    assert ssn.hypernode_gradients(ssn.jobs["ns/j1"]) is None  # no function: unconstrained
    mask = np.array([True])
    register(
        b={"hypernode_gradient": lambda j: [[("hb", mask)]]},
        c={"hypernode_gradient": lambda j: [[("hc", mask)]]},
    )
    ssn = open_session()
    assert ssn.hypernode_gradients(ssn.jobs["ns/j1"]) == [[("hb", mask)]]
    register(a={"hypernode_gradient": lambda j: None})  # the first answer stands, even None
    ssn = open_session()
    assert ssn.hypernode_gradients(ssn.jobs["ns/j1"]) is None
    ssn = open_session(switched_off("hypernode_gradient", "a", "b"))
    assert ssn.hypernode_gradients(ssn.jobs["ns/j1"]) == [[("hc", mask)]]


@covers("hypernode_order")
def test_hypernode_scores_add_up_across_plugins_and_tiers() -> None:
    cands = {"h1": np.array([True]), "h2": np.array([True])}
    register(
        a={"hypernode_order": lambda j, c: {"h1": 1.0}},
        b={"hypernode_order": lambda j, c: {"h1": 2.0, "h2": 5.0}},
        d={"hypernode_order": lambda j, c: {"h2": 0.5}},
    )
    ssn = open_session()
    assert ssn.hypernode_order(ssn.jobs["ns/j1"], cands) == {"h1": 3.0, "h2": 5.5}
    ssn = open_session(switched_off("hypernode_order", "b"))
    assert ssn.hypernode_order(ssn.jobs["ns/j1"], cands) == {"h1": 1.0, "h2": 0.5}
    REGISTRATIONS.clear()
    ssn = open_session()
    assert ssn.hypernode_order(ssn.jobs["ns/j1"], cands) == {"h1": 0.0, "h2": 0.0}


@covers("device_choice")
def test_device_choice_first_plugin_that_answers_decides() -> None:
    from core_helpers import task as make_task

    from server.model import JobSpec, TaskStatus

    def open_gpu_session(config: str = TWO_TIERS) -> tuple[Session, Any]:
        gpu_task = make_task("t", "g", {"cpu": "1", "nvidia.com/gpu": "2"})
        snap = snapshot(
            [node("n1", **{"nvidia.com/gpu": "4"})],
            [JobSpec("ns/g", "g", "ns", "default", [gpu_task])],
        )
        ssn = Session(snap, load_config(config), 1)
        return ssn, ssn.tasks["ns/t"]

    seen: list[list[str]] = []

    def record(t: Any, row: int, res: str, n: int, cands: list[Any]) -> None:
        seen.append([d.id for d in cands])

    ssn, t = open_gpu_session()
    assert ssn.choose_devices(t, 0, TaskStatus.ALLOCATED) == ["0", "1"]  # none answers: lowest ids
    register(
        a={"device_choice": record},
        b={"device_choice": lambda t, r, res, n, c: ["3", "2"]},
        c={"device_choice": lambda t, r, res, n, c: ["0", "1"]},
    )
    ssn, t = open_gpu_session()
    assert ssn.choose_devices(t, 0, TaskStatus.ALLOCATED) == [
        "3",
        "2",
    ]  # a abstains (None), b decides
    assert seen == [["0", "1", "2", "3"]]
    register(b={})
    ssn, t = open_gpu_session()
    assert ssn.choose_devices(t, 0, TaskStatus.ALLOCATED) == ["0", "1"]  # the next tier answers


# -- the table itself ---------------------------------------------------------------------------------------
def test_every_point_has_a_rule_test() -> None:
    assert sorted(set(POINTS) - set(COVERED)) == [], "a point without a rule test"
    assert sorted(set(COVERED) - set(POINTS)) == [], "a rule test for a point not in the table"


def test_register_refuses_an_unknown_point() -> None:
    register(a={"sub_job_order": lambda x, y: 0})
    with pytest.raises(KeyError, match="sub_job_order"):
        open_session()


def test_register_is_typed_per_point_as_the_table_declares() -> None:
    hints = get_type_hints(Session.register)
    row = hints["point"]
    assert get_origin(row) is Point
    assert get_args(row)[0] == hints["fn"]
    for name, p in POINTS.items():  # every row says both of its types
        assert p.name == name
        assert p.signature is not None
        assert len(get_args(vars(p)["__orig_class__"])) == 2
    # The points asked as methods are rows of the table, bound per session; the row on the class.
    asked = {attr: p for attr, p in vars(Session).items() if isinstance(p, Point)}
    assert asked["job_ready"] is JOB_READY
    assert all(POINTS[p.name] is p for p in asked.values())
    ssn = open_session()
    assert all(callable(getattr(ssn, attr)) for attr in asked)
    assert Session.job_ready is JOB_READY


def test_a_verdict_is_its_vote() -> None:
    no = refuse("p", "why")
    assert no == REJECT
    assert no < 0
    assert not no
    assert not no.ok
    assert (no.reason, no.plugin) == ("why", "p")
    assert ALLOWED == PERMIT
    assert ALLOWED
    assert ALLOWED.ok
    assert ALLOWED.reason == ""
    assert Verdict(ABSTAIN)
    assert Verdict(ABSTAIN).ok


def test_a_disabled_switch_removes_the_plugin_from_the_chain() -> None:
    register(a={"job_ready": lambda j: False})
    cfg = TWO_TIERS.replace("{name: a}", "{name: a, enableJobReady: false}")
    ssn = open_session(cfg)
    assert ssn.job_ready(ssn.jobs["ns/j1"]) is True
    assert ssn.chain("job_ready") == [[], []]


def test_disabled_mode_turns_on_only_switches_written_true() -> None:
    register(a={"job_ready": lambda j: False}, b={"job_ready": lambda j: False})
    cfg = (
        TWO_TIERS.replace("{name: a}", "{name: a, enableJobReady: true}")
        + "extension_points_not_listed: disabled\n"
    )
    ssn = open_session(cfg)
    # a is on and fails; b's switch is not written, so b is off.
    assert ssn.job_ready(ssn.jobs["ns/j1"]) is False
    assert [name for name, _ in ssn.chain("job_ready")[0]] == ["a"]


def test_the_config_accepts_exactly_the_declared_switches() -> None:
    assert {s.key: s.name for s in ALL_SWITCHES} == SWITCHES
    assert len({s.name for s in ALL_SWITCHES}) == len(ALL_SWITCHES)
    point_keys = {p.switch.key for p in POINTS.values() if p.switch is not None}
    others = {s.key for s in (*PLUGIN_SWITCHES, *COMPATIBILITY_SWITCHES)}
    assert point_keys.isdisjoint(others)
    assert point_keys | others == set(SWITCHES)
    assert [s.key for s in ALL_SWITCHES if not s.default] == ["enableHierarchy"]


@pytest.mark.parametrize("switch", list(COMPATIBILITY_SWITCHES), ids=lambda s: s.key)
def test_compatibility_switches_change_no_chain(switch: Any) -> None:
    for p in ("a", "b", "c", "d"):
        REGISTRATIONS[p] = {point: (lambda *_: None) for point in POINTS}
        REGISTRATIONS[p]["predicate"] = Predicate("static", lambda t, rows: rows >= 0)
        REGISTRATIONS[p]["node_order"] = Scorer("static", lambda t, rows: np.zeros(len(rows)))
    plain = open_session()
    off = open_session(TWO_TIERS.replace("{name: a}", f"{{name: a, {switch.key}: false}}"))
    assert all(off.chain(p) == plain.chain(p) for p in POINTS)
    assert sum(len(row) for p in POINTS for row in off.chain(p)) == 4 * len(POINTS)


def _generated(marker: str) -> str:
    text = DOCS.read_text()
    m = re.search(rf"<!-- {marker}:begin \(generated\) -->\n(.*?)<!-- {marker}:end -->", text, re.S)
    assert m is not None, f"docs/config.md lacks its {marker} markers"
    return m.group(1)


REGENERATE = "docs/config.md is stale: regenerate it as extension_points.render_docs says"


def test_docs_extension_point_table_is_generated_from_the_code() -> None:
    assert _generated("extension-points") == markdown_table(), REGENERATE


def test_docs_switch_table_is_generated_from_the_code() -> None:
    assert _generated("switches") == switches_markdown_table(), REGENERATE
    assert render_docs(DOCS.read_text()) == DOCS.read_text(), REGENERATE


# -- KAI's points ----------------------------------------------------------------------------------
@covers("queue_jobs_order")
def test_queue_jobs_order_first_non_zero_then_creation_order() -> None:
    seen: list[tuple[Any, ...]] = []
    register(
        a={"queue_jobs_order": lambda *args: seen.append(args) or 0},
        b={"queue_jobs_order": lambda lq, rq, lj, rj, lv, rv: 1 if lq.name == "q1" else -1},
        c={"queue_jobs_order": lambda *args: -1},
    )
    ssn = open_session()
    q1, q2, j1 = ssn.queues["q1"], ssn.queues["q2"], ssn.jobs[f"{NS}/j1"]
    assert ssn.queue_jobs_order(q1, q2, j1, None, [], []) is False  # a ties, b decides (q2 first)
    assert seen
    assert seen[0][2] is j1
    assert seen[0][3] is None
    register(a={}, b={}, c={})
    ssn = open_session()
    assert (
        ssn.queue_jobs_order(ssn.queues["q1"], ssn.queues["q2"], None, None, [], []) is True
    )  # creation order


@covers("job_over_capacity", "non_preemptible_over_quota")
def test_capacity_checks_first_refusal_decides() -> None:
    for point in ("job_over_capacity", "non_preemptible_over_quota"):
        register(
            a={point: lambda j, ts: ALLOWED},
            b={point: lambda j, ts: refuse("b", "queue q1 is full")},
            c={point: lambda j, ts: refuse("c", "never asked")},
        )
        ssn = open_session()
        ask = _reason_of(
            ssn.job_over_capacity
            if point == "job_over_capacity"
            else ssn.non_preemptible_over_quota
        )
        assert ask(ssn.jobs[f"{NS}/j1"], []) == "queue q1 is full"
        register(a={point: lambda j, ts: ALLOWED}, b={}, c={})
        ssn = open_session()
        ask = _reason_of(
            ssn.job_over_capacity
            if point == "job_over_capacity"
            else ssn.non_preemptible_over_quota
        )
        assert ask(ssn.jobs[f"{NS}/j1"], []) == ""


def _reason_of(check: Callable[..., Verdict]) -> Callable[..., str]:
    """The reason of ``check``'s verdict: empty when it allows."""
    return lambda *args: check(*args).reason


@covers("can_reclaim", "reclaim_scenario_valid")
def test_reclaim_checks_all_must_pass() -> None:
    register(
        a={"can_reclaim": lambda j: True, "reclaim_scenario_valid": lambda j, ts, v: True},
        c={
            "can_reclaim": lambda j: j.name == "j1",
            "reclaim_scenario_valid": lambda j, ts, v: len(v) < 2,
        },
    )
    ssn = open_session()
    j1, j2 = ssn.jobs[f"{NS}/j1"], ssn.jobs[f"{NS}/j2"]
    assert ssn.can_reclaim(j1)
    assert not ssn.can_reclaim(j2)
    assert ssn.reclaim_scenario_valid(j1, [], [])
    assert not ssn.reclaim_scenario_valid(j1, [], list(ssn.tasks.values()) * 2)


@covers("solution_start")
def test_solution_start_calls_every_plugin() -> None:
    calls: list[str] = []
    register(
        a={"solution_start": lambda: calls.append("a")},
        d={"solution_start": lambda: calls.append("d")},
    )
    open_session().solution_start()
    assert calls == ["a", "d"]


@covers("gpu_order")
def test_gpu_order_scores_add_up() -> None:
    register(
        a={"gpu_order": lambda t, row, g: 1.5}, c={"gpu_order": lambda t, row, g: 2.0 if g else 0.0}
    )
    ssn = open_session()
    t = next(iter(ssn.tasks.values()))
    assert ssn.gpu_order(t, 0, "g1") == 3.5
    assert ssn.gpu_order(t, 0, "") == 1.5


@covers("node_sets")
def test_node_sets_first_plugin_that_answers_decides() -> None:
    mask = np.array([True])
    register(
        a={"node_sets": lambda j, ts: None},
        b={"node_sets": lambda j, ts: [mask]},
        c={"node_sets": lambda j, ts: []},
    )
    ssn = open_session()
    assert ssn.node_sets(ssn.jobs[f"{NS}/j1"], []) == [mask]  # a abstains, b decides, c never asked
    register(a={}, b={}, c={})
    ssn = open_session()
    assert ssn.node_sets(ssn.jobs[f"{NS}/j1"], []) is None
