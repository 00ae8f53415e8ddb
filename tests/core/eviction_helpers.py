"""Scenario builders for the eviction-action tests (preempt, reclaim, shuffle).

They mirror the shape of Volcano's ``uthelper.TestCommonStruct`` cases (nodes, queues, pod groups
with pods, a tier list with explicit switches) and run them through ``muster simulate``'s loader
and the real scheduling core, so a case reads like its Volcano counterpart.
"""

from __future__ import annotations

import json
from typing import Any

from server.simulate import simulate_text

NS = "c1"


def node(name: str, cpu: str, memory: str, pods: int = 10, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": name, "allocatable": {"cpu": cpu, "memory": memory, "pods": pods}, "labels": labels or {}}


def queue(name: str, weight: int = 1, capability: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    q: dict[str, Any] = {"name": name, "weight": weight, **extra}
    if capability:
        q["capability"] = capability
    return q


def pod(
    name: str,
    cpu: str | None,
    memory: str | None,
    node: str | None = None,
    *,
    preemptable: bool = True,
    priority: int | None = 1,
    **extra: Any,
) -> dict[str, Any]:
    """A task; a node means Running there. Volcano gives a pod without priority the value 1."""
    request = {} if cpu is None else {"cpu": cpu, "memory": memory}
    t: dict[str, Any] = {"name": name, "request": request, "preemptable": preemptable, **extra}
    if priority is not None:
        t["priority"] = priority
    if node is not None:
        t.setdefault("status", "Running")
        t["node"] = node
    return t


def pg(
    name: str,
    queue: str,
    min_member: int,
    tasks: list[dict[str, Any]],
    *,
    phase: str = "Inqueue",
    priority_class: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    j: dict[str, Any] = {
        "name": name, "namespace": NS, "queue": queue, "minMember": min_member, "phase": phase, "tasks": tasks, **extra,
    }
    if priority_class:
        j["priorityClass"] = priority_class
    return j


def plugin(name: str, *switches: str, **arguments: Any) -> dict[str, Any]:
    p: dict[str, Any] = {"name": name, **{s: True for s in switches}}
    if arguments:
        p["arguments"] = arguments
    return p


PRIORITY_CLASSES = [{"name": "high-priority", "value": 100000}, {"name": "low-priority", "value": 10}]


def run(
    actions: list[str],
    tiers: list[list[dict[str, Any]]],
    nodes: list[dict[str, Any]],
    queues: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    *,
    priority_classes: list[dict[str, Any]] | None = None,
    action_arguments: dict[str, dict[str, Any]] | None = None,
    listed_only: bool = True,
) -> dict[str, Any]:
    """Run one cycle. ``listed_only``: only the switches written are on (Volcano's test tiers)."""
    config: dict[str, Any] = {
        "actions": actions,
        "tiers": [{"plugins": t} for t in tiers],
        "extension_points_not_listed": "disabled" if listed_only else "enabled",
    }
    if action_arguments:
        config["action_arguments"] = action_arguments
    scenario = {
        "config": config,
        "priorityClasses": PRIORITY_CLASSES if priority_classes is None else priority_classes,
        "nodes": nodes,
        "queues": queues,
        "jobs": jobs,
    }
    return simulate_text(json.dumps(scenario))


def evicted(result: dict[str, Any]) -> set[str]:
    return set(result["evictions"])


def uid(name: str) -> str:
    return f"{NS}/{name}"
