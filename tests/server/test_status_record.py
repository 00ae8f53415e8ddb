"""A job's status as the store keeps it (``JobStatusRecord.to_json`` / ``from_json``): every field
read back as written, and rows written before job control, TYJobs and accounting still read."""

from __future__ import annotations

import json

import pytest

from server.model import QUARANTINED, PodGroupPhase
from server.service.records import ConditionRecord, JobStatusRecord


def full_status() -> JobStatusRecord:
    """Every stored field set, each to a value no other field has."""
    return JobStatusRecord(
        phase=3,
        sched_phase=PodGroupPhase.RUNNING,
        cancelled=True,
        conditions=[
            ConditionRecord("Scheduled", "True", "placed", "", 7, 11.5),
            ConditionRecord(QUARANTINED, "True", "Refused", "bad spec", 8, 12.5),
        ],
        explanation={"gate": "allocate", "summary": "s", "node_reasons": {"x": 2}, "cycle_id": 8},
        submit_time=1.25,
        start_time=2.5,
        finish_time=3.75,
        schedule_state="ScheduledSucceed",
        leader_restarts=4,
        quarantined=True,
        hold="user",
        held_by="alice",
        requeue_count=5,
        dependency="met",
        used={"cpu": 6.5},
        holding={"memory": 7.5},
        used_at=8.25,
    )


def test_every_field_reads_back_as_written() -> None:
    status = full_status()
    assert JobStatusRecord.from_json(status.to_json()) == status
    fresh = JobStatusRecord(phase=1)
    again = JobStatusRecord.from_json(fresh.to_json())
    assert again == fresh
    assert again.used is not JobStatusRecord.from_json(fresh.to_json()).used  # each its own


def test_quarantined_follows_its_condition() -> None:
    status = full_status()
    status.conditions[1].status = "False"
    assert not JobStatusRecord.from_json(status.to_json()).quarantined


def test_a_row_from_before_job_control_ty_jobs_and_accounting_reads() -> None:
    raw = json.loads(full_status().to_json())
    for key in ("ctl", "ty", "use"):
        del raw[key]
    old = JobStatusRecord.from_json(json.dumps(raw))
    assert (old.hold, old.held_by, old.requeue_count, old.dependency) == ("", "", 0, "")
    assert (old.schedule_state, old.leader_restarts) == ("", 0)
    assert (old.used_at, old.used, old.holding) == (0.0, {}, {})
    assert old.submit_time == 1.25


def test_a_row_that_is_not_a_status_is_refused() -> None:
    raw = json.loads(full_status().to_json())
    raw["sched_phase"] = "Sleeping"
    # (the stores turn either into StateFileError, naming the row's table)
    with pytest.raises((KeyError, ValueError)):
        JobStatusRecord.from_json(json.dumps(raw))
    with pytest.raises(json.JSONDecodeError):
        JobStatusRecord.from_json("not json")
