"""The gang minimum: how many of a job's tasks must be placed together. One meaning of the
``min_member`` value everywhere it is written (the API's ``JobSpec.min_member``, a scenario's
``minMember``, job files, what a client shows): shared by the server, the simulator and every
client and backend; and the rule that judges a gang by it (``gang_whole``, ``gang_phase``), the
same for the server's job phase and a backend's view of its gangs."""

from __future__ import annotations

import enum

# Volcano's ``minMember: 0`` (no gang minimum at all). 0 already means "every task", so this has
# its own spelling; only scenarios accept it (the API refuses negative values).
NO_GANG_MINIMUM = -1


def gang_minimum(min_member: int | None, task_count: int) -> int:
    """The gang minimum of a job of ``task_count`` tasks whose ``min_member`` is given: 0 or unset
    (None) means every task; ``NO_GANG_MINIMUM`` (-1) means none (0); any other value is itself.
    Raises ValueError for other negative values (callers check them first)."""
    if min_member is None or min_member == 0:
        return task_count
    if min_member == NO_GANG_MINIMUM:
        return 0
    if min_member < 0:
        raise ValueError(f"min_member {min_member} is negative")
    return min_member


def podgroup_minimum(min_member: int, task_count: int) -> int:
    """The gang minimum of a Kubernetes PodGroup (Volcano, KAI) of ``task_count`` pods whose
    ``minMember`` is given: the same rule, read in Volcano's spelling, where 0 (or absent) is no
    gang minimum (``NO_GANG_MINIMUM``) rather than every task."""
    return gang_minimum(min_member if min_member > 0 else NO_GANG_MINIMUM, task_count)


def api_min_member(minimum: int, task_count: int) -> int:
    """The API's ``min_member`` for a job of ``task_count`` tasks whose gang minimum is
    ``minimum``: at most every task, and at least one -- the API cannot spell "no minimum" (0 is
    every task), and for a job that has tasks one placed task is the nearest it can say."""
    return min(task_count, max(1, minimum))


def gang_whole(minimum: int, placed: int, succeeded: int) -> bool:
    """Whether a gang holds: its placed tasks (on a node, not ended) and those that already
    succeeded reach the minimum."""
    return placed + succeeded >= minimum


class GangPhase(enum.Enum):
    """Where a gang stands, from its tasks' counts (``gang_phase``)."""

    WAITING = "waiting"  # fewer than the minimum placed or succeeded
    RUNNING = "running"  # the minimum placed or succeeded
    COMPLETED = "completed"  # every task ended, at least the minimum succeeded
    FAILED = "failed"  # fewer than the minimum can still succeed


def gang_phase(minimum: int, *, tasks: int, placed: int, succeeded: int, failed: int) -> GangPhase:
    """The gang's phase: the job phase rule of the server and a backend's view of a gang alike."""
    if succeeded + failed == tasks and succeeded >= minimum:
        return GangPhase.COMPLETED
    if tasks - failed < minimum:
        return GangPhase.FAILED
    if gang_whole(minimum, placed, succeeded):
        return GangPhase.RUNNING
    return GangPhase.WAITING
