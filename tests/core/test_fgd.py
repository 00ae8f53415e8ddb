"""fgd: the expected-fragmentation measure, and the plugin's choices on tiny clusters where a
fragmentation-blind policy (binpack) chooses otherwise."""

from __future__ import annotations

from typing import Any

import core_helpers
import numpy as np
import pytest
from core_helpers import snapshot

from muster.devices import NVIDIA_GPU
from server.config import ConfigError, load_config
from server.model import CycleResult, JobSpec, NodeSpec, PodGroupPhase
from server.plugins import PLUGINS
from server.plugins.volcano.fgd import (
    FgdPlugin,
    NodeState,
    TaskType,
    Workload,
    after_placing,
    fgd_score,
    typical_types,
)

CORE = 1000.0  # millicores


def workload(*types: tuple[float, int, float, float]) -> Workload:
    """Types as (cpu cores, GPUs, share per GPU, popularity)."""
    return Workload([TaskType(c * CORE, 0.0, g, s, p) for c, g, s, p in types])


def state(cpu_cores: float, *gpus: float) -> NodeState:
    return NodeState(cpu_cores * CORE, 0.0, tuple(sorted(gpus, reverse=True)))


# -- the measure -----------------------------------------------------------------------------------
def test_gpus_a_share_does_not_fit_on_are_fragment() -> None:
    w = workload((1, 1, 0.5, 1.0))
    assert w.fragmentation(state(8, 1.0, 0.3)) == pytest.approx(0.3)  # 0.3 < 0.5: fragment
    assert w.fragmentation(state(8, 1.0, 0.5)) == pytest.approx(0.0)


def test_what_is_left_over_the_shares_on_a_gpu_is_fragment() -> None:
    # Two 0.4 shares fit on a free GPU: 0.2 of it no task of the type can use.
    assert workload((1, 1, 0.4, 1.0)).fragmentation(state(8, 1.0)) == pytest.approx(0.2)


def test_a_type_that_cannot_run_fragments_every_free_gpu() -> None:
    assert workload((1, 0, 0.0, 1.0)).fragmentation(state(8, 1.0, 1.0)) == pytest.approx(
        2.0
    )  # asks no GPU
    assert workload((1, 2, 1.0, 1.0)).fragmentation(state(8, 1.0, 0.9)) == pytest.approx(
        1.9
    )  # one whole GPU
    assert workload((9, 1, 1.0, 1.0)).fragmentation(state(8, 1.0, 1.0)) == pytest.approx(2.0)  # cpu
    w = workload((1, 1, 1.0, 1.0))
    assert w.fragmentation(state(8, 1.0, 1.0), access=np.array([False])) == pytest.approx(
        2.0
    )  # not open to it


def test_gpus_the_cpu_left_cannot_serve_are_fragment() -> None:
    # Four free GPUs, cpu for two one-GPU tasks: two GPUs are stranded.
    assert workload((2, 1, 1.0, 1.0)).fragmentation(state(4, 1.0, 1.0, 1.0, 1.0)) == pytest.approx(
        2.0
    )
    assert workload((1, 1, 1.0, 1.0)).fragmentation(state(4, 1.0, 1.0, 1.0, 1.0)) == pytest.approx(
        0.0
    )


def test_expected_fragmentation_weighs_types_by_popularity() -> None:
    w = workload((1, 1, 1.0, 0.75), (1, 1, 0.5, 0.25))
    # [1.0, 0.5]: the whole-GPU type cannot use the half GPU (0.5), the half type uses everything.
    assert w.fragmentation(state(8, 1.0, 0.5)) == pytest.approx(0.75 * 0.5)


def test_after_placing_takes_whole_gpus_or_one_gpus_share() -> None:
    s = state(8, 1.0, 1.0, 0.5)
    assert after_placing(s, 2 * CORE, 0.0, 2, 1.0, None) == state(6, 0.5)
    assert after_placing(s, CORE, 0.0, 1, 0.5, 2) == state(7, 1.0, 1.0)  # fills the half GPU
    assert after_placing(s, CORE, 0.0, 3, 1.0, None) is None  # two whole GPUs only
    assert after_placing(s, 9 * CORE, 0.0, 0, 0.0, None) is None  # cpu


def test_typical_types_are_the_most_popular_until_the_threshold() -> None:
    tasks = [(1.0, 0.0, 1, 1.0, 0)] * 6 + [(2.0, 0.0, 1, 0.5, 0)] * 3 + [(3.0, 0.0, 0, 0.0, 0)]
    assert [(t.cpu, t.popularity) for t in typical_types(tasks)] == [
        (1.0, 0.6),
        (2.0, 0.3),
        (3.0, 0.1),
    ]
    # The kept types' popularities are shares of the kept tasks (the simulator's renormalisation).
    assert [(t.cpu, t.popularity) for t in typical_types(tasks, 0.85)] == [
        (1.0, 6 / 9),
        (2.0, 3 / 9),
    ]
    assert [(t.cpu, t.popularity) for t in typical_types(tasks, 0.5)] == [(1.0, 1.0)]


def test_score_is_the_integer_sigmoid_of_the_fragmentation_shrinking() -> None:
    assert fgd_score(0.0) == 50  # no change
    assert fgd_score(-1.0) == 73
    assert fgd_score(1.0) == 26
    assert fgd_score(0.03) == fgd_score(0.01) == 49  # within a score step: a tie
    assert fgd_score(1e9) == 0
    assert fgd_score(-1e9) == 100


# -- the plugin in a cycle ----------------------------------------------------------------------------
def config(*plugins: str, arguments: str = "") -> str:
    """``profile: kai``, allocate, one tier: predicates and ``plugins`` (``arguments``: of the last)."""
    lines = ["profile: kai", "actions: allocate", "tiers:", "- plugins:", "  - name: predicates"]
    lines += [f"  - name: {p}" for p in plugins]
    if arguments:
        lines.append(f"    arguments: {arguments}")
    return "\n".join(lines) + "\n"


def node(name: str, cpu: int, gpus: int, labels: dict[str, str] | None = None) -> NodeSpec:
    scalars: dict[str, Any] = {NVIDIA_GPU: gpus}
    return core_helpers.node(name, str(cpu), "64Gi", labels=labels, **scalars)


def task(
    name: str,
    k: int,
    cpu: float,
    gpus: int = 0,
    fraction: float = 0.0,
    node: str | None = None,
    groups: list[str] | None = None,
    selector: dict[str, str] | None = None,
) -> JobSpec:
    """Job ``ns/name`` (created ``k``-th) of one task ``ns/name-0``; a node means Running there."""
    request: dict[str, str | int | float] = {"cpu": cpu, "memory": "1Gi"}
    if gpus:
        request[NVIDIA_GPU] = gpus
    t = core_helpers.task(
        name,
        name,
        request,
        node,
        uid=f"ns/{name}-0",
        gpu_fraction=fraction,
        creation_index=k,
        gpu_groups=list(groups or []),
        node_selector=dict(selector or {}),
    )
    return core_helpers.job(
        name, tasks=[t], phase=PodGroupPhase.RUNNING if node else PodGroupPhase.INQUEUE, index=k
    )


def cycle(config_text: str, nodes: list[NodeSpec], jobs: list[JobSpec]) -> CycleResult:
    return core_helpers.cycle(snapshot(nodes, jobs), config_text)


def half_gpu_cluster() -> tuple[list[NodeSpec], list[JobSpec]]:
    """``a``: two free GPUs, its cpu mostly taken (binpack's favourite); ``b``: one GPU shared, half of
    it free. A half-GPU task arrives, then a whole-GPU one."""
    nodes = [node("a", 32, 2), node("b", 32, 1)]
    jobs = [
        task("cpu-hog", 0, 24, node="a"),
        task("half-running", 1, 1, fraction=0.5, node="b", groups=["g0"]),
        task("half", 2, 1, fraction=0.5),
        task("whole", 3, 1, gpus=1),
        task("whole-2", 4, 1, gpus=1),
    ]
    return nodes, jobs


def test_fgd_fills_the_half_free_gpu_where_binpack_splits_a_whole_one() -> None:
    nodes, jobs = half_gpu_cluster()
    fgd = cycle(config("fgd"), nodes, jobs)
    assert fgd.binds["ns/half-0"] == "b"
    assert fgd.bind_gpu_groups["ns/half-0"] == ["g0"]
    # Nothing was split: both whole-GPU tasks find a whole GPU on a.
    assert fgd.binds["ns/whole-0"] == "a"
    assert fgd.binds["ns/whole-2-0"] == "a"

    nodes, jobs = half_gpu_cluster()
    binpack = cycle(config("binpack"), nodes, jobs)
    assert binpack.binds["ns/half-0"] == "a"  # the fuller node: one of its GPUs is now split
    assert len([t for t in ("ns/whole-0", "ns/whole-2-0") if t in binpack.binds]) == 1


def test_fgd_takes_the_shared_gpu_a_share_fits_exactly_rather_than_a_whole_one() -> None:
    nodes = [node("n", 16, 2)]
    jobs = [
        task("quarter", 0, 1, fraction=0.25, node="n", groups=["g0"]),
        task("three-quarters", 1, 1, fraction=0.75),
        task("whole", 2, 1, gpus=1),
    ]
    result = cycle(config("fgd"), nodes, jobs)
    assert result.bind_gpu_groups["ns/three-quarters-0"] == ["g0"]
    assert result.binds["ns/whole-0"] == "n"


def test_cpu_only_tasks_keep_off_the_cpu_that_gpu_tasks_need() -> None:
    # Both nodes have one free GPU; ``a`` has cpu for one more GPU task, ``b`` plenty. A CPU-only task
    # taking a's last cpu would strand a's GPU: fgd sends it to b (binpack to a, the fuller node).
    nodes = [node("a", 16, 1), node("b", 64, 1)]
    jobs = [
        task("cpu-hog", 0, 8, node="a"),
        task("cpu-only", 1, 6),
        task("gpu-task", 2, 6, gpus=1),
        task("gpu-task-2", 3, 6, gpus=1),
    ]
    fgd = cycle(config("fgd"), nodes, jobs)
    assert fgd.binds["ns/cpu-only-0"] == "b"
    assert {fgd.binds.get("ns/gpu-task-0"), fgd.binds.get("ns/gpu-task-2-0")} == {"a", "b"}
    binpack = cycle(config("binpack"), nodes, jobs)
    assert binpack.binds["ns/cpu-only-0"] == "a"


def test_nodes_score_the_integer_sigmoid_so_close_growths_tie_and_go_by_name() -> None:
    # 100 tasks: 97 cpu-only (4 cores) running on a full node, one pending cpu-only, X (2 GPUs + 8
    # cores) and Y (1 GPU + 8 cores): popularity 0.01 each. The pending cpu-only task leaves 6 cores:
    # on ``a`` (2 GPUs) X loses 2 GPUs and Y 1 more (growth 0.03), on ``b`` (1 GPU) Y loses 1 (0.01).
    # Both score int(100 x sigmoid(-growth)) = 49: a tie, the first node by name wins, as in the FGD
    # simulator (scoring by the growth itself would pick ``b``).
    nodes = [node("a", 10, 2), node("b", 10, 1), core_helpers.node("c", "388", "512Gi", pods=200)]
    jobs = [task(f"busy-{k}", k, 4, node="c") for k in range(97)]
    jobs += [task("cpu-only", 97, 4), task("x", 98, 8, gpus=2), task("y", 99, 8, gpus=1)]
    assert cycle(config("fgd"), nodes, jobs).binds["ns/cpu-only-0"] == "a"
    assert (fgd_score(0.03), fgd_score(0.01)) == (49, 49)


def test_a_node_a_type_may_not_use_is_fragment_for_it() -> None:
    # Two one-GPU nodes; most tasks may only use ``a`` (node selector). A task that may go anywhere
    # goes to ``b``, keeping ``a`` for the constrained ones.
    nodes = [node("a", 16, 1, labels={"model": "x"}), node("b", 16, 1)]
    jobs = [task("free", 0, 1, gpus=1)] + [
        task(f"bound-{k}", k, 1, gpus=1, selector={"model": "x"}) for k in range(1, 4)
    ]
    result = cycle(config("fgd"), nodes, jobs)
    assert result.binds["ns/free-0"] == "b"
    assert result.binds["ns/bound-1-0"] == "a"


def test_registered_with_validated_arguments() -> None:
    assert PLUGINS["fgd"] is FgdPlugin
    cfg = load_config(config("fgd", arguments="{fgd.weight: 2}"))
    assert cfg.plugin("fgd") is not None
    with pytest.raises(ConfigError):
        load_config(config("fgd", arguments="{fgd.popularityThreshold: 0}"))
    with pytest.raises(ConfigError):
        load_config(config("fgd", arguments="{fgd.nope: 1}"))


def test_weight_zero_turns_it_off() -> None:
    nodes, jobs = half_gpu_cluster()
    text = config("fgd", arguments="{fgd.weight: 0}")
    assert cycle(text, nodes, jobs).binds["ns/half-0"] == "a"  # no score: first node by name
