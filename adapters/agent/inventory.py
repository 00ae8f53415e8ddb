"""Inventory files of the fake bare-metal agent: the nodes it pretends to own.

Format (YAML)::

    nodes:
      - name: a-1
        cpu: 4                 # cores (a quantity: 4, "3500m")
        memory: 16Gi
        gpus: 2                # nvidia.com/gpu, also exposed as devices "0", "1"
        labels: {zone: a}
        taints: [{key: dedicated, value: ml, effect: NoSchedule}]
        resources: {pods: 110, huawei.com/Ascend910: 8}   # any other resources; a device resource
                               # without a devices list gets ids Ascend910-0 .. (rings 0-3, 4-7)
        devices:               # optional: the devices one by one (they count towards their type)
          - {id: Ascend910-0, type: huawei.com/Ascend910, group: "0", healthy: true}
        unschedulable: false
      - name: b                # `count` stamps out b-0, b-1, b-2 with the same shape
        count: 3
        cpu: 8

Errors are :class:`InventoryError` naming the field (``nodes[1].cpu: "4x" is not a quantity``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from muster.devices import NVIDIA_GPU as GPU
from muster.devices import UNIT, Device, default_devices, device_count_problem, is_device_resource
from muster.quantity import QuantityError, format_resources, parse_resources
from muster.v1 import muster_pb2 as pb
from muster.yamldoc import DocumentError, load

_NODE_KEYS = {
    "name",
    "count",
    "cpu",
    "memory",
    "gpus",
    "labels",
    "taints",
    "resources",
    "unschedulable",
    "devices",
}
_DEVICE_KEYS = {"id", "type", "group", "healthy"}
_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}


class InventoryError(ValueError):
    """A malformed inventory; the message names the field."""


@dataclass(slots=True)
class InventoryNode:
    name: str
    allocatable: dict[str, float]  # canonical units
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[tuple[str, str, str]] = field(default_factory=list)
    unschedulable: bool = False
    devices: list[Device] = field(default_factory=list)

    def to_proto(self, backend: str = "") -> pb.Node:
        return pb.Node(
            name=self.name,
            backend=backend,
            allocatable=pb.ResourceList(quantities=format_resources(self.allocatable)),
            labels=self.labels,
            taints=[pb.Taint(key=k, value=v, effect=e) for k, v, e in self.taints],
            unschedulable=self.unschedulable,
            devices=[
                pb.Device(id=d.id, type=d.type, group=d.group, healthy=d.healthy)
                for d in self.devices
            ],
        )


def load_inventory(path: str | Path) -> list[InventoryNode]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InventoryError(f"{path}: {exc.strerror or exc}") from None
    return parse_inventory(text)


def parse_inventory(text: str) -> list[InventoryNode]:
    try:
        doc = load(text)
    except DocumentError as exc:
        raise InventoryError(str(exc)) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise InventoryError("nodes: expected a list of nodes")
    nodes: list[InventoryNode] = []
    for i, entry in enumerate(doc["nodes"]):
        nodes.extend(_parse_node(entry, f"nodes[{i}]"))
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise InventoryError(f"nodes: duplicate node name {node.name!r}")
        seen.add(node.name)
    return nodes


def _parse_node(entry: Any, where: str) -> list[InventoryNode]:
    if not isinstance(entry, dict):
        raise InventoryError(f"{where}: expected a mapping")
    unknown = set(entry) - _NODE_KEYS
    if unknown:
        raise InventoryError(f"{where}.{sorted(unknown)[0]}: unknown field")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise InventoryError(f"{where}.name: required, a non-empty string")
    quantities: dict[str, Any] = {}
    extra = entry.get("resources") or {}
    if not isinstance(extra, dict):
        raise InventoryError(f"{where}.resources: expected a mapping of resource name to quantity")
    for key, value in extra.items():
        quantities[str(key)] = value
    for key in ("cpu", "memory"):
        if key in entry:
            quantities[key] = entry[key]
    gpus = entry.get("gpus", 0)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
        raise InventoryError(f"{where}.gpus: expected a whole number >= 0")
    if gpus:
        quantities[GPU] = gpus
    try:
        allocatable = parse_resources(quantities)
    except QuantityError as exc:
        field_name = str(exc).split(":", 1)[0]
        prefix = f"{where}.resources" if field_name not in ("cpu", "memory") else where
        raise InventoryError(f"{prefix}.{exc}") from None
    labels = entry.get("labels") or {}
    if not isinstance(labels, dict):
        raise InventoryError(f"{where}.labels: expected a mapping")
    taints = []
    for j, taint in enumerate(entry.get("taints") or []):
        if not isinstance(taint, dict) or not taint.get("key"):
            raise InventoryError(f"{where}.taints[{j}].key: required")
        effect = str(taint.get("effect", "NoSchedule"))
        if effect not in _EFFECTS:
            raise InventoryError(
                f"{where}.taints[{j}].effect: {effect!r} is not one of {sorted(_EFFECTS)}"
            )
        taints.append((str(taint["key"]), str(taint.get("value", "")), effect))
    devices = _parse_devices(entry.get("devices"), f"{where}.devices")
    listed = Counter(d.type for d in devices)
    for res, n in listed.items():  # listed devices are what the node has of their resource
        allocatable[res] = n * UNIT
    too_many = device_count_problem(allocatable, listed.elements())
    if too_many is not None:
        field_name, message = too_many
        if field_name.startswith("allocatable."):
            res = field_name.removeprefix("allocatable.")
            field_name = "gpus" if res == GPU and gpus else f"resources.{res}"
        raise InventoryError(f"{where}.{field_name}: {message}")
    for res, value in sorted(allocatable.items()):
        if res not in listed and is_device_resource(res) and value >= UNIT:
            devices += default_devices(res, int(value // UNIT))
    count = entry.get("count")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise InventoryError(f"{where}.count: expected a whole number >= 1")
    names = [name] if count is None else [f"{name}-{k}" for k in range(count)]
    return [
        InventoryNode(
            name=n,
            allocatable=dict(allocatable),
            labels={str(k): str(v) for k, v in labels.items()},
            taints=list(taints),
            unschedulable=bool(entry.get("unschedulable", False)),
            devices=list(devices),
        )
        for n in names
    ]


def _parse_devices(raw: Any, where: str) -> list[Device]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InventoryError(f"{where}: expected a list of devices")
    out: list[Device] = []
    ids: set[str] = set()
    for i, d in enumerate(raw):
        p = f"{where}[{i}]"
        if not isinstance(d, dict):
            raise InventoryError(f"{p}: expected a mapping")
        unknown = set(d) - _DEVICE_KEYS
        if unknown:
            raise InventoryError(f"{p}.{sorted(unknown)[0]}: unknown field")
        if d.get("id") in (None, ""):
            raise InventoryError(f"{p}.id: required")
        if not isinstance(d.get("type"), str) or not is_device_resource(d["type"]):
            raise InventoryError(
                f"{p}.type: required, a device resource such as nvidia.com/gpu or huawei.com/Ascend910"
            )
        healthy = d.get("healthy", True)
        if not isinstance(healthy, bool):
            raise InventoryError(f"{p}.healthy: expected true or false")
        if str(d["id"]) in ids:
            raise InventoryError(f"{p}.id: duplicate device {d['id']!r}")
        ids.add(str(d["id"]))
        out.append(Device(str(d["id"]), d["type"], str(d.get("group", "") or ""), healthy))
    return out
