"""Volcano's actions, one module each: enqueue, allocate, backfill, preempt, reclaim, shuffle
(Volcano's ``pkg/scheduler/actions``). They are the defaults of both profiles' action lists where
KAI has no action of its own; registered in ``server/actions/__init__.py``."""
