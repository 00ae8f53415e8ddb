"""How times and node lists read in messages: the server's explanations (the reservation plugin's
"reserved: 8 nodes from 14:32 (n1..n8)") and the CLI's columns say them alike."""

from __future__ import annotations

import time
from collections.abc import Iterable


def clock_text(at: float, now: float) -> str:
    """ "14:32" (local time) within the next 20 hours, else "May 02 14:32"."""
    local = time.localtime(at)
    return time.strftime("%H:%M" if at - now < 20 * 3600 else "%b %d %H:%M", local)


def folded_names(names: Iterable[str], limit: int = 6) -> str:
    """Node names, runs of numbered names folded: "n1..n8", "a-3,a-5,b1..b4 +2 more"; "" for
    none."""
    runs: list[tuple[str, int, int, bool]] = []  # prefix, first, last, numbered
    for name in names:
        head = name.rstrip("0123456789")
        digits = name[len(head) :]
        if digits and not (len(digits) > 1 and digits.startswith("0")):
            n = int(digits)
            if runs and runs[-1][0] == head and runs[-1][3] and runs[-1][2] == n - 1:
                runs[-1] = (head, runs[-1][1], n, True)
                continue
            runs.append((head, n, n, True))
        else:
            runs.append((name, 0, 0, False))
    parts = [
        (f"{p}{a}" if a == b else f"{p}{a}..{p}{b}") if numbered else p
        for p, a, b, numbered in runs
    ]
    if len(parts) > limit:
        return ",".join(parts[:limit]) + f" +{len(parts) - limit} more"
    return ",".join(parts)
