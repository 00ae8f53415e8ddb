"""Small builders for core tests: snapshots and sessions without YAML."""

from __future__ import annotations

from muster.quantity import parse_resources
from server.config import load_config
from server.model import (
    ClusterSnapshot,
    JobSpec,
    NodeSpec,
    PodGroupPhase,
    QueueSpec,
    TaskSpec,
    TaskStatus,
)
from server.session.session import Session


def node(name: str, cpu: str = "4", memory: str = "8Gi", **extra: str) -> NodeSpec:
    return NodeSpec(name, parse_resources({"cpu": cpu, "memory": memory, **extra}))


def job(
    name: str,
    n: int,
    cpu: str = "1",
    *,
    queue: str = "default",
    min_member: int | None = None,
    priority: int = 0,
    phase: PodGroupPhase = PodGroupPhase.INQUEUE,
    status: TaskStatus = TaskStatus.PENDING,
    nodes: list[str] | None = None,
    index: int = 0,
) -> JobSpec:
    uid = f"ns/{name}"
    tasks = [
        TaskSpec(
            uid=f"ns/{name}-{i}", name=f"{name}-{i}", namespace="ns", job=uid,
            request=parse_resources({"cpu": cpu, "memory": "1Gi"}), status=status,
            node=nodes[i] if nodes else None, priority=priority, creation_index=index * 100 + i,
        )
        for i in range(n)
    ]
    return JobSpec(uid, name, "ns", queue, tasks, min_member=n if min_member is None else min_member,
                   priority=priority, phase=phase, creation_index=index)


def snapshot(nodes: list[NodeSpec], jobs: list[JobSpec], queues: list[QueueSpec] | None = None) -> ClusterSnapshot:
    return ClusterSnapshot(nodes=nodes, queues=queues or [QueueSpec("default")], jobs=jobs)


def session(snap: ClusterSnapshot, config_yaml: str) -> Session:
    return Session(snap, load_config(config_yaml), 1)
