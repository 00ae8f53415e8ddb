"""Time limits (Slurm's ``--time``, Kubernetes' ``activeDeadlineSeconds``): their spellings, shared
by job files, the CLI, the server and the backends.

* :func:`parse_time_limit` reads a limit in seconds from what users write: a duration with units
  (:mod:`muster.duration` without weeks: ``2h``, ``90m``, ``45s``, ``1d12h``, ``1h30m``) or one of
  Slurm's forms -- ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS`` (a bare
  number is minutes, as in Slurm).
* :func:`format_time_limit` writes seconds back compactly (7200 -> ``2h``, 5400 -> ``1h30m``,
  86405 -> ``1d5s``); :func:`slurm_time` in Slurm's ``D-HH:MM:SS``.
* A task ended by its limit is reported Failed with :func:`time_limit_message` (``TimeLimit: time
  limit 2m reached``); :func:`is_time_limit` recognises such a message.
"""

from __future__ import annotations

import re

from muster.duration import MAX_DURATION_TEXT, UNIT_SECONDS, DurationError, parse_duration

# The largest limit accepted (seconds): about 68 years; it fits every backend's field (Slurm's
# minutes, Kubernetes' int64) and the API's uint32.
MAX_TIME_LIMIT = 2**31 - 1
# The reason a task ended by its time limit carries: the start of its message, the job's Ended
# condition reason.
TIME_LIMIT_REASON = "TimeLimit"

# No weeks: Slurm has none, and a limit is written back in days (format_time_limit).
_UNITS = "dhms"
# Slurm: [D-]HH[:MM[:SS]] with a day, MM[:SS] or HH:MM:SS without.
_SLURM_DAYS = re.compile(r"^(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?$")
_SLURM = re.compile(r"^(\d+)(?::(\d+)(?::(\d+))?)?$")
_FORMS = "e.g. 2h, 90m, 1h30m, 45s, 1d or Slurm's MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM:SS"


class TimeLimitError(ValueError):
    """A time limit that does not parse or is out of range; the message says why (without the
    field: callers prefix it)."""


def parse_time_limit(value: object) -> int:
    """Seconds from a time limit as written (a string, or an integer: minutes, as Slurm reads
    ``--time=90``). Raises :class:`TimeLimitError` for anything else, zero or beyond
    :data:`MAX_TIME_LIMIT`."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TimeLimitError(f"{value!r} is not a time limit ({_FORMS})")
    if isinstance(value, int):
        return _checked(value * 60, value)
    text = value.strip().lower()
    if len(text) > MAX_DURATION_TEXT:  # (Slurm's forms too: int() refuses 5,000 digits)
        raise TimeLimitError(
            f"{value[:MAX_DURATION_TEXT]!r}...: too long for a time limit ({_FORMS})"
        )
    try:
        seconds = parse_duration(value, _UNITS)
    except DurationError as exc:
        raise TimeLimitError(str(exc)) from None
    if seconds is not None:
        return _checked(seconds, value)
    days = _SLURM_DAYS.match(text)
    if days:
        d, h, m, s = (int(x) if x else 0 for x in days.groups())
        _check_fields(value, h=h, m=m, s=s)
        return _checked(((d * 24 + h) * 60 + m) * 60 + s, value)
    plain = _SLURM.match(text)
    if plain:
        a, b, c = plain.groups()
        if c is not None:  # HH:MM:SS
            h, m, s = int(a), int(b), int(c)
            _check_fields(value, m=m, s=s)
            return _checked((h * 60 + m) * 60 + s, value)
        if b is not None:  # MM:SS
            m, s = int(a), int(b)
            _check_fields(value, s=s)
            return _checked(m * 60 + s, value)
        return _checked(int(a) * 60, value)  # MM
    raise TimeLimitError(f"{value!r} is not a time limit ({_FORMS})")


def _check_fields(value: object, *, h: int = 0, m: int = 0, s: int = 0) -> None:
    if h > 23 or m > 59 or s > 59:
        raise TimeLimitError(
            f"{value!r}: hours must be 0-23 after a day, minutes and seconds 0-59 ({_FORMS})"
        )


def _checked(seconds: int, value: object) -> int:
    if seconds <= 0:
        raise TimeLimitError(f"{value!r}: a time limit must be positive (leave it out for none)")
    if seconds > MAX_TIME_LIMIT:
        raise TimeLimitError(
            f"{value!r} is more than the largest time limit ({format_time_limit(MAX_TIME_LIMIT)})"
        )
    return seconds


def format_time_limit(seconds: int | float) -> str:
    """``7200`` -> ``2h``, ``5400`` -> ``1h30m``, ``90`` -> ``1m30s``, ``0`` -> ``0s``."""
    rest = int(seconds)
    if rest <= 0:
        return "0s"
    parts = []
    for unit in _UNITS:
        n, rest = divmod(rest, UNIT_SECONDS[unit])
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)


def slurm_time(seconds: int) -> str:
    """Seconds in Slurm's ``D-HH:MM:SS`` (``--time``, ``scontrol update TimeLimit=``)."""
    minutes, s = divmod(int(seconds), 60)
    hours, m = divmod(minutes, 60)
    d, h = divmod(hours, 24)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}"


def time_limit_message(seconds: int | float) -> str:
    """What a task ended by its time limit is reported with: ``TimeLimit: time limit 2m reached``."""
    return f"{TIME_LIMIT_REASON}: time limit {format_time_limit(seconds)} reached"


def is_time_limit(message: str) -> bool:
    """Whether a task's message says its time limit ended it."""
    return message.startswith(f"{TIME_LIMIT_REASON}:")
