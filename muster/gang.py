"""The gang minimum: how many of a job's tasks must be placed together. One meaning of the
``min_member`` value everywhere it is written (the API's ``JobSpec.min_member``, a scenario's
``minMember``, job files, what a client shows): shared by the server, the simulator and every
client and backend."""

from __future__ import annotations

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
