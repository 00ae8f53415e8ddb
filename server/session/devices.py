"""Device ids in a session: which accelerator (GPU, NPU chip) of a node each task holds.

A node's devices come from its ``devices`` list (id, type, interconnect group, health) or, for a
device resource it has but does not list, are made up as ids ``0 .. N-1`` (``Ascend910-0 ..`` for
Ascend chips, whose HCCS rings are chips 0-3 and 4-7). The ledger is kept by ``NodeTable.add_task``
and ``remove_task``, so every statement operation (allocate, pipeline, evict) and its undo keeps
it right: a device is held by at most one task, a device of a Releasing task is not free (it is
offered only to pipelined tasks), and an unhealthy device is never free and counts as used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from muster.devices import (
    NVIDIA_GPU,
    Device,
    devices_by_resource,
)
from server.model import NodeSpec, TaskStatus

_PIPELINED = TaskStatus.PIPELINED  # bound once: read at every placement


def node_devices(spec: NodeSpec) -> dict[str, list[Device]]:
    """Per device resource, the node's devices in listing order (listed ones, else defaults: at
    most MAX_DEVICES_PER_NODE, the bound nodes are held to where they enter)."""
    return devices_by_resource(map(device_from_dict, spec.devices), spec.allocatable)


def device_from_dict(raw: Mapping[str, Any]) -> Device:
    healthy = raw.get("healthy", True)
    return Device(
        str(raw.get("id", "")),
        str(raw.get("type", "")),
        str(raw.get("group", "") or ""),
        healthy is not False,
    )


class DeviceLedger:
    """Per node row and device resource: the devices, and the task holding each.

    ``held`` maps a device id to the task on it (Allocated, Binding, Running ... or Releasing);
    ``promised`` maps a device id to the Pipelined task that will take it once it is released."""

    def __init__(self, specs: list[NodeSpec]) -> None:
        self.specs = specs
        # Built on first use per row: most sessions never ask most nodes for device ids.
        self._devices: list[dict[str, list[Device]] | None] = [None] * len(specs)
        # Per allocatable (as its items) of a node that lists no devices: the devices made up.
        self._made: dict[tuple[tuple[str, float], ...], dict[str, list[Device]]] = {}
        self.held: list[dict[str, Any]] = [{} for _ in specs]  # id -> TaskInfo
        self.promised: list[dict[str, Any]] = [{} for _ in specs]
        # Ids that name a shared GPU group (KAI GPU sharing): not free for a whole-device task.
        self.shared: list[set[str]] = [set() for _ in specs]
        # Of those, the groups held only by releasing tasks (none pipelined behind them): a whole
        # GPU being released, offered to pipelined tasks like a device of a Releasing task.
        self.shared_releasing: list[set[str]] = [set() for _ in specs]

    def of(self, row: int) -> dict[str, list[Device]]:
        devs = self._devices[row]
        if devs is None:
            spec = self.specs[row]
            if spec.devices:
                devs = node_devices(spec)
            else:
                # Made up from allocatable alone: the same for every node of that allocatable,
                # found once (each row still gets lists of its own).
                key = tuple(spec.allocatable.items())
                made = self._made.get(key)
                if made is None:
                    made = self._made[key] = node_devices(spec)
                devs = {name: list(found) for name, found in made.items()}
            self._devices[row] = devs
        return devs

    def attach(self, row: int, task: Any) -> None:
        """Mark ``task.devices`` on the row (a Pipelined task's as promised)."""
        target = self.promised[row] if task.status == _PIPELINED else self.held[row]
        for d in task.devices:
            target[d] = task

    def detach(self, row: int, task: Any) -> None:
        devices = task.devices
        held = self.held[row]
        for d in devices:
            if held.get(d) is task:
                del held[d]
        # (run at every status change of a task with devices: most rows have no promised device,
        # and then there is nothing to look up per device)
        promised = self.promised[row]
        if promised:
            for d in devices:
                if promised.get(d) is task:
                    del promised[d]

    def free(self, row: int, resource: str, limit: int | None = None) -> list[Device]:
        """Healthy devices no task holds, in listing order; only the first ``limit`` when given
        (the rest are not looked at)."""
        held, shared = self.held[row], self.shared[row]
        found: list[Device] = []
        if limit is not None and limit <= 0:
            return found
        # (a plain loop that stops at ``limit``: asked at every placement of a device task)
        for d in self.of(row).get(resource, ()):
            if d.healthy and d.id not in held and d.id not in shared:
                found.append(d)
                if len(found) == limit:
                    break
        return found

    def releasing(self, row: int, resource: str) -> list[Device]:
        """Devices held by a Releasing task (unless a shared GPU pipelined onto it took the id), or
        shared GPUs all of whose tasks are releasing: free once they are gone (offered to pipelined
        tasks only)."""
        held, named = self.held[row], self.shared[row]
        whole = self.shared_releasing[row] if resource == NVIDIA_GPU else ()
        return [
            d
            for d in self.of(row).get(resource, ())
            if d.healthy
            and (
                (d.id in held and held[d.id].status == TaskStatus.RELEASING and d.id not in named)
                or d.id in whole
            )
        ]

    def _pool(
        self, row: int, resource: str, status: TaskStatus, limit: int | None = None
    ) -> list[Device]:
        """What a task placed with ``status`` may take: free devices; for a pipelined task, those
        being released first. Only the first ``limit`` when given."""
        if status != TaskStatus.PIPELINED:
            return self.free(row, resource, limit)
        return (self.releasing(row, resource) + self.free(row, resource))[:limit]

    def available(self, row: int, resource: str, status: TaskStatus) -> list[Device]:
        """The pool without the devices a pipelined task was promised."""
        promised = self.promised[row]
        return [d for d in self._pool(row, resource, status) if d.id not in promised]

    def candidates(
        self, row: int, resource: str, status: TaskStatus, limit: int | None = None
    ) -> list[Device]:
        """Devices a task placed with ``status`` may take, best first: an allocation takes free
        devices no pipelined task waits for, then the rest of the free ones; a pipelined task takes
        devices being released, then free ones; neither takes a device another pipelined task was
        promised while an unpromised one is left. Only the first ``limit`` when given."""
        promised = self.promised[row]
        if not promised:
            return self._pool(row, resource, status, limit)
        pool = self._pool(row, resource, status)
        return ([d for d in pool if d.id not in promised] + [d for d in pool if d.id in promised])[
            :limit
        ]

    def healthy_count(self, row: int, resource: str) -> int:
        return sum(1 for d in self.of(row).get(resource, ()) if d.healthy)

    def unhealthy_unheld(self, row: int) -> dict[str, int]:
        """Per resource, unhealthy devices no task holds: they count as used."""
        held = self.held[row]
        out: dict[str, int] = {}
        for name, devs in self.of(row).items():
            n = sum(1 for d in devs if not d.healthy and d.id not in held)
            if n:
                out[name] = n
        return out
