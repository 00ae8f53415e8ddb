"""dominant_share in plain floats gives numpy's answer, edge cases included."""

from __future__ import annotations

import math
import random

import numpy as np

from muster.quantity import MIN_RESOURCE
from server.session.info import dominant_share


def numpy_dominant_share(amount: np.ndarray, base: np.ndarray, empty: float) -> float:
    dims = base >= MIN_RESOURCE
    if not dims.any():
        return empty
    with np.errstate(all="ignore"):
        return float(np.max(amount[dims] / base[dims]))


def test_matches_the_numpy_formula_on_random_vectors() -> None:
    rng = random.Random(7)
    values = [0.0, MIN_RESOURCE / 2, MIN_RESOURCE, 1.0, 3.5e9, math.inf]
    for _ in range(20000):
        n = rng.randint(1, 6)
        amount = np.array([rng.choice([*values, rng.random() * 1e3]) for _ in range(n)])
        base = np.array([rng.choice([*values, rng.random() * 1e3]) for _ in range(n)])
        want, got = numpy_dominant_share(amount, base, 0.25), dominant_share(amount, base, 0.25)
        assert got == want or (math.isnan(got) and math.isnan(want)), (amount, base, got, want)


def test_known_values() -> None:
    assert dominant_share(np.array([2.0, 1.0, 5.0]), np.array([8.0, 2.0, 0.0])) == 0.5
    assert dominant_share(np.array([2.0]), np.array([0.0]), empty=1.0) == 1.0
    assert dominant_share(np.array([1.0, 1.0]), np.array([math.inf, 4.0])) == 0.25
