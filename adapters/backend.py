"""What a concrete adapter implements for :class:`adapters.runtime.BackendRuntime`: the
:class:`Backend` protocol and the :class:`Outcome` of applying a decision."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from muster.v1 import muster_pb2 as pb


class Rejected(Exception):
    """Raised by ``apply_bind`` / ``apply_evict`` to reject a decision; the message is the reason."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """The result of applying one decision (becomes a ``DecisionAck``)."""

    applied: bool
    reason: str = ""

    @classmethod
    def reject(cls, reason: str) -> Outcome:
        return cls(False, reason)


APPLIED = Outcome(True)


@runtime_checkable
class Backend(Protocol):
    """What a concrete adapter implements. All methods are coroutines run on the runtime's loop.

    ``apply_bind`` / ``apply_evict`` return normally when the decision is applied and raise
    :class:`Rejected` (or return an :class:`Outcome`) when it cannot be honoured. Any other
    exception rejects the decision with the exception text. Optionally a backend may define
    ``async def apply_batch(self, decisions: list[pb.Decision]) -> list[Outcome]`` to receive a
    whole burst of one cycle at once (see :mod:`adapters.runtime`).
    """

    async def list_nodes(self) -> Sequence[pb.Node]: ...

    async def list_tasks(self) -> Sequence[pb.BackendTask]: ...

    async def apply_bind(self, decision: pb.Decision) -> Outcome | None: ...

    async def apply_evict(self, decision: pb.Decision) -> Outcome | None: ...


def group_by_job(decisions: Iterable[pb.Decision]) -> dict[str, list[pb.Decision]]:
    """Split decisions by job id (bind or evict), keeping order within each job."""
    groups: dict[str, list[pb.Decision]] = {}
    for decision in decisions:
        action = decision.WhichOneof("action")
        job_id = getattr(decision, action).job_id if action else ""
        groups.setdefault(job_id, []).append(decision)
    return groups
