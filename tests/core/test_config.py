"""Volcano's scheduler configuration format loads as-is; mistakes are errors naming the field."""

from __future__ import annotations

import pytest

from server.config import DEFAULT_CONFIG_YAML, SWITCHES, ConfigError, default_config, load_config
from server.plugins import PLUGINS

VOLCANO_STYLE = """
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
    arguments:
      binpack.weight: 10
      binpack.resources: nvidia.com/gpu
      binpack.resources.nvidia.com/gpu: 5
configurations:
- name: allocate
  arguments: {predicateErrorCacheEnable: false}
"""


def test_default_configuration_is_volcanos() -> None:
    cfg = default_config()
    assert cfg.actions == ["enqueue", "allocate", "backfill"]
    assert [[p.name for p in t] for t in cfg.tiers] == [
        ["priority", "gang", "conformance"],
        ["overcommit", "drf", "predicates", "proportion", "nodeorder"],
    ]
    assert load_config(DEFAULT_CONFIG_YAML).tiers[0][1].enabled("job_ready")


def test_volcano_file_loads_with_switches_arguments_and_configurations() -> None:
    cfg = load_config(VOLCANO_STYLE)
    gang = cfg.plugin("gang")
    assert gang is not None
    assert not gang.enabled("preemptable")
    assert gang.enabled("job_order")
    assert cfg.plugin("binpack").arguments["binpack.resources.nvidia.com/gpu"] == 5  # type: ignore[union-attr]
    assert cfg.action_arguments["allocate"] == {"predicateErrorCacheEnable": False}
    # Volcano leaves hierarchy off unless asked.
    assert not cfg.plugin("drf").enabled("hierarchy")  # type: ignore[union-attr]


def test_actions_as_a_list() -> None:
    assert load_config("actions: [enqueue, allocate]\ntiers: []").actions == ["enqueue", "allocate"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('actions: "enqueue, alocate"', "config.actions[1]: unknown action 'alocate'"),
        (
            "tiers:\n- plugins:\n  - name: gnag",
            "config.tiers[0].plugins[0].name: unknown plugin 'gnag'",
        ),
        (
            "tiers:\n- plugins:\n  - name: gang\n    enableJobOrdr: true",
            "config.tiers[0].plugins[0].enableJobOrdr: unknown field",
        ),
        (
            "tiers:\n- plugins:\n  - name: binpack\n    arguments: {binpack.wieght: 1}",
            "config.tiers[0].plugins[0].arguments.binpack.wieght: unknown argument",
        ),
        ("tiers:\n- plugins:\n  - name: gang\n    enableJobOrder: yes-please", "is not a boolean"),
        ("actoins: allocate", "config.actoins: unknown field"),
        (
            "action_arguments: {allocate: {bogus: 1}}",
            "config.action_arguments.allocate.bogus: unknown argument",
        ),
        ("extension_points_not_listed: maybe", "config.extension_points_not_listed"),
        ("profile: slurm", "config.profile"),
        ("tiers: [", "not valid YAML"),
    ],
)
def test_mistakes_name_the_field(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(text)
    assert fragment in str(err.value)


def test_disabled_mode_only_written_switches_are_on() -> None:
    cfg = load_config(
        "extension_points_not_listed: disabled\ntiers:\n- plugins:\n  - {name: gang, enableJobReady: true}"
    )
    gang = cfg.plugin("gang")
    assert gang is not None
    assert gang.enabled("job_ready")
    assert not gang.enabled("job_order")


def test_x_prefixed_keys_are_ignored() -> None:
    assert load_config("x-note: hello\nactions: allocate").actions == ["allocate"]


# Volcano's conf.PluginOption switches, spelled as its YAML tags are.
VOLCANO_SWITCHES = [
    "enableJobOrder",
    "enableHierarchy",
    "enableJobReady",
    "enableJobPipelined",
    "enableTaskOrder",
    "enablePreemptable",
    "enableReclaimable",
    "enablePreemptive",
    "enableQueueOrder",
    "enabledClusterOrder",
    "enablePredicate",
    "enableBestNode",
    "enableNodeOrder",
    "enableTargetJob",
    "enableReservedNodes",
    "enableJobEnqueued",
    "enabledVictim",
    "enableJobStarving",
    "enabledOverused",
    "enabledAllocatable",
    "enabledHyperNodeOrder",
    "enabledSubJobReady",
    "enabledSubJobPipelined",
    "enabledSubJobOrder",
    "enabledHyperNodeGradient",
]


@pytest.mark.parametrize("key", VOLCANO_SWITCHES)
def test_every_volcano_switch_is_accepted(key: str) -> None:
    gang = load_config(f"tiers:\n- plugins:\n  - {{name: gang, {key}: false}}").plugin("gang")
    assert gang is not None
    assert not gang.enabled(SWITCHES[key])
    assert set(SWITCHES) == set(VOLCANO_SWITCHES)


def test_plugin_options_carry_their_plugin_class() -> None:
    cfg = default_config()
    assert all(option.plugin_class is PLUGINS[option.name] for tier in cfg.tiers for option in tier)


def test_plugin_numbers_that_are_not_finite_read_as_unset() -> None:
    """``overcommit-factor: "1e309"`` became infinity inside the plugin; now the default applies."""
    from server.plugins.base import Plugin

    plugin = Plugin({"f": "1e309", "g": "nan", "h": float("inf"), "i": "2.5"})
    assert [plugin.arg_float(k, 1.2) for k in "fghi"] == [1.2, 1.2, 1.2, 2.5]
    assert plugin.arg_int("h", 7) == 7
