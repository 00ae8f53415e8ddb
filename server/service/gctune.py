"""Garbage-collector thresholds for Muster's processes (server, core worker, benchmarks)."""

from __future__ import annotations

import gc


def tune_gc() -> None:
    """The server state holds ~10 objects per task and a cycle allocates ~10 more per task; with
    the default thresholds full collections (tens to hundreds of ms) would come often and stall
    the event loop or the cycle. Collect young objects far less often."""
    gc.set_threshold(100_000, 50, 100)
