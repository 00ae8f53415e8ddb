"""Kubernetes label-selector, node-affinity and toleration semantics over plain dicts.

Affinity uses the Kubernetes JSON form (``nodeAffinity.requiredDuringSchedulingIgnoredDuring
Execution.nodeSelectorTerms`` ...), as in pod specs and scenario files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from server.model import Taint, Toleration

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def match_requirement(labels: Mapping[str, str], req: Mapping[str, Any]) -> bool:
    key = req.get("key", "")
    op = req.get("operator", "In")
    values = [str(v) for v in req.get("values") or []]
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or not values:
            return False
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def match_node_selector_term(
    labels: Mapping[str, str], term: Mapping[str, Any], node_name: str = ""
) -> bool:
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False  # Kubernetes: an empty term matches nothing
    if not all(match_requirement(labels, e) for e in exprs):
        return False
    return all(match_requirement({"metadata.name": node_name}, f) for f in fields)


def match_label_selector(labels: Mapping[str, str], selector: Mapping[str, Any] | None) -> bool:
    """metav1.LabelSelector; a nil selector matches nothing, an empty one everything."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    return all(match_requirement(labels, e) for e in selector.get("matchExpressions") or [])


def node_affinity_required_terms(affinity: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    na = (affinity or {}).get("nodeAffinity") or {}
    req = na.get(REQUIRED)
    if not req:
        return None
    return list(req.get("nodeSelectorTerms") or [])


def node_affinity_preferred(affinity: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(((affinity or {}).get("nodeAffinity") or {}).get(PREFERRED) or [])


def matches_node_selector_and_affinity(
    labels: Mapping[str, str],
    node_selector: Mapping[str, str],
    affinity: Mapping[str, Any],
    node_name: str = "",
) -> bool:
    """kube-scheduler NodeAffinity filter: nodeSelector AND (any required term)."""
    for k, v in node_selector.items():
        if labels.get(k) != v:
            return False
    terms = node_affinity_required_terms(affinity)
    if terms is None:
        return True
    return any(match_node_selector_term(labels, t, node_name) for t in terms)


def untolerated_taint(
    taints: list[Taint], tolerations: list[Toleration], effects: tuple[str, ...]
) -> Taint | None:
    for taint in taints:
        if taint.effect not in effects:
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return taint
    return None
