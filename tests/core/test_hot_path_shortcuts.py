"""The allocate path's shortcuts (issue 29, item 5) give the answers of the plain computations
they stand for: each test fails when its shortcut is wrong."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from core_helpers import job, node, session, snapshot, task

from muster.quantity import MIN_RESOURCE
from server.config import DEFAULT_CONFIG_YAML
from server.model import NodeSpec, SubGroupSpec, TaskStatus
from server.plugins.volcano.drf import DrfPlugin
from server.plugins.volcano.proportion import ProportionPlugin
from server.session.devices import DeviceLedger, node_devices
from server.session.info import JobInfo, ResourceSpace, TaskInfo, dominant_share, rows_fit
from server.session.session import Session

GPU = "nvidia.com/gpu"


def test_rows_fit_is_every_column_at_its_limit() -> None:
    """``rows_fit`` (column by column) is ``(values >= limit).all(axis=1)``, on many rows and on
    few, with negative, infinite and NaN values and values equal to the limit."""
    rng = np.random.default_rng(5)
    for rows in (1, 3, 40, 5000):
        values = rng.integers(-2, 5, size=(rows, 3)).astype(float)
        values[rng.random((rows, 3)) < 0.05] = np.inf
        values[rng.random((rows, 3)) < 0.05] = np.nan
        for limit in ([1.0, 2.0, 0.0], [-1.0, math.inf, 1.0], [0.0, 0.0, math.nan]):
            want = (values >= np.array(limit)).all(axis=1)
            assert rows_fit(values, limit).tolist() == want.tolist()


def _weighted(least: int, most: int, balanced: int) -> str:
    return DEFAULT_CONFIG_YAML.replace(
        "  - name: nodeorder",
        "  - name: nodeorder\n"
        "    arguments:\n"
        f"      leastrequested.weight: {least}\n"
        f"      mostrequested.weight: {most}\n"
        f"      balancedresource.weight: {balanced}",
    )


@pytest.mark.parametrize("weights", [(1, 0, 1), (2, 1, 3), (0, 1, 0), (0, 0, 0)])
def test_resource_scores_match_their_one_row_form_where_a_node_lacks_cpu_or_memory(
    weights: tuple[int, int, int],
) -> None:
    """nodeorder's vector form leaves out the has-cpu / has-memory masks when every node has
    both: with nodes that lack one, and with every weight combination, it must still give the
    one-row answers on every row (used, full and over-committed ones)."""
    assert "  - name: nodeorder" in DEFAULT_CONFIG_YAML
    nodes = [node(f"n{i:02d}", "8", "16Gi") for i in range(8)]
    nodes += [node("nocpu", None, "16Gi"), node("nomem", "8", None)]
    running = [
        task(f"r{i}", "run", {"cpu": str(1 + i % 7), "memory": f"{1 + i}Gi"}, f"n{i:02d}")
        for i in range(8)
    ]
    running.append(task("big", "run", {"cpu": "20", "memory": "40Gi"}, "n00"))
    pending = [
        task("p-small", "wait", {"cpu": "1", "memory": "1Gi"}),
        task("p-cpu", "wait", {"cpu": "6"}),
        task("p-mem", "wait", {"memory": "12Gi"}),
    ]
    snap = snapshot(
        nodes, [job("run", tasks=running, min_member=1), job("wait", tasks=pending, index=1)]
    )
    ssn = session(snap, _weighted(*weights))
    scorer = next(s for s in ssn.evaluator.scorers["shape"] if s.plugin == "nodeorder")
    assert scorer.row is not None
    rows = np.arange(len(ssn.nodes))
    for t in ssn.tasks.values():
        assert scorer.score(t, rows).tolist() == [scorer.row(t, int(i)) for i in rows], t.uid


def _pods_session() -> Session:
    nodes = [node("a", "8", "16Gi", pods="2"), node("b", "8", "16Gi", pods="2")]
    held = [task(f"r{i}", "run", {"cpu": "1", "memory": "1Gi"}, "a") for i in range(2)]
    snap = snapshot(
        nodes,
        [job("run", tasks=held, min_member=1), job("w", 1, index=1)],
    )
    return session(snap, DEFAULT_CONFIG_YAML)


def test_pod_count_counts_evicted_tasks_only_while_they_are_evicted() -> None:
    """The pod-count predicate reads the evicted counts only when some task is evicted: a full
    node must pass once one of its tasks is evicted, and fail again when the eviction is undone
    (vector and one-row forms alike)."""
    ssn = _pods_session()
    pods = next(p for p in ssn.evaluator.predicates["shape"] if p.counts == "pods")
    assert pods.row is not None
    waiting = ssn.tasks["ns/w-0"]
    rows = np.arange(2)

    def answers() -> tuple[list[bool], list[bool]]:
        return pods.check(waiting, rows).tolist(), [pods.row(waiting, i) for i in (0, 1)]

    assert answers() == ([False, True], [False, True])
    stmt = ssn.statement()
    stmt.evict(ssn.tasks["ns/r0"], "test")
    assert answers() == ([True, True], [True, True])
    stmt.discard()
    assert answers() == ([False, True], [False, True])


def test_queue_checks_follow_a_new_deserved_share() -> None:
    """proportion keeps the deserved share's floats per array: a queue given another deserved
    array must be judged by it (``allocatable`` and ``overused``)."""
    snap = snapshot(
        [node("a", "8", "16Gi")],
        [job("run", 2, "2", status=TaskStatus.RUNNING, nodes="a"), job("w", 1, "2", index=1)],
    )
    ssn = session(snap, DEFAULT_CONFIG_YAML)
    plugin = next(p for p in ssn.plugins if isinstance(p, ProportionPlugin))
    queue = ssn.queues["default"]
    attr = plugin.attrs["default"]
    waiting = ssn.tasks["ns/w-0"]
    assert plugin.allocatable(queue, waiting).ok
    assert not plugin.overused(queue)
    attr.deserved = attr.allocated.copy()  # exactly what it holds: full, and nothing more fits
    assert not plugin.allocatable(queue, waiting).ok
    assert plugin.overused(queue)
    attr.deserved = attr.allocated + waiting.resreq
    assert plugin.allocatable(queue, waiting).ok
    assert not plugin.overused(queue)


def test_proportion_counts_what_jobs_hold_at_open() -> None:
    """A job holding nothing adds nothing to its queue's allocation (left out at open); one that
    holds tasks must still be counted, in allocated and in request."""
    snap = snapshot(
        [node("a", "8", "16Gi")],
        [
            job("run", 2, "2", status=[TaskStatus.RUNNING, TaskStatus.PENDING], nodes="a"),
            job("w", 1, "3", index=1),
        ],
    )
    ssn = session(snap, DEFAULT_CONFIG_YAML)
    attr = next(p for p in ssn.plugins if isinstance(p, ProportionPlugin)).attrs["default"]
    cpu = ssn.space.index["cpu"]
    assert attr.allocated[cpu] == 2000.0
    assert attr.request[cpu] == 2000.0 + 2000.0 + 3000.0


def test_made_up_devices_are_those_of_the_node_and_each_rows_own() -> None:
    """Devices made up from allocatable are found once per allocatable: the same devices as
    ``node_devices``, a node with another count its own, and each row's lists its own."""
    specs = [
        NodeSpec("g0", {"cpu": 8000.0, GPU: 4000.0}),
        NodeSpec("g1", {"cpu": 8000.0, GPU: 4000.0}),
        NodeSpec("g2", {"cpu": 8000.0, GPU: 2000.0}),
        NodeSpec("c0", {"cpu": 8000.0}),
        NodeSpec("l0", {"cpu": 8000.0, GPU: 2000.0}, devices=[{"id": "x", "type": GPU}]),
    ]
    ledger = DeviceLedger(specs)
    for row, spec in enumerate(specs):
        assert ledger.of(row) == node_devices(spec)
    assert [d.id for d in ledger.of(2)[GPU]] == ["0", "1"]
    assert [d.id for d in ledger.of(4)[GPU]] == ["x"]
    assert ledger.of(0)[GPU] is not ledger.of(1)[GPU]


def test_free_devices_up_to_a_limit_are_the_first_of_all_free_ones() -> None:
    """``free`` reads the free devices in one loop that stops at ``limit``: in every state it must
    give the first ``limit`` of what it gives without one, and the candidates start with them."""
    rng = random.Random(11)
    listed = [{"id": f"d{i}", "type": GPU, "healthy": i != 3} for i in range(8)]
    specs = [NodeSpec(f"n{i}", {GPU: 8000.0}, devices=listed) for i in range(4)]
    space = ResourceSpace([GPU])
    for _ in range(200):
        ledger = DeviceLedger(specs)
        row = rng.randrange(4)
        ids = [f"d{i}" for i in range(8)]
        rng.shuffle(ids)
        for k, ident in enumerate(ids[: rng.randint(0, 6)]):
            holder = TaskInfo(
                task(f"h{k}", "j", {GPU: "1"}, status=TaskStatus.RUNNING, node=f"n{row}"), space
            )
            holder.status = rng.choice(
                [TaskStatus.RUNNING, TaskStatus.RELEASING, TaskStatus.PIPELINED]
            )
            holder.devices = [ident]
            ledger.attach(row, holder)
        if rng.random() < 0.2:
            ledger.shared[row].add(ids[-1])
        for status in (TaskStatus.ALLOCATED, TaskStatus.PIPELINED):
            for count in range(0, 10):
                assert ledger.free(row, GPU, count) == ledger.free(row, GPU)[:count]
                want = ledger.candidates(row, GPU, status)[:count]
                assert ledger.candidates(row, GPU, status, count) == want


def test_a_job_files_its_tasks_as_add_task_does() -> None:
    """``JobInfo`` files pending tasks that ask for resources without ``add_task``: the task map,
    the status index (its order too) and every count must be those ``add_task`` gives, whatever
    the mix of statuses."""
    space = ResourceSpace(["cpu", "memory"])
    statuses = [
        TaskStatus.RUNNING,
        TaskStatus.PENDING,
        TaskStatus.PENDING,
        TaskStatus.PIPELINED,
        TaskStatus.PENDING,
        TaskStatus.SUCCEEDED,
    ]
    spec = job("mixed", status=statuses, nodes=["a", None, None, "a", None, "a"])
    spec.tasks[2].request = {}  # best-effort: pending but asking nothing
    made = JobInfo(spec, space)
    added = JobInfo(job("other", 1), space)
    added._clear_tasks(space.zeros())
    for ts in spec.tasks:
        added.add_task(TaskInfo(ts, space))
    assert list(made.tasks) == list(added.tasks)
    assert [(s, list(m)) for s, m in made.index.items()] == [
        (s, list(m)) for s, m in added.index.items()
    ]
    for count in ("status_changes", "valid_count", "ready_count", "pending_best_effort"):
        assert getattr(made, count) == getattr(added, count), count
    assert made.allocated.tolist() == added.allocated.tolist()


def test_fit_errors_count_each_short_resource() -> None:
    """The resource reasons of a task that fits nowhere are counted per resource (a node short
    of both counts in both), and only the nodes short of none go on to the later checks."""
    nodes = [node(f"c{i}", "1", "16Gi") for i in range(2)]  # short of cpu
    nodes += [node(f"m{i}", "8", "1Gi") for i in range(3)]  # short of memory
    nodes += [node("b0", "1", "1Gi")]  # short of both
    nodes += [node(f"p{i}", "8", "16Gi", pods="1") for i in range(2)]  # full of pods
    held = [task(f"r{i}", "run", {"cpu": "1", "memory": "1Gi"}, f"p{i}") for i in range(2)]
    snap = snapshot(
        nodes,
        [job("run", tasks=held, min_member=1), job("w", 1, "4", memory="8Gi", index=1)],
    )
    ssn = session(snap, DEFAULT_CONFIG_YAML)
    waiting = ssn.tasks["ns/w-0"]
    assert ssn.evaluator.select(waiting) is None
    reasons = ssn.evaluator.fit_errors(waiting).reasons
    assert reasons == {
        "Insufficient cpu": 3,
        "Insufficient memory": 4,
        "node(s) pod number exceeded": 2,
    }
    assert MIN_RESOURCE > 0


def test_queue_request_adds_every_pending_task_once() -> None:
    """proportion adds a job's pending requests once per request vector and count: jobs of one
    request with different counts, and a job of mixed requests, must each add what they ask."""
    snap = snapshot(
        [node("a", "64", "256Gi")],
        [
            job("two", 2, "1", index=0),
            job("three", 3, "1", index=1),
            job("again", 2, "1", index=2),
            job(
                "mixed",
                tasks=[
                    task("m0", "mixed", {"cpu": "1", "memory": "1Gi"}),
                    task("m1", "mixed", {"cpu": "4", "memory": "1Gi"}),
                ],
                index=3,
            ),
        ],
    )
    ssn = session(snap, DEFAULT_CONFIG_YAML)
    attr = next(p for p in ssn.plugins if isinstance(p, ProportionPlugin)).attrs["default"]
    assert attr.request[ssn.space.index["cpu"]] == (2 + 3 + 2 + 1 + 4) * 1000.0


def test_drf_share_of_a_job_that_holds_nothing_is_zero_and_others_are_computed() -> None:
    """drf knows the share of a job holding nothing (0.0) without computing it; a job holding
    tasks must get its dominant share."""
    snap = snapshot(
        [node("a", "8", "16Gi")],
        [job("run", 2, "2", status=TaskStatus.RUNNING, nodes="a"), job("w", 1, "2", index=1)],
    )
    ssn = session(snap, DEFAULT_CONFIG_YAML)
    shares = next(p for p in ssn.plugins if isinstance(p, DrfPlugin)).shares
    running = ssn.jobs["ns/run"]
    assert shares.get("ns/w") == 0.0
    assert shares.get("ns/run") == dominant_share(running.allocated, ssn.total_resource) > 0


def test_gang_validity_still_asks_sub_group_minimums() -> None:
    """gang's job_valid asks the sub-group check only of a job with sub-group minimums: a job
    one of whose sub-groups has fewer valid tasks than its minimum must still be invalid."""
    tasks = [
        task("a0", "sg", {"cpu": "1"}, sub_group="a"),
        task("b0", "sg", {"cpu": "1"}, sub_group="b", status=TaskStatus.FAILED),
        task("b1", "sg", {"cpu": "1"}, sub_group="b"),
    ]
    short = job("sg", tasks=tasks, min_member=2, sub_groups=[SubGroupSpec("b", 2)])
    met = job("ok", tasks=[task("c0", "ok", {"cpu": "1"}, sub_group="b")], index=1)
    met.sub_groups = [SubGroupSpec("b", 1)]
    ssn = session(snapshot([node("a", "8", "16Gi")], [short, met]), DEFAULT_CONFIG_YAML)
    invalid = ssn.job_valid(ssn.jobs["ns/sg"])
    assert invalid is not None
    assert not invalid.passed
    assert "subGroups" in invalid.message
    assert ssn.job_valid(ssn.jobs["ns/ok"]) is None
