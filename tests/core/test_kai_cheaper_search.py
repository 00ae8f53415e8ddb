"""The victim search's cheaper paths give the answers of the paths they stand in for, exactly:

* ``ScenarioFilters.accepts_with`` (node-affinity told from the recorded victims' room and the rows
  the attempt's victims change) answers as the filters do on the whole room (``plus``), and counts
  the same rejections;
* nodeplacement's binpack over every node in order (whole columns, in place) scores bit for bit as
  over the same rows indexed;
* proportion's queue key of a ``GivenUp`` (the given-up victims' sums kept on the lists) is the key
  of the same jobs in a plain list;
* a victim queue ordered by reversed job-order keys holds and pops its jobs as with the comparator;
* a queue filled at once (each leaf sorted, then cut to its depth) holds what pushing the jobs one
  by one leaves.

Each on KAI sessions of bench clusters (bench/cycle.py ``build``) after KAI's allocate, so that
jobs hold nodes and others wait.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import yaml
from core_helpers import load_bench, session

from server.actions.kai.allocate import KaiAllocateAction
from server.actions.kai.job_queue import Filters, JobsByQueue
from server.actions.kai.scenario_filters import ScenarioFilters
from server.model import TaskStatus
from server.plugins.kai.proportion import KaiProportionPlugin
from server.session.info import JobInfo, TaskInfo
from server.session.kai import ACTIVE_ALLOCATED, GivenUp, all_rows, is_gpu_task
from server.session.session import Session

bench = load_bench("cycle")


def allocated(nodes: int = 60, tasks: int = 300, seed: int = 1) -> Session:
    """A KAI session of a bench cluster once allocate has placed what it could."""
    ssn = session(bench.build(nodes, tasks, seed), yaml.safe_load(bench.KAI_CONFIG.read_text()))
    KaiAllocateAction().execute(ssn)
    return ssn


def placed_tasks(ssn: Session) -> list[TaskInfo]:
    return [t for j in ssn.jobs.values() for t in j.tasks.values() if t.node is not None]


def pending_tasks(ssn: Session) -> list[TaskInfo]:
    return [t for j in ssn.jobs.values() for t in j.index[TaskStatus.PENDING].values()]


@pytest.mark.parametrize("seed", [1, 2])
def test_accepts_with_answers_as_the_filters_on_the_whole_room(seed: int) -> None:
    ssn = allocated(seed=seed)
    rng = random.Random(seed)
    placed, pending = placed_tasks(ssn), pending_tasks(ssn)
    outcomes: Counter[str] = Counter()
    for _ in range(150):
        tasks = rng.sample(pending, rng.randint(1, 4))
        recorded = rng.sample(placed, rng.randint(0, 6))
        filters = ScenarioFilters(ssn, tasks, recorded)
        reference = ScenarioFilters(ssn, tasks, recorded)
        for _ in range(6):
            victims = rng.sample(placed, rng.randint(0, 14))
            got = filters.accepts_with(victims)
            assert got == reference._check(reference.recorded.plus(victims))
            room = reference.recorded.room  # (without the victims)
            before = all(f.accepts(reference.need, room) for f in reference._checks)
            outcomes[f"{before}->{got}"] += 1
        assert filters.rejected == reference.rejected
    # Refused and accepted, and accepted only thanks to the rows the victims changed.
    assert outcomes["False->False"]
    assert outcomes["True->True"]
    assert outcomes["False->True"]


def test_binpack_over_every_node_scores_as_over_the_rows_indexed() -> None:
    ssn = allocated()
    scorer = next(s for s in ssn.evaluator.scorers["task"] if s.plugin == "nodeplacement")
    n = len(ssn.nodes)
    stmt = ssn.statement()
    rng = random.Random(3)
    for t in rng.sample(placed_tasks(ssn), 25):  # releasing tasks: free is idle + releasing
        stmt.evict(t, "test")
    kinds: Counter[str] = Counter()
    for t in pending_tasks(ssn) + rng.sample(placed_tasks(ssn), 60):
        every = scorer.score(t, all_rows(n))
        indexed = scorer.score(t, np.arange(n))
        assert every.dtype == indexed.dtype
        assert every.tobytes() == indexed.tobytes()
        # GPU tasks score the GPU nodes only (not every node has the resource), CPU tasks all.
        kinds["gpu" if is_gpu_task(t, ssn.space.index) else "cpu"] += 1
        kinds["graded"] += len(set(every.tolist())) > 2
    stmt.discard()
    assert kinds["gpu"]
    assert kinds["cpu"]
    assert kinds["graded"]


def running_jobs(ssn: Session, queue: str) -> list[JobInfo]:
    return sorted(
        (
            j
            for j in ssn.jobs.values()
            if j.queue == queue and any(t.node is not None for t in j.tasks.values())
        ),
        key=lambda j: j.uid,
    )


def test_a_given_up_list_keys_its_queue_as_the_same_jobs_in_a_plain_list() -> None:
    ssn = allocated()
    plugin = next(p for p in ssn.plugins if isinstance(p, KaiProportionPlugin))
    for name in ("q0", "q1", "q2", "q3"):
        jobs = running_jobs(ssn, name)
        assert len(jobs) > 4
        q = plugin.queues[name]
        # One list built on none (from scratch), one built on a plain list of three.
        for start in (0, 3):
            shown: GivenUp | None = GivenUp(jobs[:start], None) if start else None
            keys = []
            for j in jobs[start:]:
                shown = GivenUp([*(shown or []), j], shown)
                key = plugin._queue_key(q, None, shown)
                assert key == plugin._queue_key(q, None, list(shown))
                keys.append(key)
            assert len(set(keys)) > 1  # the victims given up move the queue's place


def test_a_victim_queue_by_reversed_keys_orders_and_pops_as_by_the_comparator() -> None:
    ssn = allocated()
    filters = Filters(non_preemptible=True, non_active=True)
    for reclaimer in ("q0", "q2"):
        jobs = [j for j in ssn.jobs.values() if j.queue != reclaimer]
        by_keys = JobsByQueue(ssn, victims=True).fill(jobs, filters)
        by_comparator = JobsByQueue(ssn, victims=True)
        by_comparator._order_key = None  # (the comparator, reversed)
        by_comparator.fill(jobs, filters)
        assert by_keys._order_key is not None
        listed = {leaf: [j.uid for j in js] for leaf, js in by_keys.jobs.items()}
        assert listed == {leaf: [j.uid for j in js] for leaf, js in by_comparator.jobs.items()}
        assert sum(len(js) for js in listed.values()) > 10
        # pop_unchanged (GivenUp lists, answers kept) pops as pop (plain lists, asked afresh).
        a, b = by_keys.copy(), by_comparator.copy()
        popped_a = [a.pop_unchanged().uid for _ in range(len(a))]
        popped_b = [b.pop().uid for _ in range(len(b))]
        assert popped_a == popped_b


@pytest.mark.parametrize("victims", [False, True])
@pytest.mark.parametrize("depth", [None, 0, 3])
def test_a_queue_filled_at_once_holds_what_pushing_one_by_one_leaves(
    victims: bool, depth: int | None
) -> None:
    ssn = allocated()
    filters = Filters(non_active=True) if victims else Filters(non_pending=True)
    jobs = list(ssn.jobs.values())
    rng = random.Random(depth)
    rng.shuffle(jobs)
    filled = JobsByQueue(ssn, victims=victims, depth=depth).fill(jobs, filters)
    pushed = JobsByQueue(ssn, victims=victims, depth=depth)
    for j in jobs:  # (the jobs the filters keep, one by one)
        if victims and any(t.status in ACTIVE_ALLOCATED for t in j.tasks.values()):
            pushed.push(j)
        if not victims and j.index[TaskStatus.PENDING]:
            pushed.push(j)
    assert list(filled.jobs) == list(pushed.jobs)  # (the leaves in the same order too)
    assert {leaf: [j.uid for j in js] for leaf, js in filled.jobs.items()} == {
        leaf: [j.uid for j in js] for leaf, js in pushed.jobs.items()
    }
    assert sum(len(js) for js in pushed.jobs.values()) > 4 or depth == 0
