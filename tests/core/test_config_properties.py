"""Random scheduler configurations (hypothesis, derandomized): ``parse_config`` refuses one with
``ConfigError`` naming the field, or the configuration runs cycles of a small random cluster (the
scenarios of test_properties.py) without an exception.

Configurations: either profile (or an unknown one), actions drawn from the profile's registry (in any
order, as a list or a string, now and then an unknown name), one to three tiers of plugins from the
profile's registry with random extension-point switches and random arguments (the plugin's own keys
with values of the right type, of another type, or junk; now and then an unknown key), random
action arguments and scheduler-wide session parameters.

Properties: over-commit and device ids (test_properties.check_cycle) hold under every configuration
that loads; allocate-only configurations ([enqueue,] allocate) with gang and predicates on also keep
gangs all-or-nothing and every placement within the predicates.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, note, settings
from hypothesis import strategies as st
from test_properties import PROFILE, cases, run_case

from server.config import PROFILES, SESSION_PARAMETERS, SWITCHES, ConfigError, parse_config
from server.session.options import SchedulerConfig

# Values an argument may be given, besides its default: of its type, of another, junk.
JUNK: list[Any] = [
    "",
    "x",
    "-1",
    "1e309",
    None,
    [],
    {},
    [1],
    {"a": 1},
    -1,
    0,
    2**63,
    1.5,
    -0.5,
    1e308,
    True,
]
BY_TYPE: dict[type, list[Any]] = {
    bool: [True, False, "true", "false", "yes", 1, 0],
    int: [0, 1, 2, 10, -1, 10**6, "3"],
    float: [0.0, 0.1, 0.5, 1.0, 2.0, -1.0, "0.5"],
    str: ["", "binpack", "spread", "cpu", "nvidia.com/gpu", "1m", "10s", "cpu,memory"],
}


@st.composite
def argument_values(draw: st.DrawFn, default: Any) -> Any:
    typed = BY_TYPE.get(type(default), [])
    pool = [default, *typed] if typed else [default]
    return draw(st.one_of(st.sampled_from(pool), st.sampled_from(pool), st.sampled_from(JUNK)))


@st.composite
def arguments(draw: st.DrawFn, known: dict[str, Any], unknown: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in (
        draw(st.lists(st.sampled_from(sorted(known)), max_size=3, unique=True)) if known else []
    ):
        name = (
            key[:-1] + draw(st.sampled_from(["cpu", "nvidia.com/gpu", "x"]))
            if key.endswith("*")
            else key
        )
        out[name] = draw(argument_values(known[key]))
    if unknown:
        out["no-such-argument"] = 1
    return out


@st.composite
def plugin_entries(
    draw: st.DrawFn, registry: dict[str, Any], name: str | None = None
) -> dict[str, Any]:
    name = name or draw(st.sampled_from(sorted(registry)))
    entry: dict[str, Any] = {"name": name}
    for key in draw(st.lists(st.sampled_from(sorted(SWITCHES)), max_size=3, unique=True)):
        entry[key] = draw(st.booleans())
    if draw(st.booleans()):
        entry["arguments"] = draw(arguments(getattr(registry[name], "ARGUMENTS", {})))
    return entry


SESSION_VALUES: dict[str, list[Any]] = {
    "int": [-1, 0, 1, 16],
    "bool": [True, False],
    "duration": ["60s", "5m", 0, 30, "1h"],
    "per-action": [{}, {"allocate": 2}, {"reclaim": -1, "preempt": 0}, {"consolidation": 8}],
}
# One defect at most per configuration (most have none): each must be refused with ConfigError.
DEFECTS = [None] * 24 + [
    "profile",
    "action",
    "switch",
    "argument",
    "mode",
    "session",
    "action argument",
    "tier",
]


@st.composite
def configurations(draw: st.DrawFn) -> tuple[dict[str, Any], str | None]:
    """A configuration, and its defect (None: it has none)."""
    defect = draw(st.sampled_from(DEFECTS))
    profile = "slurm" if defect == "profile" else draw(st.sampled_from(["volcano", "kai"]))
    action_registry, plugin_registry = PROFILES.get(profile, PROFILES["volcano"])
    # A third are allocate-only with gang and predicates on: the configurations every property holds for.
    guided = draw(st.integers(0, 2)) == 0
    if guided:
        actions = draw(st.sampled_from([["allocate"], ["enqueue", "allocate"]]))
    else:
        actions = draw(
            st.lists(st.sampled_from(sorted(action_registry)), min_size=1, max_size=4, unique=True)
        )
    if defect == "action":
        actions.append("no-such-action")
    tiers = [
        draw(st.lists(plugin_entries(plugin_registry), min_size=1, max_size=5))
        for _ in range(draw(st.integers(1, 3)))
    ]
    if guided:
        tiers[0][:0] = [{"name": "gang"}, {"name": "predicates"}]
    if defect == "switch":
        tiers[-1][-1]["enableJobOrder"] = "yes"
    if defect == "argument":
        tiers[-1].append({"name": "binpack", "arguments": {"no-such-argument": 1}})
    config: dict[str, Any] = {
        "actions": ", ".join(actions) if draw(st.booleans()) else actions,
        "tiers": [{"plugins": plugins} for plugins in tiers],
    }
    if defect == "tier":
        config["tiers"].append({"plugins": [{"name": "no-such-plugin"}]})
    if profile != "volcano" or draw(st.booleans()):
        config["profile"] = profile
    if defect == "mode":
        config["extension_points_not_listed"] = "maybe"
    elif not guided and draw(st.booleans()):
        config["extension_points_not_listed"] = draw(st.sampled_from(["enabled", "disabled"]))
    if defect == "action argument" or draw(st.integers(0, 2)) == 0:
        name = draw(st.sampled_from(actions))
        known = getattr(action_registry.get(name), "ARGUMENTS", {})
        config["action_arguments"] = {
            name: draw(arguments(known, unknown=defect == "action argument"))
        }
    if defect == "session" or draw(st.integers(0, 2)) == 0:
        keys = draw(
            st.lists(
                st.sampled_from(sorted(SESSION_PARAMETERS)), min_size=1, max_size=3, unique=True
            )
        )
        config["session"] = {
            k: draw(st.sampled_from(SESSION_VALUES[SESSION_PARAMETERS[k]])) for k in keys
        }
        if defect == "session":
            config["session"][keys[0]] = {
                "int": "x",
                "bool": "x",
                "duration": "soon",
                "per-action": {"allocate": "x"},
            }[SESSION_PARAMETERS[keys[0]]]
    return config, defect


def _plugin_on(config: SchedulerConfig, name: str, switch: str) -> bool:
    return any(opt.name == name and opt.enabled(switch) for tier in config.tiers for opt in tier)


def _predicates_on(config: SchedulerConfig) -> bool:
    """The predicates plugin filters nodes with its node-affinity, taint and pod-affinity filters
    on. A plugin listed twice runs once per session with the last entry's arguments (as in Volcano:
    one function per plugin name), each entry's switches deciding where it is called."""
    entries = [opt for tier in config.tiers for opt in tier if opt.name == "predicates"]
    filters = (
        "predicate.NodeAffinityEnable",
        "predicate.TaintTolerationEnable",
        "predicate.PodAffinityEnable",
    )
    return any(opt.enabled("predicate") for opt in entries) and all(
        entries[-1].arguments.get(f, True) is True for f in filters
    )


@settings(PROFILE, max_examples=400)
@given(data=st.data())
def test_a_configuration_is_refused_or_runs(data: st.DataObject) -> None:
    raw, defect = data.draw(configurations(), label="config")
    note(json.dumps(raw))
    try:
        config = parse_config(raw)
    except ConfigError:
        return
    assert not defect, f"{defect}: a defective configuration was taken"
    allocate_only = set(config.actions) <= {"enqueue", "allocate"}
    case = data.draw(cases(config.profile, config=raw), label="case")
    note(json.dumps(case.doc))
    # Every configuration keeps nodes and devices within their capacity; allocate-only ones with gang
    # and predicates on keep gangs and predicates too (KAI's allocate places gangs whole by itself).
    gang = config.profile == "kai" or _plugin_on(config, "gang", "job_ready")
    case.gang = case.gang_pipelined = allocate_only and gang and _predicates_on(config)
    case.predicates = case.gang
    case.gang_evictions = False
    case.huawei = _plugin_on(config, "huaweiNPU", "predicate")
    run_case(case)
