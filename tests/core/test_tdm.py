"""tdm plugin: behaviour of Volcano's plugins/tdm (tdm.go, tdm_test.go)."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pytest
from core_helpers import config, job, node, plugin, queue, res, session, snapshot, task

from server.model import JobSpec, NodeSpec, PodGroupPhase, TaskSpec, TaskStatus
from server.plugins.volcano import tdm
from server.session.session import Session

NOON = datetime(2026, 3, 10, 12, 0, 0)


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tdm, "now", lambda: NOON)
    monkeypatch.setitem(tdm._last_evict_at, "at", None)


def zone_node(name: str, zone: str = "") -> NodeSpec:
    """A node, in revocable zone ``zone`` if given."""
    labels = {"volcano.sh/revocable-zone": zone} if zone else {}
    return node(name, "16", "64G", pods=10, labels=labels)


def tdm_task(
    name: str,
    job_name: str,
    *,
    annotations: dict[str, str] | None = None,
    node: str | None = None,
    status: TaskStatus = TaskStatus.PENDING,
    uid: str | None = None,
) -> TaskSpec:
    return task(
        name,
        job_name,
        res("1", "1G"),
        node,
        ns="c1",
        status=status,
        uid=uid,
        annotations=annotations or {},
    )


def tdm_job(
    name: str, tasks: list[TaskSpec], annotations: dict[str, str] | None = None, queue: str = "c1"
) -> JobSpec:
    return job(
        name,
        ns="c1",
        queue=queue,
        tasks=tasks,
        min_member=1,
        phase=PodGroupPhase.PENDING,
        annotations=annotations or {},
    )


def tdm_session(
    nodes: list[NodeSpec], jobs: list[JobSpec], arguments: dict[str, str], *switches: str
) -> Session:
    tier = [plugin("tdm", *switches, arguments=arguments)]
    return session(snapshot(nodes, jobs, [queue("c1"), queue("c2")]), config(None, [tier]))


@pytest.mark.parametrize(
    ("raw", "delta", "error"),
    [
        ("00:00_01:00", 0, "revocable zone 00:00_01:00 format error"),
        ("00:00-01:00", 3600, None),
        ("0:00-23:59", 23 * 3600 + 59 * 60, None),
        ("0:00", 0, "revocable zone 0:00 format error"),
        ("1:00-0:00", 23 * 3600, None),
        ("1:0-0:0", 0, "cannot parse '1:0' as 15:04"),
        ("   1:00-0:00    ", 23 * 3600, None),
        ("23:59-23:59", 24 * 3600, None),
        ("63:59-23:59", 0, "cannot parse '63:59' as 15:04"),
    ],
)
def test_parse_revocable_zone_window(raw: str, delta: int, error: str | None) -> None:
    """tdm_test.go Test_parseRevocableZone: the same table of windows and format errors."""
    if error is not None:
        with pytest.raises(ValueError, match=error):
            tdm.parse_revocable_zone(raw, NOON)
        return
    start, end = tdm.parse_revocable_zone(raw, NOON)
    assert (end - start).total_seconds() == delta


ZONES = {"tdm.revocable-zone.rz1": "0:00-0:00", "tdm.revocable-zone.rz2": "0:00-0:01"}
NODES = [
    zone_node("n1", "rz1"),
    zone_node("n2", "rz1"),
    zone_node("n3"),
    zone_node("n4"),
    zone_node("n5", "rz2"),
]


@pytest.mark.parametrize(
    ("annotations", "passing", "scores"),
    [
        # "preemptable task rz available": rz1 is a 24h window, rz2 is inactive at noon.
        ({"volcano.sh/revocable-zone": "*"}, ["n1", "n2", "n3", "n4"], [100, 100, 0, 0]),
        # "not preemptable task": no revocable node at all.
        ({}, ["n3", "n4"], [0, 0]),
        # a task whose preemptable annotation is true may use revocable nodes too.
        ({"volcano.sh/preemptable": "true"}, ["n1", "n2", "n3", "n4"], [100, 100, 0, 0]),
        # a revocable-zone value other than "*" means none.
        ({"volcano.sh/revocable-zone": "rz1"}, ["n3", "n4"], [0, 0]),
    ],
)
def test_predicate_and_node_order(
    annotations: dict[str, str], passing: list[str], scores: list[float]
) -> None:
    """tdm_test.go Test_TDM: revocable nodes pass only in an active zone and only for tasks that
    may use them; such nodes score MaxNodeScore."""
    ssn = tdm_session(
        NODES,
        [tdm_job("pg1", [tdm_task("p1", "pg1", annotations=annotations)])],
        ZONES,
        "enablePredicate",
        "enableNodeOrder",
    )
    t = ssn.tasks["c1/p1"]
    future_ok, _ = ssn.evaluator.feasible(t)
    names = [ssn.nodes.names[i] for i in np.nonzero(future_ok)[0]]
    assert names == passing
    rows = np.array([ssn.nodes.index[n] for n in passing])
    assert list(ssn.evaluator.scores(t, rows)) == scores


def test_fit_errors_name_the_zone() -> None:
    ssn = tdm_session(
        [zone_node("n5", "rz2")],
        [tdm_job("pg1", [tdm_task("p1", "pg1", annotations={"volcano.sh/revocable-zone": "*"})])],
        ZONES,
        "enablePredicate",
    )
    fe = ssn.evaluator.fit_errors(ssn.tasks["c1/p1"])
    assert fe.reasons == {"current time beyond revocable zone rz2:0:00-0:01": 1}


def running_job(
    name: str, queue: str, node_name: str, preemptable: list[bool], budget: dict[str, str]
) -> JobSpec:
    tasks = [
        tdm_task(
            f"{name}-p{i}",
            name,
            node=node_name,
            status=TaskStatus.RUNNING,
            uid=f"{queue}/{name}-p{i}",
            annotations={"volcano.sh/preemptable": "true" if p else "false"},
        )
        for i, p in enumerate(preemptable)
    ]
    return tdm_job(name, tasks, budget, queue=queue)


@pytest.mark.parametrize(
    ("zone", "budget", "evicted"),
    [
        ("0:00-0:01", {"volcano.sh/jdb-max-unavailable": "30%"}, 2),  # ceil(30% of 5) = 2
        ("0:00-0:00", {"volcano.sh/jdb-max-unavailable": "30%"}, 0),  # zone active: nothing to do
        ("0:00-0:01", {"volcano.sh/jdb-max-unavailable": "99%"}, 3),  # only 3 are preemptable
        ("0:00-0:01", {}, 1),  # no budget: one task per job
    ],
)
def test_victims_of_an_inactive_zone_follow_the_budget(
    zone: str, budget: dict[str, str], evicted: int
) -> None:
    """tdm_test.go Test_TDM_victimsFn: preemptable Running tasks on an inactive zone's nodes, at most
    the job's disruption budget."""
    j = running_job("pg1", "c1", "n1", [True, True, True, False, False], budget)
    ssn = tdm_session(
        [zone_node("n1", "rz1")],
        [j],
        {"tdm.revocable-zone.rz1": zone, "tdm.evict.period": "100ms"},
        "enabledVictim",
    )
    victims = ssn.victim_tasks([])
    assert len(victims) == evicted
    assert all(v.spec.annotations["volcano.sh/preemptable"] == "true" for v in victims)


@pytest.mark.parametrize(
    ("budget", "evicted"),
    [
        ({"volcano.sh/jdb-max-unavailable": "50%"}, 3),
        ({"volcano.sh/jdb-max-unavailable": "3"}, 3),
        ({"volcano.sh/jdb-min-available": "3"}, 2),
    ],
)
def test_budget_forms(budget: dict[str, str], evicted: int) -> None:
    """tdm_test.go: max-unavailable 50% / 3 and min-available 3 of 5 running tasks."""
    j = running_job("pg2", "c2", "n2", [True] * 5, budget)
    ssn = tdm_session(
        [zone_node("n2", "rz1")],
        [j],
        {"tdm.revocable-zone.rz1": "0:00-0:01", "tdm.evict.period": "1s"},
        "enabledVictim",
    )
    assert len(ssn.victim_tasks([])) == evicted


def test_victims_are_rate_limited_by_evict_period(monkeypatch: pytest.MonkeyPatch) -> None:
    """victimsFn returns nothing until tdm.evict.period has passed since the last round."""
    j = running_job("pg2", "c2", "n2", [True] * 5, {})
    args = {"tdm.revocable-zone.rz1": "0:00-0:01", "tdm.evict.period": "1m"}
    ssn = tdm_session([zone_node("n2", "rz1")], [j], args, "enabledVictim")
    assert len(ssn.victim_tasks([])) == 1
    assert ssn.victim_tasks([]) == []
    monkeypatch.setattr(tdm, "now", lambda: NOON.replace(minute=2))
    ssn = tdm_session([zone_node("n2", "rz1")], [j], args, "enabledVictim")
    assert len(ssn.victim_tasks([])) == 1


def test_preemptable_fn() -> None:
    """preemptableFn: a preemptable preemptor is rejected; otherwise preemptable Running tasks on
    non-revocable nodes, within the budget of each job."""
    victims_job = running_job(
        "v", "c1", "n3", [True, True, False], {"volcano.sh/jdb-max-unavailable": "2"}
    )
    on_revocable = running_job("r", "c1", "n1", [True], {})
    preemptor_job = tdm_job(
        "pre", [tdm_task("pre", "pre", annotations={"volcano.sh/preemptable": "false"})]
    )
    bad = tdm_job("bad", [tdm_task("bad", "bad")])  # preemptable by default
    ssn = tdm_session(
        [zone_node("n1", "rz1"), zone_node("n3")],
        [victims_job, on_revocable, preemptor_job, bad],
        ZONES,
        "enablePreemptable",
    )
    fn = dict(ssn.chain("preemptable")[0])["tdm"]
    candidates = [t for j in (victims_job, on_revocable) for t in ssn.jobs[j.uid].tasks.values()]
    chosen, verdict = fn(ssn.tasks["c1/pre"], candidates)
    assert verdict == 1
    assert sorted(t.name for t in chosen) == ["v-p0", "v-p1"]
    chosen, verdict = fn(ssn.tasks["c1/bad"], candidates)
    assert verdict == -1
    assert chosen == []


def test_job_order_pipelined_and_starving() -> None:
    """jobOrderFn: non-preemptable jobs first; jobStarvingFn: non-preemptable with pending tasks."""
    plain = tdm_job("plain", [tdm_task("a", "plain")])
    elastic = tdm_job("elastic", [tdm_task("b", "elastic")], {"volcano.sh/preemptable": "true"})
    ssn = tdm_session(
        [zone_node("n3")],
        [plain, elastic],
        ZONES,
        "enableJobOrder",
        "enableJobStarving",
        "enableJobPipelined",
    )
    p, e = ssn.jobs["c1/plain"], ssn.jobs["c1/elastic"]
    assert ssn.job_order_fn(p, e) is True
    assert ssn.job_order_fn(e, p) is False
    assert ssn.job_starving(p) is True
    assert ssn.job_starving(e) is False
    assert ssn.job_pipelined(p) is False  # nothing placed: reject
