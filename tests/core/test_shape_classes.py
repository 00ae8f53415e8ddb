"""Shape classes and the queue lookback in allocate (issue 29, server/session/shape_classes.py).

* On random clusters (hypothesis), cycles with the shape-class cache on make exactly the decisions
  they make with it off: binds, pipelined tasks, evictions, every task's status -- in several
  configurations, one of them with a second allocate after preempt (resources come back between).
* A skipped job's explanation and Unschedulable condition name the job whose shape failed.
* Resources coming back in the cycle (an eviction; a rollback past a remembered failure) make
  the class worth trying again, and the job then placed shows that skipping would have been wrong.
* ``maxQueueLookback``: a queue's jobs beyond it are not opened (the window) or, where the job
  order needs every job, not tried, and say so.
* KAI's job-order keys sort as its comparators (the job queue sorts by them).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
from core_helpers import PREEMPT_TIERS, job, node, queue, snapshot, task
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.actions.volcano.allocate import AllocateAction
from server.config import DEFAULT_CONFIG_YAML, ConfigError, load_config
from server.model import (
    BeyondWindow,
    ClusterSnapshot,
    CycleResult,
    JobSpec,
    Taint,
    TaskStatus,
    Toleration,
)
from server.scheduler import SchedulerCore
from server.session.info import JobInfo
from server.session.priority_queue import PriorityQueue
from server.session.session import Session

SAME_SHAPE = "same shape as job"

CONFIGS = {
    "default": DEFAULT_CONFIG_YAML,
    "preempt": 'actions: "enqueue, allocate, preempt, reclaim, backfill"\n' + PREEMPT_TIERS,
    # Resources come back between the two allocates (preempt evicts): the second tries again.
    "allocate-twice": 'actions: "enqueue, allocate, preempt, allocate, backfill"\n' + PREEMPT_TIERS,
    "capacity": """\
actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
- plugins:
  - name: predicates
  - name: capacity
  - name: nodeorder
""",
}


def with_session(config_yaml: str, **session: Any) -> str:
    items = ", ".join(
        f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in session.items()
    )
    return config_yaml + f"session: {{{items}}}\n"


def run(snap: ClusterSnapshot, config_yaml: str) -> CycleResult:
    return SchedulerCore(load_config(config_yaml)).run_cycle(snap, 1)


# -- random clusters --------------------------------------------------------------------------------

SHAPES = [("1", "1Gi"), ("2", "2Gi"), ("3", "4Gi")]
ZONE = {"zone": "a"}
TAINT = Taint("dedicated", "infra", "NoSchedule")


@st.composite
def clusters(draw: st.DrawFn) -> ClusterSnapshot:
    n_nodes = draw(st.integers(1, 5))
    # Nodes of one backend, or of several: gang-backend keeps a class per backend then.
    backends = draw(st.sampled_from([["a"], ["a", "b"], ["a", "b", "c"]]))
    nodes = []
    for i in range(n_nodes):
        extra = {"pods": str(draw(st.integers(1, 4)))} if draw(st.booleans()) else {}
        made = node(
            f"n{i}",
            cpu=str(draw(st.integers(2, 8))),
            memory=f"{draw(st.integers(2, 12))}Gi",
            labels=dict(ZONE) if draw(st.booleans()) else {},
            taints=[TAINT] if draw(st.integers(0, 4)) == 0 else [],
            **extra,
        )
        nodes.append(
            dataclasses.replace(
                made,
                unschedulable=draw(st.integers(0, 6)) == 0,
                backend=draw(st.sampled_from(backends)),
            )
        )
    names = [n.name for n in nodes]
    queues = [
        queue(f"q{i}", weight=draw(st.integers(1, 3))) for i in range(draw(st.integers(1, 3)))
    ]
    # A few kinds of job, each repeated: jobs of one shape class behind each other.
    kinds = []
    for _ in range(draw(st.integers(1, 3))):
        cpu, memory = draw(st.sampled_from(SHAPES))
        size = draw(st.integers(1, 4))
        kinds.append(
            (
                cpu,
                memory,
                size,
                draw(st.integers(1, size)),  # min member
                dict(ZONE) if draw(st.integers(0, 3)) == 0 else {},  # node selector
                [Toleration("dedicated", "Equal", "infra", "NoSchedule")]
                if draw(st.integers(0, 3)) == 0
                else [],
                draw(st.integers(0, 4)) == 0,  # mixed roles
            )
        )
    jobs: list[JobSpec] = []
    for j in range(draw(st.integers(2, 30))):
        cpu, memory, size, min_member, selector, tolerations, mixed = draw(st.sampled_from(kinds))
        statuses = [TaskStatus.PENDING] * size
        if draw(st.integers(0, 3)) == 0:  # some tasks already on nodes, or leaving them
            statuses = [
                draw(
                    st.sampled_from([TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.RELEASING])
                )
                for _ in range(size)
            ]
        where = [
            None if s == TaskStatus.PENDING else draw(st.sampled_from(names)) for s in statuses
        ]
        roles = [draw(st.sampled_from(["a", "b"])) if mixed else "worker" for _ in range(size)]
        spec = job(
            f"j{j}",
            cpu=cpu,
            memory=memory,
            queue=draw(st.sampled_from([q.name for q in queues])),
            status=statuses,
            nodes=where,
            roles=roles,
            min_member=min_member,
            priority=draw(st.sampled_from([0, 0, 5])),
            index=j,
        )
        tasks = [
            dataclasses.replace(t, node_selector=selector, tolerations=tolerations)
            for t in spec.tasks
        ]
        if draw(st.integers(0, 7)) == 0:  # a best-effort member
            tasks.append(task(f"j{j}-be", f"j{j}", {}, creation_index=j * 100 + 99))
        jobs.append(dataclasses.replace(spec, tasks=tasks))
    return snapshot(nodes, jobs, queues=queues)


def decisions(result: CycleResult) -> tuple[Any, ...]:
    return (
        sorted(result.binds.items()),
        sorted(result.pipelined.items()),
        sorted(result.evictions),
        sorted((uid, status.value, node_) for uid, (status, node_) in result.task_status.items()),
    )


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(clusters(), st.sampled_from(sorted(CONFIGS)), st.sampled_from([0, 0, 1, 3]))
def test_shape_classes_change_no_decision(
    snap: ClusterSnapshot, config: str, lookback: int
) -> None:
    """(With a lookback, jobs past it in the first allocate come up in the second, after
    preempt's evictions: where a class remembered across the eviction would skip wrongly.)"""
    off = run(snap, with_session(CONFIGS[config], shapeClasses=False, maxQueueLookback=lookback))
    on = run(snap, with_session(CONFIGS[config], shapeClasses=True, maxQueueLookback=lookback))
    assert decisions(on) == decisions(off)
    for uid, outcome in off.jobs.items():  # the same phase; only the wording of a finding moves
        assert on.jobs[uid].phase == outcome.phase


def test_random_clusters_do_skip() -> None:
    """The property above is not vacuous: deep queues of few shapes skip most jobs."""
    nodes = [node(f"n{i}", cpu="4", memory="8Gi") for i in range(3)]
    jobs = [job(f"j{i}", n=1 + i % 2, cpu="2", memory="2Gi", index=i) for i in range(40)]
    result = run(snapshot(nodes, jobs), DEFAULT_CONFIG_YAML)
    skipped = [
        u for u, o in result.jobs.items() if o.explanation and SAME_SHAPE in o.explanation.summary
    ]
    assert len(skipped) > 25


def test_classes_are_kept_per_backend() -> None:
    """With several backends (gang-backend) deep queues skip too, and a class that failed in one
    backend is still tried in another: here b's bigger nodes take gangs a's cannot, after a's best
    node has gone to the first gang."""
    nodes = [
        dataclasses.replace(node("a0", cpu="4", memory="8Gi"), backend="a"),
        dataclasses.replace(node("a1", cpu="2", memory="8Gi"), backend="a"),
        dataclasses.replace(node("b0", cpu="3", memory="8Gi"), backend="b"),
        dataclasses.replace(node("b1", cpu="3", memory="8Gi"), backend="b"),
    ]
    jobs = [job(f"j{i}", n=2, cpu="2", memory="1Gi", index=i) for i in range(30)]
    on = run(snapshot(nodes, jobs), DEFAULT_CONFIG_YAML)
    off = run(snapshot(nodes, jobs), with_session(DEFAULT_CONFIG_YAML, shapeClasses=False))
    assert decisions(on) == decisions(off)
    backends = {n: n[0] for n in ("a0", "a1", "b0", "b1")}
    placed = {backends[n] for n in on.binds.values()}
    assert placed == {"a", "b"}
    skipped = [
        u for u, o in on.jobs.items() if o.explanation and SAME_SHAPE in o.explanation.summary
    ]
    assert len(skipped) > 20


# -- explanations -----------------------------------------------------------------------------------


def full_cluster(n_waiting: int = 3) -> ClusterSnapshot:
    """One node held by a running job; ``n_waiting`` jobs of one shape that fits nowhere now."""
    running = job("run", cpu="4", memory="4Gi", status=TaskStatus.RUNNING, nodes="n0", index=0)
    waiting = [job(f"w{i}", n=2, cpu="2", memory="1Gi", index=i + 1) for i in range(n_waiting)]
    return snapshot([node("n0", cpu="4", memory="8Gi")], [running, *waiting])


def test_skipped_jobs_explain_the_shape_and_reason() -> None:
    off = run(full_cluster(), with_session(DEFAULT_CONFIG_YAML, shapeClasses=False))
    on = run(full_cluster(), DEFAULT_CONFIG_YAML)
    first = on.jobs["ns/w0"]
    assert first.explanation is not None
    assert SAME_SHAPE not in first.explanation.summary
    reason = first.explanation.summary  # the node-level reason of the job tried
    assert "Insufficient cpu" in reason
    for uid in ("ns/w1", "ns/w2"):
        outcome = on.jobs[uid]
        assert outcome.explanation is not None
        assert outcome.explanation.gate == off.jobs[uid].explanation.gate  # type: ignore[union-attr]
        assert outcome.explanation.summary == f"same shape as job ns/w0: {reason}"
        assert outcome.explanation.node_reasons == off.jobs[uid].explanation.node_reasons  # type: ignore[union-attr]
        unschedulable = [c for c in outcome.conditions if c.type == "Unschedulable"]
        assert unschedulable
        assert "same shape as job ns/w0" in unschedulable[0].message
        assert "Insufficient cpu" in unschedulable[0].message


def test_a_partly_placed_gang_is_told_as_its_leader() -> None:
    """The leader fit one task of two before the gang failed: a skipped job says the same."""
    snap = snapshot(
        [node("n0", cpu="3", memory="8Gi")],
        [job(f"w{i}", n=2, cpu="2", memory="1Gi", index=i) for i in range(3)],
    )
    off = run(snap, with_session(DEFAULT_CONFIG_YAML, shapeClasses=False))
    on = run(snap, DEFAULT_CONFIG_YAML)
    assert not on.binds
    assert not off.binds
    for uid in ("ns/w1", "ns/w2"):
        assert on.jobs[uid].explanation.gate == off.jobs[uid].explanation.gate == "gang"  # type: ignore[union-attr]
        assert on.jobs[uid].explanation.summary.startswith("1 of the gang's 2 tasks fit")  # type: ignore[union-attr]
        assert SAME_SHAPE in on.jobs[uid].explanation.summary  # type: ignore[union-attr]


def test_queue_refusals_are_passed_on_naming_the_leader() -> None:
    """A queue over its share refuses the leader; the skipped jobs carry that refusal."""
    snap = snapshot(
        [node("n0", cpu="8", memory="16Gi")],
        [
            job("run", cpu="4", memory="1Gi", status=TaskStatus.RUNNING, nodes="n0", queue="small"),
            *[job(f"w{i}", cpu="2", memory="1Gi", queue="small", index=i + 1) for i in range(3)],
            job("other", cpu="1", memory="1Gi", queue="big", index=9),
        ],
        queues=[queue("small", capability={"cpu": "4"}), queue("big")],
    )
    config = CONFIGS["capacity"]
    off = run(snap, with_session(config, shapeClasses=False))
    on = run(snap, config)
    assert decisions(on) == decisions(off)
    leader = on.jobs["ns/w0"].explanation
    assert leader is not None
    assert leader.gate == "queue"
    for uid in ("ns/w1", "ns/w2"):
        explanation = on.jobs[uid].explanation
        assert explanation is not None
        assert explanation.gate == "queue"
        assert explanation.summary == f"same shape as job ns/w0: {leader.summary}"


# -- resources coming back --------------------------------------------------------------------------


def open_session(snap: ClusterSnapshot) -> Session:
    return Session(snap, load_config(DEFAULT_CONFIG_YAML), 1)


def attempt(ssn: Session, job_info: JobInfo) -> bool:
    """One allocate attempt of ``job_info`` as allocate makes it, remembering a failure."""
    classes = ssn.shape_classes
    key = classes.key(ssn, job_info)
    assert key is not None
    before = classes.before(ssn, key, job_info)
    pending = [t for t in job_info.index[TaskStatus.PENDING].values() if not t.best_effort]
    stmt = AllocateAction().allocate_tasks(ssn, job_info, PriorityQueue(ssn.task_order_fn, pending))
    if stmt is None:
        classes.failed(ssn, job_info, before)
        return False
    stmt.commit()
    return True


def test_an_eviction_in_the_cycle_makes_the_class_worth_trying() -> None:
    ssn = open_session(full_cluster(2))
    classes = ssn.shape_classes
    w0, w1 = ssn.jobs["ns/w0"], ssn.jobs["ns/w1"]
    assert not attempt(ssn, w0)
    assert classes.failure(classes.key(ssn, w1)) is not None  # w1 would be skipped
    stmt = ssn.statement()
    stmt.evict(ssn.tasks["ns/run-0"], "make room")
    assert classes.failure(classes.key(ssn, w1)) is None  # resources come back: tried again
    # Tried, the releasing task's resources take w1's gang (pipelined): a skip would have been wrong.
    assert attempt(ssn, w1)
    assert {t.status for t in w1.tasks.values()} == {TaskStatus.PIPELINED}
    ssn.release()


def test_a_rollback_frees_only_for_failures_remembered_since_its_mark() -> None:
    ssn = open_session(full_cluster(2))
    classes = ssn.shape_classes
    w0, w1 = ssn.jobs["ns/w0"], ssn.jobs["ns/w1"]
    # A statement opened after the failure and discarded restores the state the failure was
    # found in (or a fuller one): the class stays failed.
    assert not attempt(ssn, w0)
    stmt = ssn.statement()
    stmt.pipeline(w1.tasks["ns/w1-0"], "n0")
    stmt.discard()
    assert classes.failure(classes.key(ssn, w1)) is not None
    # A statement holding resources when a failure was remembered gives them back at rollback:
    # the failure no longer holds.
    ssn2 = open_session(full_cluster(2))
    classes2 = ssn2.shape_classes
    holder = ssn2.statement()
    holder.evict(ssn2.tasks["ns/run-0"], "room")
    mark = holder.checkpoint()
    holder.pipeline(ssn2.tasks["ns/w0-0"], "n0")  # the room taken again
    holder.pipeline(ssn2.tasks["ns/w0-1"], "n0")
    assert not attempt(ssn2, ssn2.jobs["ns/w1"])  # nothing left for w1: remembered
    assert classes2.failures
    holder.rollback(mark)  # w0's pipelined tasks let go of the room
    assert not classes2.failures
    ssn.release()
    ssn2.release()


# -- the queue lookback -----------------------------------------------------------------------------


def lookback_cluster() -> ClusterSnapshot:
    jobs = [job(f"a{i}", cpu="1", memory="1Gi", queue="qa", index=i) for i in range(5)]
    jobs += [job(f"b{i}", cpu="1", memory="1Gi", queue="qb", index=10 + i) for i in range(5)]
    return snapshot([node("n0", cpu="16", memory="32Gi")], jobs, queues=[queue("qa"), queue("qb")])


def test_lookback_off_by_default_places_every_job() -> None:
    result = run(lookback_cluster(), DEFAULT_CONFIG_YAML)
    assert len(result.binds) == 10


def test_lookback_bounds_the_jobs_considered_per_queue() -> None:
    """The default order: the session opens the first two jobs of each queue (the window)."""
    result = run(lookback_cluster(), with_session(DEFAULT_CONFIG_YAML, maxQueueLookback=2))
    bound_jobs = {uid.rsplit("-", 1)[0] for uid in result.binds}
    assert bound_jobs == {"ns/a0", "ns/a1", "ns/b0", "ns/b1"}
    assert set(result.jobs) == bound_jobs
    assert result.beyond_window == {
        "qa": BeyondWindow(2, 3, "ns/a2"),
        "qb": BeyondWindow(2, 3, "ns/b2"),
    }


def test_lookback_in_allocate_says_why_in_each_job() -> None:
    """An order the window cannot follow (sla's waiting time): every job is opened, and
    allocate stops at the bound, saying so in each job past it."""
    sla = DEFAULT_CONFIG_YAML + "- plugins:\n  - name: sla\n"
    result = run(lookback_cluster(), with_session(sla, maxQueueLookback=2))
    bound_jobs = {uid.rsplit("-", 1)[0] for uid in result.binds}
    assert bound_jobs == {"ns/a0", "ns/a1", "ns/b0", "ns/b1"}
    assert result.beyond_window == {}
    for uid in ("ns/a2", "ns/a4", "ns/b3"):
        outcome = result.jobs[uid]
        assert outcome.explanation is not None
        assert outcome.explanation.gate == "queue"
        assert "maxQueueLookback" in outcome.explanation.summary
        assert "not considered this cycle" in outcome.explanation.summary
        unschedulable = [c for c in outcome.conditions if c.type == "Unschedulable"]
        assert unschedulable
        assert "maxQueueLookback" in unschedulable[0].message


def test_lookback_counts_skipped_jobs_and_keeps_growing_ones() -> None:
    """An elastic job that came up before the bound still grows after it is reached."""
    elastic = job("e", n=3, cpu="1", memory="1Gi", queue="qa", min_member=1, index=0)
    others = [job(f"a{i}", cpu="1", memory="1Gi", queue="qa", index=i + 1) for i in range(3)]
    snap = snapshot([node("n0", cpu="16", memory="32Gi")], [elastic, *others], queues=[queue("qa")])
    result = run(snap, with_session(DEFAULT_CONFIG_YAML, maxQueueLookback=2))
    assert {u for u in result.binds if u.startswith("ns/e-")} == {"ns/e-0", "ns/e-1", "ns/e-2"}
    assert "ns/a0-0" in result.binds
    assert "ns/a1-0" not in result.binds
    assert "ns/a2-0" not in result.binds


def test_lookback_is_checked() -> None:
    with pytest.raises(ConfigError, match="maxQueueLookback"):
        load_config(DEFAULT_CONFIG_YAML + "session: {maxQueueLookback: many}\n")
    with pytest.raises(ConfigError, match="shapeClasses"):
        load_config(DEFAULT_CONFIG_YAML + "session: {shapeClasses: 3}\n")


# -- KAI's job-order keys ---------------------------------------------------------------------------

KAI_YAML = """\
profile: kai
actions: "allocate"
tiers:
- plugins:
  - name: predicates
  - name: proportion
  - name: priority
  - name: elastic
"""


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.integers(-2, 2), st.integers(1, 3), st.integers(0, 3), st.integers(0, 3)),
        min_size=2,
        max_size=8,
    )
)
def test_kai_job_keys_sort_as_the_comparators(specs: list[tuple[int, int, int, int]]) -> None:
    jobs = []
    for i, (prio, n, running, minm) in enumerate(specs):
        statuses = [TaskStatus.RUNNING if k < running else TaskStatus.PENDING for k in range(n)]
        jobs.append(
            job(
                f"j{i}",
                status=statuses,
                nodes="n0",
                priority=prio,
                index=i % 3,
                min_member=minm or n,
            )
        )
    ssn = Session(snapshot([node("n0", cpu="64", memory="256Gi")], jobs), load_config(KAI_YAML), 1)
    key = ssn.job_order_key()
    assert key is not None
    infos = list(ssn.jobs.values())

    def compare(a: JobInfo, b: JobInfo) -> int:
        return -1 if ssn.job_order_fn(a, b) else (1 if ssn.job_order_fn(b, a) else 0)

    assert sorted(infos, key=key) == sorted(infos, key=functools.cmp_to_key(compare))
    ssn.release()
