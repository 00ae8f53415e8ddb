"""One meaning of min_member on every entry point (issue 26): the API's JobSpec.min_member and a
scenario's minMember give the same job the same gang minimum (0 / unset: every task)."""

from __future__ import annotations

import pytest
from server_test_helpers import gang

from muster.gang import (
    NO_GANG_MINIMUM,
    GangPhase,
    api_min_member,
    gang_minimum,
    gang_phase,
    podgroup_minimum,
)
from server.service import commands, convert, validate
from server.service.decisions import DecisionLog
from server.service.state import ClusterState
from server.simulate.scenario import load_scenario


def scenario_minimum(min_member: int | None, replicas: int = 4) -> int | None:
    job: dict[str, object] = {
        "name": "g",
        "namespace": "ns",
        "queue": "q",
        "tasks": [{"name": f"t{i}", "request": {"cpu": "4"}} for i in range(replicas)],
    }
    if min_member is not None:
        job["minMember"] = min_member
    sc = load_scenario({"queues": [{"name": "q"}], "nodes": [], "jobs": [job]})
    return sc.snapshot.jobs[0].min_member


def api_minimum(min_member: int, replicas: int = 4) -> int | None:
    valid = validate.normalize_job(gang("g", replicas=replicas, min_member=min_member))
    return convert.valid_job_to_model(valid, 0).min_member


def test_gang_minimum_function() -> None:
    assert gang_minimum(None, 4) == gang_minimum(0, 4) == 4
    assert gang_minimum(2, 4) == 2
    assert gang_minimum(NO_GANG_MINIMUM, 4) == 0
    with pytest.raises(ValueError, match="min_member -2 is negative"):
        gang_minimum(-2, 4)


@pytest.mark.parametrize(("min_member", "expected"), [(0, 4), (1, 1), (3, 3), (4, 4)])
def test_api_and_scenario_agree(min_member: int, expected: int) -> None:
    assert api_minimum(min_member) == scenario_minimum(min_member) == expected


def test_absent_min_member_is_every_task_in_a_scenario() -> None:
    assert scenario_minimum(None) == 4


def test_api_record_reports_the_same_minimum() -> None:
    state = ClusterState(DecisionLog(bind_timeout=30))
    commands.submit_job(state, gang("g", replicas=3, min_member=0))
    assert state.jobs["g"].min_member == 3 == scenario_minimum(0, replicas=3)


def test_no_gang_minimum_is_scenario_only() -> None:
    assert scenario_minimum(NO_GANG_MINIMUM) == 0  # Volcano's minMember 0
    with pytest.raises(Exception, match="min_member"):
        validate.normalize_job(gang("g", min_member=NO_GANG_MINIMUM))
    with pytest.raises(Exception, match="minMember"):
        scenario_minimum(-2)


def test_a_podgroups_min_member_is_the_same_rule_in_volcanos_spelling() -> None:
    # Volcano's minMember 0 is no minimum; the API, which cannot say none, gets one task.
    assert podgroup_minimum(0, 4) == gang_minimum(NO_GANG_MINIMUM, 4) == 0
    assert podgroup_minimum(3, 4) == 3
    assert podgroup_minimum(6, 4) == 6
    assert [api_min_member(m, 4) for m in (0, 1, 3, 4, 6)] == [1, 1, 3, 4, 4]


@pytest.mark.parametrize(
    ("placed", "succeeded", "failed", "expected"),
    [
        (1, 0, 0, GangPhase.WAITING),
        (2, 0, 0, GangPhase.RUNNING),
        (1, 1, 0, GangPhase.RUNNING),  # a succeeded task still counts for the gang
        (0, 2, 2, GangPhase.COMPLETED),
        (0, 1, 3, GangPhase.FAILED),
        (1, 0, 3, GangPhase.FAILED),  # 4 - 3 tasks can never make 2
    ],
)
def test_gang_phase(placed: int, succeeded: int, failed: int, expected: GangPhase) -> None:
    assert gang_phase(2, tasks=4, placed=placed, succeeded=succeeded, failed=failed) == expected
