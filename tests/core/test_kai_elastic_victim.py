"""KAI preempt with an elastic victim (KAI's preempt_elastic_test.go case 8 and its cache counts):
of the victim's two tasks one is evicted for good and the other moved, i.e. evicted where it runs
and pipelined where it fits. KAI's statement evicts both pods (``NumberOfCacheEvictions: 2``) and
pipelines two (the preemptor and the moved task); Muster's output says the same: both in
``evictions``, the moved one also in ``moved`` and ``Pipelined`` on its new node."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from server.simulate import simulate_text

CASE = (
    Path(__file__).resolve().parents[2] / "tests/scenarios/kai/preempt/preempt_elastic_test-08.yaml"
)


def _case() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CASE.read_text())
    doc.pop("x-expect")
    return doc


def test_one_task_evicted_one_moved() -> None:
    out = simulate_text(json.dumps(_case()))
    assert sorted(out["evictions"]) == ["default/running_job0-0", "default/running_job0-1"]
    assert out["moved"] == {"default/running_job0-0": {"from": "node0", "to": "node1"}}
    assert out["pipelined"] == {
        "default/pending_job0-0": "node0",
        "default/running_job0-0": "node1",
    }
    assert out["tasks"]["default/running_job0-1"]["status"] == "Releasing"
    assert out["tasks"]["default/running_job0-0"]["status"] == "Pipelined"


def test_next_cycles_run_the_moved_task_where_it_went() -> None:
    # As KAI's controller recreates the evicted pods: the moved one is placed on node1 and the
    # preemptor on node0; the evicted one waits (no GPU left).
    doc = _case()
    doc["config"] = {**copy.deepcopy(doc["config"]), "actions": ["allocate", "preempt"]}
    doc["config"]["cycles"] = 3
    out = simulate_text(json.dumps(doc))
    assert out["binds"] == {"default/pending_job0-0": "node0", "default/running_job0-0": "node1"}
    assert out["tasks"]["default/running_job0-1"]["status"] == "Pending"
