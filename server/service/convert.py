"""Proto (API) <-> model (scheduling core) conversion.

Inputs are assumed validated (``server.service.validate``); these functions do not raise on bad input.
What arrives now comes with the quantities its validation parsed (``valid_job_to_model``,
``valid_queue_to_model``, ``node_to_model``'s allocatable): each quantity is parsed once. A job read
back from the store was validated by the version that stored it: ``checked_job_to_model`` parses
it again, says what today's bounds refuse in it (the server quarantines such a job) and builds its
model with the refused quantities held to the bound.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from muster.gang import gang_minimum
from muster.quantity import (
    MAX_CANONICAL,
    QuantityError,
    QuantityTooLarge,
    format_resources,
    parse_resources,
)
from muster.v1 import muster_pb2 as pb
from server import model
from server.service.validate import ValidJob, ValidQueue

_QUEUE_STATE_NAMES = {
    pb.QUEUE_STATE_UNSPECIFIED: "Open",
    pb.QUEUE_STATE_OPEN: "Open",
    pb.QUEUE_STATE_CLOSING: "Closing",
    pb.QUEUE_STATE_CLOSED: "Closed",
}


def task_uid(job_id: str, role: str, index: int) -> str:
    return f"{job_id}/{role}-{index}"


def resource_list(resources: dict[str, float]) -> pb.ResourceList:
    return pb.ResourceList(quantities=format_resources(resources))


def timestamp(seconds: float | None) -> Timestamp | None:
    if not seconds:
        return None
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


# --- affinity: proto -> Kubernetes dict form ---------------------------------------------------


def _requirements(reqs: Any) -> list[dict[str, Any]]:
    return [{"key": r.key, "operator": r.operator, "values": list(r.values)} for r in reqs]


def _node_selector_term(term: pb.NodeSelectorTerm) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if term.match_expressions:
        out["matchExpressions"] = _requirements(term.match_expressions)
    if term.match_fields:
        out["matchFields"] = _requirements(term.match_fields)
    return out


def _pod_affinity_term(term: pb.PodAffinityTerm) -> dict[str, Any]:
    selector: dict[str, Any] = {}
    if term.label_selector.match_labels:
        selector["matchLabels"] = dict(term.label_selector.match_labels)
    if term.label_selector.match_expressions:
        selector["matchExpressions"] = _requirements(term.label_selector.match_expressions)
    out: dict[str, Any] = {"labelSelector": selector, "topologyKey": term.topology_key}
    if term.namespaces:
        out["namespaces"] = list(term.namespaces)
    return out


def _pod_affinity(pa: pb.PodAffinity) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if pa.required:
        out["requiredDuringSchedulingIgnoredDuringExecution"] = [
            _pod_affinity_term(t) for t in pa.required
        ]
    if pa.preferred:
        out["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": w.weight, "podAffinityTerm": _pod_affinity_term(w.term)}
            for w in pa.preferred
        ]
    return out


def affinity_dict(aff: pb.Affinity) -> dict[str, Any]:
    """pb.Affinity -> {nodeAffinity: ..., podAffinity: ..., podAntiAffinity: ...} (absent parts omitted)."""
    out: dict[str, Any] = {}
    node: dict[str, Any] = {}
    if aff.node_affinity.required:
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [_node_selector_term(t) for t in aff.node_affinity.required]
        }
    if aff.node_affinity.preferred:
        node["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": p.weight, "preference": _node_selector_term(p.preference)}
            for p in aff.node_affinity.preferred
        ]
    if node:
        out["nodeAffinity"] = node
    if pod := _pod_affinity(aff.pod_affinity):
        out["podAffinity"] = pod
    if anti := _pod_affinity(aff.pod_anti_affinity):
        out["podAntiAffinity"] = anti
    return out


# --- jobs ----------------------------------------------------------------------------------------


def _resources(
    path: str, rl: pb.ResourceList, problems: list[str], *, unlimited: bool = False
) -> dict[str, float]:
    """``rl`` in canonical units; what the bounds refuse (a spec stored by an earlier version) is
    noted in ``problems`` (one line naming the field) and held to the bound (too large) or 0.
    A new dict each call; parsed once per distinct list (``_parsed``)."""
    parsed, problem = _parsed(tuple(rl.quantities.items()), unlimited)
    if problem:
        problems.append(f"{path}.{problem}")
    return dict(parsed)


# Jobs repeat their requests (every replica, and most jobs of a queue): a restart that rebuilds a
# million jobs parses a few distinct lists. Keyed by the list's items as the map yields them.
@functools.lru_cache(maxsize=4096)
def _parsed(items: tuple[tuple[str, str], ...], unlimited: bool) -> tuple[dict[str, float], str]:
    """The list's quantities in canonical units (callers copy it) and what the bounds refuse in
    it ("" : nothing; the first refusal, without the field's path)."""
    quantities = dict(items)
    try:
        return parse_resources(quantities, allow_unlimited=unlimited), ""
    except QuantityError as exc:
        problem = str(exc)
    out: dict[str, float] = {}
    for name, raw in quantities.items():
        try:
            out.update(parse_resources({name: raw}, allow_unlimited=unlimited))
        except QuantityTooLarge:
            out[name] = MAX_CANONICAL
        except QuantityError:
            out[name] = 0.0
    return out, problem


def parsed_requests(spec: pb.JobSpec) -> tuple[list[dict[str, float]], dict[str, float], str]:
    """Per task group its request, the job's minResources, in canonical units (new dicts), and
    what today's bounds refuse in them ("" : nothing): what ``checked_job_to_model`` reads."""
    problems: list[str] = []
    requests = [
        _resources(f"job.task_groups[{g}].request", tg.request, problems)
        for g, tg in enumerate(spec.task_groups)
    ]
    min_resources = _resources("job.min_resources", spec.min_resources, problems)
    return requests, min_resources, "; ".join(problems)


def job_to_model(spec: pb.JobSpec, creation_index: int) -> model.JobSpec:
    """A normalized pb.JobSpec -> model.JobSpec with one TaskSpec per replica (status Pending)."""
    return checked_job_to_model(spec, creation_index)[0]


def valid_job_to_model(job: ValidJob, creation_index: int) -> model.JobSpec:
    """``job_to_model`` of a job validated now, from the quantities its validation parsed."""
    return _job_model(job.spec, creation_index, job.requests, job.min_resources)


def checked_job_to_model(spec: pb.JobSpec, creation_index: int) -> tuple[model.JobSpec, str]:
    """``job_to_model``, and what today's bounds refuse in ``spec`` ("" when nothing: always so for
    a spec validated now), e.g. ``job.task_groups[0].request.cpu: '1e308' is more than ...``."""
    requests, min_resources, refusal = parsed_requests(spec)
    return _job_model(spec, creation_index, requests, min_resources), refusal


def _job_model(
    spec: pb.JobSpec,
    creation_index: int,
    requests: Sequence[dict[str, float]],
    min_resources: dict[str, float],
) -> model.JobSpec:
    """The model of ``spec``, its quantities already parsed (``requests``: per task group)."""
    tasks: list[model.TaskSpec] = []
    for tg, request in zip(spec.task_groups, requests, strict=True):
        tolerations = [
            model.Toleration(
                key=t.key, operator=t.operator or "Equal", value=t.value, effect=t.effect
            )
            for t in tg.tolerations
        ]
        affinity = affinity_dict(tg.affinity)
        # Read each proto map once per group (a map read costs ~30x a dict copy); every task gets
        # its own copies.
        labels, annotations, node_selector = (
            dict(tg.labels),
            dict(tg.annotations),
            dict(tg.node_selector),
        )
        priority = tg.priority if tg.HasField("priority") else spec.priority
        if tg.HasField("preemptable"):
            preemptable = tg.preemptable
        elif spec.HasField("preemptible"):
            preemptable = spec.preemptible
        else:
            preemptable = True
        for index in range(tg.replicas):
            tasks.append(
                model.TaskSpec(
                    uid=task_uid(spec.id, tg.role, index),
                    name=f"{spec.name}-{tg.role}-{index}",
                    namespace=spec.namespace,
                    job=spec.id,
                    request=dict(request),
                    role=tg.role,
                    priority=priority,
                    preemptable=preemptable,
                    labels=dict(labels),
                    annotations=dict(annotations),
                    node_selector=dict(node_selector),
                    tolerations=list(tolerations),
                    affinity=affinity,
                    sub_group=tg.sub_group or None,
                    creation_index=creation_index,
                    gpu_fraction=tg.gpu_fraction,
                )
            )
    network_topology: dict[str, Any] = {}
    if spec.network_topology.mode:
        network_topology = {
            "mode": spec.network_topology.mode,
            "highestTierAllowed": spec.network_topology.highest_tier_allowed,
        }
    return model.JobSpec(
        uid=spec.id,
        name=spec.name,
        namespace=spec.namespace,
        queue=spec.queue,
        tasks=tasks,
        min_member=gang_minimum(spec.min_member, len(tasks)),  # 0: every task
        min_task_member=dict(spec.min_task_member),
        min_resources=dict(min_resources) or None,
        priority=spec.priority,
        priority_class=spec.priority_class,
        preemptible=spec.preemptible if spec.HasField("preemptible") else None,
        sub_groups=[model.SubGroupSpec(sg.name, sg.min_member) for sg in spec.sub_groups],
        network_topology=network_topology,
        annotations=dict(spec.annotations),
        creation_index=creation_index,
        tyjob=tyjob_to_model(spec.tyjob) if spec.HasField("tyjob") else None,
        time_limit_seconds=float(spec.time_limit_seconds),
    )


def tyjob_to_model(ty: pb.TYJob, leader_restarts: int = 0) -> model.TYJobSpec:
    """A normalized pb.TYJob (defaults written in by validation) -> model.TYJobSpec."""
    return model.TYJobSpec(
        leader_role=ty.leader_role,
        min_workers=ty.min_workers_num,
        restart_limit=ty.restart_limit,
        clean_pod_policy=ty.clean_pod_policy,
        job_queue_policy=ty.scheduler_policy.job_queue_policy,
        basic_policy=ty.scheduler_policy.basic_policy,
        leader_restarts=leader_restarts,
    )


# --- nodes and queues ----------------------------------------------------------------------------


def node_to_model(node: pb.Node, backend: str, allocatable: dict[str, float]) -> model.NodeSpec:
    """A validated pb.Node -> model.NodeSpec; ``allocatable`` as ``validate.check_node`` parsed it."""
    return model.NodeSpec(
        name=node.name,
        allocatable=allocatable,
        labels=dict(node.labels),
        taints=[model.Taint(t.key, t.value, t.effect) for t in node.taints],
        unschedulable=node.unschedulable,
        ready=not node.not_ready,
        backend=backend,
        devices=[
            {
                "id": d.id,
                "type": d.type,
                "healthy": d.healthy,
                "group": d.group,
                "attributes": dict(d.attributes),
            }
            for d in node.devices
        ],
    )


def queue_to_model(queue: pb.Queue) -> model.QueueSpec:
    """A normalized pb.Queue read back from the store -> model.QueueSpec ("-1" guarantee, deserved
    or capability = unlimited, i.e. +inf). A queue stored by an earlier version with a quantity beyond today's
    bound gets the bound instead."""
    ignored: list[str] = []
    return _queue_model(
        queue,
        _resources("queue.guarantee", queue.guarantee, ignored, unlimited=True),
        _resources("queue.deserved", queue.deserved, ignored, unlimited=True),
        _resources("queue.capability", queue.capability, ignored, unlimited=True),
    )


def valid_queue_to_model(queue: ValidQueue) -> model.QueueSpec:
    """``queue_to_model`` of a queue validated now, from the quantities its validation parsed."""
    return _queue_model(queue.spec, queue.guarantee, queue.deserved, queue.capability)


def _queue_model(
    queue: pb.Queue,
    guarantee: dict[str, float],
    deserved: dict[str, float],
    capability: dict[str, float],
) -> model.QueueSpec:
    return model.QueueSpec(
        name=queue.name,
        parent=queue.parent or None,
        weight=queue.weight or 1,
        guarantee=guarantee,
        deserved=deserved,
        capability=capability,
        priority=queue.priority,
        reclaimable=queue.reclaimable if queue.HasField("reclaimable") else True,
        state=_QUEUE_STATE_NAMES.get(queue.state, "Open"),
        annotations=dict(queue.annotations),
    )
