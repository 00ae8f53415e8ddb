"""adapters.retry: the one backoff schedule and retry loop every adapter uses."""

from __future__ import annotations

import random

import anyio
import pytest

from adapters.retry import Backoff, retry


def test_delays_grow_by_the_factor_and_stop_at_the_cap():
    backoff = Backoff(initial=0.1, factor=2.0, max=1.0, jitter=0)
    delays = [backoff.next() for _ in range(7)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    assert backoff.attempts == 7


def test_other_factors_are_honoured():
    backoff = Backoff(initial=1.0, factor=3.0, max=100.0, jitter=0)
    assert [backoff.next() for _ in range(4)] == pytest.approx([1.0, 3.0, 9.0, 27.0])
    constant = Backoff(initial=0.5, factor=1.0, max=10.0, jitter=0)
    assert [constant.next() for _ in range(3)] == pytest.approx([0.5, 0.5, 0.5])


def test_reset_starts_the_schedule_again():
    backoff = Backoff(initial=0.1, factor=2.0, max=1.0, jitter=0)
    for _ in range(5):
        backoff.next()
    backoff.reset()
    assert backoff.attempts == 0
    assert [backoff.next(), backoff.next()] == pytest.approx([0.1, 0.2])


def test_jitter_stays_within_the_band_below_the_cap_and_varies():
    backoff = Backoff(initial=0.2, factor=2.0, max=5.0, jitter=0.5, rng=random.Random(7))
    caps = [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
    delays = []
    for cap in caps:
        assert backoff.cap() == pytest.approx(cap)
        delay = backoff.next()
        assert cap / 2 <= delay <= cap
        delays.append(delay)
    # Jittered: at the cap the delays are not all the same value.
    assert len({round(d, 9) for d in delays[-3:]}) > 1


def test_full_jitter_band_reaches_down_to_zero():
    backoff = Backoff(initial=1.0, factor=1.0, max=1.0, jitter=1.0, rng=random.Random(1))
    delays = [backoff.next() for _ in range(200)]
    assert all(0.0 <= d <= 1.0 for d in delays)
    assert min(delays) < 0.1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial": -1}, "backoff delays must be >= 0"),
        ({"max": -1}, "backoff delays must be >= 0"),
        ({"factor": 0.5}, "backoff factor must be >= 1"),
        ({"jitter": 1.5}, r"backoff jitter must be in \[0, 1\]"),
        ({"jitter": -0.1}, r"backoff jitter must be in \[0, 1\]"),
    ],
)
def test_nonsense_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Backoff(**kwargs)


async def test_sleep_sleeps_the_delay_it_returns():
    backoff = Backoff(initial=0.05, factor=2.0, max=1.0, jitter=0)
    start = anyio.current_time()
    slept = await backoff.sleep()
    assert slept == pytest.approx(0.05)
    assert anyio.current_time() - start >= 0.05 - 0.005
    assert backoff.attempts == 1


async def test_retry_until_the_result_is_good_sleeping_the_schedule():
    answers = iter([429, 429, 429, 200])
    calls: list[int] = []
    retries: list[tuple[int, float, object]] = []

    async def call() -> int:
        calls.append(1)
        return next(answers)

    result = await retry(
        call,
        Backoff(initial=0.001, factor=2.0, max=0.003, jitter=0),
        attempts=10,
        again=lambda status: status == 429,
        on_retry=lambda n, delay, failure: retries.append((n, delay, failure)),
    )
    assert result == 200
    assert len(calls) == 4
    assert [(n, failure) for n, _, failure in retries] == [(1, 429), (2, 429), (3, 429)]
    assert [d for _, d, _ in retries] == pytest.approx([0.001, 0.002, 0.003])


async def test_retry_gives_up_after_attempts_with_the_last_result():
    calls: list[int] = []

    async def call() -> int:
        calls.append(1)
        return 429

    result = await retry(
        call, Backoff(initial=0.001, jitter=0), attempts=3, again=lambda s: s == 429
    )
    assert result == 429
    assert len(calls) == 3


async def test_retry_on_listed_errors_then_reraises_the_last():
    calls: list[int] = []

    async def call() -> str:
        calls.append(1)
        raise ConnectionError(f"try {len(calls)}")

    with pytest.raises(ConnectionError, match="try 3"):
        await retry(call, Backoff(initial=0.001, jitter=0), attempts=3, errors=(ConnectionError,))
    assert len(calls) == 3


async def test_retry_recovers_from_a_listed_error():
    calls: list[int] = []

    async def call() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("down")
        return "ok"

    assert await retry(call, Backoff(initial=0.001, jitter=0), errors=(ConnectionError,)) == "ok"
    assert len(calls) == 3


async def test_retry_does_not_retry_other_errors_or_good_results():
    calls: list[int] = []

    async def broken() -> str:
        calls.append(1)
        raise KeyError("bug")

    with pytest.raises(KeyError):
        await retry(broken, Backoff(initial=0.001), attempts=5, errors=(ConnectionError,))
    assert len(calls) == 1

    async def fine() -> int:
        calls.append(1)
        return 200

    assert await retry(fine, Backoff(initial=0.001), attempts=5, again=lambda s: s == 429) == 200
    assert len(calls) == 2
