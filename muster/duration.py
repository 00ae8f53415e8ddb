"""Durations written with units -- ``2h``, ``90m``, ``45s``, ``1h30m``, ``1d12h``, ``1w``: whole
numbers, each unit once, largest first. The one spelling read by time limits
(:mod:`muster.timelimit`, which adds Slurm's forms) and by ``muster history --since/--until``
(how long ago)."""

from __future__ import annotations

import re

UNIT_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
# No duration is spelled longer (and int() refuses the 5,000 digits a longer one could carry).
MAX_DURATION_TEXT = 32

_UNIT_NAMES = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
_DURATION = re.compile(r"^(?:\d+[wdhms])+$")
_PART = re.compile(r"(\d+)([wdhms])")


class DurationError(ValueError):
    """Text written with units that repeats one or puts a smaller one first; the message says
    so (callers prefix it with the field)."""


def parse_duration(text: str, units: str = "wdhms") -> int | None:
    """Seconds in ``text`` (blanks around it and case aside) written with ``units`` (letters of
    ``UNIT_SECONDS``, largest first); None when it is not written so: another spelling the caller
    may read. Raises :class:`DurationError` for a unit given twice or after a smaller one
    (``1m2h``)."""
    value = text.strip().lower()
    if len(value) > MAX_DURATION_TEXT or not _DURATION.match(value):
        return None
    parts = _PART.findall(value)
    found = [unit for _, unit in parts]
    if any(unit not in units for unit in found):
        return None
    if len(set(found)) != len(found) or found != sorted(found, key=units.index):
        names = ", ".join(_UNIT_NAMES[unit] for unit in units)
        raise DurationError(f"{text!r}: give each unit once, largest first ({names})")
    return sum(int(n) * UNIT_SECONDS[unit] for n, unit in parts)
