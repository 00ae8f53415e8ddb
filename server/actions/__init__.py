"""Action registry: name -> class. Each action is one module of this package."""

from __future__ import annotations

from server.actions.allocate import AllocateAction
from server.actions.backfill import BackfillAction
from server.actions.base import Action
from server.actions.enqueue import EnqueueAction
from server.actions.preempt import PreemptAction
from server.actions.reclaim import ReclaimAction
from server.actions.reserve import ReserveAction
from server.actions.shuffle import ShuffleAction

ACTIONS: dict[str, type[Action]] = {
    cls.name: cls
    for cls in (
        AllocateAction,
        BackfillAction,
        EnqueueAction,
        PreemptAction,
        ReclaimAction,
        ReserveAction,
        ShuffleAction,
    )
}

__all__ = ["ACTIONS", "Action"]
