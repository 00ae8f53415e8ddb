"""topology (KAI): place a job inside one topology domain.

A topology (scenario ``topologies``: a name and node-label levels, widest first, e.g. zone, rack,
hostname) groups nodes into a tree of domains: the nodes sharing a label value at a level (and the
values above it) form a domain. A job with ``topology: {topology, requiredLevel, preferredLevel}``
is tried on domains, one node set after another (``node_sets``): every domain from the preferred
level (or the required one) up to the required level (or the whole cluster) that can hold the job's
tasks -- counting how many copies of the job's largest task fit each node's free and releasing
resources, or comparing the job's total with the domain's free resources when its tasks differ in
kind -- deepest level first; within a level, domains whose free resources the job fills most
first (binpacking domains; ties by name). A job already running with a required level stays in the
domain that holds its running tasks. With a preferred level, nodes also score by their
preferred-level domain's rank (``node_order``). Sub-groups' own constraints are not applied (the
job's constraint is)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from muster.quantity import MIN_RESOURCE, PODS
from server.plugins.base import Plugin
from server.session.extension_points import NODE_ORDER, NODE_SETS, Scorer
from server.session.info import JobInfo, TaskInfo
from server.session.kai import ACTIVE_ALLOCATED
from server.session.session import Session

ROOT = ""
TOPOLOGY_SCORE = 10000.0
NOT_IN_DOMAIN_RATIO = 1000.0


@dataclass
class Domain:
    id: tuple[str, ...]  # label values from the widest level down to this one; () is the root
    level: str  # the node label of its level ("" for the root)
    rows: list[int] = field(default_factory=list)
    children: list[Domain] = field(default_factory=list)


def build_tree(levels: list[str], labels: list[dict[str, str]]) -> Domain:
    """The topology's domains over the nodes carrying every level's label."""
    root = Domain((), ROOT)
    index: dict[tuple[str, ...], Domain] = {(): root}
    for row, node_labels in enumerate(labels):
        if any(level not in node_labels for level in levels):
            continue
        parent = root
        root.rows.append(row)
        for k, level in enumerate(levels):
            key = tuple(node_labels[lv] for lv in levels[: k + 1])
            domain = index.get(key)
            if domain is None:
                domain = index[key] = Domain(key, level)
                parent.children.append(domain)
            domain.rows.append(row)
            parent = domain
    return root


class TopologyPlugin(Plugin):
    name: ClassVar[str] = "topology"
    ARGUMENTS: ClassVar[dict[str, object]] = {"*": None}

    def on_session_open(self, ssn: Session) -> None:
        self.ssn = ssn
        self.topologies: dict[str, list[str]] = {}
        for raw in ssn.snapshot.topologies:
            name, levels = raw.get("name"), raw.get("levels") or []
            if isinstance(name, str) and isinstance(levels, list):
                self.topologies[name] = [str(lv) for lv in levels]
        self.node_scores: dict[str, np.ndarray] = {}  # job -> per-row preferred-level score
        ssn.register(NODE_SETS, self.name, self.node_sets)
        ssn.register(NODE_ORDER, self.name, Scorer("task", self.score, plugin=self.name))

    # -- node sets ---------------------------------------------------------------------------------
    def node_sets(self, job: JobInfo, tasks: list[TaskInfo]) -> list[np.ndarray] | None:
        constraint: dict[str, Any] = job.spec.topology or {}
        name = constraint.get("topology")
        required = str(constraint.get("requiredLevel") or "")
        preferred = str(constraint.get("preferredLevel") or "")
        if not name or not (required or preferred):
            return None
        levels = self.topologies.get(str(name))
        if levels is None:
            job.job_fit_error = f"Requested topology {name} does not exist"
            return []
        if (required and required not in levels) or (preferred and preferred not in levels):
            job.job_fit_error = (
                f"topology {name} has no level {required if required not in levels else preferred}"
            )
            return []
        nodes = self.ssn.nodes
        root = build_tree(levels, nodes.labels)
        free = nodes.idle + nodes.releasing - nodes.pipelined
        total = sum((t.resreq for t in tasks), np.zeros(nodes.allocatable.shape[1]))
        fits = self._fit_counter(tasks, free)

        def ratio(d: Domain) -> float:
            have = free[d.rows].sum(axis=0) if d.rows else np.zeros_like(total)
            best = 0.0
            for k, need in enumerate(total):
                if need <= MIN_RESOURCE or self.ssn.space.dims[k] == PODS:
                    continue
                best = max(best, NOT_IN_DOMAIN_RATIO if have[k] <= 0 else need / have[k])
            return best

        deepest = preferred or required
        # Each domain's children, fullest first, down to the deepest level asked for. (A loop: a
        # recursive closure would be a reference cycle holding the plugin, and so the session.)
        below = [root]
        while below:
            d = below.pop()
            d.children.sort(key=lambda c: (-ratio(c), c.id))
            if d.level != deepest:
                below.extend(d.children)
        # Narrow to wide: from the preferred (or required) level up to the required one (or the root).
        narrow_to_wide = [*reversed(levels), ROOT]
        relevant: list[str] = []
        for level in narrow_to_wide:
            if level in (preferred, required) or relevant:
                relevant.append(level)
            if required and level == required:
                break
        allowed = self._allowed(job, root, required)
        order = _reverse_level_order(root)
        sets = []
        for d in order:
            if d.level not in relevant or (allowed is not None and d.id not in allowed):
                continue
            if fits(d) < len(tasks):
                continue
            mask = np.zeros(len(nodes), dtype=bool)
            mask[d.rows] = True
            sets.append(mask)
        if preferred:
            self.node_scores[job.uid] = self._preferred_scores(root, preferred, len(nodes))
        if not sets:
            job.job_fit_error = (
                f"topology {name}, requirement {required or '-'} couldn't be satisfied for job "
                f"<{job.namespace}/{job.name}>"
            )
        return sets

    def _fit_counter(self, tasks: list[TaskInfo], free: np.ndarray) -> Any:
        """How many of the job's tasks a domain holds: copies of the largest task per node when the
        tasks are alike in kind (KAI's representative pods), else all or none by total resources."""
        kinds = {tuple(t.resreq > 0) for t in tasks}
        biggest = np.max([t.resreq for t in tasks], axis=0) if tasks else np.zeros(free.shape[1])
        total = sum((t.resreq for t in tasks), np.zeros(free.shape[1]))

        def count(d: Domain) -> int:
            if not d.rows:
                return 0
            if len(kinds) == 1:
                if not (biggest > MIN_RESOURCE).any():
                    return len(tasks)
                asked = biggest > MIN_RESOURCE
                per_node = np.floor((free[d.rows][:, asked] + MIN_RESOURCE) / biggest[asked]).min(
                    axis=1
                )
                return int(np.clip(per_node, 0, len(tasks)).sum())
            have = free[d.rows].sum(axis=0)
            return len(tasks) if bool(np.all(total <= have + MIN_RESOURCE)) else 0

        return count

    def _allowed(self, job: JobInfo, root: Domain, required: str) -> set[tuple[str, ...]] | None:
        """A running job with a required level keeps to the required-level domains holding its
        running tasks (and their sub-domains)."""
        if not required:
            return None
        rows = {
            self.ssn.nodes.index[t.node]
            for t in job.tasks.values()
            if t.status in ACTIVE_ALLOCATED and t.node is not None
        }
        if not rows:
            return None
        allowed: set[tuple[str, ...]] = set()
        below = [(root, False)]  # (domain, inside such a domain); a loop, not a recursive closure
        while below:
            d, inside = below.pop()
            inside = inside or (d.level == required and bool(rows & set(d.rows)))
            if inside:
                allowed.add(d.id)
            below.extend((c, inside) for c in d.children)
        return allowed

    @staticmethod
    def _preferred_scores(root: Domain, preferred: str, n: int) -> np.ndarray:
        # The preferred level's domains, depth first in the children's order (a loop, not a
        # recursive closure: that would be a reference cycle left for the collector).
        domains: list[Domain] = []
        below = [root]
        while below:
            d = below.pop()
            if d.level == preferred:
                domains.append(d)
            else:
                below.extend(reversed(d.children))
        scores = np.zeros(n)
        for i, d in enumerate(domains):
            scores[d.rows] = math.floor((i + 1) / len(domains) * 10) * TOPOLOGY_SCORE
        return scores

    def score(self, task: TaskInfo, rows: np.ndarray) -> np.ndarray:
        known = self.node_scores.get(task.job)
        return known[rows] if known is not None else np.zeros(len(rows))


def _reverse_level_order(root: Domain) -> list[Domain]:
    levels: list[list[Domain]] = []
    queue = [root]
    while queue:
        levels.append(queue)
        queue = [c for d in queue for c in d.children]
    return [d for level in reversed(levels) for d in level]
