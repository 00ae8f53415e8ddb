"""Statement: operations apply at once; commit emits decisions; discard undoes in reverse order
(Volcano framework/statement.go)."""

from __future__ import annotations

import numpy as np
from core_helpers import job, node, session, snapshot

from server.model import TaskStatus

CONFIG = """
actions: "allocate"
tiers:
- plugins: [{name: gang}, {name: proportion}, {name: drf}]
"""


def _setup():
    snap = snapshot(
        [node("n1", cpu="4"), node("n2", cpu="4")],
        [
            job("a", 2, cpu="2"),
            job("run", 1, cpu="2", status=TaskStatus.RUNNING, nodes=["n2"], index=1),
        ],
    )
    return session(snap, CONFIG)


def _state(ssn):
    n = ssn.nodes
    return (
        n.idle.copy(),
        n.used.copy(),
        n.releasing.copy(),
        n.pipelined.copy(),
        n.task_count.copy(),
        {u: (t.status, t.node) for u, t in ssn.tasks.items()},
        {u: j.allocated.copy() for u, j in ssn.jobs.items()},
    )


def _equal(a, b) -> bool:
    return all(
        (
            np.array_equal(x, y)
            if isinstance(x, np.ndarray)
            else (
                x.keys() == y.keys()
                and all(
                    np.array_equal(x[k], y[k]) if isinstance(x[k], np.ndarray) else x[k] == y[k]
                    for k in x
                )
            )
            if isinstance(x, dict)
            else x == y
        )
        for x, y in zip(a, b, strict=True)
    )


def test_allocate_changes_the_session_immediately() -> None:
    ssn = _setup()
    t = ssn.tasks["ns/a-0"]
    stmt = ssn.statement()
    stmt.allocate(t, "n1")
    assert t.status == TaskStatus.ALLOCATED
    assert t.node == "n1"
    assert ssn.nodes.idle[0][0] == 2000.0
    assert ssn.jobs["ns/a"].allocated[0] == 2000.0
    assert ssn.result.binds == {}  # no decision before commit


def test_commit_turns_allocations_into_binds_and_evictions() -> None:
    ssn = _setup()
    stmt = ssn.statement()
    stmt.evict(ssn.tasks["ns/run-0"], "preempt")
    stmt.allocate(ssn.tasks["ns/a-0"], "n1")
    stmt.pipeline(ssn.tasks["ns/a-1"], "n2")
    stmt.commit()
    assert ssn.result.binds == {"ns/a-0": "n1"}
    assert ssn.result.evictions == {"ns/run-0": "preempt"}
    assert ssn.tasks["ns/a-0"].status == TaskStatus.BINDING
    assert ssn.tasks["ns/a-1"].status == TaskStatus.PIPELINED  # pipelined tasks are not bound
    assert ssn.tasks["ns/run-0"].status == TaskStatus.RELEASING
    assert ssn.close().pipelined == {"ns/a-1": "n2"}


def test_an_eviction_called_off_is_not_a_decision() -> None:
    """KAI places a victim back where it is: the eviction is called off (an UNEVICT), and commit
    reports no eviction for it, while another eviction in the statement stands."""
    ssn = _setup()
    stmt = ssn.statement()
    stmt.evict(ssn.tasks["ns/run-0"], "reclaim")
    stmt.pipeline(ssn.tasks["ns/run-0"], "n2")  # back on its own node
    assert ssn.tasks["ns/run-0"].status == TaskStatus.RUNNING
    stmt.commit()
    assert ssn.result.evictions == {}
    again = ssn.statement()
    again.evict(ssn.tasks["ns/run-0"], "preempt")
    again.commit()
    assert ssn.result.evictions == {"ns/run-0": "preempt"}


def test_discard_restores_every_array_and_status() -> None:
    ssn = _setup()
    before = _state(ssn)
    stmt = ssn.statement()
    stmt.evict(ssn.tasks["ns/run-0"], "preempt")
    stmt.pipeline(ssn.tasks["ns/a-1"], "n2")
    stmt.allocate(ssn.tasks["ns/a-0"], "n1")
    assert not _equal(before, _state(ssn))
    stmt.discard()
    assert _equal(before, _state(ssn))
    assert len(stmt) == 0


def test_evict_moves_resources_to_releasing_and_back() -> None:
    ssn = _setup()
    stmt = ssn.statement()
    stmt.evict(ssn.tasks["ns/run-0"], "reclaim")
    assert ssn.nodes.releasing[1][0] == 2000.0
    # Releasing resources count for future idle, not idle: a pipelined placement can use them.
    assert ssn.nodes.future_idle(1)[0] == 4000.0
    assert ssn.nodes.idle[1][0] == 2000.0
    stmt.discard()
    assert ssn.nodes.releasing[1][0] == 0.0
    assert ssn.tasks["ns/run-0"].status == TaskStatus.RUNNING


def test_checkpoint_rollback_undoes_only_later_operations() -> None:
    ssn = _setup()
    stmt = ssn.statement()
    stmt.allocate(ssn.tasks["ns/a-0"], "n1")
    mark = stmt.checkpoint()
    stmt.allocate(ssn.tasks["ns/a-1"], "n1")
    stmt.rollback(mark)
    assert ssn.tasks["ns/a-0"].status == TaskStatus.ALLOCATED
    assert ssn.tasks["ns/a-1"].status == TaskStatus.PENDING
    assert ssn.tasks["ns/a-1"].node is None
    assert ssn.nodes.idle[0][0] == 2000.0


def test_event_handlers_see_every_operation_and_its_undo() -> None:
    ssn = _setup()
    drf = next(p for p in ssn.plugins if p.name == "drf")
    stmt = ssn.statement()
    stmt.allocate(ssn.tasks["ns/a-0"], "n1")
    assert drf.shares["ns/a"] > 0
    stmt.discard()
    assert drf.shares["ns/a"] == 0


def test_unpipeline_makes_a_pipelined_task_pending_and_discard_pipelines_it_again() -> None:
    ssn = _setup()
    t = ssn.tasks["ns/a-1"]
    ssn.statement().pipeline(t, "n2")
    before = _state(ssn)
    stmt = ssn.statement()
    stmt.unpipeline(t)
    assert t.status == TaskStatus.PENDING
    assert t.node is None
    assert t.last_tx_status == TaskStatus.PIPELINED
    stmt.discard()
    assert _equal(_state(ssn), before)
    stmt = ssn.statement()
    stmt.unpipeline(t)
    stmt.commit()  # nothing to decide: the task is pending again
    assert t.status == TaskStatus.PENDING
    assert not ssn.result.binds
    assert not ssn.result.evictions
