"""predicates: kube-scheduler filters (Volcano ``plugins/predicates``).

Registers predicate objects, vectorised over nodes:
- static: unschedulable / not-ready nodes; nodeSelector and required node affinity; taints with
  effect NoSchedule / NoExecute that the task does not tolerate;
- shape: the node's pod count (``pods`` allocatable) is not exhausted;
- task: required inter-pod affinity and anti-affinity (including existing pods' anti-affinity
  towards the incoming task), by topology domain.
Arguments (``predicate.NodeAffinityEnable``, ``predicate.TaintTolerationEnable``,
``predicate.PodAffinityEnable``, default true) switch the individual filters.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from server.model import TaskStatus
from server.plugins.base import Plugin
from server.session.evaluator import Predicate
from server.session.extension_points import PREDICATE, EventHandler
from server.session.info import TaskInfo
from server.session.k8s import (
    REQUIRED,
    match_label_selector,
    matches_node_selector_and_affinity,
    untolerated_taint,
)
from server.session.session import Session

NODE_UNSCHEDULABLE = "node(s) were unschedulable"
NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
POD_NUMBER = "node(s) pod number exceeded"
POD_AFFINITY = "node(s) didn't match pod affinity rules"
POD_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"


def _terms(affinity: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return list(((affinity or {}).get(kind) or {}).get(REQUIRED) or [])


class PredicatesPlugin(Plugin):
    name = "predicates"
    ARGUMENTS = {
        "predicate.NodeAffinityEnable": True,
        "predicate.NodePortsEnable": True,
        "predicate.TaintTolerationEnable": True,
        "predicate.PodAffinityEnable": True,
        "predicate.NodeVolumeLimitsEnable": True,
        "predicate.VolumeZoneEnable": True,
        "predicate.PodTopologySpreadEnable": True,
        "predicate.CacheEnable": True,
        "predicate.ProportionalEnable": False,
        "predicate.GPUSharingEnable": False,
        "predicate.GPUNumberEnable": False,
        "predicate.resources*": None,
    }

    def on_session_open(self, ssn: Session) -> None:
        nodes = ssn.nodes
        names = nodes.names
        tainted_rows = np.array(
            [
                i
                for i, ts in enumerate(nodes.taints)
                if any(t.effect in ("NoSchedule", "NoExecute") for t in ts)
            ],
            dtype=np.int64,
        )
        preds: list[Predicate] = [
            Predicate(
                "static", lambda task, rows: nodes.schedulable[rows], reason=NODE_UNSCHEDULABLE
            ),
        ]

        if self.arg_bool("predicate.NodeAffinityEnable", True):

            def affinity_ok(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
                spec = task.spec
                if not spec.node_selector and not (spec.affinity or {}).get("nodeAffinity"):
                    return np.ones(len(rows), dtype=bool)
                return np.fromiter(
                    (
                        matches_node_selector_and_affinity(
                            nodes.labels[i], spec.node_selector, spec.affinity, names[i]
                        )
                        for i in rows
                    ),
                    dtype=bool,
                    count=len(rows),
                )

            preds.append(Predicate("static", affinity_ok, reason=NODE_AFFINITY))

        if self.arg_bool("predicate.TaintTolerationEnable", True):

            def taint_ok(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
                ok = np.ones(len(rows), dtype=bool)
                if not len(tainted_rows):
                    return ok
                hit = np.isin(rows, tainted_rows)
                for k in np.nonzero(hit)[0]:
                    ok[k] = (
                        untolerated_taint(
                            nodes.taints[rows[k]],
                            task.spec.tolerations,
                            ("NoSchedule", "NoExecute"),
                        )
                        is None
                    )
                return ok

            def taint_reasons(task: TaskInfo, rows: np.ndarray) -> list[str]:
                out = []
                for i in rows:
                    t = untolerated_taint(
                        nodes.taints[i], task.spec.tolerations, ("NoSchedule", "NoExecute")
                    )
                    out.append(
                        f"node(s) had untolerated taint {{{t.key}: {t.value}}}"
                        if t
                        else "node(s) had untolerated taint"
                    )
                return out

            preds.append(Predicate("static", taint_ok, reasons=taint_reasons))

        # Volcano's predicates plugin drops a pod from its node view when the session evicts it
        # (deallocate event) and puts it back on unevict, so pod count and pod (anti-)affinity no
        # longer see a victim: that is what lets preemption resolve them.
        evicted_per_row = np.zeros(len(nodes), dtype=np.int64)
        # Evicted task -> the row it was evicted from (a victim placed elsewhere leaves from there).
        self.evicted: dict[str, int] = {}

        def on_allocate(task: TaskInfo) -> None:
            if not self.evicted:  # every placement of a cycle that evicts nothing
                return
            row = self.evicted.pop(task.uid, None)
            if row is not None:
                evicted_per_row[row] -= 1

        def on_deallocate(task: TaskInfo) -> None:
            if (
                task.status == TaskStatus.RELEASING
                and task.node is not None
                and task.uid not in self.evicted
            ):
                row = nodes.index[task.node]
                self.evicted[task.uid] = row
                evicted_per_row[row] += 1

        ssn.add_event_handler(EventHandler(on_allocate, on_deallocate))
        task_count, max_tasks = nodes.task_count, nodes.max_tasks
        evicted = self.evicted

        # With no evicted task (most cycles, all of allocate's) every row's count is zero: not
        # read. (``take``: what a fancy index gives, at less cost.)
        def pods_fit(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            count = task_count.take(rows)
            if evicted:
                count = count - evicted_per_row.take(rows)
            fit: np.ndarray = count < max_tasks.take(rows)
            return fit

        def pods_fit_row(task: TaskInfo, i: int) -> bool:
            count = task_count.item(i)
            if evicted:
                count -= evicted_per_row.item(i)
            fit: bool = count < max_tasks.item(i)
            return fit

        preds.append(
            Predicate("shape", pods_fit, reason=POD_NUMBER, row=pods_fit_row, counts="pods")
        )

        if self.arg_bool("predicate.PodAffinityEnable", True):
            preds.extend(self._pod_affinity(ssn))
        ssn.register(PREDICATE, self.name, preds)

    def _pod_affinity(self, ssn: Session) -> list[Predicate]:
        nodes = ssn.nodes

        def domain(i: int, key: str) -> str | None:
            value = nodes.labels[i].get(key)
            if value is None and key == "kubernetes.io/hostname":
                return nodes.names[i]
            return value

        def matching_domains(term: dict[str, Any], namespace: str, exclude: str) -> set[str]:
            key = term.get("topologyKey", "")
            namespaces = set(term.get("namespaces") or [namespace])
            found: set[str] = set()
            for i, tasks in enumerate(nodes.tasks):
                for t in tasks.values():
                    if t.uid == exclude or t.namespace not in namespaces or t.uid in self.evicted:
                        continue
                    if match_label_selector(t.spec.labels, term.get("labelSelector")):
                        d = domain(i, key)
                        if d is not None:
                            found.add(d)
                        break
            return found

        def affinity_check(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            ok = np.ones(len(rows), dtype=bool)
            for term in _terms(task.spec.affinity, "podAffinity"):
                key = term.get("topologyKey", "")
                domains = matching_domains(term, task.namespace, task.uid)
                if not domains:
                    # Kubernetes: the first pod of a group may match its own affinity term.
                    if task.namespace in set(
                        term.get("namespaces") or [task.namespace]
                    ) and match_label_selector(task.spec.labels, term.get("labelSelector")):
                        continue
                    return np.zeros(len(rows), dtype=bool)
                ok &= np.fromiter(
                    (domain(i, key) in domains for i in rows), dtype=bool, count=len(rows)
                )
            return ok

        def anti_affinity_check(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            ok = np.ones(len(rows), dtype=bool)
            for term in _terms(task.spec.affinity, "podAntiAffinity"):
                key = term.get("topologyKey", "")
                domains = matching_domains(term, task.namespace, task.uid)
                if domains:
                    ok &= np.fromiter(
                        (domain(i, key) not in domains for i in rows), dtype=bool, count=len(rows)
                    )
            # Symmetry: an existing pod's anti-affinity that matches the incoming task.
            for i, tasks in enumerate(nodes.tasks):
                for t in tasks.values():
                    if t.uid in self.evicted:
                        continue
                    for term in _terms(t.spec.affinity, "podAntiAffinity"):
                        namespaces = set(term.get("namespaces") or [t.namespace])
                        if task.namespace in namespaces and match_label_selector(
                            task.spec.labels, term.get("labelSelector")
                        ):
                            key = term.get("topologyKey", "")
                            d = domain(i, key)
                            ok &= np.fromiter(
                                (domain(r, key) != d for r in rows), dtype=bool, count=len(rows)
                            )
            return ok

        def any_anti() -> bool:  # evaluated lazily, per call
            return any(
                _terms(t.spec.affinity, "podAntiAffinity")
                for tasks in nodes.tasks
                for t in tasks.values()
            )

        def pod_affinity(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            if not _terms(task.spec.affinity, "podAffinity"):
                return np.ones(len(rows), dtype=bool)
            return affinity_check(task, rows)

        def pod_anti_affinity(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            if not _terms(task.spec.affinity, "podAntiAffinity") and not any_anti():
                return np.ones(len(rows), dtype=bool)
            return anti_affinity_check(task, rows)

        uses_pod_affinity = any(
            t.spec.affinity.get("podAffinity") or t.spec.affinity.get("podAntiAffinity")
            for t in ssn.constrained_tasks()
        )
        if not uses_pod_affinity:
            return []
        return [
            Predicate("task", pod_affinity, reason=POD_AFFINITY),
            Predicate("task", pod_anti_affinity, reason=POD_ANTI_AFFINITY),
        ]
