"""KAI's feasible nodes: a victim search for a job every task of which asks for a GPU places (the
pending job, and the victims again) only on nodes with a GPU idle or being released, and on the
nodes of the victims it evicts (KAI's FeasibleNodesForJob, and the solver adding victims' nodes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from core_helpers import cycle, job, node, session, snapshot, task

from server.actions.kai.solver import _gpu_shares, feasible_nodes, with_nodes_of
from server.model import JobSpec, TaskStatus
from server.session.info import ResourceSpace, TaskInfo

KAI_CONFIG = (Path(__file__).resolve().parents[2] / "examples" / "config-kai.yaml").read_text()
GPU = "nvidia.com/gpu"


def _cluster() -> tuple[list, list]:
    # g1: one idle GPU, its 4 cpu held by a cpu-only job of low priority; c1: a cpu node, idle.
    # (Jobs of priority below 100 are preemptible.)
    nodes = [
        node("g1", cpu="4", memory="64Gi", **{GPU: "1"}),
        node("c1", cpu="8", memory="64Gi"),
    ]
    return nodes, [_holder(), _one_task_job("trainer", {GPU: "1"}, 1, priority=50)]


def test_a_victim_is_not_moved_to_a_node_the_gpu_job_could_not_use() -> None:
    # Moving the holder to c1 would make room on g1, but c1 has no GPU: KAI's search places on
    # g1 alone (its idle GPU, and the holder's node), so the holder cannot be placed again there
    # next to the trainer. Consolidation finds nothing; preempt evicts the holder.
    nodes, jobs = _cluster()
    result = cycle(snapshot(nodes, jobs), KAI_CONFIG)
    assert result.moved == {}
    assert result.evictions == {"ns/holder-0": "preempt: evicted to make room for ns/trainer"}
    assert result.pipelined == {"ns/trainer-0": "g1"}


def test_a_job_with_a_cpu_only_task_may_use_every_node() -> None:
    # The same, the pending job with one more task that asks for no GPU: every node is feasible,
    # and consolidation moves the holder to c1.
    nodes, jobs = _cluster()
    mixed = job(
        "trainer",
        tasks=[
            task("trainer-0", "trainer", {"cpu": "1", "memory": "1Gi", GPU: "1"}),
            task("trainer-1", "trainer", {"cpu": "1", "memory": "1Gi"}),
        ],
        priority=50,
        index=1,
    )
    ssn = session(snapshot(nodes, [jobs[0], mixed]), KAI_CONFIG)
    assert feasible_nodes(ssn, ssn.jobs["ns/trainer"]) is None
    result = cycle(snapshot(nodes, [jobs[0], mixed]), KAI_CONFIG)
    assert result.moved == {"ns/holder-0": ("g1", "c1")}


def test_feasible_nodes_are_those_with_a_gpu_idle_or_being_released() -> None:
    nodes = [
        node("idle", cpu="4", memory="8Gi", **{GPU: "1"}),
        node("full", cpu="4", memory="8Gi", **{GPU: "1"}),
        node("leaving", cpu="4", memory="8Gi", **{GPU: "1"}),
        node("taken", cpu="4", memory="8Gi", **{GPU: "1"}),
        node("cpu", cpu="4", memory="8Gi"),
    ]
    one_gpu = {"cpu": "1", "memory": "1Gi", GPU: "1"}
    held = job("held", tasks=[task("held-0", "held", one_gpu, "full")], index=0)
    leaving = job(
        "leaving",
        tasks=[task("leaving-0", "leaving", one_gpu, "leaving", status=TaskStatus.RELEASING)],
        index=1,
    )
    # A releasing GPU already promised to a pipelined task is not being released any more.
    gone = job(
        "gone",
        tasks=[task("gone-0", "gone", one_gpu, "taken", status=TaskStatus.RELEASING)],
        index=2,
    )
    taker = job(
        "taker",
        tasks=[task("taker-0", "taker", one_gpu, "taken", status=TaskStatus.PIPELINED)],
        index=3,
    )
    pending = job("pending", tasks=[task("pending-0", "pending", one_gpu)], index=4)
    ssn = session(snapshot(nodes, [held, leaving, gone, taker, pending]), KAI_CONFIG)
    mask = feasible_nodes(ssn, ssn.jobs["ns/pending"])
    assert mask is not None
    assert sorted(ssn.nodes.names[i] for i in np.nonzero(mask)[0]) == ["idle", "leaving"]
    # The search adds the nodes of the victims it evicts; every node stays every node.
    victim = ssn.jobs["ns/held"].tasks["ns/held-0"]
    grown = with_nodes_of(ssn, mask, [victim])
    assert grown is not None
    assert sorted(ssn.nodes.names[i] for i in np.nonzero(grown)[0]) == ["full", "idle", "leaving"]
    assert mask.sum() == 2  # (a new mask)
    assert with_nodes_of(ssn, None, [victim]) is None


def _shared_cluster(*extra: str) -> list:
    return [
        node(name, cpu="4" if name == "g1" else "8", memory="64Gi", **{GPU: "1"})
        for name in ("g1", "s", *extra)
    ]


def _holder() -> JobSpec:
    """A cpu-only job of low priority holding g1's 4 cpu (below priority 100: preemptible)."""
    return job("holder", 1, "4", status=TaskStatus.RUNNING, nodes="g1", index=0)


def _one_task_job(name: str, request: dict, index: int, **fields: Any) -> JobSpec:
    """Job ``name`` of one task ``<name>-0`` asking ``request`` (cpu 1, memory 1Gi, and more);
    ``fields``: the task's (node, status, gpu_fraction ...), and ``priority`` the job's."""
    priority = fields.pop("priority", 0)
    node_name = fields.pop("node", None)
    spec = task(f"{name}-0", name, {"cpu": "1", "memory": "1Gi", **request}, node_name, **fields)
    return job(name, tasks=[spec], priority=priority, index=index)


def test_a_gpu_only_promised_to_a_pipelined_share_is_not_feasible() -> None:
    # s's only GPU is being released, and allocate pipelines a half share onto it: KAI counts no
    # idle share there (pipelined shares are not held yet) and nothing left being released. So
    # the search for the trainer may use g1 alone, and preempt evicts the holder rather than
    # consolidation moving it to s.
    jobs = [
        _holder(),
        _one_task_job("rel", {GPU: "1"}, 1, node="s", status=TaskStatus.RELEASING),
        _one_task_job("p", {}, 2, gpu_fraction=0.5, priority=50),
        _one_task_job("trainer", {GPU: "1"}, 3, priority=50),
    ]
    result = cycle(snapshot(_shared_cluster(), jobs), KAI_CONFIG)
    assert result.pipelined["ns/p-0"] == "s"
    assert result.moved == {}
    assert result.evictions == {"ns/holder-0": "preempt: evicted to make room for ns/trainer"}


def test_a_share_left_free_beside_a_pipelined_one_is_feasible() -> None:
    # s's GPU: 0.75 held by a running share, and allocate pipelines a gang's 0.25 share onto it.
    # KAI still counts the 0.25 not held as idle, so s is feasible for the trainer's search and
    # consolidation moves the holder there.
    gang = job(
        "gang",
        tasks=[
            task("gang-0", "gang", {"cpu": "1", "memory": "1Gi"}, gpu_fraction=0.25),
            task("gang-1", "gang", {"cpu": "1", "memory": "1Gi", GPU: "1"}),
        ],
        priority=60,
        index=3,
    )
    jobs = [
        _holder(),
        _one_task_job("a", {}, 1, node="s", gpu_fraction=0.75, gpu_groups=["x"], priority=200),
        _one_task_job("rel", {GPU: "1"}, 2, node="r", status=TaskStatus.RELEASING),
        gang,
        _one_task_job("trainer", {GPU: "1"}, 4, priority=50),
    ]
    result = cycle(snapshot(_shared_cluster("r"), jobs), KAI_CONFIG)
    assert result.pipelined["ns/gang-0"] == "s"
    assert result.moved == {"ns/holder-0": ("g1", "s")}


def _holders(*shares: tuple[TaskStatus, float]) -> list[TaskInfo]:
    space = ResourceSpace({"cpu"})
    out = []
    for k, (status, fraction) in enumerate(shares):
        spec = task(f"h-{k}", "h", {"cpu": "1"}, "n", status=status)
        spec.gpu_fraction, spec.gpu_groups = fraction, ["0"]
        out.append(TaskInfo(spec, space))
    return out


@pytest.mark.parametrize(
    ("shares", "expected"),
    [
        # (idle share, releasing share) as KAI's GetSumOfIdleGPUs / GetSumOfReleasingGPUs add them
        ([(TaskStatus.RUNNING, 0.5)], (0.5, 0.0)),
        ([(TaskStatus.PIPELINED, 0.5)], (0.0, 0.0)),  # promised only: nothing held, nothing left
        ([(TaskStatus.RUNNING, 0.75), (TaskStatus.PIPELINED, 0.25)], (0.25, 0.0)),
        ([(TaskStatus.RUNNING, 0.5), (TaskStatus.RELEASING, 0.25)], (0.25, 0.25)),
        # the releasing share already promised to a pipelined one
        (
            [(TaskStatus.RUNNING, 0.5), (TaskStatus.RELEASING, 0.25), (TaskStatus.PIPELINED, 0.25)],
            (0.25, 0.0),
        ),
        # every task releasing: a whole GPU being released (the node's GPU column has it)
        ([(TaskStatus.RELEASING, 0.5)], (0.5, 0.0)),
        ([(TaskStatus.RUNNING, 0.3), (TaskStatus.RUNNING, 0.7)], (0.0, 0.0)),
        ([(TaskStatus.RUNNING, 0.995)], (0.0, 0.0)),  # taken shares round up to hundredths
    ],
)
def test_shared_gpu_shares_as_kai_counts_them(
    shares: list[tuple[TaskStatus, float]], expected: tuple[float, float]
) -> None:
    idle, releasing = _gpu_shares(_holders(*shares))
    assert (round(idle, 9), round(releasing, 9)) == expected
