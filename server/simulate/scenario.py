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

import yaml

from muster.quantity import QuantityError, parse_resources
from server import yamldoc
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


_TOP = {"name", "config", "priorityClasses", "topologies", "hypernodes", "nodes", "queues", "jobs"}
_NODE = {"name", "allocatable", "labels", "taints", "unschedulable", "devices"}
_QUEUE = {"name", "parent", "weight", "guarantee", "deserved", "capability", "priority", "reclaimable", "state", "annotations"}
_JOB = {
    "name", "namespace", "queue", "minMember", "minTaskMember", "minResources", "priority", "priorityClass",
    "preemptible", "phase", "staleFor", "subGroups", "topology", "networkTopology", "annotations", "tasks",
    *("leaderRole", "minWorkersNum", "restartLimit", "schedulerPolicy", "cleanPodPolicy"),
}
_TY_FIELDS = ("leaderRole", "minWorkersNum", "restartLimit", "schedulerPolicy", "cleanPodPolicy")
_DEVICE = {"id", "type", "group", "healthy"}
_TASK = {
    "name", "role", "subGroup", "request", "status", "node", "gpu_groups", "priority", "preemptable",
    "preemptionPolicy", "labels", "annotations", "nodeSelector", "tolerations", "affinity", "gpu_fraction",
    "devices",
}
_TAINT = {"key", "value", "effect"}
_TOLERATION = {"key", "operator", "value", "effect", "tolerationSeconds"}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")


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
            self.problem(f"{path}.name", f"duplicate {what} {name!r}")
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
        if obj is None:
            return {}
        if not isinstance(obj, dict):
            self.problem(path, "must be a mapping")
            return {}
        return {str(k): str(v) for k, v in obj.items()}

    def integer(self, obj: Any, path: str, default: int = 0) -> int:
        if obj is None:
            return default
        if isinstance(obj, bool) or not isinstance(obj, int):
            self.problem(path, f"{obj!r} is not an integer")
            return default
        return obj

    def boolean(self, obj: Any, path: str, default: bool) -> bool:
        if obj is None:
            return default
        if not isinstance(obj, bool):
            self.problem(path, f"{obj!r} is not a boolean")
            return default
        return obj

    def number(self, obj: Any, path: str, default: float) -> float:
        """A number >= 0 (a queue weight: KAI's over-quota weights may be 0 or fractional)."""
        if obj is None:
            return default
        if isinstance(obj, bool) or not isinstance(obj, int | float):
            self.problem(path, f"{obj!r} is not a number")
            return default
        if obj < 0:
            self.problem(path, f"{obj} must not be negative")
            return default
        return float(obj)

    def fraction(self, obj: Any, path: str) -> float:
        """A GPU fraction: a number above 0 and below 1 (absent: 0, no sharing)."""
        if obj is None:
            return 0.0
        if isinstance(obj, bool) or not isinstance(obj, int | float | str):
            self.problem(path, f"{obj!r} is not a number")
            return 0.0
        try:
            value = float(obj)
        except ValueError:
            self.problem(path, f"{obj!r} is not a number")
            return 0.0
        if not 0.0 < value < 1.0:
            self.problem(path, f"{value} is not a fraction of one GPU (above 0, below 1)")
            return 0.0
        return value

    def duration(self, obj: Any, path: str) -> float | None:
        if obj is None:
            return None
        if isinstance(obj, int | float) and not isinstance(obj, bool):
            return float(obj)
        m = _DURATION.match(str(obj))
        if not m:
            self.problem(path, f"{obj!r} is not a duration (e.g. 90s, 5m)")
            return None
        scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
        return float(m.group(1)) * scale

    def taints(self, obj: Any, path: str) -> list[Taint]:
        out = []
        for i, t in enumerate(self.items(obj, path)):
            p = f"{path}[{i}]"
            if self.keys(t, _TAINT, p):
                if not t.get("key"):
                    self.problem(f"{p}.key", "required")
                effect = t.get("effect", "NoSchedule")
                if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
                    self.problem(f"{p}.effect", f"{effect!r} is not NoSchedule, PreferNoSchedule or NoExecute")
                out.append(Taint(str(t.get("key", "")), str(t.get("value", "")), effect))
        return out

    def tolerations(self, obj: Any, path: str) -> list[Toleration]:
        out = []
        for i, t in enumerate(self.items(obj, path)):
            p = f"{path}[{i}]"
            if self.keys(t, _TOLERATION, p):
                op = t.get("operator", "Equal")
                if op not in ("Equal", "Exists"):
                    self.problem(f"{p}.operator", f"{op!r} is not Equal or Exists")
                out.append(Toleration(str(t.get("key", "")), op, str(t.get("value", "")), str(t.get("effect", ""))))
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
                self.problem(f"{p}.id", f"duplicate device {dev_id!r}")
            seen.add(str(dev_id))
            group = d.get("group")
            out.append({
                "id": str(dev_id),
                "type": dev_type,
                "group": "" if group is None else str(group),
                "healthy": self.boolean(d.get("healthy"), f"{p}.healthy", True),
            })
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
            self.problem(f"{path}.cleanPodPolicy", f"{clean!r} is not one of {', '.join(TY_CLEAN_POD_POLICIES)}")
        else:
            ty.clean_pod_policy = clean
        policy = j.get("schedulerPolicy")
        if policy is not None and self.keys(policy, {"jobQueuePolicy", "basicPolicy"}, f"{path}.schedulerPolicy"):
            queue_policy = policy.get("jobQueuePolicy", "Priority")
            if queue_policy not in TY_JOB_QUEUE_POLICIES:
                self.problem(f"{path}.schedulerPolicy.jobQueuePolicy",
                             f"{queue_policy!r} is not one of {', '.join(TY_JOB_QUEUE_POLICIES)}")
            else:
                ty.job_queue_policy = queue_policy
            basic = policy.get("basicPolicy", "Gang")
            if basic not in TY_BASIC_POLICIES:
                self.problem(f"{path}.schedulerPolicy.basicPolicy", f"{basic!r} is not one of {', '.join(TY_BASIC_POLICIES)}")
            else:
                ty.basic_policy = basic
        return ty


def _phase(loader: _Loader, raw: Any, path: str) -> PodGroupPhase:
    if raw is None:
        return PodGroupPhase.PENDING
    try:
        return PodGroupPhase(raw)
    except ValueError:
        loader.problem(path, f"{raw!r} is not one of Pending, Inqueue, Running, Unknown, Completed")
        return PodGroupPhase.PENDING


def load_scenario(raw: Any) -> Scenario:
    """Validate a parsed scenario document; raise ScenarioError listing every problem."""
    L = _Loader()
    if not isinstance(raw, dict):
        raise ScenarioError(["scenario: must be a mapping"])
    L.keys(raw, _TOP, "scenario")
    # No config at all: Muster's (= Volcano's) default configuration.
    cfg_raw = raw["config"] if raw.get("config") is not None else yaml.safe_load(DEFAULT_CONFIG_YAML)
    config: SchedulerConfig | None = None
    cycles = 1
    try:
        config = parse_config(cfg_raw, path="config")
        if isinstance(cfg_raw, dict) and "cycles" in cfg_raw:
            cycles = L.integer(cfg_raw.get("cycles"), "config.cycles", 1)
            if cycles < 1:
                L.problem("config.cycles", "must be at least 1")
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
        nodes.append(
            NodeSpec(
                name=name,
                # A listed device counts towards its resource: the session's NodeTable sets it.
                allocatable=L.resources(n.get("allocatable"), f"{p}.allocatable"),
                labels=L.string_map(n.get("labels"), f"{p}.labels"),
                taints=L.taints(n.get("taints"), f"{p}.taints"),
                unschedulable=L.boolean(n.get("unschedulable"), f"{p}.unschedulable", False),
                devices=L.devices(n.get("devices"), f"{p}.devices"),
            )
        )

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
        if state not in ("Open", "Closing", "Closed"):
            L.problem(f"{p}.state", f"{state!r} is not Open, Closing or Closed")
        weight = L.number(q.get("weight"), f"{p}.weight", 1.0)
        queues.append(
            QueueSpec(
                name=name,
                parent=q.get("parent"),
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
            L.problem(f"queues[{i}].parent", f"unknown queue {q.parent!r}")

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
        namespace = str(j.get("namespace") or "default")
        uid = f"{namespace}/{name}"
        if uid in job_uids:
            L.problem(f"{p}.name", f"duplicate job {uid!r}")
        job_uids.add(uid)
        queue = str(j.get("queue") or "default")
        priority = L.integer(j.get("priority"), f"{p}.priority", 0)
        tyjob = L.tyjob(j, p)
        if tyjob is not None:  # TY-Arranger priorities are 1..10, default 5
            if j.get("priority") is None:
                priority = 5
            elif not 1 <= priority <= 10:
                L.problem(f"{p}.priority", f"{priority} is not a TYJob priority (1 to 10)")
        pclass = j.get("priorityClass")
        if pclass is not None:
            if pclass in priority_classes:
                priority = priority_classes[pclass].value
            elif profile == "volcano":
                priority = 0  # Volcano: a PodGroup naming a class that does not exist gets priority 0
            else:
                L.problem(f"{p}.priorityClass", f"unknown priority class {pclass!r}")
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
                L.problem(f"{tp}.name", f"duplicate task {tuid!r}")
            task_uids.add(tuid)
            status_raw = t.get("status", "Pending")
            try:
                status = TaskStatus.from_title(str(status_raw))
            except KeyError:
                L.problem(f"{tp}.status", f"{status_raw!r} is not a task status")
                status = TaskStatus.PENDING
            node = t.get("node")
            if node is not None and node not in seen_nodes:
                L.problem(f"{tp}.node", f"node {node!r} does not exist")
            if node is None and status not in (TaskStatus.PENDING, *ENDED):
                L.problem(f"{tp}.node", f"a {status.title} task needs a node")
            affinity = t.get("affinity") or {}
            if not isinstance(affinity, dict):
                L.problem(f"{tp}.affinity", "must be a mapping")
                affinity = {}
            policy = t.get("preemptionPolicy", "PreemptLowerPriority")
            tasks.append(
                TaskSpec(
                    uid=tuid,
                    name=tname,
                    namespace=namespace,
                    job=uid,
                    request=L.resources(t.get("request"), f"{tp}.request"),
                    role=str(t.get("role") or ""),
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
                    sub_group=t.get("subGroup"),
                    gpu_groups=[str(g) for g in L.items(t.get("gpu_groups"), f"{tp}.gpu_groups")],
                    creation_index=creation,
                    devices=[str(d) for d in L.items(t.get("devices"), f"{tp}.devices")],
                    gpu_fraction=L.fraction(t.get("gpu_fraction"), f"{tp}.gpu_fraction"),
                )
            )
            creation += 1
        min_task_member = j.get("minTaskMember") or {}
        if not isinstance(min_task_member, dict):
            L.problem(f"{p}.minTaskMember", "must be a mapping of role to count")
            min_task_member = {}
        min_member: int | None = L.integer(j.get("minMember"), f"{p}.minMember", 0) if "minMember" in j else None
        if tyjob is not None:  # the gang: the Leader and minWorkersNum workers
            if min_member is None:
                min_member = 1 + tyjob.min_workers
            if not min_task_member:
                min_task_member = {tyjob.leader_role: 1}
        if min_member is not None and min_member < 0:
            L.problem(f"{p}.minMember", "must not be negative")
        sub_groups = []
        for s, sg in enumerate(L.items(j.get("subGroups"), f"{p}.subGroups")):
            if isinstance(sg, dict) and sg.get("name"):
                sub_groups.append(SubGroupSpec(str(sg["name"]), L.integer(sg.get("minMember"), f"{p}.subGroups[{s}].minMember", 0), sg.get("topology") or {}))
            else:
                L.problem(f"{p}.subGroups[{s}].name", "required")
        min_resources = j.get("minResources")
        jobs.append(
            JobSpec(
                uid=uid,
                name=name,
                namespace=namespace,
                queue=queue,
                tasks=tasks,
                min_member=min_member,
                min_task_member={str(r): L.integer(v, f"{p}.minTaskMember.{r}") for r, v in min_task_member.items()},  # noqa: E501
                min_resources=L.resources(min_resources, f"{p}.minResources") if min_resources is not None else None,
                priority=priority,
                priority_class=str(pclass or ""),
                preemptible=j.get("preemptible"),
                phase=_phase(L, j.get("phase"), f"{p}.phase"),
                sub_groups=sub_groups,
                topology=j.get("topology") or {},
                network_topology=j.get("networkTopology") or {},
                annotations=L.string_map(j.get("annotations"), f"{p}.annotations"),
                stale_seconds=L.duration(j.get("staleFor"), f"{p}.staleFor"),
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
        member_nodes = [str(x) for x in L.items(members.get("nodes"), f"{p}.members.nodes")]
        member_hypernodes = [str(x) for x in L.items(members.get("hypernodes"), f"{p}.members.hypernodes")]
        for k, nname in enumerate(member_nodes):
            if nname not in seen_nodes:
                L.problem(f"{p}.members.nodes[{k}]", f"node {nname!r} does not exist")
        if not h.get("name"):
            L.problem(f"{p}.name", "required")
        hypernodes.append(
            HyperNodeSpec(str(h.get("name", "")), L.integer(h.get("tier"), f"{p}.tier", 1), member_nodes, member_hypernodes)
        )
    known_hn = {h.name for h in hypernodes}
    for i, h in enumerate(hypernodes):
        for k, child in enumerate(h.hypernodes):
            if child not in known_hn:
                L.problem(f"hypernodes[{i}].members.hypernodes[{k}]", f"hypernode {child!r} does not exist")
    children = {h.name: h.hypernodes for h in hypernodes}
    for i, h in enumerate(hypernodes):
        # A hypernode may not contain itself, directly or through its members.
        stack, seen = list(h.hypernodes), set()
        while stack:
            member = stack.pop()
            if member == h.name:
                L.problem(f"hypernodes[{i}].members", f"hypernode {h.name!r} contains itself")
                break
            if member not in seen:
                seen.add(member)
                stack.extend(children.get(member, []))
    topologies = raw.get("topologies") or []
    if not isinstance(topologies, list):
        L.problem("topologies", "must be a list")
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
    )
    return Scenario(str(raw.get("name") or ""), config, snapshot, cycles)


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
                    L.problem(path, f"node {node!r} has no device {dev!r}")
                elif (node, dev) in holder:
                    L.problem(path, f"device {dev!r} of node {node!r} is already held by {holder[node, dev]}")
                else:
                    holder[node, dev] = task.uid


def parse_scenario_text(text: str) -> Scenario:
    try:
        raw = yamldoc.load(text)  # JSON is YAML
    except ValueError as exc:
        raise ScenarioError([f"scenario: {exc}"]) from None
    return load_scenario(raw)
