"""reservation: big gangs never starve (Muster; Slurm's backfill reservations, for Volcano and KAI).

The first ``depth`` jobs in line whose gang cannot start now get a reservation: the nodes where,
and the earliest time at which, the gang fits once the running tasks end as their time limits say
(``server/session/reservations.py``). This plugin enforces them, as a node filter (``predicate``):
while allocate, backfill or KAI's consolidation place tasks, a task of another job passes a
reserved node only if its job ends before the reservation starts (its time limit, else its
queue's ``defaultRuntime``), or if the reservation keeps room enough there once the task is in. A
node it may not use reads ``would delay reservation of job X on nodes n1..n8 from 14:32``.
Preempt and reclaim are not bound (their semantics stay as they are).

The reservations are planned once per cycle, when the session is ready and before any action
changes it (``on_session_ready``; nothing is kept between cycles: the plan is a function of the
snapshot). What is placed afterwards takes room from them (the session's allocate / deallocate
events). The ``reserve`` action plans again after the cycle's placements to publish them, with
every waiting job's start estimate. With ``enablePredicate: false`` reservations are only
computed and shown as estimates, never enforced.

Arguments: ``depth`` (1: how many jobs get reservations), ``defaultRuntime`` (a Go duration or
seconds: the expected runtime of jobs without a time limit; ``defaultRuntime.<queue>`` for one
queue; none: such jobs never end as far as planning knows), ``maxEstimates`` (100: how many jobs
in line are planned), ``resolution`` (60s: expected ends are rounded up to it).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from server.plugins.base import Plugin
from server.session.extension_points import PREDICATE, EventHandler, Predicate
from server.session.info import TaskInfo
from server.session.reservations import (
    PLACING_ACTIONS,
    PLUGIN,
    Enforcement,
    plan,
    settings_from,
)
from server.session.session import Session


class ReservationPlugin(Plugin):
    name: ClassVar[str] = PLUGIN
    ARGUMENTS: ClassVar[dict[str, Any]] = {
        "depth": 1,
        "defaultRuntime": "",
        "defaultRuntime.*": "",
        "maxEstimates": 100,
        "resolution": "60s",
    }
    # Running tasks' expected ends come closer as time goes by: a cycle on an unchanged cluster
    # may reserve differently.
    reads_clock: ClassVar[bool] = True

    def __init__(self, arguments: dict[str, Any] | None = None) -> None:
        super().__init__(arguments)
        self.settings = settings_from(self.arguments)
        # The cycle's reservations once planned (a list the closures below share: they must not
        # hold the plugin itself, or plugin and closures would be a reference cycle).
        self.enforcement: list[Enforcement] = []
        self.predicate: Predicate | None = None

    def on_session_open(self, ssn: Session) -> None:
        if self.settings.depth <= 0:
            return
        enforcement = self.enforcement

        def check(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            if not enforcement or ssn.action not in PLACING_ACTIONS:
                return np.ones(len(rows), dtype=bool)
            return enforcement[0].check(task, rows)

        def reasons(task: TaskInfo, rows: np.ndarray) -> list[str]:
            if not enforcement:
                return ["node(s) are reserved"] * len(rows)
            return enforcement[0].reasons(task, rows)

        def on_allocate(task: TaskInfo) -> None:
            if enforcement:
                enforcement[0].allocated(task)

        def on_deallocate(task: TaskInfo) -> None:
            if enforcement:
                enforcement[0].deallocated(task)

        self.predicate = Predicate("task", check, reasons=reasons, plugin=self.name)
        ssn.register(PREDICATE, self.name, self.predicate)
        ssn.add_event_handler(EventHandler(allocate=on_allocate, deallocate=on_deallocate))

    def on_session_ready(self, ssn: Session) -> None:
        """Plan the reservations, as the session stands before any action."""
        held = ssn.evaluator.predicates["task"]
        if self.predicate is None or not any(p is self.predicate for p in held):
            return  # off (depth 0), or its switch is: nothing to enforce
        found = plan(ssn, self.settings, estimates=False)
        if found.reservations:
            self.enforcement.append(Enforcement(ssn, self.settings, found))
        else:
            # Nothing reserved: the filter would pass every node. Out of the evaluator's
            # task-scope list, placements keep its cached path (no action has run yet).
            held[:] = [p for p in held if p is not self.predicate]
