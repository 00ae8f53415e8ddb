"""Time limits as users write them (muster.timelimit): units, Slurm's forms, refusals, formatting."""

from __future__ import annotations

import pytest

from muster import yamldoc
from muster.timelimit import (
    MAX_TIME_LIMIT,
    TimeLimitError,
    format_time_limit,
    is_time_limit,
    parse_time_limit,
    slurm_time,
    time_limit_message,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2h", 7200),
        ("90m", 5400),
        ("45s", 45),
        ("1d", 86400),
        ("1h30m", 5400),
        ("1d12h", 129600),
        ("1d2h3m4s", 93784),
        (" 2H ", 7200),
        # Slurm's --time forms: a bare number is minutes
        ("30", 1800),
        (30, 1800),
        ("5:30", 330),  # MM:SS
        ("90:00", 5400),  # minutes may pass 59 without hours
        ("1:00:00", 3600),  # HH:MM:SS
        ("36:00:00", 129600),
        ("2-12", 216000),  # D-HH
        ("2-12:30", 217800),  # D-HH:MM
        ("2-12:30:15", 217815),  # D-HH:MM:SS
        ("0-00:00:01", 1),
    ],
)
def test_parses_units_and_slurm_forms(text, seconds):
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "is not a time limit"),
        ("2x", "is not a time limit"),
        ("h", "is not a time limit"),
        ("-5", "is not a time limit"),
        ("1.5h", "is not a time limit"),
        (1.5, "is not a time limit"),
        (True, "is not a time limit"),
        (None, "is not a time limit"),
        ("UNLIMITED", "is not a time limit"),
        ("1m2h", "largest first"),
        ("1h1h", "once"),
        ("1:60", "0-59"),
        ("1:00:60", "0-59"),
        ("1-24", "0-23"),
        ("1-00:60", "0-59"),
        ("0", "must be positive"),
        ("0s", "must be positive"),
        (0, "must be positive"),
        ("0-00:00:00", "must be positive"),
        ("99999999d", "more than the largest time limit"),
        ("9" * 5000, "too long"),
    ],
)
def test_refuses_bad_input_saying_why(value, why):
    with pytest.raises(TimeLimitError) as err:
        parse_time_limit(value)
    assert why in str(err.value)


def test_largest_limit_is_accepted_and_one_more_second_is_not():
    assert parse_time_limit(f"{MAX_TIME_LIMIT}s") == MAX_TIME_LIMIT
    with pytest.raises(TimeLimitError):
        parse_time_limit(f"{MAX_TIME_LIMIT + 1}s")


@pytest.mark.parametrize(
    ("seconds", "text", "slurm"),
    [
        (1, "1s", "0-00:00:01"),
        (90, "1m30s", "0-00:01:30"),
        (7200, "2h", "0-02:00:00"),
        (93784, "1d2h3m4s", "1-02:03:04"),
        (86405, "1d5s", "1-00:00:05"),
    ],
)
def test_formats_round_trip(seconds, text, slurm):
    assert format_time_limit(seconds) == text
    assert parse_time_limit(text) == seconds
    assert slurm_time(seconds) == slurm
    assert parse_time_limit(slurm) == seconds


def test_time_limit_message_is_recognised():
    message = time_limit_message(120)
    assert message == "TimeLimit: time limit 2m reached"
    assert is_time_limit(message)
    assert not is_time_limit("exit code 1")


def test_yaml_without_base_60_keeps_slurm_times_as_text():
    text = "a: 1:30\nb: 1:30:00\nc: 90\nd: 1.5\n"
    assert list(yamldoc.load_all(text, base60=False)) == [
        {"a": "1:30", "b": "1:30:00", "c": 90, "d": 1.5}
    ]
    # The default reading (every other document) is unchanged: YAML 1.1's base 60.
    assert list(yamldoc.load_all(text)) == [{"a": 90, "b": 5400, "c": 90, "d": 1.5}]
