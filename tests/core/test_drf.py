"""drf plugin (flat mode): the functions Volcano's plugins/drf/drf.go registers without hierarchy
(job_order by dominant share, preemptable, incremental shares through event handlers). Volcano has
no test file for flat DRF; the allocate cases of TestFareShareAllocate (test_allocate.py) use it.
Hierarchical DRF is tested in test_drf_hierarchy.py."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import job, node, queue, session, simulate_yaml, snapshot

from server.model import JobSpec, PodGroupPhase, TaskStatus
from server.session.info import dominant_share
from server.session.session import Session

CONFIG = """
extension_points_not_listed: disabled
tiers:
- plugins:
  - {name: drf, enableJobOrder: true, enablePreemptable: true}
"""


def test_dominant_share_is_the_largest_fraction_of_the_cluster() -> None:
    """calculateShare: max over resources of allocated / total."""
    assert dominant_share(np.array([2000.0, 1e9]), np.array([8000.0, 2e9])) == pytest.approx(0.5)


def test_dominant_share_ignores_resources_the_cluster_lacks() -> None:
    """calculateShare walks totalResource.ResourceNames(): a dimension the cluster has none of
    (total below the epsilon) does not count, so asking for it does not make the share 1."""
    assert dominant_share(
        np.array([1000.0, 0.0, 2000.0]), np.array([4000.0, 8e9, 0.0])
    ) == pytest.approx(0.25)
    assert dominant_share(np.zeros(2), np.zeros(2)) == 0.0


def test_dominant_share_ignores_a_resource_with_no_total() -> None:
    """calculateShare only looks at the cluster's resource names (total >= epsilon)."""
    assert dominant_share(np.array([500.0, 0.0, 1.0]), np.array([1000.0, 4.0, 0.0])) == 0.5


def _job(name: str, running: int, pending: int, cpu: str = "1", index: int = 0) -> JobSpec:
    """``running`` tasks Running on n1, then ``pending`` Pending ones, each asking for ``cpu``."""
    status = [TaskStatus.RUNNING] * running + [TaskStatus.PENDING] * pending
    return job(
        name,
        cpu=cpu,
        memory=None,
        queue="q",
        status=status,
        nodes="n1",
        min_member=1,
        phase=PodGroupPhase.PENDING,
        index=index,
        task_index=0,
    )


def _session(*jobs: JobSpec) -> Session:
    return session(snapshot([node("n1", "10", "10G")], jobs, [queue("q")]), CONFIG)


def test_job_with_lower_share_orders_first() -> None:
    """drf jobOrderFn: lower dominant share first; equal shares tie (0)."""
    ssn = _session(
        _job("big", 3, 1, index=0), _job("small", 1, 1, index=1), _job("same", 1, 0, index=2)
    )
    big, small, same = ssn.jobs["ns/big"], ssn.jobs["ns/small"], ssn.jobs["ns/same"]
    assert ssn.job_order_fn(small, big)
    assert not ssn.job_order_fn(big, small)
    assert ssn.job_order_compare(small, same) == 0


def test_share_follows_allocations_and_their_undo() -> None:
    """drf event handlers: an allocation raises the job's share, discarding it restores it."""
    ssn = _session(_job("a", 0, 2), _job("b", 1, 0))
    a, b = ssn.jobs["ns/a"], ssn.jobs["ns/b"]
    assert ssn.job_order_fn(a, b)
    stmt = ssn.statement()
    stmt.allocate(ssn.tasks["ns/a-0"], "n1")
    stmt.allocate(ssn.tasks["ns/a-1"], "n1")
    assert ssn.job_order_fn(b, a)
    stmt.discard()
    assert ssn.job_order_fn(a, b)


def test_preemptable_keeps_victims_whose_job_stays_at_or_above_the_preemptor_share() -> None:
    """drf preemptableFn: the preemptor's share after gaining its task is compared with each victim
    job's share after losing the candidates so far (per job, cumulatively); ties within 1e-6 count
    as victims."""
    ssn = _session(_job("rich", 4, 0, index=0), _job("poor", 0, 1, cpu="1", index=1))
    preemptor = ssn.tasks["ns/poor-0"]  # share after: 0.1
    candidates = [ssn.tasks[f"ns/rich-{i}"] for i in range(4)]  # rich: 0.4 -> 0.3, 0.2, 0.1, 0.0
    assert [v.uid for v in ssn.preemptable(preemptor, candidates)] == [
        "ns/rich-0",
        "ns/rich-1",
        "ns/rich-2",
    ]


def test_jobs_of_one_queue_take_turns_by_share() -> None:
    """Allocate with drf job order: after each ready job's commit the job goes back with its new
    share, so two equal jobs alternate instead of the first filling the node."""
    out = simulate_yaml("""
        config:
          actions: [allocate]
          extension_points_not_listed: disabled
          tiers:
          - plugins:
            - {name: drf, enableJobOrder: true}
            - {name: predicates, enablePredicate: true}
        nodes: [{name: n1, allocatable: {cpu: "2", memory: 4Gi, pods: 10}}]
        queues: [{name: q}]
        jobs:
        - {name: a, namespace: ns, queue: q, minMember: 1, phase: Inqueue,
           tasks: [{name: a0, request: {cpu: "1"}}, {name: a1, request: {cpu: "1"}}]}
        - {name: b, namespace: ns, queue: q, minMember: 1, phase: Inqueue,
           tasks: [{name: b0, request: {cpu: "1"}}, {name: b1, request: {cpu: "1"}}]}
    """)
    assert out["binds"] == {"ns/a0": "n1", "ns/b0": "n1"}
