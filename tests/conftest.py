"""The scheduling core never changes the snapshot it is given: every cycle run in the tests checks it."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest

from server.model import ClusterSnapshot, CycleResult
from server.scheduler import SchedulerCore


@pytest.fixture(autouse=True)
def snapshot_left_unchanged(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    run_cycle = SchedulerCore.run_cycle

    def checked(self: SchedulerCore, snapshot: ClusterSnapshot, cycle_id: int) -> CycleResult:
        before = copy.deepcopy(snapshot)
        result = run_cycle(self, snapshot, cycle_id)
        assert snapshot == before, "the scheduling core changed its snapshot"
        return result

    monkeypatch.setattr(SchedulerCore, "run_cycle", checked)
    yield
