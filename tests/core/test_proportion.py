"""proportion plugin: the deserved water-filling and share of proportion.go, checked directly.

The cases of Volcano's plugins/proportion/proportion_test.go (``TestEnqueueAndAllocable``,
``TestAllocate``, ``TestNoDoubleCountingForInqueueJobWithBindingTasks``,
``TestJobEnqueuedOnOtherPluginsReject``, the bind expectation of ``TestProportion``
"pod-deallocate") are scenario files under tests/scenarios/volcano/proportion/, run by
test_volcano_cases.py. ``TestProportion`` otherwise checks the ``queue_allocated`` metric through a
metrics server after deleting PodGroups (not ported)."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import job, node, queue, res, session, snapshot

from server.plugins.volcano.proportion import ProportionPlugin
from server.session.info import dominant_share as share


def _deserved(queues: list, requests: dict[str, str], cpu: str = "12") -> dict[str, np.ndarray]:
    """Each queue's deserved, its one job asking for ``requests[queue]`` cpu."""
    jobs = [job(q, cpu=r, memory=None, queue=q, min_member=1) for q, r in requests.items()]
    snap = snapshot([node("n1", cpu, "1G")], jobs, queues)
    ssn = session(snap, "tiers: [{plugins: [{name: proportion}]}]")
    plugin = next(p for p in ssn.plugins if isinstance(p, ProportionPlugin))
    return {name: attr.deserved for name, attr in plugin.attrs.items()}


def test_deserved_is_water_filled_by_weight_and_capped_by_request() -> None:
    """proportion.go's deserved loop: 12 cpu by weight 1:1:2; q1 asks only 2 so its surplus is
    shared again between q2 and q3 by weight."""
    d = _deserved(
        [queue("q1", weight=1), queue("q2", weight=1), queue("q3", weight=2)],
        {"q1": "2", "q2": "10", "q3": "10"},
    )
    assert d["q1"][0] == pytest.approx(2000.0)
    assert d["q2"][0] == pytest.approx(10000.0 / 3)
    assert d["q3"][0] == pytest.approx(20000.0 / 3)


def test_deserved_is_raised_to_the_guarantee_and_capped_by_capability() -> None:
    """deserved = max(guarantee, min(weight share, realCapability, request))."""
    d = _deserved(
        [queue("q1", guarantee=res("5")), queue("q2", capability=res("3"))], {"q1": "1", "q2": "10"}
    )
    assert d["q1"][0] == pytest.approx(5000.0)
    assert d["q2"][0] == pytest.approx(3000.0)


def test_share_counts_only_dimensions_the_queue_deserves() -> None:
    """updateQueueAttrShare walks deserved.ResourceNames(): a dimension with no deserved amount
    does not make the share 1."""
    assert share(np.array([1000.0, 0.0, 1000.0]), np.array([4000.0, 0.0, 0.0])) == pytest.approx(
        0.25
    )
    assert share(np.array([4000.0, 2e9]), np.array([4000.0, 1e9])) == pytest.approx(2.0)
