"""Kubernetes resource quantities and Muster's canonical resource units.

Canonical units follow Volcano's ``api.Resource``: ``cpu`` in millicores, ``memory`` (and every
``*storage`` / ``hugepages-*`` resource) in bytes, ``pods`` as a count, and every other (extended /
scalar) resource in milli-units, so ``nvidia.com/gpu: 1`` is ``1000.0``. Comparisons use Volcano's
epsilon (``MIN_RESOURCE``) so that float noise never decides a fit.

Every quantity is bounded where it enters (``parse_resources``): its canonical value lies within
``MAX_CANONICAL`` (2**53, so float arithmetic on it stays exact), and NaN and infinity are refused.
The one infinity there is comes from ``allow_unlimited``: a queue's "-1" (unlimited).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"

# Volcano's minResource: quantities closer than this are equal.
MIN_RESOURCE = 0.1
# The largest canonical value (millicores, bytes, milli-units, a count) any one quantity may have:
# every integer up to it is a float, so sums and differences of quantities stay exact. 2**53
# millicores are 9 trillion cores, 2**53 bytes 8 PiB, 2**53 milli-GPUs 9 trillion GPUs.
MAX_CANONICAL = float(2**53)
_MAX_EXACT = Decimal(2**53)
# A quantity's decimal exponent (its leading digit's place, suffix included) beyond which it is
# refused as too large before any arithmetic: far above MAX_CANONICAL in any unit, far below what
# would make building the value slow. Below -_MAX_MAGNITUDE a value is 0.
_MAX_MAGNITUDE = 40

_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(
    r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:[eE]([+-]?[0-9]+))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$"
)
_RESOURCE_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class QuantityError(ValueError):
    """A malformed quantity or resource name; the message says what is wrong."""


class QuantityTooLarge(QuantityError):
    """A quantity beyond the largest allowed (``MAX_CANONICAL``)."""


# The place of each suffix's factor's leading digit (Ki = 1024: 3, m: -3).
_SUFFIX_PLACES = {suffix: factor.adjusted() for suffix, factor in _SUFFIX.items()}


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity ("500m", "4Gi", "1e3", 2) into its value in base units.

    A finite value only: NaN and infinity are refused, and so is a value far beyond any bound
    (``1e999999999``, a 400-digit number), without building it (``parse_resources`` holds the
    value itself to ``MAX_CANONICAL``)."""
    if isinstance(text, bool):
        raise QuantityError(f"{text!r} is not a quantity")
    if isinstance(text, int):
        if text.bit_length() > 4 * _MAX_MAGNITUDE:  # (str() of a huge int is slow, or refused)
            raise QuantityTooLarge(f"{_short(text)} is more than the largest quantity allowed")
        return Decimal(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise QuantityError(f"{text!r} is not a finite quantity")
        return Decimal(repr(text))
    s = str(text).strip()
    m = _QUANTITY.match(s)
    if not m:
        raise QuantityError(f"{_short(text)} is not a quantity")
    number, exponent, suffix = m.groups()
    digits = number.lstrip("+-")
    whole, _, fraction = digits.partition(".")
    whole = whole.lstrip("0")
    if whole:
        place = len(whole) - 1
    else:
        fraction_digits = fraction.lstrip("0")
        if not fraction_digits:
            return Decimal(0)  # zero, whatever its exponent
        place = -(len(fraction) - len(fraction_digits)) - 1
    exponent = exponent or "0"
    # The exponent is read only when short: a longer one is far out of range either way.
    if len(exponent) <= 12:
        exp = int(exponent)
    else:
        exp = -(10**12) if exponent.startswith("-") else 10**12
    # The place of the value's leading digit, within one (the suffix's factor may round it up).
    magnitude = place + exp + _SUFFIX_PLACES[suffix]
    if magnitude > _MAX_MAGNITUDE:
        raise QuantityTooLarge(f"{_short(text)} is more than the largest quantity allowed")
    if magnitude < -_MAX_MAGNITUDE:
        return Decimal(0)  # below a nano-unit by far: nothing
    try:
        value = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only numbers
        raise QuantityError(f"{_short(text)} is not a quantity") from exc
    if exp:
        value = value.scaleb(exp)
    return value * _SUFFIX[suffix]


def _short(text: object) -> str:
    """``text`` as an error message quotes it: its repr, cut short when long."""
    shown = repr(text)
    return shown if len(shown) <= 40 else f"{shown[:30]}...({len(shown)} characters)"


def is_bytes_resource(name: str) -> bool:
    return name == MEMORY or name.endswith("storage") or name.startswith("hugepages-")


def to_canonical(name: str, value: Decimal) -> float:
    """Base-unit value -> canonical unit of ``name`` (see module docstring)."""
    return float(exact_canonical(name, value))


def exact_canonical(name: str, value: Decimal) -> Decimal:
    """Base-unit value -> canonical unit of ``name``, exactly (before rounding to a float)."""
    if name == PODS or is_bytes_resource(name):
        return value
    return value * 1000


def from_canonical(name: str, value: float) -> str:
    """Canonical value -> the shortest readable quantity string. Never raises: +inf (a queue's
    unlimited) is "-1", as the API writes it; -inf and NaN (which no parser produces) as Python
    writes them."""
    if not math.isfinite(value):
        return "-1" if value > 0 else str(value)
    if name == PODS:
        return str(int(round(value)))
    if is_bytes_resource(name):
        v = int(round(value))
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            unit = int(_SUFFIX[suffix])
            if v and v % unit == 0:
                return f"{v // unit}{suffix}"
        return str(v)
    milli = int(round(value))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def validate_resource_name(name: str) -> None:
    if not name or len(name) > 253 or not _RESOURCE_NAME.match(name):
        raise QuantityError(f"{name!r} is not a valid resource name")


def parse_resources(
    quantities: Mapping[str, str | int | float],
    *,
    allow_negative: bool = False,
    allow_unlimited: bool = False,
) -> dict[str, float]:
    """Parse {name: quantity} into canonical units.

    Raises QuantityError whose message starts with the offending resource name, so callers can
    prefix it with the path of the field (``jobs[2].tasks[0].request.cpu: "2x" is not a quantity``).
    Every value is finite and within ``MAX_CANONICAL`` (either sign, when negatives are allowed);
    ``allow_unlimited`` maps "-1" to +inf (queue capability: unlimited), the only infinity.
    """
    out: dict[str, float] = {}
    for name, raw in quantities.items():
        try:
            validate_resource_name(name)
        except QuantityError as exc:
            raise QuantityError(f"{name}: {exc}") from None
        try:
            value = parse_quantity(raw)
        except QuantityTooLarge:
            raise QuantityTooLarge(_too_large(name, raw)) from None
        except QuantityError as exc:
            raise QuantityError(f"{name}: {exc}") from None
        if allow_unlimited and value == -1:
            out[name] = float("inf")
            continue
        if value < 0 and not allow_negative:
            raise QuantityError(f"{name}: {_short(raw)} is negative")
        # The bound on the exact value: 2**53 + 1 would round to 2**53 as a float.
        exact = exact_canonical(name, value)
        if abs(exact) > _MAX_EXACT:
            raise QuantityTooLarge(_too_large(name, raw))
        out[name] = float(exact)
    return out


def _too_large(name: str, raw: object) -> str:
    return f"{name}: {_short(raw)} is more than the largest quantity allowed ({max_quantity(name)})"


def max_quantity(name: str) -> str:
    """The largest quantity of resource ``name`` that ``parse_resources`` accepts, written out."""
    return from_canonical(name, MAX_CANONICAL)


def format_resources(resources: Mapping[str, float]) -> dict[str, str]:
    """Canonical values -> quantity strings (+inf, a queue's unlimited: "-1")."""
    return {name: from_canonical(name, value) for name, value in sorted(resources.items())}
