"""muster.jobcontrol: array specs, Slurm's dependency syntax and the dependency rule."""

from __future__ import annotations

import re

import pytest

from muster.jobcontrol import (
    MAX_ARRAY_ELEMENTS,
    ArraySpec,
    ArraySpecError,
    Outcome,
    Verdict,
    dependency_verdict,
    element_id,
    format_dependencies,
    parse_array,
    parse_dependencies,
)

C, F, X, P, S, G = (
    Outcome.COMPLETED,
    Outcome.FAILED,
    Outcome.CANCELLED,
    Outcome.PENDING,
    Outcome.STARTED,
    Outcome.GONE,
)


@pytest.mark.parametrize(
    ("text", "indexes", "limit"),
    [
        ("0-3", (0, 1, 2, 3), 0),
        ("7", (7,), 0),
        ("1,3,5-7", (1, 3, 5, 6, 7), 0),
        ("0-15:4", (0, 4, 8, 12), 0),
        ("0-99%10", tuple(range(100)), 10),
        (" 3,1,3,2 ", (1, 2, 3), 0),  # sorted, distinct
        ("0-9:3%2", (0, 3, 6, 9), 2),
    ],
)
def test_array_specs(text: str, indexes: tuple[int, ...], limit: int) -> None:
    assert parse_array(text) == ArraySpec(indexes, limit)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty array spec"),
        ("5-1", "'5-1': the range ends before it starts"),
        ("0-4:0", "'0-4:0': the step must be at least 1"),
        ("1,,2", "'' is not an index"),
        ("-1", "'-1' is not an index"),
        ("0-3%0", "%0: the running limit must be a whole number >= 1"),
        ("0-3%x", "%x: the running limit"),
        ("0-99999999", "'0-99999999': indexes go up to 9999999"),
        (f"0-{MAX_ARRAY_ELEMENTS}", f"more than {MAX_ARRAY_ELEMENTS} elements"),
    ],
)
def test_bad_array_specs_say_why(text: str, message: str) -> None:
    with pytest.raises(ArraySpecError, match="^" + re.escape(message)):
        parse_array(text)


def test_a_huge_range_is_refused_before_it_is_built() -> None:
    with pytest.raises(ArraySpecError, match="more than"):
        parse_array("0-9999999:1,0-9999999")


def test_element_ids_are_named_as_slurm() -> None:
    assert element_id("sweep", 12) == "sweep_12"


def test_slurm_dependency_syntax() -> None:
    assert parse_dependencies("afterok:a:b,afterany:c,after:d,afternotok:e") == [
        ("afterok", "a"),
        ("afterok", "b"),
        ("afterany", "c"),
        ("after", "d"),
        ("afternotok", "e"),
    ]
    assert parse_dependencies("prep") == [("afterany", "prep")]  # a bare id, as Slurm reads it
    assert format_dependencies([("afterok", "a"), ("afterany", "c"), ("afterok", "b")]) == (
        "afterok:a:b,afterany:c"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("afterok:a?afterok:b", "'?' (any one of the dependencies) is not supported"),
        ("aftercorr:a", "'aftercorr:a': dependency type 'aftercorr' is not one of"),
        ("afterok:", "'afterok:': an empty job id"),
        ("afterok:a+5", "'afterok:a+5': a delay"),
        ("", "empty dependency"),
    ],
)
def test_unsupported_dependencies_are_refused(text: str, message: str) -> None:
    with pytest.raises(ArraySpecError, match="^" + re.escape(message)):
        parse_dependencies(text)


@pytest.mark.parametrize(
    ("kind", "outcomes", "verdict"),
    [
        ("afterok", [P], Verdict.WAIT),
        ("afterok", [S], Verdict.WAIT),
        ("afterok", [C], Verdict.MET),
        ("afterok", [F], Verdict.NEVER),
        ("afterok", [X], Verdict.NEVER),
        ("afterok", [G], Verdict.MET),  # a job the server forgot: lifted, as in Slurm
        ("afterok", [C, S], Verdict.WAIT),  # an array: every element
        ("afterok", [F, S], Verdict.NEVER),  # one failed element decides at once
        ("afternotok", [S], Verdict.WAIT),
        ("afternotok", [F], Verdict.MET),
        ("afternotok", [X], Verdict.MET),
        ("afternotok", [C], Verdict.NEVER),
        ("afternotok", [C, F], Verdict.MET),
        ("afternotok", [C, C], Verdict.NEVER),
        ("afternotok", [F, S], Verdict.WAIT),
        ("afterany", [S], Verdict.WAIT),
        ("afterany", [C], Verdict.MET),
        ("afterany", [F, X], Verdict.MET),
        ("after", [P], Verdict.WAIT),
        ("after", [S], Verdict.MET),
        ("after", [X], Verdict.MET),  # cancelled before it started: no longer pending
        ("after", [S, P], Verdict.WAIT),
    ],
)
def test_dependency_verdicts(kind: str, outcomes: list[Outcome], verdict: Verdict) -> None:
    assert dependency_verdict(kind, outcomes) == verdict
