"""KAI plugins that change nothing in Muster's model, accepted so that KAI's configuration loads
as-is (each is listed in docs/plugins/kai.md with why):

- kubeflow, ray: read the pod-group minimums of Kubeflow / Ray jobs from their Kubernetes objects;
  Muster's adapters pass the minimum with the job.
- subgrouporder: orders a job's pod sets; Muster's KAI actions take unsatisfied pod sets first.
- nominatednode: prefers a pod's nominated node (a Kubernetes preemption artefact).
- dynamicresources: Kubernetes DRA claims; Muster has no DRA objects.
- minruntime: protects jobs younger than a configured minimum run time from eviction; Muster's
  snapshot has no run times yet (named in the issue's closing note).
- snapshot: dumps the session for debugging; ``muster simulate`` is Muster's equivalent.
"""

from __future__ import annotations

from typing import ClassVar

from server.plugins.base import Plugin
from server.session.session import Session


class _Passive(Plugin):
    ARGUMENTS: ClassVar[dict[str, object]] = {"*": None}

    def on_session_open(self, ssn: Session) -> None:
        return None


class KubeflowPlugin(_Passive):
    name: ClassVar[str] = "kubeflow"


class RayPlugin(_Passive):
    name: ClassVar[str] = "ray"


class SubGroupOrderPlugin(_Passive):
    name: ClassVar[str] = "subgrouporder"


class NominatedNodePlugin(_Passive):
    name: ClassVar[str] = "nominatednode"


class DynamicResourcesPlugin(_Passive):
    name: ClassVar[str] = "dynamicresources"


class MinRuntimePlugin(_Passive):
    name: ClassVar[str] = "minruntime"


class SnapshotPlugin(_Passive):
    name: ClassVar[str] = "snapshot"


PASSIVE_PLUGINS: tuple[type[Plugin], ...] = (
    KubeflowPlugin,
    RayPlugin,
    SubGroupOrderPlugin,
    NominatedNodePlugin,
    DynamicResourcesPlugin,
    MinRuntimePlugin,
    SnapshotPlugin,
)
