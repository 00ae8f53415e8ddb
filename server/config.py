"""Scheduler configuration (Volcano's format). INTERIM signatures; the full loader replaces it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

DEFAULT_CONFIG_YAML = """\
actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
    enablePreemptable: false
  - name: conformance
- plugins:
  - name: overcommit
  - name: drf
    enablePreemptable: false
  - name: predicates
  - name: proportion
  - name: nodeorder
  - name: binpack
"""


class ConfigError(ValueError):
    """Invalid configuration; the message names the offending field."""


@dataclass
class SchedulerConfig:
    actions: list[str]
    raw: dict[str, Any] = field(default_factory=dict)
    yaml_text: str = ""


def load_config(text: str) -> SchedulerConfig:
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError("config: must be a mapping")
    actions = raw.get("actions", "")
    if isinstance(actions, str):
        actions = [a.strip() for a in actions.split(",") if a.strip()]
    return SchedulerConfig(actions=list(actions), raw=raw, yaml_text=text)


def default_config() -> SchedulerConfig:
    return load_config(DEFAULT_CONFIG_YAML)
