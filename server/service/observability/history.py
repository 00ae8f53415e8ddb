"""Recent cycles, kept for the dashboard: per cycle its time, duration, per-action seconds, binds
and evictions, and per queue its allocation and deserved share. A bounded ring (``size`` cycles):
memory stays flat however long the server runs."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from muster.quantity import from_canonical, parse_resources
from server.model import CycleResult
from server.service import convert
from server.service.state import ClusterState, queue_allocated

Resources = dict[str, float]


@dataclass(slots=True)
class CycleSample:
    cycle_id: int
    at: float  # epoch seconds
    seconds: float
    actions: dict[str, float]
    binds: int
    evictions: int
    allocated: dict[str, Resources]  # queue -> resources its placed tasks hold (canonical units)
    deserved: dict[str, Resources]  # queue -> proportion's deserved share, when computed
    cluster_cpu: float  # the cluster's allocatable CPU (canonical), for shares

    def to_json(self) -> dict[str, Any]:
        def readable(per_queue: dict[str, Resources]) -> dict[str, dict[str, str]]:
            return {
                q: {r: from_canonical(r, v) for r, v in res.items()} for q, res in per_queue.items()
            }

        return {
            "cycle_id": self.cycle_id,
            "at": self.at,
            "seconds": round(self.seconds, 4),
            "actions": {k: round(v, 4) for k, v in self.actions.items()},
            "binds": self.binds,
            "evictions": self.evictions,
            "allocated": readable(self.allocated),
            "deserved": readable(self.deserved),
            # The share of the cluster's CPU each queue holds (a chart's y axis).
            "cpu_share": {
                q: round(res.get("cpu", 0.0) / self.cluster_cpu, 4) if self.cluster_cpu else 0.0
                for q, res in self.allocated.items()
            },
        }


@dataclass
class CycleHistory:
    size: int = 360
    samples: deque[CycleSample] = field(default_factory=deque)

    def record(
        self, state: ClusterState, result: CycleResult, seconds: float, binds: int, evictions: int
    ) -> None:
        self.samples.append(
            CycleSample(
                cycle_id=result.cycle_id,
                at=time.time(),
                seconds=seconds,
                actions=dict(result.action_seconds),
                binds=binds,
                evictions=evictions,
                allocated=queue_allocations(state),
                deserved={q: dict(r) for q, r in result.queue_deserved.items()},
                cluster_cpu=sum(e.spec.allocatable.get("cpu", 0.0) for e in state.nodes.values()),
            )
        )
        while len(self.samples) > self.size:
            self.samples.popleft()


def queue_allocations(state: ClusterState) -> dict[str, Resources]:
    """Per queue, the resources its placed tasks hold now (ListQueues' allocation)."""
    return {
        q: parse_resources(dict(convert.resource_list(res).quantities))
        for q, res in queue_allocated(state).items()
    }
