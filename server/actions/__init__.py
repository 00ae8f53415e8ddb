"""Action registry: name -> class, the one place action names are mapped to classes.

Each action is one module, in the sub-package of the system it comes from, as the plugins are:
``volcano/`` (Volcano's actions: enqueue, allocate, backfill, preempt, reclaim, shuffle), ``kai/``
(KAI Scheduler's, registered by ``kai.KAI_ACTIONS`` for ``profile: kai``, with the machinery they
share) and ``muster/`` (``reserve``: reservations and start estimates, usable in both profiles).
What every action shares stays here at the top: ``base.py`` (the ``Action`` class).
"""

from __future__ import annotations

from server.actions.base import Action
from server.actions.muster.reserve import ReserveAction
from server.actions.volcano.allocate import AllocateAction
from server.actions.volcano.backfill import BackfillAction
from server.actions.volcano.enqueue import EnqueueAction
from server.actions.volcano.preempt import PreemptAction
from server.actions.volcano.reclaim import ReclaimAction
from server.actions.volcano.shuffle import ShuffleAction

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
