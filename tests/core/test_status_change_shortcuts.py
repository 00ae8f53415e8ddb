"""The shortcuts that make a task's status change cheaper (KAI's reclaim evicts, simulates and rolls
back thousands of times per cycle) change nothing: the same random run of statement operations
(allocate, pipeline, evict, unevict, move, unpipeline, checkpoints and rollbacks, on whole-GPU and
shared-GPU tasks) leaves the same session state, to the bit, with each shortcut replaced by the
plain computation it stands for.

Each ``_plain_*`` below is that plain computation: the code as it was before the shortcut."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from core_helpers import load_bench, session

from server.actions.kai.allocate import KaiAllocateAction
from server.model import ALLOCATED, ClusterSnapshot, JobSpec, TaskSpec, TaskStatus
from server.plugins.kai.proportion import RESOURCES, KaiProportionPlugin
from server.session.devices import DeviceLedger
from server.session.info import _PENDING, NodeTable, TaskInfo
from server.session.kai import is_preemptible, new_group_name
from server.session.session import Session
from server.session.statement import Statement

KAI_CONFIG = (Path(__file__).resolve().parents[2] / "examples" / "config-kai.yaml").read_text()
_RELEASING, _PIPELINED = TaskStatus.RELEASING, TaskStatus.PIPELINED


# -- the plain computations ----------------------------------------------------------------------
def _plain_add_task(self: NodeTable, i: int, task: TaskInfo) -> None:
    r = task.resreq
    if task.status == _RELEASING:
        self.idle[i] -= r
        self.releasing[i] += r
        self.used[i] += r
        self._releasing_tasks += 1
    elif task.status == _PIPELINED:
        self.pipelined[i] += r
        self._pipelined_tasks += 1
    else:
        self.idle[i] -= r
        self.used[i] += r
    self.task_count[i] += 1
    self.tasks[i][task.uid] = task
    if task.devices:
        self.devices.attach(i, task)
    if task.gpu_fraction and task.gpu_groups:
        self._share(i, task, joining=True)
    self.change_log.append(i)


def _plain_remove_task(self: NodeTable, i: int, task: TaskInfo) -> None:
    r = task.resreq
    if task.status == _RELEASING:
        self.idle[i] += r
        self.releasing[i] -= r
        self.used[i] -= r
        self._releasing_tasks -= 1
    elif task.status == _PIPELINED:
        self.pipelined[i] -= r
        self._pipelined_tasks -= 1
    else:
        self.idle[i] += r
        self.used[i] -= r
    self.task_count[i] -= 1
    self.tasks[i].pop(task.uid, None)
    if task.devices:
        self.devices.detach(i, task)
    if task.gpu_fraction and task.gpu_groups:
        self._share(i, task, joining=False)
    self.change_log.append(i)


def _plain_detach(self: DeviceLedger, row: int, task: Any) -> None:
    for target in (self.held[row], self.promised[row]):
        for d in task.devices:
            if target.get(d) is task:
                del target[d]


def _plain_change_status(self: Statement, task: TaskInfo, status: TaskStatus) -> None:
    assert task.node is not None
    ssn = self.ssn
    nodes = ssn.nodes
    i = nodes.index[task.node]
    nodes.remove_task(i, task)
    job = ssn.jobs.get(task.job)
    releasing = status == _RELEASING
    if job is not None:
        job.update_task_status(task, status)
    else:
        task.status = status
    rivals = None if releasing or not task.devices else _plain_rivals(self, task)
    nodes.add_task(i, task)
    if rivals is not None:
        whole, groups = rivals
        for other in whole:
            self._choose_devices_again(other)
        for name in groups:
            self._move_share(i, name)
    for h in ssn.event_handlers:
        fn = h.deallocate if releasing else h.allocate
        if fn:
            fn(task)


def _plain_rivals(self: Statement, task: TaskInfo) -> tuple[list[TaskInfo], list[str]]:
    if not task.devices or task.node is None or task.status == _RELEASING:
        return [], []
    nodes = self.ssn.nodes
    row = nodes.index[task.node]
    promised, shared = nodes.devices.promised[row], nodes.shared[row]
    whole = {id(t): t for d in task.devices if (t := promised.get(d)) is not None and t is not task}
    groups = [
        d for d in task.devices if shared.get(d) and all(t.status == _PIPELINED for t in shared[d])
    ]
    return list(whole.values()), groups


def _plain_return(self: Statement, task: TaskInfo, node: str, status: TaskStatus) -> None:
    ssn = self.ssn
    ssn.jobs[task.job].update_task_status(task, status)
    task.node = node
    whole, groups = _plain_rivals(self, task)
    row = ssn.nodes.index[node]
    ssn.nodes.add_task(row, task)
    for other in whole:
        self._choose_devices_again(other)
    for name in groups:
        self._move_share(row, name)


def _plain_on_event(self: KaiProportionPlugin, task: TaskInfo, sign: float) -> None:
    job = self.ssn.jobs.get(task.job)
    if job is None:
        return
    np_job = not is_preemptible(job)
    amount = self._quantities(task)
    for qs in self._chain(self.queues, job.queue):
        shares = [qs.by_resource[r] for r in RESOURCES]
        for s, v in zip(shares, amount, strict=True):
            s.allocated += sign * v
            if np_job:
                s.allocated_np += sign * v
        qs.allocation_key = (shares[0].allocated, shares[1].allocated, shares[2].allocated)


# Per shortcut: the attributes that stand for it, and the plain computation of each.
PLAIN: dict[str, list[tuple[type, str, Callable[..., Any]]]] = {
    "node rows changed through views, not written back": [
        (NodeTable, "add_task", _plain_add_task),
        (NodeTable, "remove_task", _plain_remove_task),
    ],
    "detach looks at promised only when some are": [(DeviceLedger, "detach", _plain_detach)],
    "no rivals looked for on a row without promised or shared GPUs": [
        (Statement, "_change_status", _plain_change_status),
        (Statement, "_return", _plain_return),
    ],
    "proportion events found once per task, one handler per sign": [
        (KaiProportionPlugin, "_on_allocate", lambda self, t: _plain_on_event(self, t, 1.0)),
        (KaiProportionPlugin, "_on_deallocate", lambda self, t: _plain_on_event(self, t, -1.0)),
    ],
}


# -- the run -------------------------------------------------------------------------------------
def _snapshot() -> ClusterSnapshot:
    """A small bench cluster (whole-GPU gangs, every fifth job non-preemptible), with fractional
    GPU jobs added."""
    snap: ClusterSnapshot = load_bench("cycle").build(24, 140, 5)
    snap.jobs = [
        dataclasses.replace(j, preemptible=False) if k % 5 == 0 else j
        for k, j in enumerate(snap.jobs)
    ]
    for j in range(12):
        uid = f"bench/share-{j}"
        snap.jobs.append(
            JobSpec(
                uid,
                f"share-{j}",
                "bench",
                f"q{j % 4}",
                [
                    TaskSpec(
                        uid=f"{uid}-0",
                        name=f"share-{j}-0",
                        namespace="bench",
                        job=uid,
                        request={"cpu": 500.0, "memory": 2.0**30},
                        gpu_fraction=(0.25, 0.5, 0.3)[j % 3],
                        creation_index=1000 + j,
                    )
                ],
                min_member=1,
                priority=(0, 10, 100)[j % 3],
                creation_index=1000 + j,
            )
        )
    return snap


def _state(ssn: Session, proportion: KaiProportionPlugin) -> tuple[Any, ...]:
    n, ledger = ssn.nodes, ssn.nodes.devices
    return (
        [a.tobytes() for a in (n.idle, n.used, n.releasing, n.pipelined)],
        n.task_count.tolist(),
        (n._releasing_tasks, n._pipelined_tasks, len(n.change_log)),
        [list(row) for row in n.tasks],
        [[(d, t.uid) for d, t in row.items()] for row in ledger.held],
        [[(d, t.uid) for d, t in row.items()] for row in ledger.promised],
        [sorted(s) for s in ledger.shared],
        [sorted(s) for s in ledger.shared_releasing],
        [{g: [t.uid for t in ts] for g, ts in row.items()} for row in n.shared],
        {
            uid: (
                j.status_changes,
                j.ready_count,
                j.valid_count,
                j.pending_best_effort,
                j.allocated.tobytes(),
                {s: list(ts) for s, ts in j.index.items() if ts},
            )
            for uid, j in ssn.jobs.items()
        },
        {
            uid: (t.status, t.node, list(t.devices), list(t.gpu_groups), t.evicted_here)
            for uid, t in ssn.tasks.items()
        },
        {
            name: [(s.allocated.hex(), s.allocated_np.hex()) for s in qs.by_resource.values()]
            + [tuple(v.hex() for v in qs.allocation_key)]
            for name, qs in proportion.queues.items()
        },
    )


def _run(seed: int, steps: int, counts: dict[str, int]) -> Iterator[tuple[Any, ...]]:
    """The session's state after allocate, then after each of ``steps`` random operations of one
    statement, then after it is discarded."""
    ssn = session(_snapshot(), KAI_CONFIG)
    (proportion,) = [p for p in ssn.plugins if isinstance(p, KaiProportionPlugin)]
    KaiAllocateAction({}).execute(ssn)
    yield _state(ssn, proportion)
    rng = random.Random(seed)
    nodes, tasks = ssn.nodes, list(ssn.tasks.values())
    gpu_rows = [
        i for i in range(len(nodes)) if nodes.gpu_dim and nodes.allocatable[i, nodes.gpu_dim]
    ]
    stmt, marks = ssn.statement(), []

    def row_for(task: TaskInfo) -> int:
        busy = [i for i in gpu_rows if nodes.releasing[i].any()]
        if (task.device_needs or task.gpu_fraction) and busy and rng.random() < 0.8:
            return rng.choice(busy)  # where a pipelined task is promised what is released
        return rng.choice(gpu_rows if task.device_needs or task.gpu_fraction else range(len(nodes)))

    def groups_for(task: TaskInfo, row: int, releasing: bool) -> list[str] | None:
        if not task.gpu_fraction:
            return None
        existing = list(nodes.shared[row])
        if existing and rng.random() < 0.5:
            return [rng.choice(existing)]
        return [new_group_name(nodes, row, releasing=releasing)]

    for _ in range(steps):
        held = [t for t in tasks if t.node is not None and t.status in ALLOCATED]
        evicted = [t for t in tasks if t.status == _RELEASING and t.evicted_here]
        pending = [t for t in tasks if t.status == _PENDING]
        pipelined = [t for t in tasks if t.status == _PIPELINED and t.node is not None]
        kind = rng.choice(
            ["evict"] * 4
            + ["unevict"] * 3
            + ["move", "pipeline", "pipeline", "allocate"]
            + ["unpipeline", "checkpoint", "rollback"]
        )
        if kind == "evict" and held:
            stmt.evict(rng.choice(held), "test")
        elif kind == "unevict" and evicted:
            t = rng.choice(evicted)
            assert t.node is not None
            stmt.pipeline(t, t.node, list(t.gpu_groups) if t.gpu_fraction else None)
        elif kind == "move" and evicted:
            t = rng.choice(evicted)
            row = row_for(t)
            stmt.pipeline(t, nodes.names[row], groups_for(t, row, releasing=True))
        elif kind == "pipeline" and pending:
            t = rng.choice(pending)
            row = row_for(t)
            stmt.pipeline(t, nodes.names[row], groups_for(t, row, releasing=True))
        elif kind == "allocate" and pending:
            t = rng.choice(pending)
            row = rng.choice(gpu_rows if t.device_needs or t.gpu_fraction else range(len(nodes)))
            stmt.allocate(t, nodes.names[row], groups_for(t, row, releasing=False))
        elif kind == "unpipeline" and pipelined:
            stmt.unpipeline(rng.choice(pipelined))
        elif kind == "checkpoint":
            marks.append(stmt.checkpoint())
        elif kind == "rollback" and marks:
            stmt.rollback(marks.pop())
        else:
            continue
        counts[kind] = counts.get(kind, 0) + 1
        yield _state(ssn, proportion)
    stmt.discard()
    yield _state(ssn, proportion)


@contextmanager
def _plain(shortcut: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with monkeypatch.context() as m:
        for owner, name, fn in PLAIN[shortcut]:
            m.setattr(owner, name, fn)
        yield


@pytest.mark.parametrize("shortcut", list(PLAIN))
@pytest.mark.parametrize("seed", [1, 2])
def test_a_status_change_shortcut_leaves_what_the_plain_computation_leaves(
    shortcut: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts: dict[str, int] = {}
    fast = list(_run(seed, 160, counts))
    with _plain(shortcut, monkeypatch):
        plain = list(_run(seed, 160, {}))
    assert len(fast) == len(plain)
    for step, (a, b) in enumerate(zip(fast, plain, strict=True)):
        assert a == b, f"state differs after step {step}"
    # The run did what it is for: tasks evicted, uneviction while pipelined tasks were promised
    # devices, moves, rollbacks.
    assert counts.get("evict", 0) > 20
    assert counts.get("unevict", 0) > 10
    for kind in ("move", "pipeline", "unpipeline", "rollback"):
        assert counts.get(kind, 0) > 0, kind


def test_the_run_meets_rivals_and_shared_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs above take devices back from pipelined rivals and move shared GPUs, so the rival
    shortcut is tested where it must not apply too."""
    found = {"none": 0, "some": 0, "taken back": 0}
    original = Statement._rivals

    def counting(self: Statement, task: TaskInfo) -> tuple[list[TaskInfo], list[str]] | None:
        rivals = original(self, task)
        found["none" if rivals is None else "some"] += 1
        if rivals is not None and (rivals[0] or rivals[1]):
            found["taken back"] += 1
        return rivals

    monkeypatch.setattr(Statement, "_rivals", counting)
    for seed in (1, 2):
        for _ in _run(seed, 160, {}):
            pass
    for what in ("none", "some", "taken back"):
        assert found[what] > 0, what
