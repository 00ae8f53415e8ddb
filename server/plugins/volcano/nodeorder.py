"""nodeorder: kube-scheduler scores, weighted (Volcano ``plugins/nodeorder``).

Scores per node (0-100 each, integer like kube-scheduler, times the plugin weight), summed:
- ``leastrequested.weight`` (1): free fraction of cpu and memory after placing the task;
- ``mostrequested.weight`` (0): used fraction after placing;
- ``balancedresource.weight`` (1): 100 * (1 - std-dev of cpu and memory used fractions);
- ``nodeaffinity.weight`` (2): preferred node-affinity term weights, normalised to 0-100;
- ``tainttoleration.weight`` (3): fewer intolerable PreferNoSchedule taints is better, normalised;
- ``podaffinity.weight`` (2): preferred inter-pod affinity minus anti-affinity, normalised.
``imagelocality.weight`` and ``podtopologyspread.weight`` are accepted; Muster has no images or
spread constraints to score, so they add nothing.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from muster.quantity import CPU, MEMORY
from server.plugins.base import Plugin
from server.session.evaluator import Scorer
from server.session.extension_points import NODE_ORDER
from server.session.info import TaskInfo
from server.session.k8s import (
    PREFERRED,
    match_label_selector,
    match_node_selector_term,
    node_affinity_preferred,
)
from server.session.session import Session

MAX_NODE_SCORE = 100.0
# kube-scheduler's non-zero defaults for a pod that requests no cpu / memory.
DEFAULT_MILLI_CPU = 100.0
DEFAULT_MEMORY = 200.0 * 1024 * 1024


def normalize(scores: np.ndarray) -> np.ndarray:
    """kube-scheduler DefaultNormalizeScore (not reversed)."""
    top = scores.max() if len(scores) else 0.0
    if top <= 0:
        return np.zeros_like(scores)
    return np.floor(scores * MAX_NODE_SCORE / top)


def normalize_reverse(scores: np.ndarray) -> np.ndarray:
    top = scores.max() if len(scores) else 0.0
    if top <= 0:
        return np.full_like(scores, MAX_NODE_SCORE)
    return MAX_NODE_SCORE - np.floor(scores * MAX_NODE_SCORE / top)


def _halved_sum(part: np.ndarray) -> np.ndarray:
    """floor((a + b) / 2) of the two columns of ``part``: kube-scheduler's mean of two scores."""
    out: np.ndarray = part[:, 0] + part[:, 1]
    out /= 2
    np.floor(out, out=out)
    return out


class NodeOrderPlugin(Plugin):
    name = "nodeorder"
    ARGUMENTS = {
        "leastrequested.weight": 1,
        "mostrequested.weight": 0,
        "nodeaffinity.weight": 2,
        "podaffinity.weight": 2,
        "balancedresource.weight": 1,
        "tainttoleration.weight": 3,
        "imagelocality.weight": 1,
        "podtopologyspread.weight": 2,
        "selectorspread.weight": 0,
    }

    def on_session_open(self, ssn: Session) -> None:
        nodes = ssn.nodes
        cpu, mem = ssn.space.index[CPU], ssn.space.index[MEMORY]
        least = self.arg_int("leastrequested.weight", 1)
        most = self.arg_int("mostrequested.weight", 0)
        balanced = self.arg_int("balancedresource.weight", 1)
        affinity_w = self.arg_int("nodeaffinity.weight", 2)
        taint_w = self.arg_int("tainttoleration.weight", 3)
        pod_affinity_w = self.arg_int("podaffinity.weight", 2)

        assert (cpu, mem) == (0, 1), "ResourceSpace puts cpu and memory first"
        alloc = nodes.allocatable[:, :2]
        # 1/allocatable (0 where nothing is allocatable): no division on the hot path.
        inv = np.divide(1.0, alloc, out=np.zeros_like(alloc), where=alloc > 0)
        has = inv > 0

        used = nodes.used
        # Python floats for the one-row path (numpy scalars cost ~5x per arithmetic operation).
        inv_c, inv_m = inv[:, 0].tolist(), inv[:, 1].tolist()

        # Bound for the one-row path: a closure variable reads faster than a global or an
        # attribute, and this runs at every placement.
        floor, top, used_at = math.floor, MAX_NODE_SCORE, used.item

        def resource_row(task: TaskInfo, i: int) -> float:
            # One node in plain floats: the cached evaluation re-scores one or two changed rows at a
            # time, where numpy's per-call overhead would dominate. Same formula as below.
            req = task.request_floats  # the request's floats: what float(resreq[d]) gives
            ic, im = inv_c[i], inv_m[i]
            fc = (used_at(i, 0) + (req[0] or DEFAULT_MILLI_CPU)) * ic
            fm = (used_at(i, 1) + (req[1] or DEFAULT_MEMORY)) * im
            total = 0.0
            if least or most:
                ok_c, ok_m = ic > 0 and fc <= 1.0, im > 0 and fm <= 1.0
                if least:
                    lc = floor((1.0 - fc) * top) if ok_c else 0.0
                    lm = floor((1.0 - fm) * top) if ok_m else 0.0
                    total += floor((lc + lm) / 2) * least
                if most:
                    mc = floor(fc * top) if ok_c else 0.0
                    mm = floor(fm * top) if ok_m else 0.0
                    total += floor((mc + mm) / 2) * most
            if balanced:
                # min(f, 1.0) written out (what min returns, NaN included)
                cc = (1.0 if fc > 1.0 else fc) if ic > 0 else 1.0
                cm = (1.0 if fm > 1.0 else fm) if im > 0 else 1.0
                total += floor((1 - abs(cc - cm) / 2) * top) * balanced
            return total

        # Most clusters: every node has cpu and memory allocatable, and the masks below are all
        # true (left out: the same answers).
        every_node_has = bool(has.all())

        def resource_scores(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            if len(rows) <= 4:
                return np.array([resource_row(task, i) for i in rows.tolist()])
            req = (
                task.request_floats[0] or DEFAULT_MILLI_CPU,
                task.request_floats[1] or DEFAULT_MEMORY,
            )
            # The used fraction after placing. ``take`` of whole rows, then the two columns: the
            # values ``used[rows, :2]`` gives, at a third of its cost. Each numpy call below costs
            # about as much as its arithmetic on a few dozen rows: results are computed in place.
            frac = nodes.used.take(rows, axis=0)[:, :2]
            frac += req
            frac *= inv.take(rows, axis=0)
            has_rows = None if every_node_has else has.take(rows, axis=0)
            fits = frac <= 1.0
            if has_rows is not None:
                fits &= has_rows
            total: np.ndarray | None = None
            # Two columns: a + b is what sum(axis=1) gives, without the reduction's overhead. A
            # weight of 1 multiplies nothing (x * 1.0 == x): skipped; nor is the first part added
            # to zeros (0.0 + x == x, the sign of a zero aside).
            if least:
                part = 1.0 - frac
                part *= MAX_NODE_SCORE
                np.floor(part, out=part)
                part = np.where(fits, part, 0.0)
                total = _halved_sum(part) if least == 1 else _halved_sum(part) * least
            if most:
                part = frac * MAX_NODE_SCORE
                np.floor(part, out=part)
                part = np.where(fits, part, 0.0)
                scored = _halved_sum(part) if most == 1 else _halved_sum(part) * most
                total = scored if total is None else total + scored
            if balanced:
                capped = np.minimum(frac, 1.0)
                if has_rows is not None:
                    capped = np.where(has_rows, capped, 1.0)
                part = capped[:, 0] - capped[:, 1]
                np.abs(part, out=part)
                part /= 2
                part = 1 - part
                part *= MAX_NODE_SCORE
                np.floor(part, out=part)
                scored = part if balanced == 1 else part * balanced
                total = scored if total is None else total + scored
            return np.zeros(len(rows)) if total is None else total

        scorers = [Scorer("shape", resource_scores, row=resource_row)]

        if affinity_w:

            def node_affinity(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
                terms = node_affinity_preferred(task.spec.affinity)
                if not terms:
                    return np.zeros(len(rows))
                return np.array(
                    [
                        sum(
                            t.get("weight", 0)
                            for t in terms
                            if match_node_selector_term(
                                nodes.labels[i], t.get("preference") or {}, nodes.names[i]
                            )
                        )
                        for i in rows
                    ],
                    dtype=float,
                )

            scorers.append(
                Scorer("static", node_affinity, normalize=lambda s: normalize(s) * affinity_w)
            )

        if taint_w:

            def intolerable(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
                tolerations = [
                    t for t in task.spec.tolerations if t.effect in ("", "PreferNoSchedule")
                ]
                return np.array(
                    [
                        sum(
                            1
                            for taint in nodes.taints[i]
                            if taint.effect == "PreferNoSchedule"
                            and not any(t.tolerates(taint) for t in tolerations)
                        )
                        for i in rows
                    ],
                    dtype=float,
                )

            scorers.append(
                Scorer("static", intolerable, normalize=lambda s: normalize_reverse(s) * taint_w)
            )

        uses_preferred_pod_affinity = any(
            (
                (t.spec.affinity.get("podAffinity") or {}).get(PREFERRED)
                or (t.spec.affinity.get("podAntiAffinity") or {}).get(PREFERRED)
            )
            for t in ssn.constrained_tasks()
        )
        if pod_affinity_w and uses_preferred_pod_affinity:
            scorers.append(
                Scorer(
                    "task", lambda task, rows: self._pod_affinity(ssn, task, rows) * pod_affinity_w
                )
            )
        ssn.register(NODE_ORDER, self.name, scorers)

    @staticmethod
    def _pod_affinity(ssn: Session, task: TaskInfo, rows: np.ndarray) -> np.ndarray:
        nodes = ssn.nodes
        raw = np.zeros(len(rows))
        for kind, sign in (("podAffinity", 1.0), ("podAntiAffinity", -1.0)):
            for wt in (task.spec.affinity.get(kind) or {}).get(PREFERRED) or []:
                term: dict[str, Any] = wt.get("podAffinityTerm") or {}
                key = term.get("topologyKey", "")
                namespaces = set(term.get("namespaces") or [task.namespace])
                domains: dict[str, int] = {}
                for i, tasks in enumerate(nodes.tasks):
                    hits = sum(
                        1
                        for t in tasks.values()
                        if t.uid != task.uid
                        and t.namespace in namespaces
                        and match_label_selector(t.spec.labels, term.get("labelSelector"))
                    )
                    d = nodes.labels[i].get(key)
                    if hits and d is not None:
                        domains[d] = domains.get(d, 0) + hits
                for k, i in enumerate(rows):
                    d = nodes.labels[i].get(key)
                    if d is not None and d in domains:
                        raw[k] += sign * wt.get("weight", 0) * domains[d]
        lo, hi = raw.min(initial=0.0), raw.max(initial=0.0)
        if hi - lo <= 0:
            return np.zeros(len(rows))
        scores: np.ndarray = np.floor((raw - lo) * MAX_NODE_SCORE / (hi - lo))
        return scores
