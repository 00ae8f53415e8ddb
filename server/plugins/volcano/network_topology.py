"""network-topology-aware: keep a job's tasks close in the network (Volcano
``plugins/network-topology-aware``, with the snapshot's HyperNodes).

HyperNodes form a tree: a tier-1 hypernode lists nodes, a higher tier lists hypernodes. A job's
``network_topology`` says ``mode: hard|soft`` and ``highestTierAllowed`` (default: the highest tier).

* hard mode -- predicate ("task" scope): every task of the job must land inside one hypernode of
  tier <= highestTierAllowed. Before the first placement any node of such a hypernode passes;
  afterwards only nodes of a tier <= highestTierAllowed hypernode that also holds every node the job
  already uses. Nodes outside all hypernodes never pass.
* both modes -- node_order ("task" scope): once the job holds nodes, a node scores higher the lower
  the tier of the smallest hypernode it shares with all of them: ``weight * 100 * (maxTier - tier
  + 1) / maxTier``; 0 with no common hypernode or before the first placement.

* hypernode_gradient -- for a hard-mode job, the eligible hypernodes by tier (lowest first); the
  allocate action tries the whole gang in each hypernode of a tier and keeps the best one, as
  Volcano's allocateForJob does.
* hypernode_order -- Volcano's hypernode bin-packing score: (used + job request) / allocatable
  over cpu and memory, weighted by ``hypernode.binpack.cpu`` / ``hypernode.binpack.memory``.

* node_order for normal pods (jobs without a network topology) -- Volcano's hypernode-level
  bin-packing by tier, faded by ``hypernode.binpack.normal-pod.fading`` (see normal_pod_score).

Arguments are accepted with Volcano's defaults; extended resources in the job-level hypernode
score and the eviction-gradient argument are not used yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from muster.quantity import MIN_RESOURCE
from server.model import HyperNodeSpec, TaskStatus
from server.plugins.base import Plugin
from server.session.evaluator import Predicate, Scorer
from server.session.extension_points import (
    HYPERNODE_GRADIENT,
    HYPERNODE_ORDER,
    NODE_ORDER,
    PREDICATE,
    Gradients,
)
from server.session.info import JobInfo, NodeTable, TaskInfo, less_equal
from server.session.session import Session

MAX_NODE_SCORE = 100.0
# Statuses in which a task's node counts as used by the job.
_HOLDING = (
    TaskStatus.ALLOCATED,
    TaskStatus.PIPELINED,
    TaskStatus.BINDING,
    TaskStatus.BOUND,
    TaskStatus.RUNNING,
)


def hypernode_members(
    specs: Mapping[str, HyperNodeSpec], node_index: Mapping[str, int], n: int
) -> dict[str, np.ndarray]:
    """Each hypernode's real nodes as a row mask over the ``n`` nodes: its own nodes and, through
    its child hypernodes, theirs (a child that leads back into the path is not followed again)."""
    members: dict[str, np.ndarray] = {}
    for name in specs:
        _real_nodes(name, frozenset(), specs, node_index, n, members)
    return members


def _real_nodes(
    name: str,
    seen: frozenset[str],
    specs: Mapping[str, HyperNodeSpec],
    node_index: Mapping[str, int],
    n: int,
    members: dict[str, np.ndarray],
) -> np.ndarray:
    """``hypernode_members`` of one hypernode, found once (``members``). A function of the module,
    not a closure: a recursive closure is a reference cycle, left for the collector."""
    if name in members:
        return members[name]
    mask = np.zeros(n, dtype=bool)
    spec = specs[name]
    for node in spec.nodes:
        i = node_index.get(node)
        if i is not None:
            mask[i] = True
    for child in spec.hypernodes:
        if child in specs and child not in seen:
            mask |= _real_nodes(child, seen | {name}, specs, node_index, n, members)
    members[name] = mask
    return mask


def mode_and_highest_tier(topology: Mapping[str, Any], max_tier: int) -> tuple[str, int]:
    """A job's ``network_topology``: its mode (default hard) and highestTierAllowed (default, or
    not a number: ``max_tier``)."""
    mode = str(topology.get("mode", "hard")).lower()
    highest = topology.get("highestTierAllowed", topology.get("highest_tier_allowed", max_tier))
    try:
        return mode, int(highest)
    except (TypeError, ValueError):
        return mode, max_tier


class NetworkTopologyPlugin(Plugin):
    name = "network-topology-aware"
    ARGUMENTS = {
        "weight": 1,
        "hypernode.binpack.cpu": 1,
        "hypernode.binpack.memory": 1,
        "hypernode.binpack.resources": "",
        "hypernode.binpack.resources.*": 1,
        "hypernode.binpack.normal-pod.enable": True,
        "hypernode.binpack.normal-pod.fading": 0.8,
        "hypernode.gradient.evict.max-hypernodes": 0,
    }

    def on_session_open(self, ssn: Session) -> None:
        self.ssn = ssn
        self.weight = max(self.arg_int("weight", 1), 0)
        self.nodes: NodeTable = ssn.nodes
        specs = {h.name: h for h in ssn.hypernodes}
        self.members = hypernode_members(specs, self.nodes.index, len(self.nodes))
        if not specs:
            return  # no hypernodes: nothing to keep together, nothing registered
        self.max_tier = max(h.tier for h in specs.values())
        # Hypernodes by tier, smallest first, for "the lowest tier holding these rows".
        self.ordered = sorted(specs.values(), key=lambda h: (h.tier, h.name))
        self._build_normal_pod_tables(specs)
        self._read_binpack_weights(ssn)
        ssn.register(HYPERNODE_GRADIENT, self.name, self.gradients)
        ssn.register(HYPERNODE_ORDER, self.name, self.hypernode_order)
        ssn.register(
            PREDICATE,
            self.name,
            Predicate(
                "task",
                self.check,
                reason="node(s) outside the job's hypernode within its highest allowed tier",
            ),
        )
        ssn.register(NODE_ORDER, self.name, Scorer("task", self.score))

    # -- building -------------------------------------------------------------------------------
    def _build_normal_pod_tables(self, specs: Mapping[str, HyperNodeSpec]) -> None:
        """Volcano batchNodeOrderFnForNormalPods: a task of a job without a network topology scores
        a node by how well it bin-packs each enclosing hypernode, tier by tier (tier t weighted
        fading^(t-1)), over Volcano's tiers plus the virtual cluster-top hypernode (every node)
        Volcano adds one tier above the highest; a tier where no hypernode holds the node scores
        full. Here: the tier weights, every hypernode's mask (row 0: the cluster top) and, per
        tier and node, which of them holds it."""
        n = len(self.nodes)
        self.normal_enable = self.arg_bool("hypernode.binpack.normal-pod.enable", True)
        fading = self.arg_float("hypernode.binpack.normal-pod.fading", 0.8)
        if fading < 0:
            fading = 0.8
        top_tier = self.max_tier + 1
        tier_range = range(min(h.tier for h in specs.values()), top_tier + 1)
        self.tier_weights = np.array([fading ** (t - 1) for t in tier_range])
        # owner[k][row]: index into hn_masks of the tier-k hypernode holding the row, -1 if none.
        hn_masks: list[np.ndarray] = [np.ones(n, dtype=bool)]  # 0: the cluster top
        owner = np.full((len(tier_range), n), -1, dtype=np.int64)
        owner[-1, :] = 0
        for h in sorted(specs.values(), key=lambda h: (h.tier, h.name), reverse=True):
            k = h.tier - tier_range.start
            hn_masks.append(self.members[h.name])
            owner[k, self.members[h.name]] = len(hn_masks) - 1  # ties: the first by name wins
        self.owner = owner
        self.hn_matrix = np.array(hn_masks, dtype=float)

    def _read_binpack_weights(self, ssn: Session) -> None:
        self.binpack_cpu = self.arg_int("hypernode.binpack.cpu", 1)
        self.binpack_memory = self.arg_int("hypernode.binpack.memory", 1)
        # Volcano priorityWeight: cpu, memory and the listed extended resources (negative -> 1).
        weights: dict[int, int] = {
            0: self.binpack_cpu if self.binpack_cpu >= 0 else 1,
            1: self.binpack_memory if self.binpack_memory >= 0 else 1,
        }
        for res_name in str(self.arguments.get("hypernode.binpack.resources") or "").split(","):
            res_name = res_name.strip()
            if res_name and res_name in ssn.space.index:
                w = self.arg_int(f"hypernode.binpack.resources.{res_name}", 1)
                weights[ssn.space.index[res_name]] = w if w >= 0 else 1
        self.binpack_weights = weights

    # -- the job's topology and placement -------------------------------------------------------
    def topology(self, task: TaskInfo) -> tuple[str, int] | None:
        """The task's job's mode and highest allowed tier; None without a network topology."""
        job = self.ssn.jobs.get(task.job)
        if job is None or not job.spec.network_topology:
            return None
        return mode_and_highest_tier(job.spec.network_topology, self.max_tier)

    def held_rows(self, job: JobInfo) -> np.ndarray:
        """The rows of the nodes the job's tasks hold, ascending."""
        index = self.nodes.index
        rows = {
            index[t.node]
            for s in _HOLDING
            for t in job.index[s].values()
            if t.node is not None and t.node in index
        }
        return np.fromiter(sorted(rows), dtype=np.int64, count=len(rows))

    def region(self, task: TaskInfo, highest: int) -> np.ndarray:
        """The nodes of every hypernode of tier <= ``highest`` that holds all the job's nodes."""
        used = self.held_rows(self.ssn.jobs[task.job])
        allowed = np.zeros(len(self.nodes), dtype=bool)
        for h in self.ordered:
            if h.tier > highest:
                continue
            m = self.members[h.name]
            if len(used) == 0 or m[used].all():
                allowed |= m
        return allowed

    # -- predicate and node order ---------------------------------------------------------------
    def check(self, task: TaskInfo, rows: np.ndarray) -> np.ndarray:
        topo = self.topology(task)
        if topo is None or topo[0] != "hard":
            return np.ones(len(rows), dtype=bool)
        inside: np.ndarray = self.region(task, topo[1])[rows]
        return inside

    def normal_pod_score(self, task: TaskInfo, rows: np.ndarray) -> np.ndarray:
        """The tier-faded hypernode bin-packing score of a task without a network topology."""
        nodes, weights = self.nodes, self.binpack_weights
        dims = [d for d, w in weights.items() if task.resreq[d] >= MIN_RESOURCE and w > 0]
        hn_scores = np.zeros(len(self.hn_matrix))
        if dims:
            w = np.array([weights[d] for d in dims], dtype=float)
            alloc = self.hn_matrix @ nodes.allocatable[:, dims]
            after = self.hn_matrix @ nodes.used[:, dims] + task.resreq[dims]
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(alloc > 0, after / alloc, np.inf)
            fits = (ratio <= 1.0).all(axis=1)
            hn_scores = np.where(
                fits, (np.where(np.isfinite(ratio), ratio, 0.0) @ w) / w.sum(), 0.0
            )
        owners = self.owner[:, rows]
        per_tier = np.where(owners >= 0, hn_scores[np.maximum(owners, 0)], 1.0)
        scores: np.ndarray = (
            self.weight * MAX_NODE_SCORE * (self.tier_weights @ per_tier) / self.tier_weights.sum()
        )
        return scores

    def score(self, task: TaskInfo, rows: np.ndarray) -> np.ndarray:
        out = np.zeros(len(rows))
        if self.weight == 0:
            return out
        if self.topology(task) is None:
            return self.normal_pod_score(task, rows) if self.normal_enable else out
        used = self.held_rows(self.ssn.jobs[task.job])
        if len(used) == 0:
            return out
        max_tier = self.max_tier
        done = np.zeros(len(rows), dtype=bool)
        for h in self.ordered:  # lowest tier first: the first hypernode holding both decides
            m = self.members[h.name]
            if not m[used].all():
                continue
            hit = m[rows] & ~done
            out[hit] = self.weight * MAX_NODE_SCORE * (max_tier - h.tier + 1) / max_tier
            done |= hit
        return out

    # -- hypernode search (the allocate action) -------------------------------------------------
    def gradients(self, job: JobInfo) -> Gradients | None:
        """Volcano hyperNodeGradientFn: eligible hypernodes of tier <= highestTierAllowed, by
        tier, lowest first. A job already holding nodes may only use hypernodes holding them all;
        otherwise a hypernode must have room (idle or future idle) for the job's minimum."""
        mode, highest = mode_and_highest_tier(job.spec.network_topology, self.max_tier)
        if mode != "hard":
            return None
        nodes = self.nodes
        held = self.held_rows(job)
        need = job.min_resources
        if need is None:
            pending = sorted(job.index[TaskStatus.PENDING].values(), key=lambda t: t.creation_index)
            missing = max(job.min_available - job.ready_task_num(), 0)
            need = (
                np.sum([t.resreq for t in pending[:missing]], axis=0)
                if missing and pending
                else None
            )
        by_tier: dict[int, list[tuple[str, np.ndarray]]] = {}
        for h in self.ordered:
            if h.tier > highest:
                continue
            m = self.members[h.name]
            if len(held):
                if not m[held].all():
                    continue
            elif need is not None:
                idle = nodes.idle[m].sum(axis=0)
                future = nodes.future_idle()[m].sum(axis=0)
                if not (less_equal(need, idle) or less_equal(need, future)):
                    continue
            by_tier.setdefault(h.tier, []).append((h.name, m))
        return [by_tier[t] for t in sorted(by_tier)]

    def hypernode_order(self, job: JobInfo, candidates: dict[str, np.ndarray]) -> dict[str, float]:
        """Volcano HyperNodeOrderFn: bin-packing of the job's request into each hypernode,
        (used + request) / allocatable weighted over cpu and memory; 0 if it overflows."""
        nodes = self.nodes
        request = (
            np.sum([t.resreq for t in job.tasks.values()], axis=0)
            if job.tasks
            else self.ssn.space.zeros()
        )
        out: dict[str, float] = {}
        for name, m in candidates.items():
            alloc = nodes.allocatable[m].sum(axis=0)
            used = nodes.used[m].sum(axis=0)
            total, weights = 0.0, 0
            overflow = False
            for d, w in ((0, self.binpack_cpu), (1, self.binpack_memory)):
                if request[d] <= 0 or w <= 0:
                    continue
                if used[d] + request[d] > alloc[d]:
                    overflow = True
                    break
                total += w * (used[d] + request[d]) / alloc[d]
                weights += w
            out[name] = (
                0.0 if overflow or weights == 0 else self.weight * MAX_NODE_SCORE * total / weights
            )
        return out
