"""Helpers more than one plugin needs (plugins never import each other's modules).

* Go durations (``time.ParseDuration``): sla's waiting times, tdm's eviction period.
* A job's inqueue and elastic resources (Volcano ``util.GetInqueueResource`` and the elastic part
  of allocations above minResources): proportion and capacity.
"""

from __future__ import annotations

import re

import numpy as np

from server.session.info import JobInfo, less_equal

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Go ``time.ParseDuration`` in seconds; ValueError on a malformed string."""
    s = text.strip() if isinstance(text, str) else ""
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    sign = 1.0
    if s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    total, pos = 0.0, 0
    while pos < len(s):
        m = _DURATION.match(s, pos)
        if m is None or m.group(1) in ("", "."):
            raise ValueError(f"invalid duration {text!r}")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos == 0:
        raise ValueError(f"invalid duration {text!r}")
    return sign * total


def exceeded(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    return np.maximum(left - right, 0.0)


def inqueue_resource(job: JobInfo) -> np.ndarray:
    """Volcano util.GetInqueueResource: minResources not yet covered by allocations."""
    if job.min_resources is None:
        return np.zeros_like(job.allocated)
    return exceeded(job.min_resources, job.allocated)


def elastic_resource(job: JobInfo) -> np.ndarray:
    if job.min_resources is None:
        return np.zeros_like(job.allocated)
    if less_equal(job.allocated, job.min_resources):
        return np.zeros_like(job.allocated)
    return exceeded(job.allocated, job.min_resources)
