"""Plugin registry: name -> class, the one place plugin names are mapped to classes.

Each plugin is one module, in the sub-package of the system it comes from: ``volcano/`` (Volcano's
plugins, and fgd), ``kai/`` (KAI Scheduler's, registered by ``kai.KAI_PLUGINS`` for ``profile: kai``),
``tyarranger/`` (TY-Arranger's policies), ``ascend/`` (huaweiNPU) and ``muster/`` (gang-backend).
What several plugins share stays here at the top: ``base.py`` (the ``Plugin`` class) and ``util.py``.
"""

from __future__ import annotations

from server.plugins.ascend.huawei_npu import HuaweiNPUPlugin
from server.plugins.base import Plugin
from server.plugins.muster.gang_backend import GangBackendPlugin
from server.plugins.muster.reservation import ReservationPlugin
from server.plugins.tyarranger.tyarranger import TYArrangerPlugin
from server.plugins.volcano.binpack import BinpackPlugin
from server.plugins.volcano.capacity import CapacityPlugin
from server.plugins.volcano.conformance import ConformancePlugin
from server.plugins.volcano.drf import DrfPlugin
from server.plugins.volcano.fgd import FgdPlugin
from server.plugins.volcano.gang import GangPlugin
from server.plugins.volcano.network_topology import NetworkTopologyPlugin
from server.plugins.volcano.nodeorder import NodeOrderPlugin
from server.plugins.volcano.overcommit import OvercommitPlugin
from server.plugins.volcano.predicates import PredicatesPlugin
from server.plugins.volcano.priority import PriorityPlugin
from server.plugins.volcano.proportion import ProportionPlugin
from server.plugins.volcano.sla import SlaPlugin
from server.plugins.volcano.task_topology import TaskTopologyPlugin
from server.plugins.volcano.tdm import TdmPlugin

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
        ReservationPlugin,
        SlaPlugin,
        TaskTopologyPlugin,
        TdmPlugin,
        TYArrangerPlugin,
    )
}

__all__ = ["PLUGINS", "Plugin"]
