"""overcommit plugin: Volcano's plugins/overcommit/overcommit_test.go (``TestOvercommitPlugin``),
run the way that test does (job_enqueued, then job_enqueueable, for every job of the session), and
the inqueue accounting of overcommit.go."""

from __future__ import annotations

import textwrap

import pytest

from muster.quantity import parse_resources
from server.config import load_config
from server.model import (
    ClusterSnapshot,
    JobSpec,
    NodeSpec,
    PodGroupPhase,
    QueueSpec,
    TaskSpec,
    TaskStatus,
)
from server.session.session import Session
from server.simulate import simulate_text

NODES = [NodeSpec("n1", parse_resources({"cpu": "2", "memory": "4Gi"})),
         NodeSpec("n2", parse_resources({"cpu": "4", "memory": "16Gi"}))]
HUGE = parse_resources({"cpu": "20000m", "memory": "20G"})
NORMAL = parse_resources({"cpu": "2000m", "memory": "2G"})


def _config(factor: float) -> str:
    return f"""
extension_points_not_listed: disabled
tiers:
- plugins:
  - {{name: overcommit, enableJobEnqueued: true, arguments: {{overcommit-factor: {factor}}}}}
"""


def _pg(min_resources: dict[str, float] | None) -> JobSpec:
    return JobSpec(uid="test-namespace/pg", name="pg", namespace="test-namespace", queue="c1", tasks=[],
                   min_member=2, min_resources=min_resources, phase=PodGroupPhase.INQUEUE)


@pytest.mark.parametrize(
    ("name", "factor", "min_resources", "expected"),
    [
        ("overCommitFactor is more than 0", 1.2, NORMAL, True),
        ("overCommitFactor is less than 0", 0.8, NORMAL, True),  # below 1 falls back to 1.2
        ("when the required resources of pg are too large", 1.2, HUGE, False),
        ("when pg does not fill MinResources", 1.2, None, True),
    ],
)
def test_overcommit_enqueueable(name: str, factor: float, min_resources: dict[str, float] | None,
                                expected: bool) -> None:
    """TestOvercommitPlugin: each case calls JobEnqueued then JobEnqueueable on the (Inqueue) job;
    the cluster is 6 cpu / 20Gi, times the factor."""
    snap = ClusterSnapshot(nodes=NODES, queues=[QueueSpec("c1")], jobs=[_pg(min_resources)])
    ssn = Session(snap, load_config(_config(factor)), 1)
    for job in ssn.jobs.values():
        ssn.job_enqueued(job)
        assert ssn.job_enqueueable(job) is expected, name


def _session_with(*jobs: JobSpec) -> Session:
    snap = ClusterSnapshot(nodes=[NodeSpec("n1", {"cpu": 10000.0, "memory": 10e9})], queues=[QueueSpec("q")],
                           jobs=list(jobs))
    return Session(snap, load_config(_config(1.0)), 1)


def _job(name: str, phase: PodGroupPhase, min_cpu: float, running: int = 0, pending: int = 0) -> JobSpec:
    tasks = [
        TaskSpec(uid=f"ns/{name}-{i}", name=f"{name}-{i}", namespace="ns", job=f"ns/{name}", request={"cpu": 1000.0},
                 status=TaskStatus.RUNNING if i < running else TaskStatus.PENDING, node="n1" if i < running else None)
        for i in range(running + pending)
    ]
    return JobSpec(uid=f"ns/{name}", name=name, namespace="ns", queue="q", tasks=tasks, min_member=max(running, 1),
                   min_resources={"cpu": min_cpu}, phase=phase)


def test_inqueue_job_reserves_its_whole_min_resources() -> None:
    """overcommit.go counts an Inqueue job's full minResources as inqueue, even the part its
    running tasks already hold (unlike proportion): 10 cpu, 2 used by the Inqueue job's tasks, its
    5-cpu minResources reserved, so a 4-cpu job does not fit (2 + 5 + 4 > 10)."""
    ssn = _session_with(_job("held", PodGroupPhase.INQUEUE, 5000.0, running=2, pending=3),
                        _job("new", PodGroupPhase.PENDING, 4000.0, pending=4))
    assert not ssn.job_enqueueable(ssn.jobs["ns/new"])


def test_running_job_reserves_only_its_uncovered_min_resources() -> None:
    """overcommit.go: a Running job holding minMember tasks reserves minResources minus what it
    has allocated: 10 cpu, 2 used, 5 - 2 = 3 reserved, so a 4-cpu job fits (2 + 3 + 4 <= 10)."""
    ssn = _session_with(_job("run", PodGroupPhase.RUNNING, 5000.0, running=2, pending=3),
                        _job("new", PodGroupPhase.PENDING, 4000.0, pending=4))
    assert ssn.job_enqueueable(ssn.jobs["ns/new"])


def test_enqueue_admits_jobs_until_the_inflated_cluster_is_full() -> None:
    """Enqueue with overcommit: a 2-cpu cluster at factor 1.5 holds 3 cpu of minResources; of
    four 1-cpu jobs the first three are admitted."""
    jobs = "\n".join(
        f"- {{name: j{i}, namespace: ns, queue: q, minMember: 1, minResources: {{cpu: '1'}}, "
        f"tasks: [{{name: t{i}, request: {{cpu: '1'}}}}]}}" for i in range(4)
    )
    out = simulate_text(textwrap.dedent("""
        config:
          actions: [enqueue]
          tiers:
          - plugins: [{name: overcommit, arguments: {overcommit-factor: 1.5}}]
        nodes: [{name: n1, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}]
        queues: [{name: q}]
        jobs:
    """) + jobs + "\n")
    assert [out["jobs"][f"ns/j{i}"]["phase"] for i in range(4)] == ["Inqueue", "Inqueue", "Inqueue", "Pending"]
