"""Where a job stands, from its conditions, in one word and one line: shared by the CLI and the
dashboard so both say the same."""

from __future__ import annotations

from collections.abc import Iterable

from muster.v1 import muster_pb2 as pb

# Conditions that say where a job stands, most telling first: how it ended, that it is left out of
# scheduling (a cycle failed with it; held; waiting for a dependency or for its array's running
# limit: docs/jobs.md), that it can never fit, why it waits.
REASON_CONDITIONS = (
    "Ended",
    "Quarantined",
    "Held",
    "Dependency",
    "ArrayTaskLimit",
    "Unsatisfiable",
    "Unschedulable",
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
