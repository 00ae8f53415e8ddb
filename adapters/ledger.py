"""The decision ledger: outcomes of applied decisions, so a decision id is never applied twice.

:class:`BackendRuntime <adapters.runtime.BackendRuntime>` re-acknowledges a decision the server
resends (after a reconnect) with the outcome remembered here. :class:`FileDecisionLedger` keeps it
across a restart of the adapter itself.

Before the runtime hands decisions to the backend it calls :meth:`DecisionLedger.begin` with their
ids; a :class:`FileDecisionLedger` makes that durable at once, *before* any side effect. An adapter
killed while applying restarts with those ids "in doubt" (:meth:`DecisionLedger.in_doubt`): they may
or may not have been applied, so the runtime asks the backend what became of them instead of
applying them again (see :mod:`adapters.runtime`).

The ledger also keeps the highest leadership term (``Decision.term``) the runtime has seen from the
server: a decision of a lower term comes from a leader that has been replaced and is refused. A
:class:`FileDecisionLedger` persists it, so a restarted adapter still refuses the old terms.

:func:`write_private` is the one way state files are written here and by the agent: to a temporary
file in the same directory, fsynced, then renamed over the old one (and the directory fsynced), with
mode 0600 whatever the umask.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import structlog

from adapters.backend import Outcome

log = structlog.get_logger("muster.adapter")


def write_private(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably; the file is 0600 whatever the umask.

    A reader (or the next run after a crash) sees the old content or the new one, never a mix."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and its parents) if needed and make it 0700, whatever the umask."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def _fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (best effort: some file systems refuse)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class DecisionLedger:
    """Outcomes of applied decisions, keyed by decision id, for one server identity.

    Bounded: keeps the most recent ``capacity`` ids. ``high_water`` is the highest id whose outcome
    is recorded (an id only begun is not counted: the server must resend it). ``term`` is the
    highest leadership term seen in a decision (0: only unreplicated servers so far).
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self.server_id = ""
        self.high_water = 0
        self.term = 0
        self._outcomes: OrderedDict[int, Outcome] = OrderedDict()
        # Ids an earlier run of the adapter began applying and never recorded an outcome for.
        self._doubt: set[int] = set()

    def get(self, decision_id: int) -> Outcome | None:
        return self._outcomes.get(decision_id)

    def begin(self, decision_ids: Iterable[int]) -> None:
        """These ids are about to be applied (their side effects may start any moment). A
        :class:`FileDecisionLedger` records that durably before returning."""

    def in_doubt(self, decision_id: int) -> bool:
        """Whether an earlier run of the adapter began applying ``decision_id`` and died before
        recording its outcome: it may or may not have been applied."""
        return decision_id in self._doubt and decision_id not in self._outcomes

    @property
    def doubtful(self) -> int:
        """How many ids are in doubt."""
        return sum(1 for d in self._doubt if d not in self._outcomes)

    def record(self, decision_id: int, outcome: Outcome) -> None:
        self._outcomes[decision_id] = outcome
        self._outcomes.move_to_end(decision_id)
        self._doubt.discard(decision_id)
        self.high_water = max(self.high_water, decision_id)
        while len(self._outcomes) > self.capacity:
            self._outcomes.popitem(last=False)

    def observe_term(self, term: int) -> bool:
        """A decision of leadership ``term`` is accepted; returns True when it is a new highest."""
        if term <= self.term:
            return False
        self.term = term
        return True

    def bind_server(self, server_id: str) -> bool:
        """Adopt ``server_id``; returns True (and forgets everything) when it changed."""
        if self.server_id == server_id:
            return False
        changed = bool(self.server_id)
        self.server_id = server_id
        if changed:
            self._outcomes.clear()
            self._doubt.clear()
            self.high_water = 0
            # Another store (a server that lost its state) counts its terms afresh.
            self.term = 0
        return changed

    def flush(self) -> None:
        """Persist (no-op in memory)."""

    def __len__(self) -> int:
        return len(self._outcomes)

    def _dump(self) -> dict[str, Any]:
        return {
            "server_id": self.server_id,
            "high_water": self.high_water,
            "term": self.term,
            "outcomes": [[k, v.applied, v.reason] for k, v in self._outcomes.items()],
        }

    def _load(self, data: dict[str, Any]) -> None:
        self.server_id = str(data.get("server_id", ""))
        self.high_water = int(data.get("high_water", 0))
        self.term = int(data.get("term", 0))
        for decision_id, applied, reason in data.get("outcomes", []):
            self._outcomes[int(decision_id)] = Outcome(bool(applied), str(reason))


class FileDecisionLedger(DecisionLedger):
    """A ledger persisted as JSON (atomic, fsynced, 0600) so an adapter restart never re-applies.

    Outcomes live in ``path``; the ids being applied right now in ``<path>.applying``, written by
    :meth:`begin` before the backend sees them (small: one burst's ids, not the whole ledger)."""

    def __init__(self, path: str | os.PathLike[str], capacity: int = 100_000) -> None:
        super().__init__(capacity)
        self.path = Path(path)
        self.applying_path = self.path.with_name(self.path.name + ".applying")
        if self.path.exists():
            try:
                self._load(json.loads(self.path.read_text()))
            except (ValueError, TypeError, OSError) as exc:
                log.warning(
                    "ledger unreadable, starting empty", path=str(self.path), error=str(exc)
                )
        if self.applying_path.exists():
            try:
                applying = json.loads(self.applying_path.read_text())
                server_id = str(applying.get("server_id", ""))
                # No outcome flushed yet (a first burst): the applying file names the server.
                if server_id == self.server_id or not self.server_id:
                    self.server_id = server_id
                    self._doubt = {int(d) for d in applying.get("applying", [])} - set(
                        self._outcomes
                    )
                    # A burst of a new term may have begun after the last flush.
                    self.term = max(self.term, int(applying.get("term", 0)))
            except (ValueError, TypeError, OSError, AttributeError) as exc:
                log.warning(
                    "ledger's applying file unreadable",
                    path=str(self.applying_path),
                    error=str(exc),
                )
        if self._doubt:
            log.warning(
                "decisions in doubt: the adapter stopped while applying them",
                ids=sorted(self._doubt)[:20],
                count=len(self._doubt),
            )

    def begin(self, decision_ids: Iterable[int]) -> None:
        self._make_parent()
        data = {
            "server_id": self.server_id,
            "term": self.term,
            "applying": sorted(set(decision_ids)),
        }
        write_private(self.applying_path, json.dumps(data).encode())

    def flush(self) -> None:
        self._make_parent()
        write_private(self.path, json.dumps(self._dump()).encode())

    def _make_parent(self) -> None:
        if not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
