"""A cycle that raises because of one job: the cycle goes on without it (``SchedulerCore``'s
quarantine), every other job is placed, and the job left out carries the Quarantined condition."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from core_helpers import NS, job, node, scheduler_config, snapshot

from muster.quantity import from_canonical
from server.model import QUARANTINED, TaskStatus
from server.plugins import PLUGINS
from server.plugins.base import Plugin
from server.scheduler import MAX_QUARANTINED_PER_CYCLE, SchedulerCore
from server.session import outcomes
from server.session.session import Session

# Jobs the "explode" plugin raises on (its job_valid function), set per test.
EXPLODE_ON: set[str] = set()

CONFIG = """
actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
  - name: explode
- plugins:
  - name: drf
  - name: predicates
  - name: proportion
  - name: nodeorder
"""


class Explode(Plugin):
    name: ClassVar[str] = "explode"

    def on_session_open(self, ssn: Any) -> None:
        def valid(job: Any) -> None:
            if job.uid in EXPLODE_ON:
                raise RuntimeError(f"plugin bug on {job.uid}")

        ssn.register("job_valid", self.name, valid)


@pytest.fixture(autouse=True)
def explode_plugin(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(PLUGINS, "explode", Explode)
    EXPLODE_ON.clear()
    yield
    EXPLODE_ON.clear()


def _jobs(count: int) -> list[Any]:
    return [job(f"j{i}", 1, "1", index=i) for i in range(count)]


def _placed(result: Any) -> set[str]:
    return {uid.rsplit("-", 1)[0] for uid in result.binds}


def test_a_job_that_makes_a_plugin_raise_is_quarantined_and_the_others_are_placed() -> None:
    jobs = _jobs(9)
    EXPLODE_ON.add(f"{NS}/j5")
    snap = snapshot([node("n0", cpu="8"), node("n1", cpu="8")], jobs)
    result = SchedulerCore(scheduler_config(CONFIG)).run_cycle(snap, 1)
    assert _placed(result) == {f"{NS}/j{i}" for i in range(9) if i != 5}
    assert set(result.quarantined) == {f"{NS}/j5"}
    assert "RuntimeError: plugin bug on ns/j5" in result.quarantined[f"{NS}/j5"]
    outcome = result.jobs[f"{NS}/j5"]
    (cond,) = [c for c in outcome.conditions if c.type == QUARANTINED]
    assert (cond.status, cond.reason) == ("True", "CycleFailed")
    assert "plugin bug on ns/j5" in cond.message
    assert "test_quarantine.py" in cond.message
    assert outcome.explanation is not None
    assert outcome.explanation.gate == "quarantined"
    assert result.task_status[f"{NS}/j5-0"] == (TaskStatus.PENDING, None)
    # The others' outcomes are the ordinary ones.
    assert not any(c.type == QUARANTINED for c in result.jobs[f"{NS}/j4"].conditions)


def test_several_bad_jobs_are_each_quarantined() -> None:
    EXPLODE_ON.update({f"{NS}/j0", f"{NS}/j7"})
    snap = snapshot([node("n0", cpu="16")], _jobs(10))
    result = SchedulerCore(scheduler_config(CONFIG)).run_cycle(snap, 1)
    assert set(result.quarantined) == {f"{NS}/j0", f"{NS}/j7"}
    assert _placed(result) == {f"{NS}/j{i}" for i in range(10)} - {f"{NS}/j0", f"{NS}/j7"}


def test_a_quarantined_jobs_running_tasks_keep_their_node() -> None:
    """A job left out still holds the nodes its tasks run on: nothing else is placed there."""
    running = job("run", 1, "4", status=TaskStatus.RUNNING, nodes="n0", index=0)
    EXPLODE_ON.add(f"{NS}/run")
    snap = snapshot([node("n0", cpu="4")], [running, job("new", 1, "4", index=1)])
    result = SchedulerCore(scheduler_config(CONFIG)).run_cycle(snap, 1)
    assert set(result.quarantined) == {f"{NS}/run"}
    assert result.binds == {}  # n0 is full: the quarantined job's task still runs there
    assert result.task_status[f"{NS}/run-0"] == (TaskStatus.RUNNING, "n0")


def test_a_cycle_that_fails_without_any_job_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Any, ssn: Any) -> None:
        raise RuntimeError("action bug")

    from server.actions.volcano.allocate import AllocateAction

    monkeypatch.setattr(AllocateAction, "execute", broken)
    snap = snapshot([node("n0")], _jobs(3))
    with pytest.raises(RuntimeError, match="action bug"):
        SchedulerCore(scheduler_config(CONFIG)).run_cycle(snap, 1)


def test_quarantine_stops_at_its_bound() -> None:
    """More failing jobs than one cycle may leave out: the cycle raises (no job is the cause)."""
    EXPLODE_ON.update(f"{NS}/j{i}" for i in range(MAX_QUARANTINED_PER_CYCLE + 1))
    snap = snapshot([node("n0", cpu="64")], _jobs(MAX_QUARANTINED_PER_CYCLE + 3))
    with pytest.raises(RuntimeError, match="plugin bug"):
        SchedulerCore(scheduler_config(CONFIG)).run_cycle(snap, 1)


def test_the_explanation_raising_on_one_job_quarantines_it(monkeypatch: pytest.MonkeyPatch) -> None:
    explain = outcomes.explain

    def failing(ssn: Session, job: Any, phase: Any) -> Any:
        if job.uid == f"{NS}/big":
            raise OverflowError("cannot convert float infinity to integer")
        return explain(ssn, job, phase)

    monkeypatch.setattr(outcomes, "explain", failing)
    jobs = [*_jobs(4), job("big", 1, "64", index=9)]
    result = SchedulerCore(scheduler_config(CONFIG)).run_cycle(
        snapshot([node("n0", cpu="8")], jobs), 1
    )
    assert set(result.quarantined) == {f"{NS}/big"}
    assert _placed(result) == {f"{NS}/j{i}" for i in range(4)}


def test_a_request_at_the_bound_is_explained_without_overflow() -> None:
    """The largest quantity allowed, asked of a cluster that has less: an ordinary "can never
    run" explanation (it used to overflow turning an infinite request into an integer)."""
    big = job("big", 1, "9007199254740992m", index=0)
    result = SchedulerCore(scheduler_config(CONFIG)).run_cycle(
        snapshot([node("n0")], [big, job("ok", index=1)]), 1
    )
    assert not result.quarantined
    assert result.jobs[f"{NS}/big"].explanation.gate == "unsatisfiable"
    assert "9007199254740992m" in result.jobs[f"{NS}/big"].explanation.summary
    assert _placed(result) == {f"{NS}/ok"}
    assert from_canonical("cpu", float("inf")) == "-1"
    assert from_canonical("cpu", float("nan")) == "nan"
