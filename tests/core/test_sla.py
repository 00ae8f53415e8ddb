"""sla plugin: behaviour of Volcano's plugins/sla (sla.go, sla_test.go)."""

from __future__ import annotations

import re

import pytest
from core_helpers import config, cycle, job, node, plugin, queue, session, snapshot

from server.model import ClusterSnapshot, JobSpec, PodGroupPhase
from server.plugins.volcano import sla
from server.session.session import Session

NOW = 1_000_000.0


def sla_job(
    name: str,
    *,
    created: float | None = NOW,
    annotations: dict[str, str] | None = None,
    cpu: str = "1",
    min_resources: dict[str, str] | None = None,
    index: int = 0,
) -> JobSpec:
    """A Pending job of one task asking for ``cpu``, submitted at ``created``."""
    return job(
        name,
        cpu=cpu,
        memory=None,
        queue="q",
        min_member=None,
        phase=PodGroupPhase.PENDING,
        index=index,
        task_index=0,
        annotations=annotations or {},
        created_at=created,
        min_resources=min_resources,
    )


def sla_snapshot(*jobs: JobSpec) -> ClusterSnapshot:
    return snapshot([node("n1", "4", "8G", pods=110)], jobs, [queue("q")])


def sla_session(snap: ClusterSnapshot, **arguments: object) -> Session:
    tier = [
        plugin(
            "sla", "enableJobOrder", "enableJobEnqueued", "enableJobPipelined", arguments=arguments
        )
    ]
    return session(snap, config(None, [tier]))


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sla, "now", lambda: NOW)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("3m", 180.0),
        ("1h2m3s4ms5us6ns", 3723.004005006),
        ("1.5h", 5400.0),
        ("0", 0.0),
        ("-2s", -2.0),
        ("300ms", 0.3),
        ("2µs", 2e-6),
    ],
)
def test_go_durations_parse_like_time_ParseDuration(text: str, seconds: float) -> None:
    assert sla.parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "3", "1x", "h", "1h 2m", "."])
def test_malformed_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match=f"^invalid duration {re.escape(repr(text))}$"):
        sla.parse_go_duration(text)


def test_global_waiting_time_orders_jobs_with_sla_first() -> None:
    """sla_test.go "sla normal placement": with sla-waiting-time 3m, a job without its own
    waiting time (global applies) vs one with an annotation: the earlier deadline goes first."""
    a = sla_job("a", created=NOW - 100)  # deadline NOW + 80 (global 3m)
    b = sla_job(
        "b", created=NOW - 100, annotations={"sla-waiting-time": "10m"}
    )  # deadline NOW + 500
    ssn = sla_session(sla_snapshot(a, b), **{"sla-waiting-time": "3m"})
    ja, jb = ssn.jobs["ns/a"], ssn.jobs["ns/b"]
    assert ssn.job_order_fn(ja, jb) is True
    assert ssn.job_order_fn(jb, ja) is False


def test_job_with_waiting_time_precedes_job_without() -> None:
    """sla jobOrderFn: a nil waiting time sorts after any set one (no global argument)."""
    plain = sla_job("plain", created=NOW - 9999, index=0)
    timed = sla_job("timed", annotations={"volcano.sh/sla-waiting-time": "1h"}, index=1)
    ssn = sla_session(sla_snapshot(plain, timed))
    assert ssn.job_order_fn(ssn.jobs["ns/timed"], ssn.jobs["ns/plain"]) is True
    assert ssn.job_order_fn(ssn.jobs["ns/plain"], ssn.jobs["ns/timed"]) is False


def test_invalid_global_argument_is_ignored() -> None:
    """sla_test.go "sla error type placement": a non-string waiting time sets no SLA, so job order
    falls back to creation order and the job stays enqueueable (abstain -> permit)."""
    late = sla_job("late", created=NOW - 9999, index=1)
    early = sla_job("early", index=0)
    ssn = sla_session(sla_snapshot(late, early), **{"sla-waiting-time": 1})
    assert ssn.job_order_fn(ssn.jobs["ns/early"], ssn.jobs["ns/late"]) is True
    assert ssn.job_enqueueable(ssn.jobs["ns/late"]) is True


def test_overdue_job_permits_enqueue_and_pipeline_votes() -> None:
    """permitableFn: waited longer than its waiting time -> Permit, else Abstain."""
    overdue = sla_job("over", created=NOW - 120, annotations={"sla-waiting-time": "1m"})
    fresh = sla_job("fresh", created=NOW - 10, annotations={"sla-waiting-time": "1m"})
    ssn = sla_session(sla_snapshot(overdue, fresh))
    fns = dict(ssn.chain("job_enqueueable")[0])
    assert fns["sla"](ssn.jobs["ns/over"]) == 1
    assert fns["sla"](ssn.jobs["ns/fresh"]) == 0
    assert dict(ssn.chain("job_pipelined")[0])["sla"](ssn.jobs["ns/over"]) == 1


def test_invalid_annotation_falls_back_to_global() -> None:
    """An unparsable or non-positive job annotation means "no job setting": the global applies."""
    j = sla_job("j", created=NOW - 120, annotations={"sla-waiting-time": "-5m"})
    ssn = sla_session(sla_snapshot(j), **{"sla-waiting-time": "1m"})
    assert dict(ssn.chain("job_enqueueable")[0])["sla"](ssn.jobs["ns/j"]) == 1


def test_overdue_job_is_enqueued_past_the_proportion_quota() -> None:
    """An overdue job's permit in an earlier tier ends the enqueue vote before proportion's
    reject (Volcano JobEnqueueable: a permit ends the check at the end of its tier)."""
    big = sla_job(
        "big",
        created=NOW - 3600,
        annotations={"sla-waiting-time": "1m"},
        cpu="8",
        min_resources={"cpu": "8"},
    )
    cfg_text = """
actions: "enqueue"
tiers:
- plugins:
  - name: sla
- plugins:
  - name: proportion
"""
    result = cycle(sla_snapshot(big), cfg_text)
    assert result.jobs["ns/big"].phase == PodGroupPhase.INQUEUE
    no_sla = cfg_text.replace("  - name: sla\n", "  - name: priority\n")
    result = cycle(sla_snapshot(big), no_sla)
    assert result.jobs["ns/big"].phase == PodGroupPhase.PENDING
