"""Job arrays and dependencies, Slurm's way: the spellings the API, job files, the CLI and the
Slurm adapter share, and the dependency rule (pure functions; the server applies them).

* An array spec (``JobSpec.array``, ``sbatch --array``): comma-separated indexes ``3``, ranges
  ``0-9`` and stepped ranges ``0-15:4``, then optionally ``%N``, at most N elements running at
  once: ``0-99%10``, ``1,3,5-7``. :func:`parse_array` gives the sorted, distinct indexes.
* A dependency list (``sbatch --dependency``): ``afterok:a:b,afterany:c`` -- every item must be
  satisfied (Slurm's ``,``; its ``?``, any of them, is not supported). :func:`parse_dependencies`.
* :func:`dependency_verdict`: whether a dependency is met, may still be met, or never can be, from
  the state of the jobs it names (Slurm's ``test_job_dependency``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

# Indexes run 0 .. MAX_ARRAY_INDEX; one array has at most MAX_ARRAY_ELEMENTS elements (Slurm's
# MaxArraySize defaults to 1001; a Muster array is created in one request, hence a bound).
MAX_ARRAY_INDEX = 9_999_999
MAX_ARRAY_ELEMENTS = 10_000

# Dependency types: Slurm's names. ``after``: the job named has started (or ended).
AFTER, AFTER_ANY, AFTER_OK, AFTER_NOT_OK = "after", "afterany", "afterok", "afternotok"
DEPENDENCY_TYPES = (AFTER_OK, AFTER_ANY, AFTER_NOT_OK, AFTER)
DEFAULT_DEPENDENCY_TYPE = AFTER_ANY  # a bare job id, as Slurm reads ``--dependency=123``

_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


class ArraySpecError(ValueError):
    """An array spec or dependency list that does not parse; the message says why."""


@dataclass(frozen=True, slots=True)
class ArraySpec:
    indexes: tuple[int, ...]  # sorted, distinct
    max_running: int = 0  # %N; 0: no limit

    def __len__(self) -> int:
        return len(self.indexes)


def parse_array(text: str) -> ArraySpec:
    """``"0-99%10"`` -> ArraySpec(indexes 0..99, max_running 10); ArraySpecError saying why not."""
    spec = text.strip()
    if not spec:
        raise ArraySpecError("empty array spec (e.g. 0-9, 1,3,5-7, 0-15:4, 0-99%10)")
    body, sep, limit = spec.partition("%")
    max_running = 0
    if sep:
        if not limit.isdigit() or int(limit) < 1:
            raise ArraySpecError(f"%{limit}: the running limit must be a whole number >= 1")
        max_running = int(limit)
    ranges: list[range] = []
    total = 0
    for item in body.split(","):
        item = item.strip()
        m = _ITEM.match(item)
        if m is None:
            raise ArraySpecError(
                f"{item!r} is not an index, a range A-B or a stepped range A-B:S "
                "(e.g. 0-9, 1,3,5-7, 0-15:4, 0-99%10)"
            )
        first = int(m[1])
        last = int(m[2]) if m[2] is not None else first
        step = int(m[3]) if m[3] is not None else 1
        if last < first:
            raise ArraySpecError(f"{item!r}: the range ends before it starts")
        if step < 1:
            raise ArraySpecError(f"{item!r}: the step must be at least 1")
        if last > MAX_ARRAY_INDEX:
            raise ArraySpecError(f"{item!r}: indexes go up to {MAX_ARRAY_INDEX}")
        r = range(first, last + 1, step)
        total += len(r)
        if total > MAX_ARRAY_ELEMENTS:
            raise ArraySpecError(
                f"more than {MAX_ARRAY_ELEMENTS} elements (an array has at most "
                f"{MAX_ARRAY_ELEMENTS})"
            )
        ranges.append(r)
    return ArraySpec(tuple(sorted({i for r in ranges for i in r})), max_running)


def element_id(array_id: str, index: int) -> str:
    """An array element's job id, as Slurm names it (``JOBID_INDEX``)."""
    return f"{array_id}_{index}"


def parse_dependencies(text: str) -> list[tuple[str, str]]:
    """Slurm's ``--dependency`` -> [(type, job id), ...]: ``afterok:a:b,afterany:c`` ->
    [(afterok, a), (afterok, b), (afterany, c)]; a bare id means afterany. ArraySpecError when
    it does not parse or uses what Muster does not support (``?``, ``singleton``, ``+time``)."""
    spec = text.strip()
    if not spec:
        raise ArraySpecError("empty dependency (e.g. afterok:a, afterany:a:b,after:c)")
    if "?" in spec:
        raise ArraySpecError(
            "'?' (any one of the dependencies) is not supported: every dependency must be met "
            "(separate them with ',')"
        )
    out: list[tuple[str, str]] = []
    for item in spec.split(","):
        item = item.strip()
        kind, sep, jobs = item.partition(":")
        if not sep:
            kind, jobs = DEFAULT_DEPENDENCY_TYPE, item
        if kind not in DEPENDENCY_TYPES:
            raise ArraySpecError(
                f"{item!r}: dependency type {kind!r} is not one of {', '.join(DEPENDENCY_TYPES)}"
            )
        names = jobs.split(":")
        for name in names:
            if not name:
                raise ArraySpecError(f"{item!r}: an empty job id")
            if "+" in name:
                raise ArraySpecError(f"{item!r}: a delay (+minutes) is not supported")
            out.append((kind, name))
    return out


def format_dependencies(deps: Iterable[tuple[str, str]]) -> str:
    """[(type, job), ...] -> Slurm's spelling, one item per type in first-seen order:
    ``afterok:a:b,afterany:c``."""
    by_type: dict[str, list[str]] = {}
    for kind, job in deps:
        by_type.setdefault(kind or DEFAULT_DEPENDENCY_TYPE, []).append(job)
    return ",".join(":".join([kind, *jobs]) for kind, jobs in by_type.items())


class Outcome(StrEnum):
    """Where a job a dependency names stands."""

    PENDING = "pending"  # not started yet
    STARTED = "started"  # started, not ended
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    GONE = "gone"  # the server no longer knows it: as Slurm, the dependency is lifted


ENDED_OUTCOMES = frozenset({Outcome.COMPLETED, Outcome.FAILED, Outcome.CANCELLED, Outcome.GONE})
NOT_OK_OUTCOMES = frozenset({Outcome.FAILED, Outcome.CANCELLED})


class Verdict(StrEnum):
    MET = "met"
    WAIT = "wait"
    NEVER = "never"


def dependency_verdict(kind: str, outcomes: Sequence[Outcome]) -> Verdict:
    """Whether a dependency of type ``kind`` on jobs now at ``outcomes`` (one job, or every element
    of an array) is met, may be met later, or never can be."""
    if kind == AFTER:
        return Verdict.WAIT if Outcome.PENDING in outcomes else Verdict.MET
    ended = all(o in ENDED_OUTCOMES for o in outcomes)
    if kind == AFTER_OK:
        if any(o in NOT_OK_OUTCOMES for o in outcomes):
            return Verdict.NEVER
        return Verdict.MET if ended else Verdict.WAIT
    if kind == AFTER_NOT_OK:
        if not ended:
            return Verdict.WAIT
        return (
            Verdict.MET
            if any(o in NOT_OK_OUTCOMES or o == Outcome.GONE for o in outcomes)
            else Verdict.NEVER
        )
    return Verdict.MET if ended else Verdict.WAIT  # afterany
