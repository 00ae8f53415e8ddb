"""Accelerator devices (GPUs, NPU chips): which resources are counted in devices with ids, and the
ids a node has when it does not list them. Shared by the server and every backend."""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Resources whose units are whole devices with ids. vNPU resources (``huawei.com/Ascend910-2c``)
# are plain counts: they have no ids.
DEVICE_RESOURCE = re.compile(
    r"^(?:nvidia\.com/gpu|amd\.com/gpu|intel\.com/gpu|huawei\.com/Ascend\d+[A-Za-z]*)$"
)
NVIDIA_GPU = "nvidia.com/gpu"
ASCEND910 = "huawei.com/Ascend910"
UNIT = 1000.0  # canonical milli-units per device (``muster.quantity``)
# The most devices of one device resource a node may have (counted or listed): a node declaring
# more is refused where it enters (API, scenario, agent inventory), and nothing makes up more
# device ids than this for a node (``default_devices``).
MAX_DEVICES_PER_NODE = 1024
# The environment variable through which each kind of device is handed to a process.
VISIBLE_DEVICES_ENV = {
    "nvidia.com/gpu": "CUDA_VISIBLE_DEVICES",
    "amd.com/gpu": "ROCR_VISIBLE_DEVICES",
}
ASCEND_VISIBLE_DEVICES = "ASCEND_VISIBLE_DEVICES"


def is_device_resource(name: str) -> bool:
    return DEVICE_RESOURCE.match(name) is not None


def device_needs(request: Mapping[str, float]) -> dict[str, int]:
    """Whole devices a request (canonical units) asks for, per device resource (a fractional GPU
    share has no id)."""
    needs: dict[str, int] = {}
    for name, value in request.items():
        if value > 0 and is_device_resource(name):
            count = value / UNIT
            if count == int(count):
                needs[name] = int(count)
    return needs


@dataclass(frozen=True, slots=True)
class Device:
    id: str
    type: str
    group: str = ""
    healthy: bool = True


def device_count_problem(
    allocatable: Mapping[str, float], device_types: Iterable[str] = ()
) -> tuple[str, str] | None:
    """(field, message) when a node has more than MAX_DEVICES_PER_NODE devices of one device
    resource: listed (``device_types``, one entry per listed device), or, for a device resource it
    lists none of, counted in ``allocatable`` (canonical units). The field is relative to the node:
    ``devices`` or ``allocatable.nvidia.com/gpu``. None when every count is within the bound."""
    listed = Counter(device_types)
    for kind, count in listed.items():
        if count > MAX_DEVICES_PER_NODE:
            return (
                "devices",
                f"{count} devices of type {kind} are more than a node may have "
                f"({MAX_DEVICES_PER_NODE} per device resource)",
            )
    for name, value in allocatable.items():
        if name not in listed and is_device_resource(name) and value / UNIT > MAX_DEVICES_PER_NODE:
            return (
                f"allocatable.{name}",
                f"{value / UNIT:.15g} devices are more than a node may have ({MAX_DEVICES_PER_NODE} per device resource)",
            )
    return None


def default_devices(resource: str, count: int) -> list[Device]:
    """The devices of a node that lists none: ``0 .. N-1``; Ascend chips ``Ascend910-<i>`` in HCCS
    rings of four (chips 0-3 ring "0", 4-7 ring "1", as on a 910 x8 module). A new list each call;
    the devices (immutable) are shared between nodes of the same kind. At most
    MAX_DEVICES_PER_NODE (a larger count, refused where nodes enter, never enumerates per unit)."""
    return list(_default_devices(resource, max(0, min(count, MAX_DEVICES_PER_NODE))))


def devices_by_resource(
    listed: Iterable[Device], allocatable: Mapping[str, float]
) -> dict[str, list[Device]]:
    """Per device resource, a node's devices: those it lists, in listing order, else (a device
    resource it has but lists none of) :func:`default_devices`, as many as it has whole."""
    out: dict[str, list[Device]] = {}
    for d in listed:
        if d.type:
            out.setdefault(d.type, []).append(d)
    for name, value in allocatable.items():
        if name not in out and is_device_resource(name) and value >= UNIT:
            # (min first: int() of an infinite count would raise)
            out[name] = default_devices(name, int(min(value, MAX_DEVICES_PER_NODE * UNIT) // UNIT))
    return out


@functools.lru_cache(maxsize=256)
def _default_devices(resource: str, count: int) -> tuple[Device, ...]:
    if resource.startswith("huawei.com/Ascend"):
        prefix = resource.split("/", 1)[1]
        return tuple(Device(f"{prefix}-{i}", resource, str(i // 4)) for i in range(count))
    return tuple(Device(str(i), resource) for i in range(count))


def shared_gpu(
    gpu_group: str, devices: Iterable[str], gpu_fraction: float
) -> tuple[str, list[str]]:
    """(the GPU a task shares, the devices it holds whole) of a bind, a backend's task or a stored
    task. Before ``gpu_group`` existed, a fractional task's shared GPU was the one entry of
    ``devices`` (such a task holds no whole device): decisions, records and backends of that time
    still say it so, and are read here as if they named ``gpu_group``."""
    held = list(devices)
    if gpu_fraction and not gpu_group and len(held) == 1:
        return held[0], []
    return gpu_group, held


def chip_number(device_id: str) -> int | None:
    """The number at the end of a chip id (``Ascend910-5`` -> 5), None when there is none."""
    tail = device_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def visible_devices_env(devices: list[Device]) -> dict[str, str]:
    """Environment variables that hand ``devices`` to a process: CUDA_VISIBLE_DEVICES for NVIDIA
    GPUs (their ids), ASCEND_VISIBLE_DEVICES for Ascend chips (the chip numbers, as Ascend's
    runtime reads them: ``Ascend910-4`` -> ``4``)."""
    env: dict[str, list[str]] = {}
    for d in devices:
        if d.type.startswith("huawei.com/Ascend"):
            number = chip_number(d.id)
            env.setdefault(ASCEND_VISIBLE_DEVICES, []).append(
                d.id if number is None else str(number)
            )
        elif d.type in VISIBLE_DEVICES_ENV:
            env.setdefault(VISIBLE_DEVICES_ENV[d.type], []).append(d.id)
    return {k: ",".join(v) for k, v in env.items()}
