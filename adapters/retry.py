"""Backoff and retry for every adapter: one policy, written once.

:class:`Backoff` is the delay schedule of a loop that waits between tries: ``initial`` seconds,
multiplied by ``factor`` after every try up to ``max``, with jitter (each delay is drawn uniformly
from ``[cap * (1 - jitter), cap]``, so many adapters restarted together do not retry in step), and
:meth:`Backoff.reset` after a success. A loop that owns its own control flow (the runtime's
reconnect, an informer's re-watch, a controller's "mark dirty and try again") uses it directly::

    backoff = Backoff(initial=0.2, max=5.0)
    while True:
        try:
            await session()
            backoff.reset()
        except OSError:
            await backoff.sleep()

:func:`retry` wraps one call that may fail or answer "not now" (an eviction refused with 429)::

    result = await retry(evict, Backoff(initial=0.2, max=5.0, jitter=0), attempts=5,
                         again=lambda r: r.status == 429)
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")


class Backoff:
    """Exponential backoff with jitter; see the module docstring."""

    def __init__(
        self,
        initial: float = 0.2,
        factor: float = 2.0,
        max: float = 5.0,
        jitter: float = 0.5,
        *,
        rng: random.Random | None = None,
    ) -> None:
        if initial < 0 or max < 0:
            raise ValueError("backoff delays must be >= 0")
        if factor < 1:
            raise ValueError("backoff factor must be >= 1")
        if not 0 <= jitter <= 1:
            raise ValueError("backoff jitter must be in [0, 1]")
        self.initial = initial
        self.factor = factor
        self.max = max
        self.jitter = jitter
        self.attempts = 0  # delays handed out since the last reset
        self._rng = rng or random.Random()

    def cap(self) -> float:
        """The longest the next delay can be (no jitter)."""
        return min(self.max, self.initial * self.factor**self.attempts)

    def next(self) -> float:
        """The next delay in seconds; each call moves one step along the schedule."""
        cap = self.cap()
        self.attempts += 1
        if not self.jitter:
            return cap
        return self._rng.uniform(cap * (1 - self.jitter), cap)

    def reset(self) -> None:
        """After a success: the next delay starts again from ``initial``."""
        self.attempts = 0

    async def sleep(self) -> float:
        """Sleep for :meth:`next`; returns the delay slept."""
        delay = self.next()
        await anyio.sleep(delay)
        return delay


async def retry(
    call: Callable[[], Awaitable[T]],
    backoff: Backoff,
    *,
    attempts: int | None = None,
    again: Callable[[T], bool] | None = None,
    errors: tuple[type[Exception], ...] = (),
    on_retry: Callable[[int, float, T | Exception], None] | None = None,
) -> T:
    """Call ``call`` until it succeeds, sleeping ``backoff`` between tries.

    A try fails when it raises one of ``errors`` or returns a result for which ``again(result)``
    is true. After ``attempts`` tries (None: no limit) the last failure stands: its exception is
    raised, or its result returned (the caller tells "gave up" from the result). ``on_retry`` is
    called with (try number, delay, failure) before each sleep, for logging. Other exceptions
    propagate at once.
    """
    tried = 0
    while True:
        tried += 1
        failure: T | Exception
        try:
            result = await call()
        except errors as exc:
            if attempts is not None and tried >= attempts:
                raise
            failure = exc
        else:
            if again is None or not again(result) or (attempts is not None and tried >= attempts):
                return result
            failure = result
        delay = backoff.next()
        if on_retry is not None:
            on_retry(tried, delay, failure)
        await anyio.sleep(delay)
