"""Kubernetes objects (plain JSON dicts, as the API server sends them) -> Muster API messages.

Pure functions, no I/O: Nodes -> ``pb.Node``, Pods -> requests / ``pb.BackendTask`` / task groups,
Volcano, coscheduling and KAI PodGroups -> gang parameters of a ``pb.JobSpec``, Volcano and KAI
Queues -> ``pb.Queue``, PriorityClasses -> priority values.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from muster.devices import NVIDIA_GPU, chip_number, is_device_resource
from muster.gang import podgroup_minimum
from muster.quantity import QuantityError, format_resources, parse_resources
from muster.timelimit import MAX_TIME_LIMIT, TIME_LIMIT_REASON, time_limit_message
from muster.v1 import muster_pb2 as pb

Obj = dict[str, Any]

VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_TASK_SPEC = "volcano.sh/task-spec"
VOLCANO_PODGROUP = "scheduling.volcano.sh/v1beta1"
COSCHEDULING_PODGROUP = "scheduling.x-k8s.io/v1alpha1"
# KAI Scheduler (NVIDIA): PodGroups in scheduling.run.ai/v2alpha2, Queues (cluster scoped) in
# scheduling.run.ai/v2, and the pod conventions of KAI's pod grouper, binder and scheduler.
KAI_PODGROUP = "scheduling.run.ai/v2alpha2"
KAI_QUEUE_API = ("scheduling.run.ai", "v2")
KAI_GROUP_ANNOTATION = "pod-group-name"
KAI_QUEUE_LABEL = "kai.scheduler/queue"
KAI_LEGACY_QUEUE_LABEL = "runai/queue"  # before KAI v0.6
KAI_SUBGROUP_LABEL = "kai.scheduler/subgroup-name"
KAI_PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"
KAI_TOPOLOGY = "kai.scheduler/topology"
KAI_TOPOLOGY_REQUIRED = (
    "kai.scheduler/topology-required-placement"  # the preferred placement: ignored
)
GPU_FRACTION_ANNOTATION = "gpu-fraction"
GPU_MEMORY_ANNOTATION = "gpu-memory"
GPU_FRACTION_DEVICES_ANNOTATION = "gpu-fraction-num-devices"
GPU_GROUP_LABEL = "runai-gpu-group"  # the shared GPU a fractional pod was bound to
# Pod names of a task group, in task-index order: lets an adapter restart recover the mapping
# task id <-> pod from the server (GetJob) instead of guessing it.
PODS_ANNOTATION = "muster.dev/pods"
DEFAULT_ROLE = "task"
TERMINAL_PHASES = ("Succeeded", "Failed")
# A pod's status.reason once the kubelet ended it at its spec.activeDeadlineSeconds.
DEADLINE_EXCEEDED = "DeadlineExceeded"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def key_of(obj: Obj) -> str:
    """Cache key: "namespace/name" (or "name" for cluster-scoped objects)."""
    m = meta(obj)
    return f"{m['namespace']}/{m['name']}" if m.get("namespace") else str(m.get("name", ""))


# ------------------------------------------------------------------------------------------
# Nodes
# ------------------------------------------------------------------------------------------


def node_ready(node: Obj) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            ready: bool = cond.get("status") == "True"
            return ready
    return False  # no Ready condition yet: the kubelet has not reported


# Ascend's device plugin lists a node's healthy chips in an annotation named after the resource
# (``huawei.com/Ascend910: Ascend910-0,Ascend910-1,...``) and its broken ones in ``<resource>-Unhealthy``;
# a pod's chips are written on it in the same annotation before it is bound.
ASCEND_PREFIX = "huawei.com/Ascend"
UNHEALTHY_SUFFIX = "-Unhealthy"


def _chip_list(value: Any) -> list[str]:
    return [c.strip() for c in str(value or "").split(",") if c.strip()]


def node_devices(annotations: dict[str, Any]) -> list[pb.Device]:
    """The Ascend chips of a node from its device-plugin annotations (HCCS ring = chip number // 4)."""
    out: list[pb.Device] = []
    for key, value in sorted(annotations.items()):
        if (
            not key.startswith(ASCEND_PREFIX)
            or key.endswith(UNHEALTHY_SUFFIX)
            or not is_device_resource(key)
        ):
            continue
        healthy = [(c, True) for c in _chip_list(value)]
        broken = [(c, False) for c in _chip_list(annotations.get(key + UNHEALTHY_SUFFIX))]
        seen: set[str] = set()
        for chip, ok in sorted(healthy + broken, key=lambda x: _chip_sort(x[0])):
            if chip in seen:
                continue
            seen.add(chip)
            number = chip_number(chip)
            out.append(
                pb.Device(
                    id=chip,
                    type=key,
                    group=str(number // 4) if number is not None else "",
                    healthy=ok,
                )
            )
    return out


def _chip_sort(chip: str) -> int:
    number = chip_number(chip)
    return -1 if number is None else number


def pod_device_annotations(devices: list[str], request: dict[str, str]) -> dict[str, str]:
    """What a bind with device ids writes on the pod: the Ascend chips in the annotation Ascend's
    device plugin reads (``huawei.com/Ascend910: Ascend910-0,Ascend910-1``)."""
    out: dict[str, str] = {}
    for resource in request:
        if resource.startswith(ASCEND_PREFIX) and is_device_resource(resource):
            prefix = resource.split("/", 1)[1] + "-"
            chips = [d for d in devices if d.startswith(prefix)]
            if chips:
                out[resource] = ",".join(chips)
    return out


def node_to_pb(node: Obj) -> pb.Node:
    m, spec, status = meta(node), node.get("spec") or {}, node.get("status") or {}
    allocatable = {
        k: str(v) for k, v in (status.get("allocatable") or {}).items() if _valid_quantity(k, v)
    }
    taints = [
        pb.Taint(key=t.get("key", ""), value=t.get("value", "") or "", effect=t.get("effect", ""))
        for t in spec.get("taints") or []
        if t.get("key") and t.get("effect") in TAINT_EFFECTS
    ]
    return pb.Node(
        name=m["name"],
        allocatable=pb.ResourceList(quantities=allocatable),
        labels={k: str(v) for k, v in (m.get("labels") or {}).items()},
        taints=taints,
        unschedulable=bool(spec.get("unschedulable")),
        not_ready=not node_ready(node),
        devices=node_devices(m.get("annotations") or {}),
    )


def _valid_quantity(name: str, value: Any) -> bool:
    try:
        parse_resources({name: value})
    except QuantityError:
        return False
    return True


# ------------------------------------------------------------------------------------------
# Pods
# ------------------------------------------------------------------------------------------


def pod_request(pod: Obj) -> dict[str, str]:
    """Effective request as kube-scheduler computes it: max(sum(containers), max(initContainers))
    + overhead, plus one ``pods`` slot. Malformed quantities are skipped (the API server would
    have refused them)."""
    spec = pod.get("spec") or {}
    total: dict[str, float] = {}
    for c in spec.get("containers") or []:
        for name, value in _requests(c).items():
            total[name] = total.get(name, 0.0) + value
    for c in spec.get("initContainers") or []:
        for name, value in _requests(c).items():
            total[name] = max(total.get(name, 0.0), value)
    for name, value in _parse(spec.get("overhead") or {}).items():
        total[name] = total.get(name, 0.0) + value
    total["pods"] = 1
    return format_resources(total)


def _requests(container: Obj) -> dict[str, float]:
    res = container.get("resources") or {}
    # A container with limits but no requests requests its limits (API server defaulting).
    merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    return _parse(merged)


def _parse(quantities: Obj) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in quantities.items():
        try:
            out.update(parse_resources({name: value}))
        except QuantityError:
            continue
    return out


def pod_group_ref(pod: Obj) -> tuple[str, str] | None:
    """(podgroup apiVersion, "namespace/name") of the gang a pod joins, or None (a job of one)."""
    m = meta(pod)
    ns = m.get("namespace", "default")
    annotations = m.get("annotations") or {}
    name = annotations.get(VOLCANO_GROUP_ANNOTATION)
    if name:
        return VOLCANO_PODGROUP, f"{ns}/{name}"
    name = annotations.get(KAI_GROUP_ANNOTATION)
    if name:
        return KAI_PODGROUP, f"{ns}/{name}"
    name = (m.get("labels") or {}).get(COSCHEDULING_GROUP_LABEL)
    if name:
        return COSCHEDULING_PODGROUP, f"{ns}/{name}"
    return None


_ROLE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def pod_role(pod: Obj) -> str:
    m = meta(pod)
    raw = (m.get("annotations") or {}).get(VOLCANO_TASK_SPEC) or (m.get("labels") or {}).get(
        VOLCANO_TASK_SPEC
    )
    role = _ROLE_BAD.sub("-", raw or "").strip("-_.")
    return role or DEFAULT_ROLE


def pod_queue_label(pod: Obj) -> str:
    """The queue a KAI pod names in its labels (``kai.scheduler/queue``, or the older
    ``runai/queue``), or ""."""
    labels = meta(pod).get("labels") or {}
    return str(labels.get(KAI_QUEUE_LABEL) or labels.get(KAI_LEGACY_QUEUE_LABEL) or "")


def pod_sub_group(pod: Obj) -> str:
    """The KAI sub-group a pod belongs to (label ``kai.scheduler/subgroup-name``), or ""."""
    return str((meta(pod).get("labels") or {}).get(KAI_SUBGROUP_LABEL) or "")


def pod_gpu_fraction(pod: Obj) -> float:
    """The share of one GPU a pod asks through KAI's ``gpu-fraction`` annotation; 0 without one
    (or with a value :func:`pod_gpu_problem` refuses)."""
    raw = (meta(pod).get("annotations") or {}).get(GPU_FRACTION_ANNOTATION)
    if raw is None:
        return 0.0
    value = _fraction(str(raw))
    return value if 0 < value < 1 else 0.0


def _fraction(raw: str) -> float:
    """A ``gpu-fraction`` annotation's number; NaN when it is none (NaN is never in (0, 1))."""
    try:
        return float(raw)
    except ValueError:
        return float("nan")


def pod_gpu_group(pod: Obj) -> str:
    """The shared GPU a bound fractional pod sits on (label ``runai-gpu-group``), or ""."""
    return str((meta(pod).get("labels") or {}).get(GPU_GROUP_LABEL) or "")


def pod_gpu_problem(pod: Obj) -> str:
    """Why Muster cannot schedule the pod's KAI GPU-sharing request as asked ("" when it can).
    Checked like KAI's binder does: a fraction in (0, 1), not together with whole GPUs; GPU memory
    requests (``gpu-memory``) and fractions of several GPUs are not supported by Muster."""
    annotations = meta(pod).get("annotations") or {}
    name = key_of(pod)
    if GPU_MEMORY_ANNOTATION in annotations:
        return (
            f"pod {name}: annotation {GPU_MEMORY_ANNOTATION}={annotations[GPU_MEMORY_ANNOTATION]!s} asks GPU "
            f"memory, which Muster does not support; ask a share of a GPU with {GPU_FRACTION_ANNOTATION} instead"
        )
    if GPU_FRACTION_ANNOTATION not in annotations:
        return ""
    raw = str(annotations[GPU_FRACTION_ANNOTATION])
    if not 0 < _fraction(raw) < 1:  # NaN fails too
        return f"pod {name}: annotation {GPU_FRACTION_ANNOTATION}={raw!r} is not a share of one GPU (above 0, below 1)"
    containers = (pod.get("spec") or {}).get("containers") or []
    if any(
        NVIDIA_GPU in ((c.get("resources") or {}).get(kind) or {})
        for c in containers
        for kind in ("requests", "limits")
    ):
        return (
            f"pod {name}: annotation {GPU_FRACTION_ANNOTATION} and a whole {NVIDIA_GPU} request together; "
            "ask one or the other"
        )
    devices = str(annotations.get(GPU_FRACTION_DEVICES_ANNOTATION) or "1")
    if devices != "1":
        return (
            f"pod {name}: annotation {GPU_FRACTION_DEVICES_ANNOTATION}={devices} asks fractions of several GPUs; "
            "Muster shares one GPU per pod"
        )
    return ""


@dataclass(slots=True)
class KaiTopology:
    """KAI's topology constraint (PodGroup ``spec.topologyConstraint``, a sub-group's, or the top
    owner's ``kai.scheduler/topology*`` annotations). Its preferred level is only a preference,
    ignored, so not read."""

    topology: str = ""
    required: str = ""

    @classmethod
    def from_constraint(cls, constraint: Any) -> KaiTopology:
        """From a PodGroup's or sub-group's ``topologyConstraint``."""
        constraint = constraint or {}
        return cls(
            str(constraint.get("topology") or ""),
            str(constraint.get("requiredTopologyLevel") or ""),
        )

    def problem(self, what: str) -> str:
        """KAI applies a constraint only when it names a Topology; a required level is refused
        (Muster cannot keep the pods inside one domain of a KAI Topology), a preferred one is not."""
        if self.topology and self.required:
            return (
                f"{what}: KAI topology constraint (topology {self.topology!r}, required level "
                f"{self.required!r}) is not supported by Muster"
            )
        return ""


def pod_topology(pod: Obj) -> KaiTopology:
    annotations = meta(pod).get("annotations") or {}
    return KaiTopology(
        str(annotations.get(KAI_TOPOLOGY) or ""), str(annotations.get(KAI_TOPOLOGY_REQUIRED) or "")
    )


def preemptibility(value: Any, what: str) -> tuple[bool | None, str]:
    """KAI ``preemptible`` / ``non-preemptible`` / unset (priority decides) -> (preemptible, problem)."""
    text = str(value or "")
    if text == "preemptible":
        return True, ""
    if text == "non-preemptible":
        return False, ""
    if not text:
        return None, ""
    return None, f"{what}: preemptibility {text!r} is neither preemptible nor non-preemptible"


def pod_preemptibility(pod: Obj) -> tuple[bool | None, str]:
    """:func:`preemptibility` of a pod's own ``kai.scheduler/preemptibility`` label (KAI reads it
    on a pod without group, its own top owner)."""
    return preemptibility(
        (meta(pod).get("labels") or {}).get(KAI_PREEMPTIBILITY_LABEL), f"pod {key_of(pod)}"
    )


def pod_node(pod: Obj) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def pod_phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def pod_terminal(pod: Obj) -> bool:
    return pod_phase(pod) in TERMINAL_PHASES


def pod_active_deadline(pod: Obj) -> int:
    """The pod's ``spec.activeDeadlineSeconds`` (0: none, or not a positive integer)."""
    value = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return 0
    return value


def pods_time_limit(pods: list[Obj]) -> int:
    """A job's time limit from its pods: the smallest ``activeDeadlineSeconds`` among them (0:
    none), within what the API accepts."""
    deadlines = [d for d in (pod_active_deadline(p) for p in pods) if d]
    return min(*deadlines, MAX_TIME_LIMIT) if deadlines else 0


def pod_failure_message(pod: Obj) -> str:
    """What a failed pod is reported with: ``TimeLimit: time limit 2m reached`` when the kubelet
    ended it at its active deadline (reason DeadlineExceeded), else ""."""
    status = pod.get("status") or {}
    if pod_phase(pod) != "Failed" or status.get("reason") != DEADLINE_EXCEEDED:
        return ""
    deadline = pod_active_deadline(pod)
    if not deadline:
        return f"{TIME_LIMIT_REASON}: active deadline exceeded"
    return time_limit_message(deadline)


def pod_active_on_node(pod: Obj) -> bool:
    """Bound and not finished: holds node capacity."""
    return bool(pod_node(pod)) and not pod_terminal(pod)


def pod_task_status(pod: Obj) -> pb.TaskStatus:
    phase = pod_phase(pod)
    if phase == "Succeeded":
        return pb.TASK_STATUS_SUCCEEDED
    if phase == "Failed":
        return pb.TASK_STATUS_FAILED
    if phase == "Running":
        return pb.TASK_STATUS_RUNNING
    return pb.TASK_STATUS_BOUND if pod_node(pod) else pb.TASK_STATUS_PENDING


def pod_exit_code(pod: Obj) -> int:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term and term.get("exitCode"):
            return int(term["exitCode"])
    return 0


def foreign_task_id(pod: Obj) -> str:
    m = meta(pod)
    return f"k8s:{m.get('namespace', 'default')}:pod:{m['name']}"


def foreign_task(pod: Obj) -> pb.BackendTask:
    """A bound pod Muster did not place: it only consumes capacity."""
    return pb.BackendTask(
        task_id=foreign_task_id(pod),
        node=pod_node(pod),
        request=pb.ResourceList(quantities=pod_request(pod)),
        status=pb.TASK_STATUS_RUNNING if pod_phase(pod) == "Running" else pb.TASK_STATUS_BOUND,
        foreign_task=True,
        **gpu_share(pod),
    )


def gpu_share(pod: Obj) -> dict[str, Any]:
    """``BackendTask`` fields of a bound pod sharing a GPU: its fraction and the shared GPU
    (KAI's ``runai-gpu-group`` label), so the server counts the share as taken."""
    fraction = pod_gpu_fraction(pod)
    if not fraction:
        return {}
    return {"gpu_fraction": fraction, "gpu_group": pod_gpu_group(pod)}


def task_group(role: str, pods: list[Obj], sub_group: str = "") -> pb.TaskGroup:
    """One TaskGroup for the pods of one role; the template is the first pod (by name), its KAI
    ``gpu-fraction`` annotation included."""
    pods = sorted(pods, key=lambda p: meta(p)["name"])
    first = pods[0]
    spec = first.get("spec") or {}
    tolerations = [
        pb.Toleration(
            key=t.get("key", "") or "",
            operator=t.get("operator", "") or "",
            value=t.get("value", "") or "",
            effect=t.get("effect", "") or "",
            toleration_seconds=int(t.get("tolerationSeconds") or 0),
        )
        for t in spec.get("tolerations") or []
    ]
    group = pb.TaskGroup(
        role=role,
        replicas=len(pods),
        request=pb.ResourceList(quantities=pod_request(first)),
        node_selector={k: str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
        tolerations=tolerations,
        labels={k: str(v) for k, v in (meta(first).get("labels") or {}).items()},
        annotations={PODS_ANNOTATION: ",".join(meta(p)["name"] for p in pods)},
        sub_group=sub_group,
        gpu_fraction=pod_gpu_fraction(first),
    )
    affinity = affinity_to_pb(spec.get("affinity") or {})
    if affinity is not None:
        group.affinity.CopyFrom(affinity)
    return group


def _requirements(reqs: list[Obj] | None) -> list[pb.LabelSelectorRequirement]:
    return [
        pb.LabelSelectorRequirement(
            key=r.get("key", ""),
            operator=r.get("operator", ""),
            values=[str(v) for v in r.get("values") or []],
        )
        for r in reqs or []
    ]


def _term(term: Obj) -> pb.NodeSelectorTerm:
    return pb.NodeSelectorTerm(
        match_expressions=_requirements(term.get("matchExpressions")),
        match_fields=_requirements(term.get("matchFields")),
    )


def _pod_term(term: Obj) -> pb.PodAffinityTerm:
    sel = term.get("labelSelector") or {}
    return pb.PodAffinityTerm(
        label_selector=pb.LabelSelector(
            match_labels=sel.get("matchLabels") or {},
            match_expressions=_requirements(sel.get("matchExpressions")),
        ),
        namespaces=term.get("namespaces") or [],
        topology_key=term.get("topologyKey", ""),
    )


def _pod_affinity(pa: Obj) -> pb.PodAffinity:
    return pb.PodAffinity(
        required=[
            _pod_term(t) for t in pa.get("requiredDuringSchedulingIgnoredDuringExecution") or []
        ],
        preferred=[
            pb.WeightedPodAffinityTerm(
                weight=int(w.get("weight", 1)), term=_pod_term(w.get("podAffinityTerm") or {})
            )
            for w in pa.get("preferredDuringSchedulingIgnoredDuringExecution") or []
        ],
    )


def affinity_to_pb(aff: Obj) -> pb.Affinity | None:
    if not aff:
        return None
    out = pb.Affinity()
    na = aff.get("nodeAffinity") or {}
    if na:
        required = (na.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
            "nodeSelectorTerms"
        ) or []
        out.node_affinity.CopyFrom(
            pb.NodeAffinity(
                required=[_term(t) for t in required],
                preferred=[
                    pb.PreferredSchedulingTerm(
                        weight=int(p.get("weight", 1)), preference=_term(p.get("preference") or {})
                    )
                    for p in na.get("preferredDuringSchedulingIgnoredDuringExecution") or []
                ],
            )
        )
    if aff.get("podAffinity"):
        out.pod_affinity.CopyFrom(_pod_affinity(aff["podAffinity"]))
    if aff.get("podAntiAffinity"):
        out.pod_anti_affinity.CopyFrom(_pod_affinity(aff["podAntiAffinity"]))
    return out


# ------------------------------------------------------------------------------------------
# PodGroups, queues, priority classes
# ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class GangSpec:
    """The gang parameters of a PodGroup (Volcano, coscheduling or KAI)."""

    min_member: int = 1
    min_task_member: dict[str, int] = field(default_factory=dict)
    min_resources: dict[str, str] = field(default_factory=dict)
    queue: str = ""
    priority_class: str = ""
    # KAI only: the minimum of each leaf sub-group (a sub-group no other names as parent; KAI's
    # pod sets), every sub-group's name, preemptibility, and what Muster cannot schedule as asked.
    sub_groups: dict[str, int] = field(default_factory=dict)
    all_sub_groups: set[str] = field(default_factory=set)
    preemptible: bool | None = None
    problem: str = ""

    def minimum(self, pods: int) -> int:
        """The gang minimum over ``pods`` pods (muster.gang's rule; minMember 0 is none)."""
        return podgroup_minimum(self.min_member, pods)


def gang_spec(podgroup: Obj) -> GangSpec:
    spec = podgroup.get("spec") or {}
    min_resources = {
        k: str(v) for k, v in (spec.get("minResources") or {}).items() if _valid_quantity(k, v)
    }
    gang = GangSpec(
        min_member=max(0, int(spec.get("minMember") or 0)),
        min_task_member={str(k): int(v) for k, v in (spec.get("minTaskMember") or {}).items()},
        min_resources=min_resources,
        queue=str(spec.get("queue") or ""),
        priority_class=str(spec.get("priorityClassName") or ""),
    )
    if podgroup.get("apiVersion") == KAI_PODGROUP:
        _kai_gang(gang, spec, f"PodGroup {key_of(podgroup)}")
    return gang


def _kai_gang(gang: GangSpec, spec: Obj, what: str) -> None:
    """KAI's PodGroup fields beyond Volcano's: sub-groups, preemptibility, topology constraints."""
    problems: list[str] = []
    gang.preemptible, problem = preemptibility(spec.get("preemptibility"), what)
    problems.append(problem)
    problems.append(KaiTopology.from_constraint(spec.get("topologyConstraint")).problem(what))
    sub_groups = [
        sg for sg in spec.get("subGroups") or [] if isinstance(sg, dict) and sg.get("name")
    ]
    names = [str(sg["name"]) for sg in sub_groups]
    parents = {str(sg["parent"]) for sg in sub_groups if sg.get("parent")}
    gang.all_sub_groups = set(names)
    if len(names) != len(gang.all_sub_groups):
        problems.append(f"{what}: duplicate sub-group names in {names}")
    for parent in sorted(parents - gang.all_sub_groups):
        problems.append(f"{what}: sub-group parent {parent!r} is not one of its sub-groups")
    for sg in sub_groups:
        name = str(sg["name"])
        problems.append(
            KaiTopology.from_constraint(sg.get("topologyConstraint")).problem(
                f"{what} sub-group {name}"
            )
        )
        if name not in parents:  # a leaf: KAI's pod set, at least one member
            gang.sub_groups[name] = max(1, int(sg.get("minMember") or 0))
    gang.problem = "; ".join(p for p in problems if p)


def job_id_for_group(namespace: str, name: str) -> str:
    # ':' because the server reserves '/' to separate a job id from its task suffix.
    return f"k8s:{namespace}:{name}"


def job_id_for_pod(namespace: str, name: str) -> str:
    return f"k8s:{namespace}:pod:{name}"


def queue_to_pb(queue: Obj) -> pb.Queue:
    """Volcano ``scheduling.volcano.sh/v1beta1`` Queue -> Muster queue."""
    m, spec, status = meta(queue), queue.get("spec") or {}, queue.get("status") or {}

    def rl(value: Any) -> pb.ResourceList:
        return pb.ResourceList(
            quantities={
                k: str(v)
                for k, v in (value or {}).items()
                if str(v) == "-1" or _valid_quantity(k, v)
            }
        )

    state = {
        "Open": pb.QUEUE_STATE_OPEN,
        "Closing": pb.QUEUE_STATE_CLOSING,
        "Closed": pb.QUEUE_STATE_CLOSED,
    }.get(str(status.get("state") or spec.get("state") or "Open"), pb.QUEUE_STATE_OPEN)
    q = pb.Queue(
        name=m["name"],
        parent="" if m["name"] == "root" else str(spec.get("parent") or ""),
        weight=max(0, int(spec.get("weight") or 1)),
        guarantee=rl((spec.get("guarantee") or {}).get("resource")),
        deserved=rl(spec.get("deserved")),
        capability=rl(spec.get("capability")),
        priority=int(spec.get("priority") or 0),
        state=state,
    )
    if "reclaimable" in spec:
        q.reclaimable = bool(spec["reclaimable"])
    return q


# KAI's queue resources and the Muster resource (and unit) each maps to: GPUs (fractions allowed),
# CPU in millicores, memory in megabytes (10^6 bytes).
KAI_QUEUE_RESOURCES = {"gpu": (NVIDIA_GPU, ""), "cpu": ("cpu", "m"), "memory": ("memory", "M")}
KAI_DEFAULT_QUEUE_PRIORITY = 100  # KAI's priority of a queue that sets none


def _kai_amount(value: Any, unit: str) -> str | None:
    """A KAI queue number as a Muster quantity: -1 is "-1" (unlimited), a negative or malformed
    number is None (left out)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if number == -1:
        return "-1"
    if number < 0 or not math.isfinite(number):
        return None
    text = f"{number:.6f}".rstrip("0").rstrip(".")
    return f"{text}{unit}" if text != "0" else "0"


def kai_queue_to_pb(queue: Obj) -> pb.Queue:
    """KAI ``scheduling.run.ai/v2`` Queue -> Muster queue.

    Per resource (gpu, cpu, memory): ``quota`` -> guarantee and deserved (-1: deserved unlimited,
    no guarantee, since a guarantee cannot be unlimited), ``limit`` -> capability (-1: unlimited).
    ``overQuotaWeight`` of GPUs -> weight (rounded to a whole number, at least 1; Muster's KAI
    profile weighs GPUs only). ``parentQueue`` -> parent, ``priority`` -> priority (KAI's default
    100). A resource or field the object leaves out is left at Muster's default (no quota, no limit).
    """
    m, spec = meta(queue), queue.get("spec") or {}
    guarantee: dict[str, str] = {}
    deserved: dict[str, str] = {}
    capability: dict[str, str] = {}
    weight = 1
    resources = spec.get("resources") or {}
    for kai_name, (name, unit) in KAI_QUEUE_RESOURCES.items():
        res = resources.get(kai_name)
        if not isinstance(res, dict):
            continue
        if "quota" in res:
            amount = _kai_amount(res["quota"], unit)
            if amount is not None:
                deserved[name] = amount
                if amount != "-1":
                    guarantee[name] = amount
        if "limit" in res:
            amount = _kai_amount(res["limit"], unit)
            if amount is not None:
                capability[name] = amount
        if kai_name == "gpu" and "overQuotaWeight" in res:
            try:
                weight = max(1, round(float(res["overQuotaWeight"])))
            except (TypeError, ValueError, OverflowError):
                weight = 1
    priority = spec.get("priority")
    return pb.Queue(
        name=m["name"],
        parent="" if m["name"] == "root" else str(spec.get("parentQueue") or ""),
        weight=weight,
        guarantee=pb.ResourceList(quantities=guarantee),
        deserved=pb.ResourceList(quantities=deserved),
        capability=pb.ResourceList(quantities=capability),
        priority=KAI_DEFAULT_QUEUE_PRIORITY if priority is None else int(priority),
        state=pb.QUEUE_STATE_OPEN,
    )


def priority_value(priority_class: Obj) -> int:
    return int(priority_class.get("value") or 0)
