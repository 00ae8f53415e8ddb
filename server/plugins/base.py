"""Plugin base class: arguments with defaults, validation, session hooks.

A plugin is one small module: it registers functions for extension points on the session in
``on_session_open`` (``ssn.register(JOB_READY, self.name, fn)``; the points, the type of each one's
function and how the answers combine are the table in ``server/session/extension_points.py``) and
may report in ``on_session_close``. Plugins never import each other's modules (what several need
is in ``server/plugins/util.py``); they only talk to the session.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from server.session.options import flag
from server.session.session import Session


class Plugin:
    name: ClassVar[str] = ""
    # Known arguments and their defaults. A key ending in "*" admits any suffix
    # (e.g. "binpack.resources.*" for per-resource weights).
    ARGUMENTS: ClassVar[dict[str, Any]] = {}
    # Decides by the time of day (waiting times, time windows), not only by the snapshot.
    reads_clock: ClassVar[bool] = False

    def __init__(self, arguments: dict[str, Any] | None = None) -> None:
        self.arguments: dict[str, Any] = {
            k: v for k, v in self.ARGUMENTS.items() if not k.endswith("*")
        } | dict(arguments or {})

    @classmethod
    def validate_arguments(cls, arguments: dict[str, Any]) -> None:
        """Raise ValueError("<key>: <problem>") for an unknown argument."""
        prefixes = [k[:-1] for k in cls.ARGUMENTS if k.endswith("*")]
        for key in arguments:
            if key in cls.ARGUMENTS or any(key.startswith(p) for p in prefixes):
                continue
            raise ValueError(f"{key}: unknown argument of plugin {cls.name}")

    # -- typed argument access (Volcano framework.Arguments.GetInt / GetBool / GetFloat64) --
    def arg_int(self, key: str, default: int = 0) -> int:
        value = self.arguments.get(key, default)
        try:
            return int(value)
        except (TypeError, ValueError, OverflowError):  # OverflowError: int(float("inf"))
            return default

    def arg_float(self, key: str, default: float = 0.0) -> float:
        value = self.arguments.get(key, default)
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            return default
        return number if math.isfinite(number) else default  # "1e309", "inf", "nan": as if unset

    def arg_bool(self, key: str, default: bool = False) -> bool:
        return flag(self.arguments, key, default)

    def on_session_open(self, ssn: Session) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def on_session_close(self, ssn: Session) -> None:
        return None
