"""Scenario builders for the core tests: one builder per thing, keyword parameters for the variations.

The same cluster is written in one of two forms:

* model objects, for tests that open a ``Session`` or run ``SchedulerCore`` themselves:
  ``node``, ``task``, ``job``, ``queue``, ``snapshot``, then ``session`` / ``cycle``;
* scenario documents (what ``muster simulate`` reads), for tests that run whole cycles the way
  Volcano's ``uthelper.TestCommonStruct`` cases do: ``scenario_node``, ``scenario_queue``, ``pod``,
  ``pg``, ``plugin``, ``config``, then ``simulate`` (or ``simulate_yaml`` for YAML text).

Amounts are written as in scenario YAML: Kubernetes quantities ("500m", "4Gi") or plain numbers in
cores / bytes / counts; ``res`` writes a resource list, and the model builders parse it into
canonical units (millicores, bytes) with ``muster.quantity.parse_resources``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import EllipsisType, ModuleType
from typing import Any

import yaml

from muster.quantity import parse_resources
from server.config import load_config
from server.model import (
    ClusterSnapshot,
    CycleResult,
    JobSpec,
    NodeSpec,
    PodGroupPhase,
    QueueSpec,
    Taint,
    TaskSpec,
    TaskStatus,
)
from server.scheduler import SchedulerCore
from server.session.session import Session
from server.simulate import simulate_text

ROOT = Path(__file__).resolve().parents[2]
NS = "ns"  # namespace of the model builders
SCENARIO_NS = "c1"  # namespace of the scenario builders (Volcano's test namespace)

Quantities = Mapping[str, str | int | float]


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` (a script, not in a package) as the module ``bench_<name>``."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def res(
    cpu: str | float | None = None, memory: str | float | None = None, **scalars: Any
) -> dict[str, Any]:
    """A resource list like Volcano's ``BuildResourceList``: unset (None or "") amounts are left
    out; in a scalar's keyword ``__`` stands for "/" and ``_`` for "." (``nvidia_com__gpu=1``)."""
    out: dict[str, Any] = {}
    if cpu is not None and cpu != "":
        out["cpu"] = cpu
    if memory is not None and memory != "":
        out["memory"] = memory
    out.update({k.replace("__", "/").replace("_", "."): v for k, v in scalars.items()})
    return out


def _parse(quantities: Quantities | None, **options: bool) -> dict[str, float]:
    return parse_resources(quantities or {}, **options)


# -- model objects ------------------------------------------------------------------------------


def node(
    name: str,
    cpu: str | None = "4",
    memory: str | None = "8Gi",
    *,
    labels: dict[str, str] | None = None,
    taints: list[Taint] | None = None,
    **extra: Any,
) -> NodeSpec:
    """A node whose allocatable is cpu, memory (None: left out) and ``extra`` (pods, scalars)."""
    return NodeSpec(
        name, _parse({**res(cpu, memory), **extra}), labels=labels or {}, taints=taints or []
    )


def task(
    name: str,
    job: str | None = None,
    request: Quantities | None = None,
    node: str | None = None,
    *,
    ns: str = NS,
    status: TaskStatus | None = None,
    uid: str | None = None,
    **fields: Any,
) -> TaskSpec:
    """Task ``ns/name`` of job ``ns/job`` (none: a foreign task); a node without a status means
    Running there."""
    if status is None:
        status = TaskStatus.RUNNING if node else TaskStatus.PENDING
    return TaskSpec(
        uid=uid or f"{ns}/{name}",
        name=name,
        namespace=ns,
        job=f"{ns}/{job}" if job else "",
        request=_parse(request),
        status=status,
        node=node,
        **fields,
    )


def job(
    name: str,
    n: int = 1,
    cpu: str | None = "1",
    *,
    memory: str | None = "1Gi",
    ns: str = NS,
    queue: str = "default",
    tasks: list[TaskSpec] | None = None,
    status: TaskStatus | Sequence[TaskStatus] = TaskStatus.PENDING,
    nodes: str | Sequence[str | None] | None = None,
    roles: Sequence[str] | None = None,
    task_index: int | None = None,
    min_member: int | None | EllipsisType = ...,
    priority: int = 0,
    phase: PodGroupPhase = PodGroupPhase.INQUEUE,
    index: int = 0,
    **fields: Any,
) -> JobSpec:
    """Job ``ns/name`` (its PodGroup), created ``index``-th.

    Its tasks are ``tasks`` or else ``n`` alike tasks ``name-0`` .. ``name-<n-1>`` asking for
    ``cpu`` and ``memory`` (None: left out), of the job's priority, with ``status`` (one for all, or
    one per task: then their number is the task count), ``nodes`` (one per task, or one node for
    every task that is not Pending), ``roles`` (one per task), and creation index ``task_index``
    (one for all; None: counting up from ``index * 100``).

    ``min_member``: by default the task count; None leaves it unset (the model's "every task").
    ``fields``: other ``JobSpec`` fields (min_resources, a resource list; annotations ...).
    """
    if tasks is None:
        statuses = [status] * n if isinstance(status, TaskStatus) else list(status)
        tasks = []
        for i, s in enumerate(statuses):
            if isinstance(nodes, str):
                where = None if s == TaskStatus.PENDING else nodes
            else:
                where = nodes[i] if nodes else None
            tasks.append(
                TaskSpec(
                    uid=f"{ns}/{name}-{i}",
                    name=f"{name}-{i}",
                    namespace=ns,
                    job=f"{ns}/{name}",
                    request=_parse(res(cpu, memory)),
                    status=s,
                    node=where,
                    priority=priority,
                    role=roles[i] if roles else "",
                    creation_index=index * 100 + i if task_index is None else task_index,
                )
            )
    if fields.get("min_resources") is not None:
        fields["min_resources"] = _parse(fields["min_resources"])
    return JobSpec(
        f"{ns}/{name}",
        name,
        ns,
        queue,
        tasks,
        min_member=len(tasks) if min_member is ... else min_member,
        priority=priority,
        phase=phase,
        creation_index=index,
        **fields,
    )


def queue(
    name: str,
    deserved: Quantities | None = None,
    capability: Quantities | None = None,
    *,
    guarantee: Quantities | None = None,
    **fields: Any,
) -> QueueSpec:
    """A queue; deserved, capability and guarantee are resource lists (``res``)."""
    return QueueSpec(
        name,
        deserved=_parse(deserved),
        capability=_parse(capability, allow_unlimited=True),
        guarantee=_parse(guarantee),
        **fields,
    )


def snapshot(
    nodes: Sequence[NodeSpec],
    jobs: Sequence[JobSpec],
    queues: Sequence[QueueSpec] | None = None,
    **fields: Any,
) -> ClusterSnapshot:
    """The cluster; without queues, one queue "default"."""
    return ClusterSnapshot(
        nodes=list(nodes),
        queues=list(queues) if queues else [QueueSpec("default")],
        jobs=list(jobs),
        **fields,
    )


def scheduler_config(config: str | Mapping[str, Any]) -> Any:
    """A scheduler configuration from YAML text or a ``config`` dict."""
    if isinstance(config, str):
        return load_config(config)
    return load_config(yaml.safe_dump(dict(config), sort_keys=False))


def session(snap: ClusterSnapshot, config: str | Mapping[str, Any]) -> Session:
    """An open session (cycle 1) of ``snap`` under ``config`` (YAML text or a ``config`` dict)."""
    return Session(snap, scheduler_config(config), 1)


def cycle(snap: ClusterSnapshot, config: str | Mapping[str, Any]) -> CycleResult:
    """One scheduling cycle (cycle 1) of ``snap``: what ``SchedulerCore`` decides."""
    return SchedulerCore(scheduler_config(config)).run_cycle(snap, 1)


# -- scenario documents -------------------------------------------------------------------------

# Volcano's test priority classes.
# The default configuration's tiers without overcommit (whose admission would leave out jobs that
# preempt and reclaim should see): what the tests of several actions run with.
PREEMPT_TIERS = """\
tiers:
- plugins:
  - name: priority
  - name: gang
  - name: conformance
- plugins:
  - name: drf
  - name: predicates
  - name: proportion
  - name: nodeorder
  - name: binpack
"""

PRIORITY_CLASSES = [
    {"name": "high-priority", "value": 100000},
    {"name": "low-priority", "value": 10},
]


def scenario_node(
    name: str,
    allocatable: Mapping[str, Any],
    *,
    pods: int = 10,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A node with ``allocatable`` (``res``) and room for ``pods`` pods."""
    return {"name": name, "allocatable": {**allocatable, "pods": pods}, "labels": labels or {}}


def scenario_queue(
    name: str,
    deserved: Mapping[str, Any] | None = None,
    capability: Mapping[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A queue; only what is given is written (weight, parent, guarantee, priority, state ...)."""
    q: dict[str, Any] = {"name": name, **fields}
    if deserved:
        q["deserved"] = deserved
    if capability:
        q["capability"] = capability
    return q


def pod(
    name: str,
    request: Mapping[str, Any] | None,
    node: str | None = None,
    *,
    preemptable: bool = True,
    priority: int | None = 1,
    selector: dict[str, str] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A task asking for ``request`` (``res``); a node means Running there (unless ``status`` is
    given). Volcano gives a pod without priority the value 1; None leaves it to the job's."""
    t: dict[str, Any] = {
        "name": name,
        "request": dict(request or {}),
        "preemptable": preemptable,
        **fields,
    }
    if priority is not None:
        t["priority"] = priority
    if node is not None:
        t.setdefault("status", "Running")
        t["node"] = node
    if selector:
        t["nodeSelector"] = selector
    return t


def pg(
    name: str,
    queue: str,
    min_member: int,
    tasks: list[dict[str, Any]],
    *,
    phase: str = "Inqueue",
    ns: str = SCENARIO_NS,
    priority_class: str | None = None,
    min_resources: Mapping[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A job (PodGroup) with its pods."""
    j: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "queue": queue,
        "minMember": min_member,
        "phase": phase,
        "tasks": tasks,
        **fields,
    }
    if priority_class:
        j["priorityClass"] = priority_class
    if min_resources is not None:
        j["minResources"] = min_resources
    return j


def plugin(
    name: str, *switches: str, arguments: dict[str, Any] | None = None, **switch_values: bool
) -> dict[str, Any]:
    """A tier entry: the named switches on, ``switch_values`` as given."""
    p: dict[str, Any] = {"name": name, **dict.fromkeys(switches, True), **switch_values}
    if arguments:
        p["arguments"] = arguments
    return p


def config(
    actions: list[str] | None,
    tiers: list[list[dict[str, Any]]],
    *,
    listed_only: bool = True,
    action_arguments: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A scheduler configuration (actions None: the default ones). ``listed_only``: only the
    switches written are on (the way Volcano's test tiers are built)."""
    out: dict[str, Any] = {} if actions is None else {"actions": actions}
    out["tiers"] = [{"plugins": t} for t in tiers]
    out["extension_points_not_listed"] = "disabled" if listed_only else "enabled"
    if action_arguments:
        out["action_arguments"] = action_arguments
    return out


def simulate(
    scheduler: Mapping[str, Any],
    nodes: list[dict[str, Any]],
    queues: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    *,
    priority_classes: list[dict[str, Any]] | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """Run one scenario (``muster simulate``) under the ``scheduler`` configuration (``config``);
    returns its output object."""
    scenario: dict[str, Any] = {"config": dict(scheduler)}
    if priority_classes is not None:
        scenario["priorityClasses"] = priority_classes
    scenario.update(nodes=nodes, queues=queues, jobs=jobs, **sections)
    return simulate_text(json.dumps(scenario))


def simulate_yaml(*parts: str) -> dict[str, Any]:
    """Run a scenario written as YAML text, each part dedented on its own."""
    return simulate_text("".join(textwrap.dedent(p) for p in parts))


def evicted(result: dict[str, Any]) -> set[str]:
    return set(result["evictions"])


def uid(name: str, ns: str = SCENARIO_NS) -> str:
    return f"{ns}/{name}"
