"""Scheduler configuration in Volcano's format, loaded as-is.

    actions: "enqueue, allocate, backfill"      # or a YAML list
    tiers:
    - plugins:
      - name: gang
        enablePreemptable: false                # per-extension-point switches
        arguments: {...}                        # plugin arguments, validated by the plugin
    configurations:                             # Volcano's per-action arguments
    - name: preempt
      arguments: {enableTopologyAwarePreemption: true}

Muster additions: ``action_arguments`` (the scenario form of ``configurations``),
``extension_points_not_listed: enabled|disabled`` (``disabled``: only switches written as ``true``
are on, the way Volcano's own tests build tiers), ``profile: volcano|kai``, ``session`` (scheduler-
wide parameters) and ``priorityClasses``. Unknown keys, actions, plugins, switches and arguments are
errors naming the field.
"""

from __future__ import annotations

import math
from typing import Any

from muster import yamldoc
from muster.yamldoc import brief
from server.actions import ACTIONS
from server.actions.kai import KAI_ACTIONS
from server.model import PriorityClass
from server.plugins import PLUGINS
from server.plugins.kai import KAI_PLUGINS
from server.session.extension_points import ALL_SWITCHES
from server.session.options import (
    MAX_DURATION_SECONDS,
    PluginOption,
    SchedulerConfig,
    parse_go_duration,
)

__all__ = [
    "DEFAULT_CONFIG_YAML",
    "SWITCHES",
    "ConfigError",
    "PluginOption",
    "SchedulerConfig",
    "default_config",
    "load_config",
    "parse_config",
    "parse_priority_classes",
]

DEFAULT_CONFIG_YAML = """\
actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
  - name: conformance
- plugins:
  - name: overcommit
  - name: drf
  - name: predicates
  - name: proportion
  - name: nodeorder
"""

# YAML key -> switch name (Volcano conf.PluginOption), from the extension point table.
SWITCHES: dict[str, str] = {s.key: s.name for s in ALL_SWITCHES}
# Volcano's defaulting leaves hierarchy off unless asked for; every other switch defaults to on.
_DEFAULT_OFF = {s.name for s in ALL_SWITCHES if not s.default}


class ConfigError(ValueError):
    """Invalid configuration; the message names the offending field."""


_TOP_KEYS = {
    "actions",
    "tiers",
    "configurations",
    "action_arguments",
    "extension_points_not_listed",
    "profile",
    "session",
    "priorityClasses",
    "metrics",
    "cycles",
    "name",
}


# Per profile, the actions and plugins its names mean: KAI's where both systems have the name.
PROFILES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "volcano": (ACTIONS, PLUGINS),
    "kai": ({**ACTIONS, **KAI_ACTIONS}, {**PLUGINS, **KAI_PLUGINS}),
}


# Kubernetes priorities are 32-bit integers.
_INT32 = (-(2**31), 2**31 - 1)


def _bool(value: Any, path: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{path}: {brief(value)} is not a boolean")


def _check_arguments(args: dict[Any, Any], path: str) -> None:
    """What holds for the arguments of every plugin and action (each checks its own names, and
    reads values leniently, as Volcano's ``GetInt``...): names are strings (YAML also allows
    numbers, null ... as keys) and numbers are finite and within 64 bits (``.inf`` or ``1e400``
    would overflow where a plugin converts them)."""
    for key, value in args.items():
        if not isinstance(key, str):
            raise ConfigError(f"{path}.{brief(key)}: an argument name must be a string")
        _check_argument_value(value, f"{path}.{key}")


def _check_argument_value(value: Any, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{path}: {brief(value)} is not a finite number")
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise ConfigError(f"{path}: {brief(value)} is out of range")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_argument_value(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_argument_value(v, f"{path}[{i}]")


def parse_priority_classes(raw: Any, path: str) -> dict[str, PriorityClass]:
    out: dict[str, PriorityClass] = {}
    if raw is None:
        return out
    if not isinstance(raw, list):
        raise ConfigError(f"{path}: must be a list")
    for i, pc in enumerate(raw):
        p = f"{path}[{i}]"
        if not isinstance(pc, dict):
            raise ConfigError(f"{p}: must be a mapping")
        unknown = set(pc) - {"name", "value", "preemptionPolicy", "globalDefault", "description"}
        if unknown:
            raise ConfigError(f"{p}.{sorted(unknown)[0]}: unknown field")
        if not isinstance(pc.get("name"), str) or not pc["name"]:
            raise ConfigError(f"{p}.name: required")
        value = pc.get("value")
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{p}.value: {brief(value)} is not an integer")
        if not _INT32[0] <= value <= _INT32[1]:
            raise ConfigError(f"{p}.value: {brief(value)} is not a 32-bit integer")
        policy = pc.get("preemptionPolicy", "PreemptLowerPriority")
        if policy not in ("PreemptLowerPriority", "Never"):
            raise ConfigError(
                f"{p}.preemptionPolicy: {brief(policy)} is not PreemptLowerPriority or Never"
            )
        if not isinstance(pc.get("description", ""), str):
            raise ConfigError(f"{p}.description: must be a string")
        default = _bool(pc.get("globalDefault", False), f"{p}.globalDefault")
        out[pc["name"]] = PriorityClass(pc["name"], value, policy, default)
    return out


def parse_config(raw: Any, *, path: str = "config", text: str = "") -> SchedulerConfig:
    """Validate a configuration mapping (already parsed from YAML/JSON). Each plugin option
    carries its plugin class, resolved here from the registry."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a mapping")
    for key in raw:
        if key not in _TOP_KEYS and not str(key).startswith("x-"):
            raise ConfigError(f"{path}.{key}: unknown field")

    profile = raw.get("profile", "volcano")
    if not isinstance(profile, str) or profile not in PROFILES:
        raise ConfigError(f"{path}.profile: {brief(profile)} is not volcano or kai")
    action_registry, plugin_registry = PROFILES[profile]
    actions_raw = raw.get("actions", "enqueue, allocate, backfill")
    if isinstance(actions_raw, str):
        actions = [a.strip() for a in actions_raw.split(",") if a.strip()]
    elif isinstance(actions_raw, list) and all(isinstance(a, str) for a in actions_raw):
        actions = [a.strip() for a in actions_raw]
    else:
        raise ConfigError(f"{path}.actions: must be a string or a list of action names")
    for i, a in enumerate(actions):
        if a not in action_registry:
            raise ConfigError(
                f"{path}.actions[{i}]: unknown action {brief(a)} (known in profile {profile}: {', '.join(sorted(action_registry))})"
            )

    mode = raw.get("extension_points_not_listed", "enabled")
    if not isinstance(mode, str) or mode not in ("enabled", "disabled"):
        raise ConfigError(
            f"{path}.extension_points_not_listed: {brief(mode)} is not enabled or disabled"
        )
    tiers_raw = raw.get("tiers", [])
    if not isinstance(tiers_raw, list):
        raise ConfigError(f"{path}.tiers: must be a list")
    tiers: list[list[PluginOption]] = []
    for ti, tier in enumerate(tiers_raw):
        tp = f"{path}.tiers[{ti}]"
        if not isinstance(tier, dict) or set(tier) - {"plugins"}:
            raise ConfigError(f"{tp}: a tier is a mapping with one key, plugins")
        plugins_raw = tier.get("plugins") or []
        if not isinstance(plugins_raw, list):
            raise ConfigError(f"{tp}.plugins: must be a list")
        options: list[PluginOption] = []
        for pi, p in enumerate(plugins_raw):
            pp = f"{tp}.plugins[{pi}]"
            if not isinstance(p, dict) or not isinstance(p.get("name"), str):
                raise ConfigError(f"{pp}.name: required")
            name = p["name"]
            plugin_cls = plugin_registry.get(name)
            if plugin_cls is None:
                raise ConfigError(
                    f"{pp}.name: unknown plugin {brief(name)} (known in profile {profile}: {', '.join(sorted(plugin_registry))})"
                )
            switches: dict[str, bool] = {}
            for key, value in p.items():
                if key in ("name", "arguments"):
                    continue
                if key not in SWITCHES:
                    raise ConfigError(f"{pp}.{key}: unknown field")
                switches[SWITCHES[key]] = _bool(value, f"{pp}.{key}")
            for point in SWITCHES.values():
                if point not in switches:
                    switches[point] = mode == "enabled" and point not in _DEFAULT_OFF
            args = p.get("arguments") or {}
            if not isinstance(args, dict):
                raise ConfigError(f"{pp}.arguments: must be a mapping")
            _check_arguments(args, f"{pp}.arguments")
            try:
                plugin_cls.validate_arguments(args)
            except ValueError as exc:
                raise ConfigError(f"{pp}.arguments.{exc}") from None
            options.append(PluginOption(name, switches, dict(args), plugin_class=plugin_cls))
        tiers.append(options)

    action_arguments: dict[str, dict[str, Any]] = {}
    confs = raw.get("configurations") or []
    if not isinstance(confs, list):
        raise ConfigError(f"{path}.configurations: must be a list")
    for ci, c in enumerate(confs):
        cp = f"{path}.configurations[{ci}]"
        if not isinstance(c, dict):
            raise ConfigError(f"{cp}: must be a mapping (name, arguments)")
        if not isinstance(c.get("name"), str):
            raise ConfigError(f"{cp}.name: required")
        if c["name"] not in action_registry:
            raise ConfigError(f"{cp}.name: unknown action {brief(c['name'])}")
        args = c.get("arguments") or {}
        if not isinstance(args, dict):
            raise ConfigError(f"{cp}.arguments: must be a mapping")
        _check_arguments(args, f"{cp}.arguments")
        action_arguments.setdefault(c["name"], {}).update(args)
    extra = raw.get("action_arguments") or {}
    if not isinstance(extra, dict):
        raise ConfigError(f"{path}.action_arguments: must be a mapping")
    for name, args in extra.items():
        if not isinstance(name, str):
            raise ConfigError(
                f"{path}.action_arguments.{brief(name)}: an action name must be a string"
            )
        if not isinstance(args, dict):
            raise ConfigError(f"{path}.action_arguments.{name}: must be a mapping")
        _check_arguments(args, f"{path}.action_arguments.{name}")
        action_arguments.setdefault(name, {}).update(args)
    for name, args in action_arguments.items():
        action_cls = action_registry.get(name)
        if action_cls is None:
            raise ConfigError(f"{path}.action_arguments.{name}: unknown action")
        try:
            action_cls.validate_arguments(args)
        except ValueError as exc:
            raise ConfigError(f"{path}.action_arguments.{name}.{exc}") from None

    session = raw.get("session") or {}
    if not isinstance(session, dict):
        raise ConfigError(f"{path}.session: must be a mapping")
    _check_session(session, f"{path}.session")
    return SchedulerConfig(
        actions=actions,
        tiers=tiers,
        action_arguments=action_arguments,
        profile=profile,
        session=dict(session),
        priority_classes=parse_priority_classes(
            raw.get("priorityClasses"), f"{path}.priorityClasses"
        ),
        yaml_text=text,
        action_classes={a: action_registry[a] for a in actions},
    )


# Scheduler-wide parameters (KAI's ``SchedulerParams``): those Muster acts on, with their check,
# and those accepted for compatibility that change nothing here.
SESSION_PARAMETERS: dict[str, str] = {
    "maxNumberConsolidationPreemptees": "int",  # consolidation's victim-job bound (-1: none, 0: off)
    "allowConsolidatingReclaim": "bool",  # reclaim victims re-placed elsewhere are not counted as lost
    "globalDefaultStalenessGracePeriod": "duration",  # stalegangeviction's grace period
    "gangAcrossBackends": "bool",  # Muster: may a gang span backends (server/scheduler.py)
    "shapeClasses": "bool",  # allocate: skip a job whose shape found no room (server/session/shape_classes.py)
    "maxQueueLookback": "int",  # allocate: the most jobs of a queue one cycle considers (0: no bound)
    "useSchedulingSignatures": "bool",  # KAI: skip a job no easier than one that found no victims
    "scenarioFilters": "bool",  # KAI victim searches: reject a scenario before simulating it (default true)
    "solverPruning": "bool",  # KAI victim searches: skip scenarios sure to fail alike (default true)
    "queueDepthPerAction": "per-action",  # KAI: the most jobs of a queue each action tries
    "simulationBudgetPerAction": "per-action",  # KAI victim searches: the most scenarios an action simulates
}
SESSION_COMPATIBILITY = frozenset(
    {
        "isInferencePreemptible",
        "restrictSchedulingNodes",
        "detailedFitErrors",
        "fullHierarchyFairness",
        "numOfStatusRecordingWorkers",
        "schedulePeriod",
        "schedulerName",
        "partitionParams",
        "k8sClusterPodAffinityInfo",
        "updatePodEvictionCondition",
    }
)


def _check_session(session: dict[str, Any], path: str) -> None:
    for key, value in session.items():
        kind = SESSION_PARAMETERS.get(str(key))
        if kind is None:
            if key in SESSION_COMPATIBILITY or str(key).startswith("x-"):
                continue
            raise ConfigError(
                f"{path}.{key}: unknown scheduler parameter (known: {', '.join(sorted(SESSION_PARAMETERS))})"
            )
        if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{path}.{key}: {brief(value)} is not an integer")
        if kind == "int" and not -(2**63) <= value < 2**63:
            raise ConfigError(f"{path}.{key}: {brief(value)} is out of range")
        if kind == "bool":
            _bool(value, f"{path}.{key}")
        if kind == "per-action" and (
            not isinstance(value, dict)
            or not all(
                isinstance(a, str) and isinstance(n, int) and not isinstance(n, bool)
                for a, n in value.items()
            )
        ):
            raise ConfigError(
                f"{path}.{key}: {brief(value)} is not a mapping of action names to integers"
            )
        if kind == "duration":
            try:
                if isinstance(value, bool) or not isinstance(value, str | int | float):
                    raise ValueError
                if isinstance(value, str):
                    parse_go_duration(value)
                elif not abs(value) <= MAX_DURATION_SECONDS:  # also inf and nan
                    raise ValueError
            except ValueError:
                raise ConfigError(
                    f"{path}.{key}: {brief(value)} is not a duration (e.g. 60s, 5m)"
                ) from None


def load_config(text: str) -> SchedulerConfig:
    try:
        raw = yamldoc.load(text)
    except yamldoc.DocumentError as exc:
        raise ConfigError(f"config: {exc}") from None
    if not isinstance(raw, dict):
        # `-0`, `null`, `[]` or an empty text would otherwise pass as a configuration of nothing.
        raise ConfigError(
            f"config: must be a mapping (actions, tiers ...), not {type(raw).__name__}"
        )
    return parse_config(raw, text=text)


def default_config() -> SchedulerConfig:
    return load_config(DEFAULT_CONFIG_YAML)
