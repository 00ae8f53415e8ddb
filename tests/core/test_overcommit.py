"""overcommit plugin: Volcano's plugins/overcommit/overcommit_test.go (``TestOvercommitPlugin``),
run the way that test does (job_enqueued, then job_enqueueable, for every job of the session), and
the inqueue accounting of overcommit.go."""

from __future__ import annotations

import pytest
from core_helpers import config, job, node, plugin, queue, res, session, simulate_yaml, snapshot

from server.model import JobSpec, PodGroupPhase, TaskStatus
from server.session.session import Session

NODES = [node("n1", "2", "4Gi"), node("n2", "4", "16Gi")]
HUGE = res("20000m", "20G")
NORMAL = res("2000m", "2G")


def _config(factor: float) -> dict:
    return config(
        None, [[plugin("overcommit", "enableJobEnqueued", arguments={"overcommit-factor": factor})]]
    )


@pytest.mark.parametrize(
    ("name", "factor", "min_resources", "expected"),
    [
        ("overCommitFactor is more than 0", 1.2, NORMAL, True),
        ("overCommitFactor is less than 0", 0.8, NORMAL, True),  # below 1 falls back to 1.2
        ("when the required resources of pg are too large", 1.2, HUGE, False),
        ("when pg does not fill MinResources", 1.2, None, True),
    ],
)
def test_overcommit_enqueueable(
    name: str, factor: float, min_resources: dict[str, float] | None, expected: bool
) -> None:
    """TestOvercommitPlugin: each case calls JobEnqueued then JobEnqueueable on the (Inqueue) job;
    the cluster is 6 cpu / 20Gi, times the factor."""
    pg = job(
        "pg", ns="test-namespace", queue="c1", tasks=[], min_member=2, min_resources=min_resources
    )
    ssn = session(snapshot(NODES, [pg], [queue("c1")]), _config(factor))
    for info in ssn.jobs.values():
        ssn.job_enqueued(info)
        assert ssn.job_enqueueable(info) is expected, name


def _session_with(*jobs: JobSpec) -> Session:
    return session(snapshot([node("n1", "10", "10G")], jobs, [queue("q")]), _config(1.0))


def _job(
    name: str, phase: PodGroupPhase, min_cpu: str, running: int = 0, pending: int = 0
) -> JobSpec:
    """``running`` 1-cpu tasks Running on n1, then ``pending`` Pending ones; minResources ``min_cpu``."""
    status = [TaskStatus.RUNNING] * running + [TaskStatus.PENDING] * pending
    return job(
        name,
        memory=None,
        queue="q",
        status=status,
        nodes="n1",
        min_member=max(running, 1),
        min_resources=res(min_cpu),
        phase=phase,
        task_index=0,
    )


def test_inqueue_job_reserves_its_whole_min_resources() -> None:
    """overcommit.go counts an Inqueue job's full minResources as inqueue, even the part its
    running tasks already hold (unlike proportion): 10 cpu, 2 used by the Inqueue job's tasks, its
    5-cpu minResources reserved, so a 4-cpu job does not fit (2 + 5 + 4 > 10)."""
    ssn = _session_with(
        _job("held", PodGroupPhase.INQUEUE, "5", running=2, pending=3),
        _job("new", PodGroupPhase.PENDING, "4", pending=4),
    )
    assert not ssn.job_enqueueable(ssn.jobs["ns/new"])


def test_running_job_reserves_only_its_uncovered_min_resources() -> None:
    """overcommit.go: a Running job holding minMember tasks reserves minResources minus what it
    has allocated: 10 cpu, 2 used, 5 - 2 = 3 reserved, so a 4-cpu job fits (2 + 3 + 4 <= 10)."""
    ssn = _session_with(
        _job("run", PodGroupPhase.RUNNING, "5", running=2, pending=3),
        _job("new", PodGroupPhase.PENDING, "4", pending=4),
    )
    assert ssn.job_enqueueable(ssn.jobs["ns/new"])


def test_enqueue_admits_jobs_until_the_inflated_cluster_is_full() -> None:
    """Enqueue with overcommit: a 2-cpu cluster at factor 1.5 holds 3 cpu of minResources; of
    four 1-cpu jobs the first three are admitted."""
    jobs = "\n".join(
        f"- {{name: j{i}, namespace: ns, queue: q, minMember: 1, minResources: {{cpu: '1'}}, "
        f"tasks: [{{name: t{i}, request: {{cpu: '1'}}}}]}}"
        for i in range(4)
    )
    out = simulate_yaml(
        """
        config:
          actions: [enqueue]
          tiers:
          - plugins: [{name: overcommit, arguments: {overcommit-factor: 1.5}}]
        nodes: [{name: n1, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}]
        queues: [{name: q}]
        jobs:
    """,
        jobs + "\n",
    )
    assert [out["jobs"][f"ns/j{i}"]["phase"] for i in range(4)] == [
        "Inqueue",
        "Inqueue",
        "Inqueue",
        "Pending",
    ]
