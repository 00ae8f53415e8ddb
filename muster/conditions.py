"""A job's conditions: their types, the one spelling of them for the server that sets them and
the clients that read them; and where a job stands, from its conditions, in one word and one line
(shared by the CLI and the dashboard so both say the same)."""

from __future__ import annotations

from collections.abc import Iterable

from muster.v1 import muster_pb2 as pb

# Condition types (``JobStatus.conditions[].type``).
ENDED = "Ended"  # how it ended (reason: its phase, or TimeLimit)
QUARANTINED = "Quarantined"  # left out of scheduling: a cycle failed with it, a refused spec
HELD = "Held"  # held: not scheduled until released
DEPENDENCY = "Dependency"  # waits for the jobs it depends on (or never can run)
ARRAY_TASK_LIMIT = "ArrayTaskLimit"  # an array element waiting for its array's %N
UNSATISFIABLE = "Unsatisfiable"  # can never fit as things stand
UNSCHEDULABLE = "Unschedulable"  # the last cycle did not place it
SCHEDULED = "Scheduled"  # its gang is placed
REQUEUED = "Requeued"  # sent back to pending (muster requeue)

# Conditions that say where a job stands, most telling first: how it ended, that it is left out of
# scheduling (a cycle failed with it; held; waiting for a dependency or for its array's running
# limit: docs/jobs.md), that it can never fit, why it waits.
REASON_CONDITIONS = (
    ENDED,
    QUARANTINED,
    HELD,
    DEPENDENCY,
    ARRAY_TASK_LIMIT,
    UNSATISFIABLE,
    UNSCHEDULABLE,
)


def job_reason(conditions: Iterable[pb.Condition]) -> tuple[str, str]:
    """(one-word reason code, message) of the first true condition of REASON_CONDITIONS; ("", "")
    when none is true. Volcano's reasons are sometimes sentences: then the condition's type is the code."""
    conds = list(conditions)
    for kind in REASON_CONDITIONS:
        for cond in reversed(conds):
            if cond.type == kind and cond.status == "True":
                code = cond.reason if cond.reason and " " not in cond.reason else kind
                return code, cond.message
    return "", ""
