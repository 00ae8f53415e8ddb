"""Action base class: one step of a scheduling cycle (enqueue, allocate, preempt ...)."""

from __future__ import annotations

from typing import Any, ClassVar

from server.session.options import flag
from server.session.session import Session


class Action:
    name: ClassVar[str] = ""
    # Known per-action arguments (Volcano ``configurations``) and their defaults.
    ARGUMENTS: ClassVar[dict[str, Any]] = {}
    # Decides by the time of day, not only by the snapshot (see Plugin.reads_clock).
    reads_clock: ClassVar[bool] = False

    def __init__(self, arguments: dict[str, Any] | None = None) -> None:
        self.arguments: dict[str, Any] = dict(self.ARGUMENTS) | dict(arguments or {})

    @classmethod
    def validate_arguments(cls, arguments: dict[str, Any]) -> None:
        for key in arguments:
            if key not in cls.ARGUMENTS:
                raise ValueError(f"{key}: unknown argument of action {cls.name}")

    def arg_bool(self, key: str) -> bool:
        return flag(self.arguments, key, False)

    def execute(self, ssn: Session) -> None:  # pragma: no cover - interface
        raise NotImplementedError
