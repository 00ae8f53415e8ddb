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

Muster differs from Volcano in how the hypernode is chosen: Volcano's allocate action tries each
candidate hypernode (gradient by tier) for the whole job and keeps the best-scoring one
(HyperNodeOrderFn, hypernode binpacking); here the first task's node fixes the region greedily
and the gang is discarded if the region cannot hold it. Arguments are accepted with Volcano's
defaults; ``weight`` scales the score, the ``hypernode.binpack.*`` ones are not used yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from server.model import TaskStatus
from server.plugins.base import Plugin
from server.session.evaluator import Predicate, Scorer
from server.session.info import TaskInfo

if TYPE_CHECKING:
    from server.session.session import Session

MAX_NODE_SCORE = 100.0
# Statuses in which a task's node counts as used by the job.
_HOLDING = (TaskStatus.ALLOCATED, TaskStatus.PIPELINED, TaskStatus.BINDING, TaskStatus.BOUND, TaskStatus.RUNNING)


class NetworkTopologyPlugin(Plugin):
    name = "network-topology-aware"
    ARGUMENTS = {
        "weight": 1,
        "hypernode.binpack.cpu": 1,
        "hypernode.binpack.memory": 1,
        "hypernode.binpack.resources": "",
        "hypernode.binpack.resources.*": 1,
        "hypernode.binpack.normal-pod.enable": False,
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
                highest = int(nt.get("highestTierAllowed", nt.get("highest_tier_allowed", max_tier)))
            except (TypeError, ValueError):
                highest = max_tier
            return mode, highest

        def used_rows(task: TaskInfo) -> np.ndarray:
            job = ssn.jobs[task.job]
            rows = {nodes.index[t.node] for s in _HOLDING for t in job.index[s].values()
                    if t.node is not None and t.node in nodes.index}
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
            return region(task, topo[1])[rows]

        def score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            out = np.zeros(len(rows))
            if topology(task) is None or weight == 0:
                return out
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

        ssn.register(
            "predicate",
            self.name,
            Predicate("task", check, reason="node(s) outside the job's hypernode within its highest allowed tier"),
        )
        ssn.register("node_order", self.name, Scorer("task", score))
