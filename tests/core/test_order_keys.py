"""The order keys that allocate sorts by give exactly the comparators' order (priority, gang, drf,
sla job order; priority task order) on varied jobs: any job or task, sorted either way, lands in
the same place."""

from __future__ import annotations

import functools

from core_helpers import job, node, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from server.config import DEFAULT_CONFIG_YAML, load_config
from server.model import TaskStatus
from server.session.session import Session

WITH_SLA = DEFAULT_CONFIG_YAML.replace("- name: gang", "- name: sla\n    arguments: {sla-waiting-time: 1h}\n  - name: gang", 1)

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
        statuses = [TaskStatus.RUNNING if k < min(running, n) else TaskStatus.PENDING for k in range(n)]
        annotations = {"sla-waiting-time": wait} if wait else {}
        jobs.append(job(f"j{i}", status=statuses, nodes="n0", priority=prio - i % 2, index=i % 3,
                        min_member=minm or n, cpu=str(1 + i % 2), annotations=annotations))
    return Session(snapshot([node("n0", cpu="64", memory="256Gi")], jobs), load_config(config), 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(JOB, min_size=2, max_size=8), st.booleans())
def test_job_and_task_keys_sort_as_the_comparators(specs: list[tuple[int, int, int, int, str]], sla: bool) -> None:
    ssn = _session(specs, WITH_SLA if sla else DEFAULT_CONFIG_YAML)
    job_key, task_key = ssn.job_order_key(), ssn.task_order_key()
    assert job_key is not None and task_key is not None
    jobs = list(ssn.jobs.values())
    by_cmp = sorted(jobs, key=functools.cmp_to_key(lambda a, b: -1 if ssn.job_order_fn(a, b) else (1 if ssn.job_order_fn(b, a) else 0)))
    assert [j.uid for j in sorted(jobs, key=job_key)] == [j.uid for j in by_cmp]
    tasks = [t for j in jobs for t in j.tasks.values()]
    by_cmp_t = sorted(tasks, key=functools.cmp_to_key(lambda a, b: -1 if ssn.task_order_fn(a, b) else (1 if ssn.task_order_fn(b, a) else 0)))
    assert [t.uid for t in sorted(tasks, key=task_key)] == [t.uid for t in by_cmp_t]
