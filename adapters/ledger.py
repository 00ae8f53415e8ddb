"""The decision ledger: outcomes of applied decisions, so a decision id is never applied twice.

:class:`BackendRuntime <adapters.runtime.BackendRuntime>` re-acknowledges a decision the server
resends (after a reconnect) with the outcome remembered here. :class:`FileDecisionLedger` keeps it
across a restart of the adapter itself.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import structlog

from adapters.backend import Outcome

log = structlog.get_logger("muster.adapter")


class DecisionLedger:
    """Outcomes of applied decisions, keyed by decision id, for one server identity.

    Bounded: keeps the most recent ``capacity`` ids. ``high_water`` is the highest id applied.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self.server_id = ""
        self.high_water = 0
        self._outcomes: OrderedDict[int, Outcome] = OrderedDict()

    def get(self, decision_id: int) -> Outcome | None:
        return self._outcomes.get(decision_id)

    def record(self, decision_id: int, outcome: Outcome) -> None:
        self._outcomes[decision_id] = outcome
        self._outcomes.move_to_end(decision_id)
        self.high_water = max(self.high_water, decision_id)
        while len(self._outcomes) > self.capacity:
            self._outcomes.popitem(last=False)

    def bind_server(self, server_id: str) -> bool:
        """Adopt ``server_id``; returns True (and forgets everything) when it changed."""
        if self.server_id == server_id:
            return False
        changed = bool(self.server_id)
        self.server_id = server_id
        if changed:
            self._outcomes.clear()
            self.high_water = 0
        return changed

    def flush(self) -> None:
        """Persist (no-op in memory)."""

    def __len__(self) -> int:
        return len(self._outcomes)

    def _dump(self) -> dict[str, Any]:
        return {
            "server_id": self.server_id,
            "high_water": self.high_water,
            "outcomes": [[k, v.applied, v.reason] for k, v in self._outcomes.items()],
        }

    def _load(self, data: dict[str, Any]) -> None:
        self.server_id = str(data.get("server_id", ""))
        self.high_water = int(data.get("high_water", 0))
        for decision_id, applied, reason in data.get("outcomes", []):
            self._outcomes[int(decision_id)] = Outcome(bool(applied), str(reason))


class FileDecisionLedger(DecisionLedger):
    """A ledger persisted as JSON (atomic replace) so an adapter restart never re-applies."""

    def __init__(self, path: str | os.PathLike[str], capacity: int = 100_000) -> None:
        super().__init__(capacity)
        self.path = Path(path)
        if self.path.exists():
            try:
                self._load(json.loads(self.path.read_text()))
            except (ValueError, TypeError, OSError) as exc:
                log.warning("ledger unreadable, starting empty", path=str(self.path), error=str(exc))

    def flush(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._dump()))
        os.replace(tmp, self.path)
