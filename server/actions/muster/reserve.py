"""reserve: publish reservations and start estimates (Muster; Slurm's backfill plan, ``squeue --start``).

Placed after allocate (and backfill), it plans again with what the cycle placed: the first
``depth`` jobs in line whose gang cannot start now get reservations (their nodes from the earliest
time the gang fits, from running tasks' expected ends), every other job in line gets its estimated
start, or a note saying why there is none (``server/session/reservations.py``). The result carries
them per job (``CycleResult.estimates``, each job's ``JobOutcome.estimate``): ``muster job``,
``muster jobs --start``, ``muster explain`` and the dashboard show them. Planning reads the
``reservation`` plugin's arguments (the configuration must list the plugin); the plugin is what
enforces the reservations while allocate places tasks. It changes nothing in the session.
"""

from __future__ import annotations

from typing import ClassVar

from server.actions.base import Action
from server.session.extension_points import PREDICATE
from server.session.reservations import PLUGIN, plan, session_settings
from server.session.session import Session


class ReserveAction(Action):
    name: ClassVar[str] = "reserve"
    reads_clock: ClassVar[bool] = True

    def execute(self, ssn: Session) -> None:
        found = plan(ssn, session_settings(ssn), estimates=True)
        option = ssn.option(PLUGIN)
        if option is None or not (
            PREDICATE.switch is not None and option.enabled(PREDICATE.switch.name)
        ):
            # Nothing enforces them: shown as the estimates they are, not as reservations.
            for estimate in found.estimates.values():
                estimate.reserved = False
        ssn.result.estimates.update(found.estimates)
