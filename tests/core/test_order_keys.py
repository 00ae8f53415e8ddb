"""The order keys that allocate sorts by give exactly the comparators' order (priority, gang, drf,
sla job order; priority task order) on varied jobs: any job or task, sorted either way, lands in
the same place."""

from __future__ import annotations

import functools

from core_helpers import job, node, queue, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from server.config import DEFAULT_CONFIG_YAML, load_config
from server.model import TaskStatus
from server.session.session import Session

WITH_SLA = DEFAULT_CONFIG_YAML.replace(
    "- name: gang", "- name: sla\n    arguments: {sla-waiting-time: 1h}\n  - name: gang", 1
)

JOB = st.tuples(
    st.integers(-2, 2),  # priority
    st.integers(1, 3),  # tasks
    st.integers(0, 3),  # of them running
    st.integers(0, 3),  # min member (0: the task count)
    st.sampled_from(["", "10m", "2h"]),  # sla waiting time annotation
)


def _session(specs: list[tuple[int, int, int, int, str]], config: str) -> Session:
    jobs = []
    for i, (prio, n, running, minm, wait) in enumerate(specs):
        statuses = [
            TaskStatus.RUNNING if k < min(running, n) else TaskStatus.PENDING for k in range(n)
        ]
        annotations = {"sla-waiting-time": wait} if wait else {}
        jobs.append(
            job(
                f"j{i}",
                status=statuses,
                nodes="n0",
                priority=prio - i % 2,
                index=i % 3,
                min_member=minm or n,
                cpu=str(1 + i % 2),
                annotations=annotations,
            )
        )
    return Session(snapshot([node("n0", cpu="64", memory="256Gi")], jobs), load_config(config), 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(JOB, min_size=2, max_size=8), st.booleans())
def test_job_and_task_keys_sort_as_the_comparators(
    specs: list[tuple[int, int, int, int, str]], sla: bool
) -> None:
    ssn = _session(specs, WITH_SLA if sla else DEFAULT_CONFIG_YAML)
    job_key, task_key = ssn.job_order_key(), ssn.task_order_key()
    assert job_key is not None
    assert task_key is not None
    jobs = list(ssn.jobs.values())
    by_cmp = sorted(
        jobs,
        key=functools.cmp_to_key(
            lambda a, b: -1 if ssn.job_order_fn(a, b) else (1 if ssn.job_order_fn(b, a) else 0)
        ),
    )
    assert [j.uid for j in sorted(jobs, key=job_key)] == [j.uid for j in by_cmp]
    tasks = [t for j in jobs for t in j.tasks.values()]
    by_cmp_t = sorted(
        tasks,
        key=functools.cmp_to_key(
            lambda a, b: -1 if ssn.task_order_fn(a, b) else (1 if ssn.task_order_fn(b, a) else 0)
        ),
    )
    assert [t.uid for t in sorted(tasks, key=task_key)] == [t.uid for t in by_cmp_t]


QUEUE = st.tuples(
    st.integers(0, 2),  # priority
    st.integers(1, 4),  # weight
    st.integers(0, 4),  # running tasks of its job
    st.integers(1, 3),  # cpu per task
)


@settings(max_examples=60, deadline=None)
@given(st.lists(QUEUE, min_size=2, max_size=6))
def test_queue_key_sorts_as_the_comparator(specs: list[tuple[int, int, int, int]]) -> None:
    """proportion's queue order (priority, then share of the deserved) as a key: the same order,
    ties (equal shares, equal priorities) included."""
    queues = [
        queue(f"q{i}", priority=prio, weight=weight) for i, (prio, weight, _, _) in enumerate(specs)
    ]
    jobs = [
        job(
            f"j{i}",
            n=max(running, 1),
            status=[TaskStatus.RUNNING] * running or [TaskStatus.PENDING],
            nodes="n0",
            cpu=str(cpu),
            queue=f"q{i}",
            index=i,
        )
        for i, (_, _, running, cpu) in enumerate(specs)
    ]
    ssn = Session(
        snapshot([node("n0", cpu="64", memory="256Gi")], jobs, queues),
        load_config(DEFAULT_CONFIG_YAML),
        1,
    )
    queue_key = ssn.queue_order_key()
    assert queue_key is not None
    infos = list(ssn.queues.values())
    by_cmp = sorted(
        infos,
        key=functools.cmp_to_key(
            lambda a, b: -1 if ssn.queue_order_fn(a, b) else (1 if ssn.queue_order_fn(b, a) else 0)
        ),
    )
    assert [q.uid for q in sorted(infos, key=queue_key)] == [q.uid for q in by_cmp]


def test_no_queue_key_when_a_queue_order_plugin_gives_none() -> None:
    """capacity orders queues by a comparator only: allocate then compares queues as before."""
    config = DEFAULT_CONFIG_YAML.replace("- name: proportion", "- name: capacity")
    ssn = Session(snapshot([node("n0")], [job("j0")]), load_config(config), 1)
    assert ssn.queue_order_key() is None
