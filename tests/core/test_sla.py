"""sla plugin: behaviour of Volcano's plugins/sla (sla.go, sla_test.go)."""

from __future__ import annotations

import pytest

from server.config import load_config
from server.model import ClusterSnapshot, JobSpec, NodeSpec, PodGroupPhase, QueueSpec, TaskSpec
from server.plugins import sla
from server.scheduler import SchedulerCore
from server.session.session import Session

NOW = 1_000_000.0


def job(name: str, *, created: float | None = NOW, annotations: dict[str, str] | None = None,
        cpu: float = 1000, n: int = 1, min_resources: dict[str, float] | None = None,
        phase: PodGroupPhase = PodGroupPhase.PENDING, index: int = 0) -> JobSpec:
    tasks = [TaskSpec(uid=f"ns/{name}-{i}", name=f"{name}-{i}", namespace="ns", job=f"ns/{name}",
                      request={"cpu": cpu}) for i in range(n)]
    return JobSpec(uid=f"ns/{name}", name=name, namespace="ns", queue="q", tasks=tasks,
                   annotations=annotations or {}, created_at=created, min_resources=min_resources,
                   phase=phase, creation_index=index)


def snapshot(*jobs: JobSpec, cpu: float = 4000) -> ClusterSnapshot:
    return ClusterSnapshot(nodes=[NodeSpec("n1", {"cpu": cpu, "memory": 8e9, "pods": 110})],
                           queues=[QueueSpec("q")], jobs=list(jobs))


def session(snap: ClusterSnapshot, arguments: str = "") -> Session:
    cfg = load_config(f"""
extension_points_not_listed: disabled
tiers:
- plugins:
  - name: sla
    enableJobOrder: true
    enableJobEnqueued: true
    enableJobPipelined: true
    {arguments}
""")
    return Session(snap, cfg)


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sla, "now", lambda: NOW)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("3m", 180.0), ("1h2m3s4ms5us6ns", 3723.004005006), ("1.5h", 5400.0), ("0", 0.0), ("-2s", -2.0),
     ("300ms", 0.3), ("2µs", 2e-6)],
)
def test_go_durations_parse_like_time_ParseDuration(text: str, seconds: float) -> None:
    assert sla.parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "3", "1x", "h", "1h 2m", "."])
def test_malformed_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        sla.parse_go_duration(text)


def test_global_waiting_time_orders_jobs_with_sla_first() -> None:
    """sla_test.go "sla normal placement": with sla-waiting-time 3m, a job without its own
    waiting time (global applies) vs one with an annotation: the earlier deadline goes first."""
    a = job("a", created=NOW - 100)  # deadline NOW + 80 (global 3m)
    b = job("b", created=NOW - 100, annotations={"sla-waiting-time": "10m"})  # deadline NOW + 500
    ssn = session(snapshot(a, b), "arguments: {sla-waiting-time: 3m}")
    ja, jb = ssn.jobs["ns/a"], ssn.jobs["ns/b"]
    assert ssn.job_order_fn(ja, jb) is True
    assert ssn.job_order_fn(jb, ja) is False


def test_job_with_waiting_time_precedes_job_without() -> None:
    """sla jobOrderFn: a nil waiting time sorts after any set one (no global argument)."""
    plain = job("plain", created=NOW - 9999, index=0)
    timed = job("timed", annotations={"volcano.sh/sla-waiting-time": "1h"}, index=1)
    ssn = session(snapshot(plain, timed))
    assert ssn.job_order_fn(ssn.jobs["ns/timed"], ssn.jobs["ns/plain"]) is True
    assert ssn.job_order_fn(ssn.jobs["ns/plain"], ssn.jobs["ns/timed"]) is False


def test_invalid_global_argument_is_ignored() -> None:
    """sla_test.go "sla error type placement": a non-string waiting time sets no SLA, so job order
    falls back to creation order and the job stays enqueueable (abstain -> permit)."""
    late = job("late", created=NOW - 9999, index=1)
    early = job("early", index=0)
    ssn = session(snapshot(late, early), "arguments: {sla-waiting-time: 1}")
    assert ssn.job_order_fn(ssn.jobs["ns/early"], ssn.jobs["ns/late"]) is True
    assert ssn.job_enqueueable(ssn.jobs["ns/late"]) is True


def test_overdue_job_permits_enqueue_and_pipeline_votes() -> None:
    """permitableFn: waited longer than its waiting time -> Permit, else Abstain."""
    overdue = job("over", created=NOW - 120, annotations={"sla-waiting-time": "1m"})
    fresh = job("fresh", created=NOW - 10, annotations={"sla-waiting-time": "1m"})
    ssn = session(snapshot(overdue, fresh))
    fns = dict(ssn.chain("job_enqueueable")[0])
    assert fns["sla"](ssn.jobs["ns/over"]) == 1
    assert fns["sla"](ssn.jobs["ns/fresh"]) == 0
    assert dict(ssn.chain("job_pipelined")[0])["sla"](ssn.jobs["ns/over"]) == 1


def test_invalid_annotation_falls_back_to_global() -> None:
    """An unparsable or non-positive job annotation means "no job setting": the global applies."""
    j = job("j", created=NOW - 120, annotations={"sla-waiting-time": "-5m"})
    ssn = session(snapshot(j), "arguments: {sla-waiting-time: 1m}")
    assert dict(ssn.chain("job_enqueueable")[0])["sla"](ssn.jobs["ns/j"]) == 1


def test_overdue_job_is_enqueued_past_the_proportion_quota() -> None:
    """An overdue job's permit in an earlier tier ends the enqueue vote before proportion's
    reject (Volcano JobEnqueueable: a permit ends the check at the end of its tier)."""
    big = job("big", created=NOW - 3600, annotations={"sla-waiting-time": "1m"}, cpu=8000,
              min_resources={"cpu": 8000})
    cfg_text = """
actions: "enqueue"
tiers:
- plugins:
  - name: sla
- plugins:
  - name: proportion
"""
    result = SchedulerCore(load_config(cfg_text)).run_cycle(snapshot(big), 1)
    assert result.jobs["ns/big"].phase == PodGroupPhase.INQUEUE
    no_sla = cfg_text.replace("  - name: sla\n", "  - name: priority\n")
    result = SchedulerCore(load_config(no_sla)).run_cycle(snapshot(big), 1)
    assert result.jobs["ns/big"].phase == PodGroupPhase.PENDING
