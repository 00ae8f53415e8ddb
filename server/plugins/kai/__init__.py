"""KAI Scheduler's plugins (``profile: kai``): each one small module, registered under KAI's names.

Where a name exists in both systems (proportion, priority, predicates), ``profile: kai`` selects the
module here (predicates: the Kubernetes filters are the same in both, so both use Volcano's
``server/plugins/volcano/predicates.py``)."""

from __future__ import annotations

from server.plugins.base import Plugin
from server.plugins.kai.elastic import ElasticPlugin
from server.plugins.kai.gpupack import GpuPackPlugin
from server.plugins.kai.gpusharingorder import GpuSharingOrderPlugin
from server.plugins.kai.gpuspread import GpuSpreadPlugin
from server.plugins.kai.nodeavailability import NodeAvailabilityPlugin
from server.plugins.kai.nodeplacement import NodePlacementPlugin
from server.plugins.kai.passive import PASSIVE_PLUGINS
from server.plugins.kai.priority import KaiPriorityPlugin
from server.plugins.kai.proportion import KaiProportionPlugin
from server.plugins.kai.resourcetype import ResourceTypePlugin
from server.plugins.kai.taskorder import TaskOrderPlugin
from server.plugins.kai.topology import TopologyPlugin

_CLASSES: tuple[type[Plugin], ...] = (
    ElasticPlugin,
    GpuPackPlugin,
    GpuSharingOrderPlugin,
    GpuSpreadPlugin,
    KaiPriorityPlugin,
    KaiProportionPlugin,
    NodeAvailabilityPlugin,
    NodePlacementPlugin,
    ResourceTypePlugin,
    TaskOrderPlugin,
    TopologyPlugin,
    *PASSIVE_PLUGINS,
)
KAI_PLUGINS: dict[str, type[Plugin]] = {cls.name: cls for cls in _CLASSES}

__all__ = ["KAI_PLUGINS"]
