"""Kubernetes resource quantities and Muster's canonical resource units.

Canonical units follow Volcano's ``api.Resource``: ``cpu`` in millicores, ``memory`` (and every
``*storage`` / ``hugepages-*`` resource) in bytes, ``pods`` as a count, and every other (extended /
scalar) resource in milli-units, so ``nvidia.com/gpu: 1`` is ``1000.0``. Comparisons use Volcano's
epsilon (``MIN_RESOURCE``) so that float noise never decides a fit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"

# Volcano's minResource: quantities closer than this are equal.
MIN_RESOURCE = 0.1

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
_QUANTITY = re.compile(r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:[eE]([+-]?[0-9]+))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")
_RESOURCE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class QuantityError(ValueError):
    """A malformed quantity or resource name; the message says what is wrong."""


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity ("500m", "4Gi", "1e3", 2) into its value in base units."""
    if isinstance(text, bool):
        raise QuantityError(f"{text!r} is not a quantity")
    if isinstance(text, int | float):
        return Decimal(str(text))
    s = str(text).strip()
    m = _QUANTITY.match(s)
    if not m:
        raise QuantityError(f"{text!r} is not a quantity")
    number, exponent, suffix = m.groups()
    try:
        value = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only numbers
        raise QuantityError(f"{text!r} is not a quantity") from exc
    if exponent:
        value *= Decimal(10) ** int(exponent)
    return value * _SUFFIX[suffix]


def is_bytes_resource(name: str) -> bool:
    return name == MEMORY or name.endswith("storage") or name.startswith("hugepages-")


def to_canonical(name: str, value: Decimal) -> float:
    """Base-unit value -> canonical unit of ``name`` (see module docstring)."""
    if name == PODS or is_bytes_resource(name):
        return float(value)
    return float(value * 1000)


def from_canonical(name: str, value: float) -> str:
    """Canonical value -> the shortest readable quantity string."""
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
    quantities: Mapping[str, str | int | float], *, allow_negative: bool = False, allow_unlimited: bool = False
) -> dict[str, float]:
    """Parse {name: quantity} into canonical units.

    Raises QuantityError whose message starts with the offending resource name, so callers can
    prefix it with the path of the field (``jobs[2].tasks[0].request.cpu: "2x" is not a quantity``).
    ``allow_unlimited`` maps "-1" to +inf (queue capability: unlimited).
    """
    out: dict[str, float] = {}
    for name, raw in quantities.items():
        try:
            validate_resource_name(name)
        except QuantityError as exc:
            raise QuantityError(f"{name}: {exc}") from None
        try:
            value = parse_quantity(raw)
        except QuantityError as exc:
            raise QuantityError(f"{name}: {exc}") from None
        if allow_unlimited and value == -1:
            out[name] = float("inf")
            continue
        if value < 0 and not allow_negative:
            raise QuantityError(f"{name}: {raw!r} is negative")
        out[name] = to_canonical(name, value)
    return out


def format_resources(resources: Mapping[str, float]) -> dict[str, str]:
    return {
        name: ("-1" if value == float("inf") else from_canonical(name, value))
        for name, value in sorted(resources.items())
    }
