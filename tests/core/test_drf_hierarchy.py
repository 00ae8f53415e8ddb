"""drf plugin, hierarchical mode: behaviour of Volcano's plugins/drf (drf.go, hdrf_test.go)."""

from __future__ import annotations

import pytest
from core_helpers import cycle, job, node, queue, res, session, snapshot, task

from server.model import ClusterSnapshot, JobSpec, QueueSpec, TaskStatus
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


def hqueue(name: str, hierarchy: str, weights: str) -> QueueSpec:
    """A queue placed in the hierarchy by its annotations."""
    return queue(
        name,
        annotations={"volcano.sh/hierarchy": hierarchy, "volcano.sh/hierarchy-weights": weights},
    )


def hjob(
    name: str,
    queue_name: str,
    n: int,
    cpu: str | float,
    mem: str | float,
    *,
    running_on: str | None = None,
    index: int = 0,
) -> JobSpec:
    """Job default/name of ``n`` tasks name-p0.. asking for ``cpu`` and ``mem``, Running on ``running_on``."""
    tasks = [
        task(f"{name}-p{i}", name, res(cpu, mem), running_on, ns="default", creation_index=i)
        for i in range(n)
    ]
    return job(name, ns="default", queue=queue_name, tasks=tasks, min_member=1, index=index)


def allocated_by_job(snap: ClusterSnapshot) -> dict[str, tuple[float, float]]:
    result = cycle(snap, HDRF_TIERS)
    out: dict[str, list[float]] = {}
    by_uid = {t.uid: t for j in snap.jobs for t in j.tasks}
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
    snap = snapshot(
        nodes=[node("n", "10", "10G", pods=50)],
        queues=[
            hqueue("root-sci", "root/sci", "100/50"),
            hqueue("root-eng-dev", "root/eng/dev", "100/50/50"),
            hqueue("root-eng-prod", "root/eng/prod", "100/50/50"),
        ],
        jobs=[
            hjob("pg1", "root-sci", 10, "1", "1G", index=0),
            hjob("pg21", "root-eng-dev", 10, "1", 0, index=1),
            hjob("pg22", "root-eng-prod", 10, 0, "1G", index=2),
        ],
    )
    assert allocated_by_job(snap) == {"pg1": (5000, 5 * GI), "pg21": (5000, 0), "pg22": (0, 5 * GI)}


def test_blocked_resource_saturates_and_others_keep_allocating() -> None:
    """hdrf_test.go "blocking nodes test": once cpu is exhausted, cpu-hungry jobs are saturated and
    the memory-only jobs share the rest: 10 cpu each to pg1, pg2, pg31; 15G each to pg32, pg4."""
    snap = snapshot(
        nodes=[node("n", "30", "30G", pods=500)],
        queues=[
            hqueue("root-pg1", "root/pg1", "100/25"),
            hqueue("root-pg2", "root/pg2", "100/25"),
            hqueue("root-pg3-pg31", "root/pg3/pg31", "100/25/50"),
            hqueue("root-pg3-pg32", "root/pg3/pg32", "100/25/50"),
            hqueue("root-pg4", "root/pg4", "100/25"),
        ],
        jobs=[
            hjob("pg1", "root-pg1", 30, "1", 0, index=0),
            hjob("pg2", "root-pg2", 30, "1", 0, index=1),
            hjob("pg31", "root-pg3-pg31", 30, "1", 0, index=2),
            hjob("pg32", "root-pg3-pg31", 30, 0, "1G", index=3),
            hjob("pg4", "root-pg4", 30, 0, "1G", index=4),
        ],
    )
    got = allocated_by_job(snap)
    assert got == {
        "pg1": (10000, 0),
        "pg2": (10000, 0),
        "pg31": (10000, 0),
        "pg32": (0, 15 * GI),
        "pg4": (0, 15 * GI),
    }


def hdrf_session(jobs: list[JobSpec], queues: list[QueueSpec]) -> Session:
    return session(snapshot([node("n", "10", "10G", pods=100)], jobs, queues), HDRF_TIERS)


def test_queue_order_lower_weighted_share_first() -> None:
    """compareQueues: at the first differing level the lower share / weight goes first; a heavier
    weight halves the share it is judged by."""
    queues = [hqueue("a", "root/a", "1/1"), hqueue("b", "root/b", "1/4")]
    jobs = [
        hjob("ja", "a", 2, "2", 0, running_on="n", index=0),
        hjob("jb", "b", 3, "2", 0, running_on="n", index=1),
        hjob("pa", "a", 1, "1", 0, index=2),
        hjob("pb", "b", 1, "1", 0, index=3),
    ]
    ssn = hdrf_session(jobs, queues)
    qa, qb = ssn.queues["a"], ssn.queues["b"]
    # a: share 0.4 / weight 1; b: share 0.6 / weight 4 = 0.15 -> b first.
    assert ssn.queue_order_fn(qb, qa) is True
    assert ssn.queue_order_fn(qa, qb) is False


def test_saturated_queue_goes_last() -> None:
    """Saturated nodes have the lowest priority, whatever their share."""
    queues = [hqueue("a", "root/a", "1/1"), hqueue("b", "root/b", "1/1")]
    # ja holds everything it asked for (saturated); jb holds more but still wants more.
    jobs = [
        hjob("ja", "a", 1, "1", 0, running_on="n", index=0),
        hjob("jb", "b", 3, "2", 0, running_on="n", index=1),
    ]
    jobs[1].tasks.append(task("jb-extra", "jb", res("1"), ns="default"))
    ssn = hdrf_session(jobs, queues)
    assert ssn.queue_order_fn(ssn.queues["b"], ssn.queues["a"]) is True


def test_hierarchy_is_off_by_default() -> None:
    """EnabledHierarchy defaults to false: no queue order or reclaimable from drf."""
    snap = snapshot([node("n", "1", None)], [hjob("j", "q", 1, "100m", 0)], [queue("q")])
    ssn = session(snap, "tiers:\n- plugins:\n  - name: drf\n")
    assert all(name != "drf" for row in ssn.chain("queue_order") for name, _ in row)
    assert all(name != "drf" for row in ssn.chain("reclaimable") for name, _ in row)
    assert any(name == "drf" for row in ssn.chain("job_order") for name, _ in row)


@pytest.mark.parametrize(("victim_cpu", "reclaimed"), [(1000, True), (6000, False)])
def test_reclaimable_when_reclaimer_queue_stays_lower(victim_cpu: float, reclaimed: bool) -> None:
    """reclaimFn: after moving the task, the reclaimer's queue must still compare lower than the
    victim's queue. Queue b holds 8 of 10 cpu; a small reclaimer in empty queue a may take a task
    from b, a big one (6 cpu) may not (a would then be above b)."""
    queues = [hqueue("a", "root/a", "1/1"), hqueue("b", "root/b", "1/1")]
    victim = hjob("vb", "b", 2, "4", 0, running_on="n", index=0)
    victim.tasks.append(task("vb-more", "vb", res("4"), ns="default"))
    # Two tasks: after gaining one the reclaimer still wants more (a job holding all it asked for
    # is saturated and would sort last).
    reclaimer = hjob("ra", "a", 2, f"{victim_cpu}m", 0, index=1)
    ssn = hdrf_session([victim, reclaimer], queues)
    fn = dict(ssn.chain("reclaimable")[0])["drf"]
    candidates = [ssn.tasks["default/vb-p0"]]
    chosen, verdict = fn(ssn.tasks["default/ra-p0"], candidates)
    assert verdict == 1
    assert (chosen == candidates) is reclaimed
    # The what-if left the live tree untouched.
    assert ssn.queue_order_fn(ssn.queues["a"], ssn.queues["b"]) is True


def test_reclaimer_that_would_be_saturated_reclaims_nothing() -> None:
    """resourceSaturated: a reclaimer job that would hold all it asked for is saturated, and a
    saturated queue compares after an unsaturated one, so it is not given victims."""
    queues = [hqueue("a", "root/a", "1/1"), hqueue("b", "root/b", "1/1")]
    victim = hjob("vb", "b", 3, "4", 0, running_on="n", index=0)
    victim.tasks[2].status, victim.tasks[2].node = TaskStatus.PENDING, None
    reclaimer = hjob("ra", "a", 1, "1", 0, index=1)
    ssn = hdrf_session([victim, reclaimer], queues)
    fn = dict(ssn.chain("reclaimable")[0])["drf"]
    chosen, _ = fn(ssn.tasks["default/ra-p0"], [ssn.tasks["default/vb-p0"]])
    assert chosen == []
