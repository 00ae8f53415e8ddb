"""A cycle's view of the state: ``capture`` on the event loop, ``Capture.materialize`` elsewhere.

``capture(state)`` is cheap: it takes the immutable specs (node, queue and job templates are
replaced, never mutated) and each active job's task statuses and nodes. ``materialize`` deep-copies
that into a ``model.ClusterSnapshot`` (in a worker thread), so the scheduling core may change its
snapshot freely. ``server.apply`` later compares a cycle's result against the same capture and
drops whatever the world changed in between.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from server import model
from server.model import OCCUPYING, PodGroupPhase, TaskStatus
from server.records import JobRecord
from server.state import ClusterState


@dataclass
class Capture:
    """What a cycle sees, captured on the event loop; ``materialize`` deep-copies it (in a thread)."""

    cycle_id: int
    nodes: list[model.NodeSpec]
    queues: list[model.QueueSpec]
    # (record, phase, per task (status, node, device ids), Leader restarts) at capture time
    jobs: list[tuple[JobRecord, PodGroupPhase, list[tuple[TaskStatus, str | None, tuple[str, ...]]], int]]
    foreign: list[model.TaskSpec]
    priority_classes: dict[str, model.PriorityClass]

    def materialize(self) -> model.ClusterSnapshot:
        jobs = []
        for rec, phase, states, restarts in self.jobs:
            tmpl = rec.template
            tasks = [
                _copy_task(t, status, node, devices)
                for t, (status, node, devices) in zip(tmpl.tasks, states, strict=True)
            ]
            jobs.append(
                model.JobSpec(
                    uid=tmpl.uid,
                    name=tmpl.name,
                    namespace=tmpl.namespace,
                    queue=tmpl.queue,
                    tasks=tasks,
                    min_member=tmpl.min_member,
                    min_task_member=dict(tmpl.min_task_member),
                    min_resources=dict(tmpl.min_resources) if tmpl.min_resources else None,
                    priority=tmpl.priority,
                    priority_class=tmpl.priority_class,
                    preemptible=tmpl.preemptible,
                    phase=phase,
                    sub_groups=[model.SubGroupSpec(s.name, s.min_member) for s in tmpl.sub_groups],
                    network_topology=dict(tmpl.network_topology),
                    annotations=dict(tmpl.annotations),
                    creation_index=tmpl.creation_index,
                    created_at=rec.status.submit_time or None,  # sla's waiting time
                    tyjob=replace(tmpl.tyjob, leader_restarts=restarts) if tmpl.tyjob is not None else None,
                )
            )
        return model.ClusterSnapshot(
            nodes=[_copy_node(n) for n in self.nodes],
            queues=[_copy_queue(q) for q in self.queues],
            jobs=jobs,
            foreign_tasks=[_copy_task(t, t.status, t.node, tuple(t.devices)) for t in self.foreign],
            priority_classes={k: model.PriorityClass(v.name, v.value, v.preemption_policy, v.global_default)
                              for k, v in self.priority_classes.items()},
        )


def _copy_task(t: model.TaskSpec, status: TaskStatus, node: str | None, devices: tuple[str, ...]) -> model.TaskSpec:
    return model.TaskSpec(
        uid=t.uid,
        name=t.name,
        namespace=t.namespace,
        job=t.job,
        request=dict(t.request),
        role=t.role,
        status=status,
        node=node,
        priority=t.priority,
        preemptable=t.preemptable,
        preemption_policy=t.preemption_policy,
        labels=dict(t.labels),
        annotations=dict(t.annotations),
        node_selector=dict(t.node_selector),
        tolerations=[model.Toleration(x.key, x.operator, x.value, x.effect) for x in t.tolerations],
        affinity=_deep(t.affinity) if t.affinity else {},
        sub_group=t.sub_group,
        # A fractional task's stored device is the shared GPU it sits on: its group in the session.
        gpu_groups=list(devices) if t.gpu_fraction else list(t.gpu_groups),
        creation_index=t.creation_index,
        devices=[] if t.gpu_fraction else list(devices),
        gpu_fraction=t.gpu_fraction,
    )


def _copy_node(n: model.NodeSpec) -> model.NodeSpec:
    return model.NodeSpec(
        name=n.name,
        allocatable=dict(n.allocatable),
        labels=dict(n.labels),
        taints=[model.Taint(t.key, t.value, t.effect) for t in n.taints],
        unschedulable=n.unschedulable,
        ready=n.ready,
        backend=n.backend,
        devices=_deep(n.devices) if n.devices else [],
    )


def _copy_queue(q: model.QueueSpec) -> model.QueueSpec:
    return model.QueueSpec(
        name=q.name,
        parent=q.parent,
        weight=q.weight,
        guarantee=dict(q.guarantee),
        deserved=dict(q.deserved),
        capability=dict(q.capability),
        priority=q.priority,
        reclaimable=q.reclaimable,
        state=q.state,
        annotations=dict(q.annotations),
    )


def _deep(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep(v) for v in value]
    return value


def capture(state: ClusterState) -> Capture:
    """What the next cycle works on, taken now (cheap: references to immutable specs and each
    task's status and node); the cycle id is assigned here."""
    cycle_id = state.next_cycle_id
    state.next_cycle_id += 1
    state.set_meta("next_cycle_id", str(state.next_cycle_id))
    jobs = []
    # Tasks of jobs that are over but still hold a node (being released, or kept running by a
    # TYJob's cleanPodPolicy None) hold its capacity like foreign work.
    leftovers: list[model.TaskSpec] = []
    for rec in state.jobs.values():
        if rec.active:
            jobs.append((rec, rec.status.sched_phase, [(t.status, t.node, tuple(t.devices)) for t in rec.tasks],
                         rec.status.leader_restarts))
        elif any(t.node and t.status in OCCUPYING for t in rec.tasks):
            leftovers += [
                replace(spec, job="", status=t.status, node=t.node, devices=list(t.devices))
                for spec, t in zip(rec.template.tasks, rec.tasks, strict=True)
                if t.node and t.status in OCCUPYING
            ]
    return Capture(
        cycle_id=cycle_id,
        nodes=[e.spec for e in state.nodes.values()],
        queues=[e.spec for e in state.queues.values()],
        jobs=jobs,
        foreign=[f.spec for f in state.foreign.values()] + leftovers,
        priority_classes=dict(state.priority_classes),
    )
