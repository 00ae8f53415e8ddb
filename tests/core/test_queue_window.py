"""The queue window (issue 29, server/session/window.py): with ``maxQueueLookback`` L a session
opens every job that holds something and the first L whole-waiting jobs of each queue.

* On random clusters (hypothesis), where every waiting job is admitted and valid, a windowed cycle
  makes exactly the decisions of a cycle that opens every job (allocate's own lookback then stops
  at the same jobs), gives the opened jobs the same outcomes, and the share plugins the same
  deserved shares: the jobs past the window still ask through their queue.
* The window opens the jobs allocate would take first: priority, gang readiness, creation order.
* Configurations whose job order a spec does not tell (sla, hierarchical drf, KAI) open every job.
* What is past the window is reported per queue.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from core_helpers import job, node, queue, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_shape_classes import CONFIGS, clusters, decisions, run, with_session

import server.scheduler
from server.config import DEFAULT_CONFIG_YAML, load_config
from server.model import (
    BeyondWindow,
    ClusterSnapshot,
    CycleResult,
    PodGroupPhase,
    TaskStatus,
    WaitingSummary,
    Window,
)
from server.session.window import open_window, summarize


def allocate_only(config_yaml: str) -> str:
    """The configuration with one action, allocate: the one a window may not change."""
    return re.sub(r"(?m)^actions: .*$", 'actions: "allocate"', config_yaml)


# Volcano's defaults, capacity's tiers, and the orders drf, gang, priority.
ALLOCATE_CONFIGS = {
    "default": allocate_only(DEFAULT_CONFIG_YAML),
    "capacity": allocate_only(CONFIGS["capacity"]),
    "drf-gang-priority": allocate_only(
        DEFAULT_CONFIG_YAML.replace("  - name: drf\n", "").replace(
            "  - name: priority\n  - name: gang\n",
            "  - name: drf\n  - name: gang\n  - name: priority\n",
        )
    ),
}


def full_run(
    snap: ClusterSnapshot, config_yaml: str, monkeypatch: pytest.MonkeyPatch
) -> CycleResult:
    """The cycle with every job opened (no window)."""
    with monkeypatch.context() as m:
        m.setattr(server.scheduler, "open_window", lambda s, c: (s, Window()))
        return run(snap, config_yaml)


def admitted(snap: ClusterSnapshot) -> ClusterSnapshot:
    return dataclasses.replace(
        snap, jobs=[dataclasses.replace(j, phase=PodGroupPhase.INQUEUE) for j in snap.jobs]
    )


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(clusters(), st.sampled_from(sorted(ALLOCATE_CONFIGS)), st.integers(1, 4))
def test_a_window_decides_as_the_whole_queue_does(
    snap: ClusterSnapshot, tiers: str, lookback: int
) -> None:
    snap = admitted(snap)
    config = with_session(ALLOCATE_CONFIGS[tiers], maxQueueLookback=lookback)
    with pytest.MonkeyPatch.context() as mp:
        full = full_run(snap, config, mp)
    windowed = run(snap, config)
    hidden = set(full.jobs) - set(windowed.jobs)
    # The jobs past the window are not in the session: no status of their tasks is reported.
    assert not any(uid.rsplit("-", 1)[0] in hidden for uid in windowed.task_status)
    full.task_status = {
        uid: s for uid, s in full.task_status.items() if uid.rsplit("-", 1)[0] not in hidden
    }
    assert decisions(windowed) == decisions(full)
    assert windowed.queue_deserved == full.queue_deserved
    for uid, outcome in windowed.jobs.items():
        assert outcome == full.jobs[uid], uid
    assert sum(b.jobs for b in windowed.beyond_window.values()) == len(hidden)


def test_the_property_is_not_vacuous() -> None:
    """Deep queues leave jobs past the window, and they change the deserved share."""
    nodes = [node(f"n{i}", cpu="4", memory="8Gi") for i in range(2)]
    jobs = [job(f"a{i}", cpu="1", memory="1Gi", queue="qa", index=i) for i in range(12)]
    jobs += [job(f"b{i}", cpu="1", memory="1Gi", queue="qb", index=20 + i) for i in range(2)]
    snap = snapshot(nodes, jobs, queues=[queue("qa"), queue("qb")])
    config = with_session(DEFAULT_CONFIG_YAML, maxQueueLookback=2)
    result = run(snap, config)
    assert result.beyond_window == {"qa": BeyondWindow(2, 10, "ns/a2")}
    # qa asks 12 cpu in all: its deserved share is what the whole queue asks allows, not 2 cpu.
    assert result.queue_deserved["qa"]["cpu"] > 2000
    opened, _ = open_window(snap, load_config(config))
    assert [j.uid for j in opened.jobs] == ["ns/a0", "ns/a1", "ns/b0", "ns/b1"]


def test_the_window_takes_jobs_in_allocate_order() -> None:
    """Higher priority first, then jobs not yet ready (gang), then creation order."""
    jobs = [
        job("old", queue="q", index=0),
        job("ready", queue="q", index=1, min_member=0),
        job("urgent", queue="q", index=2, priority=9),
        job("young", queue="q", index=3),
    ]
    snap = snapshot([node("n0", cpu="1", memory="1Gi")], jobs, queues=[queue("q")])
    config = load_config(with_session(DEFAULT_CONFIG_YAML, maxQueueLookback=3))
    opened, window = open_window(snap, config)
    assert [j.uid for j in opened.jobs] == ["ns/old", "ns/urgent", "ns/young"]
    assert window.beyond["q"].first == "ns/ready"
    assert window.beyond["q"].jobs == 1


def test_jobs_holding_resources_are_always_opened() -> None:
    running = job("running", queue="q", index=5, status=TaskStatus.RUNNING, nodes="n0")
    waiting = [job(f"w{i}", queue="q", index=i) for i in range(4)]
    snap = snapshot([node("n0", cpu="8", memory="8Gi")], [*waiting, running], queues=[queue("q")])
    opened, window = open_window(
        snap, load_config(with_session(DEFAULT_CONFIG_YAML, maxQueueLookback=1))
    )
    assert [j.uid for j in opened.jobs] == ["ns/w0", "ns/running"]
    assert window.beyond["q"].jobs == 3
    assert window.beyond["q"].request == {"cpu": 3000.0, "memory": 3 * 2.0**30}


@pytest.mark.parametrize(
    "extra",
    [
        "- plugins:\n  - name: sla\n",
        "- plugins:\n  - name: drf\n    enableHierarchy: true\n",
    ],
)
def test_orders_a_spec_does_not_tell_open_every_job(extra: str) -> None:
    jobs = [job(f"a{i}", queue="q", index=i) for i in range(5)]
    snap = snapshot([node("n0", cpu="8", memory="8Gi")], jobs, queues=[queue("q")])
    config = load_config(with_session(DEFAULT_CONFIG_YAML + extra, maxQueueLookback=1))
    opened, window = open_window(snap, config)
    assert opened is snap
    assert window.beyond == {}
    # allocate's own lookback still bounds what it tries, and says so in each job
    result = server.scheduler.SchedulerCore(config).run_cycle(snap, 1)
    assert result.beyond_window == {}
    assert "maxQueueLookback" in str(result.jobs["ns/a3"].explanation)


def test_kai_profile_opens_every_job() -> None:
    config = load_config(
        "profile: kai\nactions: allocate\ntiers:\n- plugins:\n  - name: proportion\n"
        "session: {maxQueueLookback: 1}\n"
    )
    jobs = [job(f"a{i}", queue="q", index=i) for i in range(3)]
    snap = snapshot([node("n0", cpu="8", memory="8Gi")], jobs, queues=[queue("q")])
    opened, window = open_window(snap, config)
    assert opened is snap
    assert window.beyond == {}


def test_the_window_knows_every_plugin_that_orders_jobs() -> None:
    """SPEC_ORDERED and ORDERED_OTHERWISE are exactly the Volcano-profile plugins that register a
    job order: a new one must say whether a spec tells its order of waiting jobs."""
    from server.plugins import PLUGINS
    from server.session.session import Session
    from server.session.window import ORDERED_OTHERWISE, SPEC_ORDERED

    ordering = set()
    snap = snapshot([node("n0")], [job("a", queue="q")], queues=[queue("q")])
    for name in PLUGINS:
        ssn = Session(
            snap, load_config(f"actions: allocate\ntiers:\n- plugins:\n  - name: {name}\n")
        )
        try:
            if any(ssn._fns["job_order"].values()):
                ordering.add(name)
        finally:
            ssn.release()
    # TY-Arranger registers its order only when a TYJob is in the session (none here).
    assert ordering == (SPEC_ORDERED | ORDERED_OTHERWISE) - {"tyarranger"}


@settings(max_examples=60, deadline=None, derandomize=True)
@given(clusters(), st.integers(1, 3))
def test_a_summary_made_once_decides_as_one_made_by_the_cycle(
    snap: ClusterSnapshot, lookback: int
) -> None:
    """The server's copies carry each job's WaitingSummary; scenarios do not: the same cycle."""
    snap = admitted(snap)
    summarised = dataclasses.replace(
        snap, jobs=[dataclasses.replace(j, waiting=summarize(j.tasks)) for j in snap.jobs]
    )
    config = with_session(DEFAULT_CONFIG_YAML, maxQueueLookback=lookback)
    plain, made = run(snap, config), run(summarised, config)
    assert decisions(made) == decisions(plain)
    assert made.beyond_window == plain.beyond_window
    assert made.queue_deserved == plain.queue_deserved


def test_summaries_say_who_waits_whole() -> None:
    waiting = job("w", n=2, queue="q")
    holding = job("h", n=2, queue="q", status=[TaskStatus.PENDING, TaskStatus.RUNNING], nodes="n0")
    best_effort_only = job("b", n=2, cpu=None, memory=None, queue="q")
    assert summarize(waiting.tasks) == WaitingSummary(0, {"cpu": 2000.0, "memory": 2 * 2.0**30})
    assert summarize(holding.tasks).best_effort == -1
    assert summarize(best_effort_only.tasks).best_effort == -1
