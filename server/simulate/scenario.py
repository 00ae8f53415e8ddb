"""``muster simulate`` scenarios: load and validate a scenario document into a config and a
``ClusterSnapshot``.

The format is documented in docs/simulate.md. Loading validates every field and reports every
problem at once, one line each, naming the field's path (``jobs[2].tasks[0].request.cpu: '2x' is
not a quantity``); keys starting with ``x-`` are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from muster import yamldoc
from muster.devices import device_count_problem
from muster.gang import NO_GANG_MINIMUM, gang_minimum
from muster.quantity import QuantityError, parse_resources
from muster.yamldoc import brief
from server.config import (
    DEFAULT_CONFIG_YAML,
    ConfigError,
    SchedulerConfig,
    parse_config,
    parse_priority_classes,
)
from server.model import (
    ENDED,
    TY_BASIC_POLICIES,
    TY_CLEAN_POD_POLICIES,
    TY_JOB_QUEUE_POLICIES,
    ClusterSnapshot,
    HyperNodeSpec,
    JobSpec,
    NodeSpec,
    PodGroupPhase,
    PriorityClass,
    QueueSpec,
    SubGroupSpec,
    Taint,
    TaskSpec,
    TaskStatus,
    Toleration,
    TYJobSpec,
)
from server.session.devices import node_devices
from server.session.options import MAX_DURATION_SECONDS


class ScenarioError(ValueError):
    """An invalid scenario: ``problems`` holds one line per problem, each naming the field path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class Scenario:
    name: str
    config: SchedulerConfig
    snapshot: ClusterSnapshot
    cycles: int = 1


# A scenario runs at most this many cycles.
MAX_CYCLES = 1000

_TOP = {
    "name",
    "now",
    "config",
    "priorityClasses",
    "topologies",
    "hypernodes",
    "nodes",
    "queues",
    "jobs",
}
_NODE = {"name", "allocatable", "labels", "taints", "unschedulable", "devices"}
_QUEUE = {
    "name",
    "parent",
    "weight",
    "guarantee",
    "deserved",
    "capability",
    "priority",
    "reclaimable",
    "state",
    "annotations",
}
_JOB = {
    "name",
    "namespace",
    "queue",
    "minMember",
    "minTaskMember",
    "minResources",
    "priority",
    "priorityClass",
    "preemptible",
    "phase",
    "staleFor",
    "timeLimit",
    "runningFor",
    "subGroups",
    "topology",
    "networkTopology",
    "annotations",
    "tasks",
    *("leaderRole", "minWorkersNum", "restartLimit", "schedulerPolicy", "cleanPodPolicy"),
}
_TY_FIELDS = ("leaderRole", "minWorkersNum", "restartLimit", "schedulerPolicy", "cleanPodPolicy")
_DEVICE = {"id", "type", "group", "healthy"}
_TASK = {
    "name",
    "role",
    "subGroup",
    "request",
    "status",
    "node",
    "gpu_groups",
    "priority",
    "preemptable",
    "preemptionPolicy",
    "labels",
    "annotations",
    "nodeSelector",
    "tolerations",
    "affinity",
    "gpu_fraction",
    "devices",
}
_TAINT = {"key", "value", "effect"}
_TOLERATION = {"key", "operator", "value", "effect", "tolerationSeconds"}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_INT64 = (-(2**63), 2**63 - 1)
_MAX_WEIGHT = 2**31 - 1  # a queue weight (Volcano's is an int32)
_SCALAR = (str, int, float, bool)
_PREEMPTION_POLICIES = ("PreemptLowerPriority", "Never")

# The nested Kubernetes-form fields a scenario passes through to the plugins, as shapes for
# ``_Loader.shape``: a type (``str``, ``int``: not bool, ``_SCALAR``: any scalar), ``[shape]`` (a
# list of), ``{key: shape}`` (a mapping; a key not named here is a problem: unknown field) or
# ``_MapOf(shape)`` (a mapping of string keys to values of shape).


@dataclass(frozen=True)
class _MapOf:
    values: Any


_REQUIREMENT = {"key": str, "operator": str, "values": [_SCALAR]}
_NODE_TERM = {"matchExpressions": [_REQUIREMENT], "matchFields": [_REQUIREMENT]}
_SELECTOR = {"matchLabels": _MapOf(_SCALAR), "matchExpressions": [_REQUIREMENT]}
_POD_TERM = {
    "labelSelector": _SELECTOR,
    "topologyKey": str,
    "namespaces": [str],
    "namespaceSelector": _SELECTOR,
}
_POD_AFFINITY = {
    "requiredDuringSchedulingIgnoredDuringExecution": [_POD_TERM],
    "preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": int, "podAffinityTerm": _POD_TERM}
    ],
}
_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [_NODE_TERM]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": int, "preference": _NODE_TERM}
        ],
    },
    "podAffinity": _POD_AFFINITY,
    "podAntiAffinity": _POD_AFFINITY,
}
_TOPOLOGY = {
    "topology": str,
    "requiredLevel": str,
    "preferredLevel": str,
}  # KAI's topology constraint
_NETWORK_TOPOLOGY = {"mode": str, "highestTierAllowed": int, "highest_tier_allowed": int}
_TOPOLOGIES = [{"name": str, "levels": [str]}]


class _Loader:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def problem(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def unique_name(self, obj: dict[str, Any], path: str, seen: set[str], what: str) -> str | None:
        """The ``name`` of a listed object: required, and unique among its kind."""
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            self.problem(f"{path}.name", "required")
            return None
        if name in seen:
            self.problem(f"{path}.name", f"duplicate {what} {brief(name)}")
        seen.add(name)
        return name

    def items(self, obj: Any, path: str) -> list[Any]:
        """A list field (absent: empty); anything else is a problem, not a crash."""
        if obj is None:
            return []
        if not isinstance(obj, list):
            self.problem(path, "must be a list")
            return []
        return obj

    def strings(self, obj: Any, path: str) -> list[str]:
        """A list of names (ids as numbers allowed: written as strings)."""
        out = []
        for i, v in enumerate(self.items(obj, path)):
            if isinstance(v, str | int) and not isinstance(v, bool):
                out.append(str(v))
            else:
                self.problem(f"{path}[{i}]", "must be a string")
        return out

    def keys(self, obj: Any, allowed: set[str], path: str) -> bool:
        if not isinstance(obj, dict):
            self.problem(path, "must be a mapping")
            return False
        for k in obj:
            if str(k).startswith("x-"):
                continue
            if k not in allowed:
                self.problem(f"{path}.{k}", "unknown field")
        return True

    def resources(self, obj: Any, path: str, *, unlimited: bool = False) -> dict[str, float]:
        if obj is None:
            return {}
        if not isinstance(obj, dict):
            self.problem(path, "must be a mapping of resource name to quantity")
            return {}
        out: dict[str, float] = {}
        for name, raw in obj.items():
            try:
                out.update(parse_resources({str(name): raw}, allow_unlimited=unlimited))
            except QuantityError as exc:
                self.problem(f"{path}.{name}", str(exc).split(": ", 1)[-1])
        return out

    def string_map(self, obj: Any, path: str) -> dict[str, str]:
        """Labels, annotations, a node selector: string keys, scalar values (as strings)."""
        if obj is None:
            return {}
        if not isinstance(obj, dict):
            self.problem(path, "must be a mapping")
            return {}
        out: dict[str, str] = {}
        for k, v in obj.items():
            if not isinstance(v, _SCALAR):
                self.problem(f"{path}.{k}", "must be a string")
            else:
                out[str(k)] = str(v)
        return out

    def string(self, obj: Any, path: str, default: str | None = None) -> str | None:
        """A name or another string field (absent: ``default``)."""
        if obj is None:
            return default
        if not isinstance(obj, str):
            self.problem(path, "must be a string")
            return default
        return obj

    def text(self, obj: Any, path: str) -> str:
        """A scalar written as a string (a taint's value may be written ``1``); absent: ''."""
        if obj is None:
            return ""
        if not isinstance(obj, _SCALAR):
            self.problem(path, "must be a string")
            return ""
        return str(obj)

    def shape(self, obj: Any, shape: Any, path: str) -> bool:
        """Does ``obj`` have the ``shape`` (see _AFFINITY)? Each mismatch is a problem."""
        if obj is None:
            return True  # absent: Kubernetes' default
        if isinstance(shape, dict):
            if not isinstance(obj, dict):
                self.problem(path, "must be a mapping")
                return False
            # A key the shape does not name would be ignored (a typo of
            # requiredDuringSchedulingIgnoredDuringExecution loses the rule): refused, by name.
            unknown = [k for k in obj if k not in shape]
            for k in unknown:
                self.problem(f"{path}.{k}", f"unknown field (known: {', '.join(shape)})")
            known = [self.shape(obj.get(k), sub, f"{path}.{k}") for k, sub in shape.items()]
            return all(known) and not unknown
        if isinstance(shape, _MapOf):
            if not isinstance(obj, dict):
                self.problem(path, "must be a mapping")
                return False
            ok = True
            for k, v in obj.items():
                if not isinstance(k, str):
                    self.problem(f"{path}.{k}", "must be a string key")
                    ok = False
                elif not self.shape(v, shape.values, f"{path}.{k}"):
                    ok = False
            return ok
        if isinstance(shape, list):
            if not isinstance(obj, list):
                self.problem(path, "must be a list")
                return False
            return all(self.shape(v, shape[0], f"{path}[{i}]") for i, v in enumerate(obj))
        if shape is int:
            if isinstance(obj, bool) or not isinstance(obj, int):
                self.problem(path, f"{brief(obj)} is not an integer")
                return False
            if not _INT64[0] <= obj <= _INT64[1]:
                self.problem(path, f"{brief(obj)} is out of range")
                return False
            return True
        if isinstance(obj, bool) and shape is not _SCALAR:
            self.problem(path, "must be a string")
            return False
        if not isinstance(obj, shape):
            self.problem(
                path, "must be a string" if shape is str else "must be a string or a number"
            )
            return False
        return True

    def mapping(self, obj: Any, shape: dict[str, Any], path: str) -> dict[str, Any]:
        """A Kubernetes-form mapping (affinity, topology ...) checked against its shape; absent
        or wrong: {}."""
        if obj is None or not self.shape(obj, shape, path):
            return {}
        return dict(obj)

    def integer(self, obj: Any, path: str, default: int = 0) -> int:
        if obj is None:
            return default
        if isinstance(obj, bool) or not isinstance(obj, int):
            self.problem(path, f"{brief(obj)} is not an integer")
            return default
        if not _INT64[0] <= obj <= _INT64[1]:
            self.problem(path, f"{brief(obj)} is out of range")
            return default
        return obj

    def boolean(self, obj: Any, path: str, default: bool) -> bool:
        if obj is None:
            return default
        if not isinstance(obj, bool):
            self.problem(path, f"{brief(obj)} is not a boolean")
            return default
        return obj

    def number(self, obj: Any, path: str, default: float) -> float:
        """A number >= 0 (a queue weight: KAI's over-quota weights may be 0 or fractional)."""
        if obj is None:
            return default
        if isinstance(obj, bool) or not isinstance(obj, int | float):
            self.problem(path, f"{brief(obj)} is not a number")
            return default
        if obj < 0:
            # KAI's -1 means unlimited in a quota (guarantee) or a limit (capability) only.
            self.problem(
                path,
                f"{brief(obj)} must not be negative (KAI's -1, unlimited, is for a quota "
                "(guarantee) or a limit (capability), not for the over-quota weight)",
            )
            return default
        if not obj <= _MAX_WEIGHT:  # also NaN
            self.problem(path, f"{brief(obj)} is more than {_MAX_WEIGHT}")
            return default
        return float(obj)

    def fraction(self, obj: Any, path: str) -> float:
        """A GPU fraction: a number above 0 and below 1 (absent: 0, no sharing)."""
        if obj is None:
            return 0.0
        if isinstance(obj, bool) or not isinstance(obj, int | float | str):
            self.problem(path, f"{brief(obj)} is not a number")
            return 0.0
        try:
            value = float(obj)
        except ValueError:
            self.problem(path, f"{brief(obj)} is not a number")
            return 0.0
        if not 0.0 < value < 1.0:
            self.problem(path, f"{value} is not a fraction of one GPU (above 0, below 1)")
            return 0.0
        return value

    def duration(self, obj: Any, path: str) -> float | None:
        if obj is None:
            return None
        if isinstance(obj, int | float) and not isinstance(obj, bool):
            seconds = obj
        else:
            m = _DURATION.match(obj) if isinstance(obj, str) else None
            if not m:
                self.problem(path, f"{brief(obj)} is not a duration (e.g. 90s, 5m)")
                return None
            seconds = (
                float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
            )
        if not abs(seconds) <= MAX_DURATION_SECONDS:  # also inf and nan
            self.problem(path, f"{brief(obj)} is out of range")
            return None
        return float(seconds)

    def taints(self, obj: Any, path: str) -> list[Taint]:
        out = []
        for i, t in enumerate(self.items(obj, path)):
            p = f"{path}[{i}]"
            if self.keys(t, _TAINT, p):
                key = self.text(t.get("key"), f"{p}.key")
                if not key:
                    self.problem(f"{p}.key", "required")
                effect = t.get("effect", "NoSchedule")
                if not isinstance(effect, str) or effect not in (
                    "NoSchedule",
                    "PreferNoSchedule",
                    "NoExecute",
                ):
                    self.problem(
                        f"{p}.effect",
                        f"{brief(effect)} is not NoSchedule, PreferNoSchedule or NoExecute",
                    )
                    effect = "NoSchedule"
                out.append(Taint(key, self.text(t.get("value"), f"{p}.value"), effect))
        return out

    def tolerations(self, obj: Any, path: str) -> list[Toleration]:
        out = []
        for i, t in enumerate(self.items(obj, path)):
            p = f"{path}[{i}]"
            if self.keys(t, _TOLERATION, p):
                op = t.get("operator", "Equal")
                if not isinstance(op, str) or op not in ("Equal", "Exists"):
                    self.problem(f"{p}.operator", f"{brief(op)} is not Equal or Exists")
                    op = "Equal"
                effect = self.text(t.get("effect"), f"{p}.effect")
                if effect not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
                    self.problem(
                        f"{p}.effect",
                        f"{brief(effect)} is not NoSchedule, PreferNoSchedule or NoExecute",
                    )
                if t.get("tolerationSeconds") is not None:
                    self.integer(t.get("tolerationSeconds"), f"{p}.tolerationSeconds")
                out.append(
                    Toleration(
                        self.text(t.get("key"), f"{p}.key"),
                        op,
                        self.text(t.get("value"), f"{p}.value"),
                        effect,
                    )
                )
        return out

    def devices(self, obj: Any, path: str) -> list[dict[str, Any]]:
        """A node's devices: a list of {id, type, group, healthy}; ids unique on the node."""
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        for i, d in enumerate(self.items(obj, path)):
            p = f"{path}[{i}]"
            if not self.keys(d, _DEVICE, p):
                continue
            dev_id, dev_type = d.get("id"), d.get("type")
            if not isinstance(dev_id, str | int) or isinstance(dev_id, bool) or str(dev_id) == "":
                self.problem(f"{p}.id", "required")
                continue
            if not isinstance(dev_type, str) or not dev_type:
                self.problem(f"{p}.type", "required (the resource the device counts towards)")
                continue
            if str(dev_id) in seen:
                self.problem(f"{p}.id", f"duplicate device {brief(dev_id)}")
            seen.add(str(dev_id))
            group = d.get("group")
            out.append(
                {
                    "id": str(dev_id),
                    "type": dev_type,
                    "group": "" if group is None else str(group),
                    "healthy": self.boolean(d.get("healthy"), f"{p}.healthy", True),
                }
            )
        return out

    def tyjob(self, j: dict[str, Any], path: str) -> TYJobSpec | None:
        """TY-Arranger's fields of a job (None: not a TYJob)."""
        if not any(k in j for k in _TY_FIELDS):
            return None
        ty = TYJobSpec()
        leader = j.get("leaderRole", "leader")
        if not isinstance(leader, str) or not leader:
            self.problem(f"{path}.leaderRole", "must be a non-empty role name")
        else:
            ty.leader_role = leader
        ty.min_workers = self.integer(j.get("minWorkersNum"), f"{path}.minWorkersNum", 1)
        if ty.min_workers < 0:
            self.problem(f"{path}.minWorkersNum", "must not be negative")
        ty.restart_limit = self.integer(j.get("restartLimit"), f"{path}.restartLimit", 3)
        if ty.restart_limit < 0:
            self.problem(f"{path}.restartLimit", "must not be negative")
        clean = j.get("cleanPodPolicy", "All")
        if clean not in TY_CLEAN_POD_POLICIES:
            self.problem(
                f"{path}.cleanPodPolicy",
                f"{brief(clean)} is not one of {', '.join(TY_CLEAN_POD_POLICIES)}",
            )
        else:
            ty.clean_pod_policy = clean
        policy = j.get("schedulerPolicy")
        if policy is not None and self.keys(
            policy, {"jobQueuePolicy", "basicPolicy"}, f"{path}.schedulerPolicy"
        ):
            queue_policy = policy.get("jobQueuePolicy", "Priority")
            if queue_policy not in TY_JOB_QUEUE_POLICIES:
                self.problem(
                    f"{path}.schedulerPolicy.jobQueuePolicy",
                    f"{brief(queue_policy)} is not one of {', '.join(TY_JOB_QUEUE_POLICIES)}",
                )
            else:
                ty.job_queue_policy = queue_policy
            basic = policy.get("basicPolicy", "Gang")
            if basic not in TY_BASIC_POLICIES:
                self.problem(
                    f"{path}.schedulerPolicy.basicPolicy",
                    f"{brief(basic)} is not one of {', '.join(TY_BASIC_POLICIES)}",
                )
            else:
                ty.basic_policy = basic
        return ty


def _phase(loader: _Loader, raw: Any, path: str) -> PodGroupPhase:
    if raw is None:
        return PodGroupPhase.PENDING
    try:
        return PodGroupPhase(raw)
    except ValueError:
        loader.problem(
            path, f"{brief(raw)} is not one of Pending, Inqueue, Running, Unknown, Completed"
        )
        return PodGroupPhase.PENDING


def load_scenario(raw: Any) -> Scenario:
    """Validate a parsed scenario document; raise ScenarioError listing every problem."""
    L = _Loader()
    if not isinstance(raw, dict):
        raise ScenarioError(["scenario: must be a mapping"])
    L.keys(raw, _TOP, "scenario")
    scenario_name = L.string(raw.get("name"), "name") or ""
    # No config at all: Muster's (= Volcano's) default configuration.
    cfg_raw = raw["config"] if raw.get("config") is not None else yamldoc.load(DEFAULT_CONFIG_YAML)
    config: SchedulerConfig | None = None
    cycles = 1
    try:
        config = parse_config(cfg_raw, path="config")
        if isinstance(cfg_raw, dict) and "cycles" in cfg_raw:
            cycles = L.integer(cfg_raw.get("cycles"), "config.cycles", 1)
            if not 1 <= cycles <= MAX_CYCLES:
                L.problem("config.cycles", f"must be between 1 and {MAX_CYCLES}")
    except ConfigError as exc:
        L.problems.append(str(exc))
    priority_classes: dict[str, PriorityClass] = {}
    try:
        priority_classes = parse_priority_classes(raw.get("priorityClasses"), "priorityClasses")
    except ConfigError as exc:
        L.problems.append(str(exc))
    if config is not None:
        priority_classes = {**config.priority_classes, **priority_classes}

    nodes: list[NodeSpec] = []
    seen_nodes: set[str] = set()
    for i, n in enumerate(L.items(raw.get("nodes"), "nodes")):
        p = f"nodes[{i}]"
        if not L.keys(n, _NODE, p):
            continue
        name = L.unique_name(n, p, seen_nodes, "node")
        if name is None:
            continue
        node_spec = NodeSpec(
            name=name,
            # A listed device counts towards its resource: the session's NodeTable sets it.
            allocatable=L.resources(n.get("allocatable"), f"{p}.allocatable"),
            labels=L.string_map(n.get("labels"), f"{p}.labels"),
            taints=L.taints(n.get("taints"), f"{p}.taints"),
            unschedulable=L.boolean(n.get("unschedulable"), f"{p}.unschedulable", False),
            devices=L.devices(n.get("devices"), f"{p}.devices"),
        )
        too_many = device_count_problem(
            node_spec.allocatable, (str(d["type"]) for d in node_spec.devices)
        )
        if too_many is not None:  # device ids are made up per unit: a node is held to the bound
            L.problem(f"{p}.{too_many[0]}", too_many[1])
            continue
        nodes.append(node_spec)

    queues: list[QueueSpec] = []
    queue_names: set[str] = set()
    for i, q in enumerate(L.items(raw.get("queues"), "queues")):
        p = f"queues[{i}]"
        if not L.keys(q, _QUEUE, p):
            continue
        name = L.unique_name(q, p, queue_names, "queue")
        if name is None:
            continue
        state = q.get("state", "Open")
        if not isinstance(state, str) or state not in ("Open", "Closing", "Closed"):
            L.problem(f"{p}.state", f"{brief(state)} is not Open, Closing or Closed")
            state = "Open"
        weight = L.number(q.get("weight"), f"{p}.weight", 1.0)
        queues.append(
            QueueSpec(
                name=name,
                parent=L.string(q.get("parent"), f"{p}.parent"),
                weight=weight,
                guarantee=L.resources(q.get("guarantee"), f"{p}.guarantee", unlimited=True),
                deserved=L.resources(q.get("deserved"), f"{p}.deserved"),
                capability=L.resources(q.get("capability"), f"{p}.capability", unlimited=True),
                priority=L.integer(q.get("priority"), f"{p}.priority", 0),
                reclaimable=L.boolean(q.get("reclaimable"), f"{p}.reclaimable", True),
                state=state,
                annotations=L.string_map(q.get("annotations"), f"{p}.annotations"),
            )
        )
    for i, q in enumerate(queues):
        if q.parent and q.parent not in queue_names and q.parent != "root":
            L.problem(f"queues[{i}].parent", f"unknown queue {brief(q.parent)}")

    # The instant the scenario happens at (epoch seconds; default 0): jobs' running times count
    # back from it and start estimates forward.
    now = L.number(raw.get("now"), "now", 0.0)
    jobs: list[JobSpec] = []
    task_uids: set[str] = set()
    job_uids: set[str] = set()
    creation = 0
    default_class = next((pc for pc in priority_classes.values() if pc.global_default), None)
    profile = config.profile if config is not None else "volcano"
    for i, j in enumerate(L.items(raw.get("jobs"), "jobs")):
        p = f"jobs[{i}]"
        if not L.keys(j, _JOB, p):
            continue
        name = j.get("name")
        if not isinstance(name, str) or not name:
            L.problem(f"{p}.name", "required")
            continue
        namespace = L.string(j.get("namespace"), f"{p}.namespace") or "default"
        uid = f"{namespace}/{name}"
        if uid in job_uids:
            L.problem(f"{p}.name", f"duplicate job {brief(uid)}")
        job_uids.add(uid)
        queue = L.string(j.get("queue"), f"{p}.queue") or "default"
        priority = L.integer(j.get("priority"), f"{p}.priority", 0)
        tyjob = L.tyjob(j, p)
        if tyjob is not None:  # TY-Arranger priorities are 1..10, default 5
            if j.get("priority") is None:
                priority = 5
            elif not 1 <= priority <= 10:
                L.problem(f"{p}.priority", f"{priority} is not a TYJob priority (1 to 10)")
        pclass = L.string(j.get("priorityClass"), f"{p}.priorityClass")
        if pclass is not None:
            if pclass in priority_classes:
                priority = priority_classes[pclass].value
            elif profile == "volcano":
                priority = (
                    0  # Volcano: a PodGroup naming a class that does not exist gets priority 0
                )
            else:
                L.problem(f"{p}.priorityClass", f"unknown priority class {brief(pclass)}")
        elif j.get("priority") is None and default_class is not None:
            priority = default_class.value
        tasks: list[TaskSpec] = []
        for k, t in enumerate(L.items(j.get("tasks"), f"{p}.tasks")):
            tp = f"{p}.tasks[{k}]"
            if not L.keys(t, _TASK, tp):
                continue
            tname = t.get("name")
            if not isinstance(tname, str) or not tname:
                L.problem(f"{tp}.name", "required")
                continue
            tuid = f"{namespace}/{tname}"
            if tuid in task_uids:
                L.problem(f"{tp}.name", f"duplicate task {brief(tuid)}")
            task_uids.add(tuid)
            status_raw = t.get("status", "Pending")
            try:
                status = TaskStatus.from_title(str(status_raw))
                if status == TaskStatus.UNKNOWN:  # the server's, for a silent backend's tasks
                    raise KeyError(status_raw)
            except KeyError:
                L.problem(f"{tp}.status", f"{brief(status_raw)} is not a task status")
                status = TaskStatus.PENDING
            node = L.string(t.get("node"), f"{tp}.node")
            if node is not None and node not in seen_nodes:
                L.problem(f"{tp}.node", f"node {brief(node)} does not exist")
            if (
                node is None
                and t.get("node") is None
                and status not in (TaskStatus.PENDING, *ENDED)
            ):
                L.problem(f"{tp}.node", f"a {status.title} task needs a node")
            affinity = L.mapping(t.get("affinity"), _AFFINITY, f"{tp}.affinity")
            policy = t.get("preemptionPolicy", "PreemptLowerPriority")
            if not isinstance(policy, str) or policy not in _PREEMPTION_POLICIES:
                L.problem(
                    f"{tp}.preemptionPolicy",
                    f"{brief(policy)} is not PreemptLowerPriority or Never",
                )
                policy = "PreemptLowerPriority"
            tasks.append(
                TaskSpec(
                    uid=tuid,
                    name=tname,
                    namespace=namespace,
                    job=uid,
                    request=L.resources(t.get("request"), f"{tp}.request"),
                    role=L.string(t.get("role"), f"{tp}.role") or "",
                    status=status,
                    node=node,
                    priority=L.integer(t.get("priority"), f"{tp}.priority", priority),
                    preemptable=L.boolean(t.get("preemptable"), f"{tp}.preemptable", True),
                    preemption_policy=policy,
                    labels=L.string_map(t.get("labels"), f"{tp}.labels"),
                    annotations=L.string_map(t.get("annotations"), f"{tp}.annotations"),
                    node_selector=L.string_map(t.get("nodeSelector"), f"{tp}.nodeSelector"),
                    tolerations=L.tolerations(t.get("tolerations"), f"{tp}.tolerations"),
                    affinity=affinity,
                    sub_group=L.string(t.get("subGroup"), f"{tp}.subGroup"),
                    gpu_groups=L.strings(t.get("gpu_groups"), f"{tp}.gpu_groups"),
                    creation_index=creation,
                    devices=L.strings(t.get("devices"), f"{tp}.devices"),
                    gpu_fraction=L.fraction(t.get("gpu_fraction"), f"{tp}.gpu_fraction"),
                )
            )
            creation += 1
        min_task_member = j.get("minTaskMember") or {}
        if not isinstance(min_task_member, dict):
            L.problem(f"{p}.minTaskMember", "must be a mapping of role to count")
            min_task_member = {}
        # minMember as the API's min_member: absent or 0 is every task; NO_GANG_MINIMUM (-1) is
        # none (Volcano's minMember 0).
        min_member: int = (
            L.integer(j.get("minMember"), f"{p}.minMember", 0) if "minMember" in j else 0
        )
        if tyjob is not None:  # the gang: the Leader and minWorkersNum workers
            if min_member == 0:
                min_member = 1 + tyjob.min_workers
            if not min_task_member:
                min_task_member = {tyjob.leader_role: 1}
        if min_member < NO_GANG_MINIMUM:
            L.problem(
                f"{p}.minMember",
                f"must not be negative (except {NO_GANG_MINIMUM}: no gang minimum)",
            )
            min_member = 0
        sub_groups = []
        for s, sg in enumerate(L.items(j.get("subGroups"), f"{p}.subGroups")):
            sp = f"{p}.subGroups[{s}]"
            if not L.keys(sg, {"name", "minMember", "topology"}, sp):
                continue
            sg_name = L.string(sg.get("name"), f"{sp}.name")
            if not sg_name:
                L.problem(f"{sp}.name", "required")
                continue
            sub_groups.append(
                SubGroupSpec(
                    sg_name,
                    L.integer(sg.get("minMember"), f"{sp}.minMember", 0),
                    L.mapping(sg.get("topology"), _TOPOLOGY, f"{sp}.topology"),
                )
            )
        min_resources = j.get("minResources")
        running_for = L.duration(j.get("runningFor"), f"{p}.runningFor")
        jobs.append(
            JobSpec(
                uid=uid,
                name=name,
                namespace=namespace,
                queue=queue,
                tasks=tasks,
                min_member=gang_minimum(min_member, len(tasks)),
                min_task_member={
                    str(r): L.integer(v, f"{p}.minTaskMember.{r}")
                    for r, v in min_task_member.items()
                },
                min_resources=L.resources(min_resources, f"{p}.minResources")
                if min_resources is not None
                else None,
                priority=priority,
                priority_class=str(pclass or ""),
                preemptible=None
                if j.get("preemptible") is None
                else L.boolean(j.get("preemptible"), f"{p}.preemptible", True),
                phase=_phase(L, j.get("phase"), f"{p}.phase"),
                sub_groups=sub_groups,
                topology=L.mapping(j.get("topology"), _TOPOLOGY, f"{p}.topology"),
                network_topology=L.mapping(
                    j.get("networkTopology"), _NETWORK_TOPOLOGY, f"{p}.networkTopology"
                ),
                annotations=L.string_map(j.get("annotations"), f"{p}.annotations"),
                stale_seconds=L.duration(j.get("staleFor"), f"{p}.staleFor"),
                time_limit_seconds=L.duration(j.get("timeLimit"), f"{p}.timeLimit") or 0.0,
                started_at=None if running_for is None else now - running_for,
                creation_index=i,
                tyjob=tyjob,
            )
        )
    if "default" not in queue_names and any(j.queue == "default" for j in jobs):
        queues.insert(0, QueueSpec("default"))

    hypernodes: list[HyperNodeSpec] = []
    for i, h in enumerate(L.items(raw.get("hypernodes"), "hypernodes")):
        p = f"hypernodes[{i}]"
        if not L.keys(h, {"name", "tier", "members"}, p):
            continue
        members = h.get("members") or {}
        if not L.keys(members, {"nodes", "hypernodes"}, f"{p}.members"):
            members = {}
        member_nodes = L.strings(members.get("nodes"), f"{p}.members.nodes")
        member_hypernodes = L.strings(members.get("hypernodes"), f"{p}.members.hypernodes")
        for k, nname in enumerate(member_nodes):
            if nname not in seen_nodes:
                L.problem(f"{p}.members.nodes[{k}]", f"node {brief(nname)} does not exist")
        hn_name = h.get("name")
        if not isinstance(hn_name, str) or not hn_name:
            L.problem(f"{p}.name", "required" if hn_name in (None, "") else "must be a string")
            hn_name = ""
        hypernodes.append(
            HyperNodeSpec(
                hn_name, L.integer(h.get("tier"), f"{p}.tier", 1), member_nodes, member_hypernodes
            )
        )
    known_hn = {h.name for h in hypernodes}
    for i, h in enumerate(hypernodes):
        for k, child in enumerate(h.hypernodes):
            if child not in known_hn:
                L.problem(
                    f"hypernodes[{i}].members.hypernodes[{k}]",
                    f"hypernode {brief(child)} does not exist",
                )
    children = {h.name: h.hypernodes for h in hypernodes}
    for i, h in enumerate(hypernodes):
        # A hypernode may not contain itself, directly or through its members.
        stack, seen = list(h.hypernodes), set()
        while stack:
            member = stack.pop()
            if member == h.name:
                L.problem(f"hypernodes[{i}].members", f"hypernode {brief(h.name)} contains itself")
                break
            if member not in seen:
                seen.add(member)
                stack.extend(children.get(member, []))
    topologies = raw.get("topologies") or []
    if not L.shape(topologies, _TOPOLOGIES, "topologies"):
        topologies = []

    _check_held_devices(L, nodes, jobs)
    if L.problems or config is None:
        raise ScenarioError(L.problems or ["config: invalid"])
    snapshot = ClusterSnapshot(
        nodes=nodes,
        queues=queues,
        jobs=jobs,
        priority_classes=priority_classes,
        hypernodes=hypernodes,
        topologies=topologies,
        now=now,
    )
    return Scenario(scenario_name, config, snapshot, cycles)


def _check_held_devices(L: _Loader, nodes: list[NodeSpec], jobs: list[JobSpec]) -> None:
    """Device ids named by tasks must exist on their node, each held by one task only."""
    by_name = {n.name: n for n in nodes}
    known: dict[str, set[str]] = {}
    holder: dict[tuple[str, str], str] = {}
    for i, job in enumerate(jobs):
        for k, task in enumerate(job.tasks):
            if not task.devices or task.node not in by_name:
                continue
            node = task.node
            if node not in known:
                known[node] = {d.id for devs in node_devices(by_name[node]).values() for d in devs}
            for m, dev in enumerate(task.devices):
                path = f"jobs[{i}].tasks[{k}].devices[{m}]"
                if dev not in known[node]:
                    L.problem(path, f"node {brief(node)} has no device {brief(dev)}")
                elif (node, dev) in holder:
                    L.problem(
                        path,
                        f"device {brief(dev)} of node {brief(node)} is already held by {holder[node, dev]}",
                    )
                else:
                    holder[node, dev] = task.uid


def parse_scenario_text(text: str) -> Scenario:
    try:
        raw = yamldoc.load(text)  # JSON is YAML
    except yamldoc.DocumentError as exc:
        raise ScenarioError([f"scenario: {exc}"]) from None
    return load_scenario(raw)
