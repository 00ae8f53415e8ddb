"""The configuration a session is opened with, as plain data (parsed by ``server/config.py``).

``PluginOption.plugin_class`` is the plugin's class, resolved by the config parser from the plugin
registry: the session builds its plugins from the options and never looks at the registry, so the
framework does not depend on the plugin package.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from server.model import PriorityClass

if TYPE_CHECKING:  # the session imports this module: annotations only
    from server.session.session import Session


# ``session: {gangAcrossBackends: true}`` lets a gang's tasks go to nodes of several backends.
GANG_ACROSS_BACKENDS = "gangAcrossBackends"


def flag(values: Mapping[str, Any], key: str, default: bool) -> bool:
    """A boolean setting (a scheduler parameter, an action's or plugin's argument), ``default``
    when absent; a string is true when it says true, 1 or yes."""
    value = values.get(key, default)
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


class SessionPlugin(Protocol):
    """What the session needs of a plugin (``server.plugins.base.Plugin`` implements it)."""

    @property
    def name(self) -> str: ...

    def on_session_open(self, ssn: Session) -> None: ...

    def on_session_close(self, ssn: Session) -> None: ...


# A plugin class: called with the plugin's arguments, once per session.
PluginFactory = Callable[[dict[str, Any]], SessionPlugin]


@dataclass
class PluginOption:
    name: str
    switches: dict[str, bool]  # switch name (``Switch.name``) -> on
    arguments: dict[str, Any] = field(default_factory=dict)
    plugin_class: PluginFactory | None = None  # resolved by the config parser

    def enabled(self, switch: str) -> bool:
        return self.switches.get(switch, False)


@dataclass
class SchedulerConfig:
    actions: list[str]
    tiers: list[list[PluginOption]]
    action_arguments: dict[str, dict[str, Any]] = field(default_factory=dict)
    profile: str = "volcano"
    session: dict[str, Any] = field(default_factory=dict)
    priority_classes: dict[str, PriorityClass] = field(default_factory=dict)
    yaml_text: str = ""
    # Per action name, its class for this profile (resolved by the config parser, like plugins).
    action_classes: dict[str, Any] = field(default_factory=dict)

    @property
    def reads_clock(self) -> bool:
        """Does a configured plugin or action decide by the time of day (a cycle on an unchanged
        cluster may then decide differently)?"""
        plugins = (p.plugin_class for tier in self.tiers for p in tier)
        return any(
            getattr(c, "reads_clock", False) for c in (*plugins, *self.action_classes.values())
        )

    def plugin(self, name: str) -> PluginOption | None:
        for tier in self.tiers:
            for p in tier:
                if p.name == name:
                    return p
        return None


_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
# Go's Duration is int64 nanoseconds: about 292 years; a longer one is invalid there too.
MAX_DURATION_SECONDS = (2**63 - 1) / 1e9


def parse_go_duration(text: str) -> float:
    """Go ``time.ParseDuration`` in seconds; ValueError on a malformed string."""
    s = text.strip() if isinstance(text, str) else ""
    shown = repr(text[:40]) if isinstance(text, str) else type(text).__name__
    if not s:
        raise ValueError(f"invalid duration {shown}")
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
            raise ValueError(f"invalid duration {shown}")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos == 0:
        raise ValueError(f"invalid duration {shown}")
    if not total <= MAX_DURATION_SECONDS:  # also inf and nan
        raise ValueError(f"invalid duration {shown}: out of range")
    return sign * total
