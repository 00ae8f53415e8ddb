"""KAI Scheduler's actions (``profile: kai``): allocate, consolidation, reclaim, preempt and
stalegangeviction, each one module; the victim search the three evicting actions share is
``solver.py``, the hierarchical job queue ``job_queue.py``."""

from __future__ import annotations

from server.actions.base import Action
from server.actions.kai.allocate import KaiAllocateAction
from server.actions.kai.consolidation import ConsolidationAction
from server.actions.kai.preempt import KaiPreemptAction
from server.actions.kai.reclaim import KaiReclaimAction
from server.actions.kai.stalegangeviction import StaleGangEvictionAction

KAI_ACTIONS: dict[str, type[Action]] = {
    cls.name: cls
    for cls in (
        KaiAllocateAction,
        ConsolidationAction,
        KaiPreemptAction,
        KaiReclaimAction,
        StaleGangEvictionAction,
    )
}

__all__ = ["KAI_ACTIONS"]
