"""drf plugin, hierarchical mode: behaviour of Volcano's plugins/drf (drf.go, hdrf_test.go)."""

from __future__ import annotations

import numpy as np
import pytest

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
from server.scheduler import SchedulerCore
from server.session.session import Session

GI = 1e9

HDRF_TIERS = """
extension_points_not_listed: disabled
actions: "allocate"
tiers:
- plugins:
  - name: drf
    enableHierarchy: true
    enableQueueOrder: true
    enableJobOrder: true
    enableReclaimable: true
  - name: proportion
    enableJobEnqueued: true
    enableQueueOrder: true
    enableReclaimable: true
"""


def queue(name: str, hierarchy: str, weights: str) -> QueueSpec:
    return QueueSpec(name, annotations={"volcano.sh/hierarchy": hierarchy, "volcano.sh/hierarchy-weights": weights})


def job(name: str, queue_name: str, n: int, cpu: float, mem: float, *, running_on: str | None = None,
        index: int = 0) -> JobSpec:
    status = TaskStatus.RUNNING if running_on else TaskStatus.PENDING
    tasks = [TaskSpec(uid=f"default/{name}-p{i}", name=f"{name}-p{i}", namespace="default", job=f"default/{name}",
                      request={"cpu": cpu, "memory": mem}, status=status, node=running_on, creation_index=i)
             for i in range(n)]
    return JobSpec(uid=f"default/{name}", name=name, namespace="default", queue=queue_name, tasks=tasks,
                   min_member=1, phase=PodGroupPhase.INQUEUE, creation_index=index)


def allocated_by_job(snapshot: ClusterSnapshot) -> dict[str, tuple[float, float]]:
    result = SchedulerCore(load_config(HDRF_TIERS)).run_cycle(snapshot, 1)
    out: dict[str, list[float]] = {}
    by_uid = {t.uid: t for j in snapshot.jobs for t in j.tasks}
    for uid in result.binds:
        t = by_uid[uid]
        acc = out.setdefault(t.job.split("/")[1], [0.0, 0.0])
        acc[0] += t.request["cpu"]
        acc[1] += t.request["memory"]
    return {k: (v[0], v[1]) for k, v in out.items()}


def test_rescaling_splits_by_hierarchy_weights() -> None:
    """hdrf_test.go "rescaling test": sci and eng weigh the same at level 1; eng's two children
    (cpu-only dev, memory-only prod) are rescaled to the same dominant share, so eng as a whole
    matches sci: sci gets 5 cpu + 5G, dev 5 cpu, prod 5G of a 10 cpu / 10G node."""
    snap = ClusterSnapshot(
        nodes=[NodeSpec("n", {"cpu": 10000, "memory": 10 * GI, "pods": 50})],
        queues=[queue("root-sci", "root/sci", "100/50"), queue("root-eng-dev", "root/eng/dev", "100/50/50"),
                queue("root-eng-prod", "root/eng/prod", "100/50/50")],
        jobs=[job("pg1", "root-sci", 10, 1000, 1 * GI, index=0), job("pg21", "root-eng-dev", 10, 1000, 0, index=1),
              job("pg22", "root-eng-prod", 10, 0, 1 * GI, index=2)],
    )
    assert allocated_by_job(snap) == {"pg1": (5000, 5 * GI), "pg21": (5000, 0), "pg22": (0, 5 * GI)}


def test_blocked_resource_saturates_and_others_keep_allocating() -> None:
    """hdrf_test.go "blocking nodes test": once cpu is exhausted, cpu-hungry jobs are saturated and
    the memory-only jobs share the rest: 10 cpu each to pg1, pg2, pg31; 15G each to pg32, pg4."""
    snap = ClusterSnapshot(
        nodes=[NodeSpec("n", {"cpu": 30000, "memory": 30 * GI, "pods": 500})],
        queues=[queue("root-pg1", "root/pg1", "100/25"), queue("root-pg2", "root/pg2", "100/25"),
                queue("root-pg3-pg31", "root/pg3/pg31", "100/25/50"),
                queue("root-pg3-pg32", "root/pg3/pg32", "100/25/50"), queue("root-pg4", "root/pg4", "100/25")],
        jobs=[job("pg1", "root-pg1", 30, 1000, 0, index=0), job("pg2", "root-pg2", 30, 1000, 0, index=1),
              job("pg31", "root-pg3-pg31", 30, 1000, 0, index=2), job("pg32", "root-pg3-pg31", 30, 0, 1 * GI, index=3),
              job("pg4", "root-pg4", 30, 0, 1 * GI, index=4)],
    )
    got = allocated_by_job(snap)
    assert got == {"pg1": (10000, 0), "pg2": (10000, 0), "pg31": (10000, 0), "pg32": (0, 15 * GI),
                   "pg4": (0, 15 * GI)}


def hdrf_session(jobs: list[JobSpec], queues: list[QueueSpec], cpu: float = 10000) -> Session:
    snap = ClusterSnapshot(nodes=[NodeSpec("n", {"cpu": cpu, "memory": 10 * GI, "pods": 100})], queues=queues, jobs=jobs)
    return Session(snap, load_config(HDRF_TIERS))


def test_queue_order_lower_weighted_share_first() -> None:
    """compareQueues: at the first differing level the lower share / weight goes first; a heavier
    weight halves the share it is judged by."""
    queues = [queue("a", "root/a", "1/1"), queue("b", "root/b", "1/4")]
    jobs = [job("ja", "a", 2, 2000, 0, running_on="n", index=0), job("jb", "b", 3, 2000, 0, running_on="n", index=1),
            job("pa", "a", 1, 1000, 0, index=2), job("pb", "b", 1, 1000, 0, index=3)]
    ssn = hdrf_session(jobs, queues)
    qa, qb = ssn.queues["a"], ssn.queues["b"]
    # a: share 0.4 / weight 1; b: share 0.6 / weight 4 = 0.15 -> b first.
    assert ssn.queue_order_fn(qb, qa) is True
    assert ssn.queue_order_fn(qa, qb) is False


def test_saturated_queue_goes_last() -> None:
    """Saturated nodes have the lowest priority, whatever their share."""
    queues = [queue("a", "root/a", "1/1"), queue("b", "root/b", "1/1")]
    # ja holds everything it asked for (saturated); jb holds more but still wants more.
    jobs = [job("ja", "a", 1, 1000, 0, running_on="n", index=0),
            job("jb", "b", 3, 2000, 0, running_on="n", index=1)]
    jobs[1].tasks.append(TaskSpec(uid="default/jb-extra", name="jb-extra", namespace="default", job="default/jb",
                                  request={"cpu": 1000}))
    ssn = hdrf_session(jobs, queues)
    assert ssn.queue_order_fn(ssn.queues["b"], ssn.queues["a"]) is True


def test_hierarchy_is_off_by_default() -> None:
    """EnabledHierarchy defaults to false: no queue order or reclaimable from drf."""
    snap = ClusterSnapshot(nodes=[NodeSpec("n", {"cpu": 1000})], queues=[QueueSpec("q")],
                           jobs=[job("j", "q", 1, 100, 0)])
    ssn = Session(snap, load_config("tiers:\n- plugins:\n  - name: drf\n"))
    assert all(name != "drf" for row in ssn.chain("queue_order") for name, _ in row)
    assert all(name != "drf" for row in ssn.chain("reclaimable") for name, _ in row)
    assert any(name == "drf" for row in ssn.chain("job_order") for name, _ in row)


@pytest.mark.parametrize(("victim_cpu", "reclaimed"), [(1000, True), (6000, False)])
def test_reclaimable_when_reclaimer_queue_stays_lower(victim_cpu: float, reclaimed: bool) -> None:
    """reclaimFn: after moving the task, the reclaimer's queue must still compare lower than the
    victim's queue. Queue b holds 8 of 10 cpu; a small reclaimer in empty queue a may take a task
    from b, a big one (6 cpu) may not (a would then be above b)."""
    queues = [queue("a", "root/a", "1/1"), queue("b", "root/b", "1/1")]
    victim = job("vb", "b", 2, 4000, 0, running_on="n", index=0)
    victim.tasks.append(TaskSpec(uid="default/vb-more", name="vb-more", namespace="default", job="default/vb",
                                 request={"cpu": 4000}))
    # Two tasks: after gaining one the reclaimer still wants more (a job holding all it asked for
    # is saturated and would sort last).
    reclaimer = job("ra", "a", 2, victim_cpu, 0, index=1)
    ssn = hdrf_session([victim, reclaimer], queues)
    fn = dict(ssn.chain("reclaimable")[0])["drf"]
    candidates = [ssn.tasks["default/vb-p0"]]
    chosen, verdict = fn(ssn.tasks["default/ra-p0"], candidates)
    assert verdict == 1
    assert (chosen == candidates) is reclaimed
    # The what-if left the live tree untouched.
    assert ssn.queue_order_fn(ssn.queues["a"], ssn.queues["b"]) is True


def test_flat_dominant_share_ignores_resources_the_cluster_lacks() -> None:
    """calculateShare only looks at the cluster's resource names (total >= epsilon)."""
    from server.session.info import dominant_share

    assert dominant_share(np.array([500.0, 0.0, 1.0]), np.array([1000.0, 4.0, 0.0])) == 0.5


def test_reclaimer_that_would_be_saturated_reclaims_nothing() -> None:
    """resourceSaturated: a reclaimer job that would hold all it asked for is saturated, and a
    saturated queue compares after an unsaturated one, so it is not given victims."""
    queues = [queue("a", "root/a", "1/1"), queue("b", "root/b", "1/1")]
    victim = job("vb", "b", 3, 4000, 0, running_on="n", index=0)
    victim.tasks[2].status, victim.tasks[2].node = TaskStatus.PENDING, None
    reclaimer = job("ra", "a", 1, 1000, 0, index=1)
    ssn = hdrf_session([victim, reclaimer], queues)
    fn = dict(ssn.chain("reclaimable")[0])["drf"]
    chosen, _ = fn(ssn.tasks["default/ra-p0"], [ssn.tasks["default/vb-p0"]])
    assert chosen == []
