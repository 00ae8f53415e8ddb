"""Configurations and scenarios are validated as data: whatever a field holds (a list where a name
belongs, a mapping, a negative, a huge number, null ...), parsing either succeeds or raises
ConfigError / ScenarioError naming the field, never another exception (which the server would
answer as INTERNAL).

Each test takes a valid document and, for every path in it (leaves and subtrees), replaces the
value there with each of a few wrong values. A scenario that still parses is also run, as
``Simulate`` would.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from muster import yamldoc
from server.config import ConfigError, parse_config
from server.simulate.run import run_scenario
from server.simulate.scenario import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parents[2]
WRONG: list[Any] = [[], {}, -1, "x", None, {"a": 1}, ["x"], 1e308, True, 10**30, float("inf")]

# Every Volcano plugin and action with its arguments, every top-level field.
VOLCANO_CONFIG = """
actions: "enqueue, allocate, preempt, reclaim, backfill"
extension_points_not_listed: enabled
tiers:
- plugins:
  - {name: priority}
  - {name: gang, enablePreemptable: false, enableJobStarving: true}
  - {name: conformance}
  - {name: sla, arguments: {sla-waiting-time: 1h}}
  - {name: tdm, arguments: {tdm.revocable-zone.rz1: "0:00-23:59", tdm.evict.period: 1m}}
- plugins:
  - {name: overcommit, arguments: {overcommit-factor: 1.2}}
  - {name: drf, enableHierarchy: false, arguments: {drf.namespace.order: false}}
  - {name: predicates, arguments: {predicate.GPUSharingEnable: false, predicate.resources.nvidia.com/gpu: true}}
  - {name: proportion}
  - {name: capacity, arguments: {ancestorReclaimLevel: 0}}
  - name: nodeorder
    arguments: {leastrequested.weight: 1, mostrequested.weight: 0, nodeaffinity.weight: 2, podaffinity.weight: 2}
  - name: binpack
    arguments: {binpack.weight: 1, binpack.cpu: 1, binpack.resources: nvidia.com/gpu, binpack.resources.nvidia.com/gpu: 2}
  - {name: network-topology-aware, arguments: {weight: 1, hypernode.binpack.normal-pod.fading: 0.8}}
  - {name: task-topology, arguments: {task-topology.weight: 1}}
  - {name: fgd, arguments: {fgd.weight: 1, fgd.popularityThreshold: 0.5, fgd.memory: false}}
  - {name: tyarranger, arguments: {tyarranger.weight: 1000, tyarranger.leaderFirst.raisedWeight: 5}}
configurations:
- name: preempt
  arguments: {enableTopologyAwarePreemption: false, minCandidateNodesPercentage: 10}
- name: allocate
  arguments: {predicateErrorCacheEnable: true}
action_arguments:
  reclaim: {predicateErrorCacheEnable: true}
session:
  gangAcrossBackends: false
  globalDefaultStalenessGracePeriod: 60s
  maxNumberConsolidationPreemptees: 16
priorityClasses:
- {name: high, value: 1000, preemptionPolicy: PreemptLowerPriority, globalDefault: false, description: urgent}
"""

# Every scenario field, at least once.
SCENARIO = """
name: every field
config:
  cycles: 2
  actions: "enqueue, allocate, preempt, backfill"
  tiers:
  - plugins: [{name: priority}, {name: gang}, {name: conformance}, {name: tyarranger}]
  - plugins:
    - {name: drf}
    - {name: predicates}
    - {name: proportion}
    - {name: nodeorder}
    - {name: network-topology-aware}
priorityClasses:
- {name: low, value: 10}
topologies: [{name: dc, levels: [zone, rack]}]
hypernodes:
- {name: rack-a, tier: 1, members: {nodes: [n1, n2]}}
- {name: zone-1, tier: 2, members: {hypernodes: [rack-a]}}
nodes:
- name: n1
  allocatable: {cpu: "8", memory: 32Gi, pods: 110}
  labels: {zone: z1, rack: r1}
  taints: [{key: dedicated, value: ml, effect: NoSchedule}]
  unschedulable: false
- name: n2
  allocatable: {cpu: "8", memory: 32Gi}
  labels: {zone: z1, rack: r2}
  devices:
  - {id: gpu-0, type: nvidia.com/gpu, group: "0", healthy: true}
  - {id: gpu-1, type: nvidia.com/gpu, group: "0"}
queues:
- name: ml
  parent: root
  weight: 2
  guarantee: {cpu: "1"}
  deserved: {cpu: "8"}
  capability: {cpu: "16"}
  priority: 1
  reclaimable: true
  state: Open
  annotations: {team: ml}
- {name: web, parent: ml, weight: 1}
jobs:
- name: train
  namespace: team-a
  queue: ml
  minMember: 2
  minTaskMember: {worker: 2}
  minResources: {cpu: "2"}
  priority: 5
  priorityClass: low
  preemptible: true
  phase: Inqueue
  staleFor: 90s
  subGroups: [{name: g1, minMember: 1, topology: {topology: dc, requiredLevel: rack}}]
  topology: {topology: dc, requiredLevel: zone, preferredLevel: rack}
  networkTopology: {mode: hard, highestTierAllowed: 2}
  annotations: {owner: alice}
  tasks:
  - name: w0
    role: worker
    subGroup: g1
    request: {cpu: "1", memory: 1Gi}
    priority: 5
    preemptable: true
    preemptionPolicy: PreemptLowerPriority
    labels: {app: train}
    annotations: {note: first}
    nodeSelector: {zone: z1}
    tolerations: [{key: dedicated, operator: Equal, value: ml, effect: NoSchedule, tolerationSeconds: 10}]
    affinity:
      nodeAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
          nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [z1]}]}]
        preferredDuringSchedulingIgnoredDuringExecution:
        - {weight: 1, preference: {matchExpressions: [{key: rack, operator: In, values: [r1]}]}}
      podAntiAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
        - {labelSelector: {matchLabels: {app: web}}, topologyKey: kubernetes.io/hostname, namespaces: [team-b]}
        preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 10
          podAffinityTerm: {labelSelector: {matchExpressions: [{key: app, operator: Exists}]}, topologyKey: zone}
  - {name: w1, role: worker, request: {cpu: "1", nvidia.com/gpu: 1}, status: Running, node: n2, devices: [gpu-0],
     gpu_groups: ["0"]}
  - {name: w2, role: worker, request: {cpu: "1", nvidia.com/gpu: 1}, gpu_fraction: 0.5}
- name: ppo
  namespace: rl
  queue: web
  leaderRole: leader
  minWorkersNum: 1
  restartLimit: 3
  cleanPodPolicy: All
  schedulerPolicy: {jobQueuePolicy: Priority, basicPolicy: LeaderFirst}
  tasks:
  - {name: ppo-leader, role: leader, request: {cpu: "1"}}
  - {name: ppo-actor-0, role: actor, request: {cpu: "1"}}
"""


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path in ``doc``: the root, each mapping value and each list entry, recursively."""
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from paths(value, (*prefix, i))


def replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return copy.deepcopy(value)
    out = copy.deepcopy(doc)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = copy.deepcopy(value)
    return out


def mutations(doc: Any) -> Iterator[tuple[str, Any]]:
    for path in paths(doc):
        for value in WRONG:
            yield (
                f"{'.'.join(map(str, path)) or '(root)'} = {value!r:.30}",
                replaced(doc, path, value),
            )


def config_documents() -> list[tuple[str, Any]]:
    return [
        ("volcano", yamldoc.load(VOLCANO_CONFIG)),
        *(
            (p.name, yamldoc.load(p.read_text()))
            for p in sorted((ROOT / "examples").glob("config-*.yaml"))
        ),
    ]


def test_the_documents_are_valid() -> None:
    for _, doc in config_documents():
        parse_config(doc)
    run_scenario(load_scenario(yamldoc.load(SCENARIO)))


@pytest.mark.parametrize(
    ("name", "doc"), config_documents(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_a_wrong_value_anywhere_in_a_config_is_a_config_error(name: str, doc: Any) -> None:
    escaped = []
    for where, mutated in mutations(doc):
        try:
            parse_config(mutated)
        except ConfigError:
            pass
        except Exception as exc:  # noqa: BLE001 - what the test looks for
            escaped.append(f"{where}: {type(exc).__name__}: {exc}")
    assert escaped == []


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on an unlimited (-1) guarantee
def test_a_wrong_value_anywhere_in_a_scenario_is_a_scenario_error() -> None:
    escaped = []
    unnamed = []  # problems that do not name their field
    for where, mutated in mutations(yamldoc.load(SCENARIO)):
        try:
            scenario = load_scenario(mutated)
        except ScenarioError as exc:
            unnamed += [f"{where}: {line}" for line in exc.problems if ": " not in line]
            continue
        except Exception as exc:  # noqa: BLE001 - what the test looks for
            escaped.append(f"parse {where}: {type(exc).__name__}: {exc}")
            continue
        try:
            run_scenario(scenario, 1)  # what Simulate does with it
        except Exception as exc:  # noqa: BLE001 - what the test looks for
            escaped.append(f"run {where}: {type(exc).__name__}: {exc}")
    assert unnamed == []
    assert escaped == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("profile: []", "config.profile: [] is not volcano or kai"),
        ("profile: {a: 1}", "config.profile: {'a': 1} is not volcano or kai"),
        (
            "configurations: [{name: preempt, arguments: -1}]",
            "config.configurations[0].arguments: must be a mapping",
        ),
        (
            "configurations: [{name: preempt, arguments: [x]}]",
            "config.configurations[0].arguments: must be a mapping",
        ),
        ("configurations: [{name: nope}]", "config.configurations[0].name: unknown action 'nope'"),
        ("configurations: [x]", "config.configurations[0]: must be a mapping"),
        (
            "tiers: [{plugins: [{name: binpack, arguments: {1: 2}}]}]",
            "config.tiers[0].plugins[0].arguments.1: an argument name must be a string",
        ),
        (
            "tiers: [{plugins: [{name: binpack, arguments: {binpack.weight: .inf}}]}]",
            "binpack.weight: inf is not a finite number",
        ),
        (
            "session: {globalDefaultStalenessGracePeriod: 99999999999999999999h}",
            "is not a duration",
        ),
        (
            "priorityClasses: [{name: a, value: 1, globalDefault: x}]",
            "config.priorityClasses[0].globalDefault: 'x' is not a boolean",
        ),
        (
            "priorityClasses: [{name: a, value: 4294967296}]",
            "config.priorityClasses[0].value: 4294967296 is not a 32-bit integer",
        ),
    ],
)
def test_wrong_types_in_a_config_name_the_field(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(yamldoc.load(text))
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"node": []}, "jobs[0].tasks[0].node: must be a string"),
        ({"role": {"a": 1}}, "jobs[0].tasks[0].role: must be a string"),
        (
            {"affinity": {"nodeAffinity": []}},
            "jobs[0].tasks[0].affinity.nodeAffinity: must be a mapping",
        ),
        ({"labels": {"app": ["x"]}}, "jobs[0].tasks[0].labels.app: must be a string"),
        (
            {"preemptionPolicy": ["x"]},
            "jobs[0].tasks[0].preemptionPolicy: ['x'] is not PreemptLowerPriority or Never",
        ),
    ],
)
def test_wrong_types_in_a_scenario_name_the_field(change: dict[str, Any], message: str) -> None:
    doc = {
        "nodes": [{"name": "n1", "allocatable": {"cpu": "1"}}],
        "jobs": [{"name": "j", "tasks": [{"name": "t", "request": {"cpu": "1"}, **change}]}],
    }
    with pytest.raises(ScenarioError) as err:
        load_scenario(doc)
    assert message in err.value.problems


def test_a_queue_weight_past_the_bound_is_refused() -> None:
    doc = {"queues": [{"name": "q", "weight": 10**30}]}
    with pytest.raises(ScenarioError, match=r"queues\[0\].weight: .* is more than"):
        load_scenario(doc)
