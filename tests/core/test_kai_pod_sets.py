"""KAI's pod sets (server/session/kai.py): kept on the job until a task of it changes status, and
``JobInfo.with_tasks`` (KAI ``CloneWithTasks``) a view whose figures count only its own tasks."""

from __future__ import annotations

from core_helpers import job, node, session, snapshot

from server.model import SubGroupSpec, TaskStatus
from server.session.info import JobInfo
from server.session.kai import (
    gang_satisfied,
    min_available_state,
    pod_sets,
    tasks_to_evict,
)
from server.session.session import Session

CONFIG = """
profile: kai
actions: allocate
tiers:
- plugins: [{name: predicates}, {name: proportion}, {name: priority}, {name: elastic}]
"""

R, P = TaskStatus.RUNNING, TaskStatus.PENDING


def _session() -> Session:
    """Job w: sub-group a (minimum 2) runs w-0, w-1, w-2 on n1; sub-group b (minimum 1) runs w-3
    on n1 and waits with w-4."""
    w = job("w", status=[R, R, R, R, P], nodes="n1", cpu="1", min_member=3)
    for t, group in zip(w.tasks, ["a", "a", "a", "b", "b"], strict=True):
        t.sub_group = group
    w.sub_groups = [SubGroupSpec("a", 2), SubGroupSpec("b", 1)]
    return session(snapshot([node("n1", cpu="8"), node("n2", cpu="8")], [w]), CONFIG)


def _counts(j: JobInfo) -> dict[str, tuple[int, int, int, int]]:
    return {
        ps.name: (len(ps.tasks), ps.active_allocated, ps.active_used, ps.alive)
        for ps in pod_sets(j)
    }


def test_a_partial_view_counts_only_its_own_tasks() -> None:
    ssn = _session()
    w = ssn.jobs["ns/w"]
    assert _counts(w) == {"a": (3, 3, 3, 3), "b": (2, 1, 1, 2)}
    view = w.with_tasks([ssn.tasks["ns/w-1"], ssn.tasks["ns/w-2"], ssn.tasks["ns/w-4"]])
    assert list(view.tasks) == ["ns/w-1", "ns/w-2", "ns/w-4"]
    # Pod sets built from its tasks, not the job's (nor the job's cached ones).
    assert _counts(view) == {"a": (2, 2, 2, 2), "b": (1, 0, 0, 1)}
    assert not gang_satisfied(view)
    assert min_available_state(view) == 0
    # The task index and the figures kept with it.
    assert set(view.index[R]) == {"ns/w-1", "ns/w-2"}
    assert set(view.index[P]) == {"ns/w-4"}
    assert view.count(R) == 2
    assert view.ready_task_num() == 2
    assert view.allocated[0] == 2000.0
    assert w.allocated[0] == 4000.0
    # The job itself is untouched.
    assert _counts(w) == {"a": (3, 3, 3, 3), "b": (2, 1, 1, 2)}
    assert len(w.tasks) == 5
    assert w.count(R) == 4
    assert w.ready_task_num() == 4
    assert gang_satisfied(w)
    assert min_available_state(w) == 2
    # A victim given up in pieces: the job's sub-group a is above its minimum and gives one task;
    # in the view it is at its minimum and gives both, which is all the view holds.
    chosen, more = tasks_to_evict(w, ssn.task_order_fn)
    assert len(chosen) == 1
    assert chosen[0].sub_group == "a"
    assert more
    chosen, more = tasks_to_evict(view, ssn.task_order_fn)
    assert {t.uid for t in chosen} == {"ns/w-1", "ns/w-2"}
    assert not more


def test_pod_sets_are_kept_until_a_task_is_placed_or_evicted() -> None:
    ssn = _session()
    w = ssn.jobs["ns/w"]
    first = pod_sets(w)
    assert pod_sets(w) is first  # nothing changed: the same sets
    stmt = ssn.statement()
    stmt.allocate(ssn.tasks["ns/w-4"], "n2")
    assert _counts(w) == {"a": (3, 3, 3, 3), "b": (2, 2, 2, 2)}
    stmt.evict(ssn.tasks["ns/w-0"], "test")
    # Releasing: still used, no longer allocated.
    assert _counts(w) == {"a": (3, 2, 3, 2), "b": (2, 2, 2, 2)}
    stmt.discard()
    assert _counts(w) == {"a": (3, 3, 3, 3), "b": (2, 1, 1, 2)}
    assert pod_sets(w) is not first
