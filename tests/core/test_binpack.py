"""binpack plugin: Volcano's plugins/binpack/binpack_test.go (``TestArguments``, ``TestNode``):
the argument parsing and the exact node scores of its table."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import job, node, queue, session, snapshot, task

from server.model import ClusterSnapshot, PodGroupPhase, TaskStatus
from server.plugins.volcano.binpack import BinpackPlugin


def test_arguments_set_weights_and_a_negative_resource_weight_falls_back_to_one() -> None:
    """TestArguments: weight 10, cpu 5, memory 2, gpu 7, example.com/foo -3 -> 1."""
    plugin = BinpackPlugin(
        {
            "binpack.weight": 10,
            "binpack.cpu": 5,
            "binpack.memory": 2,
            "binpack.resources": "nvidia.com/gpu, example.com/foo",
            "binpack.resources.nvidia.com/gpu": 7,
            "binpack.resources.example.com/foo": -3,
        }
    )
    assert plugin.arg_int("binpack.weight") == 10
    assert plugin.resource_weights() == {
        "nvidia.com/gpu": 7,
        "example.com/foo": 1,
        "cpu": 5,
        "memory": 2,
    }


def _snapshot() -> ClusterSnapshot:
    """TestNode's cluster: p1 bound to n1, p2 to n3, p3 and p4 pending."""
    tasks = [
        task("p1", "pg1", {"cpu": "1", "memory": "1Gi"}, "n1", ns="c1", status=TaskStatus.BOUND),
        task("p2", "pg1", {"cpu": "1.5", "memory": "0Gi"}, "n3", ns="c1", status=TaskStatus.BOUND),
        task("p3", "pg1", {"cpu": "2", "memory": "10Gi", "nvidia.com/gpu": "2"}, ns="c1"),
        task("p4", "pg1", {"cpu": "3", "memory": "4Gi", "example.com/foo": "3"}, ns="c1"),
    ]
    nodes = [
        node("n1", "2", "4Gi", pods="10"),
        node("n2", "4", "16Gi", pods="10", **{"nvidia.com/gpu": "4"}),
        node("n3", "2", "4Gi", pods="10", **{"example.com/foo": "16"}),
    ]
    pg1 = job("pg1", ns="c1", queue="c1", tasks=tasks, min_member=1, phase=PodGroupPhase.PENDING)
    return snapshot(nodes, [pg1], [queue("c1")])


ARGS_1 = """{binpack.weight: 10, binpack.cpu: 2, binpack.memory: 3, binpack.resources: "nvidia.com/gpu, example.com/foo",
  binpack.resources.nvidia.com/gpu: 7, binpack.resources.example.com/foo: 8}"""
ARGS_2 = """{binpack.weight: 1, binpack.cpu: 1, binpack.memory: 1, binpack.resources: nvidia.com/gpu,
  binpack.resources.nvidia.com/gpu: 23}"""


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (
            ARGS_1,
            {
                "p1": [700, 137.5, 0],
                "p2": [0, 375, 0],
                "p3": [0, 531.25, 0],
                "p4": [0, 173.076923076, 0],
            },
        ),
        (ARGS_2, {"p1": [75, 15.625, 0], "p2": [0, 37.5, 0], "p3": [0, 50.5, 0], "p4": [0, 50, 0]}),
    ],
    ids=["weights-10-2-3-gpu7-foo8", "weights-1-1-1-gpu23"],
)
def test_node_scores_match_volcano_table(arguments: str, expected: dict[str, list[float]]) -> None:
    """TestNode: every task (bound ones too) scored on n1, n2, n3; a node the request would
    overflow in any weighted resource scores 0; a weighted resource the node lacks adds its weight
    but no score."""
    ssn = session(
        _snapshot(),
        f"""
extension_points_not_listed: disabled
tiers:
- plugins:
  - {{name: binpack, enableNodeOrder: true, arguments: {arguments}}}
""",
    )
    rows = np.arange(len(ssn.nodes))
    assert ssn.nodes.names == ["n1", "n2", "n3"]
    for name, scores in expected.items():
        got = ssn.evaluator.scores(ssn.tasks[f"c1/{name}"], rows)
        assert got == pytest.approx(scores, abs=1e-6), name


def test_zero_weight_registers_no_score() -> None:
    """binpack.weight 0 multiplies every score by 0: nothing to register."""
    ssn = session(
        _snapshot(), "tiers: [{plugins: [{name: binpack, arguments: {binpack.weight: 0}}]}]"
    )
    assert not any(ssn.evaluator.scorers.values())
