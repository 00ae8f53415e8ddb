"""Plugin registry: name -> class. Each plugin is one module of this package."""

from __future__ import annotations

from server.plugins.base import Plugin
from server.plugins.binpack import BinpackPlugin
from server.plugins.capacity import CapacityPlugin
from server.plugins.conformance import ConformancePlugin
from server.plugins.drf import DrfPlugin
from server.plugins.fgd import FgdPlugin
from server.plugins.gang import GangPlugin
from server.plugins.gang_backend import GangBackendPlugin
from server.plugins.huawei_npu import HuaweiNPUPlugin
from server.plugins.network_topology import NetworkTopologyPlugin
from server.plugins.nodeorder import NodeOrderPlugin
from server.plugins.overcommit import OvercommitPlugin
from server.plugins.predicates import PredicatesPlugin
from server.plugins.priority import PriorityPlugin
from server.plugins.proportion import ProportionPlugin
from server.plugins.sla import SlaPlugin
from server.plugins.task_topology import TaskTopologyPlugin
from server.plugins.tdm import TdmPlugin
from server.plugins.tyarranger import TYArrangerPlugin

PLUGINS: dict[str, type[Plugin]] = {
    cls.name: cls
    for cls in (
        BinpackPlugin,
        CapacityPlugin,
        ConformancePlugin,
        DrfPlugin,
        FgdPlugin,
        GangPlugin,
        GangBackendPlugin,
        HuaweiNPUPlugin,
        NetworkTopologyPlugin,
        NodeOrderPlugin,
        OvercommitPlugin,
        PredicatesPlugin,
        PriorityPlugin,
        ProportionPlugin,
        SlaPlugin,
        TaskTopologyPlugin,
        TdmPlugin,
        TYArrangerPlugin,
    )
}

__all__ = ["PLUGINS", "Plugin"]
