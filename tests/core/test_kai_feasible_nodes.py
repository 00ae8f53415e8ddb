"""KAI's feasible nodes: a victim search for a job every task of which asks for a GPU places (the
pending job, and the victims again) only on nodes with a GPU idle or being released, and on the
nodes of the victims it evicts (KAI's FeasibleNodesForJob, and the solver adding victims' nodes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from core_helpers import cycle, job, node, session, snapshot, task

from server.actions.kai.solver import feasible_nodes, with_nodes_of
from server.model import TaskStatus

KAI_CONFIG = (Path(__file__).resolve().parents[2] / "examples" / "config-kai.yaml").read_text()
GPU = "nvidia.com/gpu"


def _cluster() -> tuple[list, list]:
    # g1: one idle GPU, its 4 cpu held by a cpu-only job of low priority; c1: a cpu node, idle.
    # (Jobs of priority below 100 are preemptible.)
    nodes = [
        node("g1", cpu="4", memory="64Gi", **{GPU: "1"}),
        node("c1", cpu="8", memory="64Gi"),
    ]
    holder = job("holder", 1, "4", status=TaskStatus.RUNNING, nodes="g1", index=0)
    gpu_job = job(
        "trainer",
        tasks=[task("trainer-0", "trainer", {"cpu": "1", "memory": "1Gi", GPU: "1"})],
        priority=50,
        index=1,
    )
    return nodes, [holder, gpu_job]


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
