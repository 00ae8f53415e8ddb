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

import numpy as np

from muster.quantity import MIN_RESOURCE
from server.model import TaskStatus
from server.plugins.base import Plugin
from server.session.evaluator import Predicate, Scorer
from server.session.info import JobInfo, TaskInfo, less_equal
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
        weight = max(self.arg_int("weight", 1), 0)
        nodes = ssn.nodes
        n = len(nodes)
        specs = {h.name: h for h in ssn.hypernodes}
        members: dict[str, np.ndarray] = {}

        def real_nodes(name: str, seen: frozenset[str] = frozenset()) -> np.ndarray:
            if name in members:
                return members[name]
            mask = np.zeros(n, dtype=bool)
            spec = specs[name]
            for node in spec.nodes:
                i = nodes.index.get(node)
                if i is not None:
                    mask[i] = True
            for child in spec.hypernodes:
                if child in specs and child not in seen:
                    mask |= real_nodes(child, seen | {name})
            members[name] = mask
            return mask

        for name in specs:
            real_nodes(name)
        if not specs:
            return
        max_tier = max(h.tier for h in specs.values())
        # Hypernodes by tier, smallest first, for "the lowest tier holding these rows".
        ordered = sorted(specs.values(), key=lambda h: (h.tier, h.name))

        def topology(task: TaskInfo) -> tuple[str, int] | None:
            job = ssn.jobs.get(task.job)
            if job is None or not job.spec.network_topology:
                return None
            nt = job.spec.network_topology
            mode = str(nt.get("mode", "hard")).lower()
            try:
                highest = int(
                    nt.get("highestTierAllowed", nt.get("highest_tier_allowed", max_tier))
                )
            except (TypeError, ValueError):
                highest = max_tier
            return mode, highest

        def used_rows(task: TaskInfo) -> np.ndarray:
            job = ssn.jobs[task.job]
            rows = {
                nodes.index[t.node]
                for s in _HOLDING
                for t in job.index[s].values()
                if t.node is not None and t.node in nodes.index
            }
            return np.fromiter(sorted(rows), dtype=np.int64, count=len(rows))

        def region(task: TaskInfo, highest: int) -> np.ndarray:
            used = used_rows(task)
            allowed = np.zeros(n, dtype=bool)
            for h in ordered:
                if h.tier > highest:
                    continue
                m = members[h.name]
                if len(used) == 0 or m[used].all():
                    allowed |= m
            return allowed

        def check(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            topo = topology(task)
            if topo is None or topo[0] != "hard":
                return np.ones(len(rows), dtype=bool)
            inside: np.ndarray = region(task, topo[1])[rows]
            return inside

        # Volcano batchNodeOrderFnForNormalPods: a task of a job without a network topology scores
        # a node by how well it bin-packs each enclosing hypernode, tier by tier (tier t weighted
        # fading^(t-1)), over Volcano's tiers plus the virtual cluster-top hypernode (every node)
        # Volcano adds one tier above the highest; a tier where no hypernode holds the node
        # scores full.
        normal_enable = self.arg_bool("hypernode.binpack.normal-pod.enable", True)
        fading = self.arg_float("hypernode.binpack.normal-pod.fading", 0.8)
        if fading < 0:
            fading = 0.8
        top_tier = max_tier + 1
        tier_range = range(min(h.tier for h in specs.values()), top_tier + 1)
        tier_weights = np.array([fading ** (t - 1) for t in tier_range])
        # owner[k][row]: index into hn_masks of the tier-k hypernode holding the row, -1 if none.
        hn_masks: list[np.ndarray] = [np.ones(n, dtype=bool)]  # 0: the cluster top
        owner = np.full((len(tier_range), n), -1, dtype=np.int64)
        owner[-1, :] = 0
        for h in sorted(specs.values(), key=lambda h: (h.tier, h.name), reverse=True):
            k = h.tier - tier_range.start
            hn_masks.append(members[h.name])
            owner[k, members[h.name]] = len(hn_masks) - 1  # ties: the first by name wins
        hn_matrix = np.array(hn_masks, dtype=float)

        def normal_pod_score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            dims = [
                d for d, w in binpack_weights.items() if task.resreq[d] >= MIN_RESOURCE and w > 0
            ]
            hn_scores = np.zeros(len(hn_masks))
            if dims:
                w = np.array([binpack_weights[d] for d in dims], dtype=float)
                alloc = hn_matrix @ nodes.allocatable[:, dims]
                after = hn_matrix @ nodes.used[:, dims] + task.resreq[dims]
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = np.where(alloc > 0, after / alloc, np.inf)
                fits = (ratio <= 1.0).all(axis=1)
                hn_scores = np.where(
                    fits, (np.where(np.isfinite(ratio), ratio, 0.0) @ w) / w.sum(), 0.0
                )
            owners = owner[:, rows]
            per_tier = np.where(owners >= 0, hn_scores[np.maximum(owners, 0)], 1.0)
            scores: np.ndarray = (
                weight * MAX_NODE_SCORE * (tier_weights @ per_tier) / tier_weights.sum()
            )
            return scores

        def score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            out = np.zeros(len(rows))
            if weight == 0:
                return out
            if topology(task) is None:
                return normal_pod_score(task, rows) if normal_enable else out
            used = used_rows(task)
            if len(used) == 0:
                return out
            done = np.zeros(len(rows), dtype=bool)
            for h in ordered:  # lowest tier first: the first hypernode holding both decides
                m = members[h.name]
                if not m[used].all():
                    continue
                hit = m[rows] & ~done
                out[hit] = weight * MAX_NODE_SCORE * (max_tier - h.tier + 1) / max_tier
                done |= hit
            return out

        def gradients(job: JobInfo) -> list[list[tuple[str, np.ndarray]]] | None:
            """Volcano hyperNodeGradientFn: eligible hypernodes of tier <= highestTierAllowed, by
            tier, lowest first. A job already holding nodes may only use hypernodes holding them all;
            otherwise a hypernode must have room (idle or future idle) for the job's minimum."""
            nt = job.spec.network_topology
            if str(nt.get("mode", "hard")).lower() != "hard":
                return None
            try:
                highest = int(
                    nt.get("highestTierAllowed", nt.get("highest_tier_allowed", max_tier))
                )
            except (TypeError, ValueError):
                highest = max_tier
            held = sorted(
                {
                    nodes.index[t.node]
                    for s in _HOLDING
                    for t in job.index[s].values()
                    if t.node is not None and t.node in nodes.index
                }
            )
            need = job.min_resources
            if need is None:
                pending = sorted(
                    job.index[TaskStatus.PENDING].values(), key=lambda t: t.creation_index
                )
                missing = max(job.min_available - job.ready_task_num(), 0)
                need = (
                    np.sum([t.resreq for t in pending[:missing]], axis=0)
                    if missing and pending
                    else None
                )
            by_tier: dict[int, list[tuple[str, np.ndarray]]] = {}
            for h in ordered:
                if h.tier > highest:
                    continue
                m = members[h.name]
                if held:
                    if not m[held].all():
                        continue
                elif need is not None:
                    idle = nodes.idle[m].sum(axis=0)
                    future = nodes.future_idle()[m].sum(axis=0)
                    if not (less_equal(need, idle) or less_equal(need, future)):
                        continue
                by_tier.setdefault(h.tier, []).append((h.name, m))
            return [by_tier[t] for t in sorted(by_tier)]

        def hypernode_order(job: JobInfo, candidates: dict[str, np.ndarray]) -> dict[str, float]:
            """Volcano HyperNodeOrderFn: bin-packing of the job's request into each hypernode,
            (used + request) / allocatable weighted over cpu and memory; 0 if it overflows."""
            request = (
                np.sum([t.resreq for t in job.tasks.values()], axis=0)
                if job.tasks
                else ssn.space.zeros()
            )
            out: dict[str, float] = {}
            for name, m in candidates.items():
                alloc = nodes.allocatable[m].sum(axis=0)
                used = nodes.used[m].sum(axis=0)
                total, weights = 0.0, 0
                overflow = False
                for d, w in ((0, binpack_cpu), (1, binpack_memory)):
                    if request[d] <= 0 or w <= 0:
                        continue
                    if used[d] + request[d] > alloc[d]:
                        overflow = True
                        break
                    total += w * (used[d] + request[d]) / alloc[d]
                    weights += w
                out[name] = (
                    0.0 if overflow or weights == 0 else weight * MAX_NODE_SCORE * total / weights
                )
            return out

        binpack_cpu = self.arg_int("hypernode.binpack.cpu", 1)
        binpack_memory = self.arg_int("hypernode.binpack.memory", 1)
        # Volcano priorityWeight: cpu, memory and the listed extended resources (negative -> 1).
        binpack_weights: dict[int, int] = {
            0: binpack_cpu if binpack_cpu >= 0 else 1,
            1: binpack_memory if binpack_memory >= 0 else 1,
        }
        for res_name in str(self.arguments.get("hypernode.binpack.resources") or "").split(","):
            res_name = res_name.strip()
            if res_name and res_name in ssn.space.index:
                w = self.arg_int(f"hypernode.binpack.resources.{res_name}", 1)
                binpack_weights[ssn.space.index[res_name]] = w if w >= 0 else 1
        ssn.register("hypernode_gradient", self.name, gradients)
        ssn.register("hypernode_order", self.name, hypernode_order)
        ssn.register(
            "predicate",
            self.name,
            Predicate(
                "task",
                check,
                reason="node(s) outside the job's hypernode within its highest allowed tier",
            ),
        )
        ssn.register("node_order", self.name, Scorer("task", score))
