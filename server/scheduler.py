"""Entry point of the scheduling core: one cycle over a snapshot.

``SchedulerCore.run_cycle`` is pure: snapshot in, decisions out (open session -> configured
actions -> close session). The server runs it in a worker thread; ``muster simulate`` runs it
directly.
"""

from __future__ import annotations

import time

from server.actions import ACTIONS
from server.config import SchedulerConfig, default_config
from server.model import ClusterSnapshot, CycleResult
from server.session.session import Session


class SchedulerCore:
    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or default_config()

    def update_config(self, config: SchedulerConfig) -> None:
        """Takes effect at the next cycle."""
        self.config = config

    def run_cycle(self, snapshot: ClusterSnapshot, cycle_id: int) -> CycleResult:
        config = self.config  # one config for the whole cycle, even if swapped meanwhile
        started = time.perf_counter()
        ssn = Session(snapshot, config, cycle_id)
        ssn.result.action_seconds["session.open"] = time.perf_counter() - started
        for name in config.actions:
            action = ACTIONS[name](config.action_arguments.get(name))
            t0 = time.perf_counter()
            action.execute(ssn)
            ssn.result.action_seconds[name] = time.perf_counter() - t0
        t0 = time.perf_counter()
        result = ssn.close()
        result.action_seconds["session.close"] = time.perf_counter() - t0
        return result
