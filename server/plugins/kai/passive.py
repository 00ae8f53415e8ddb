"""KAI plugins that change nothing in Muster's model, accepted so that KAI's configuration loads
as-is (each is listed in docs/plugins/kai.md with why):

- kubeflow, ray: read the pod-group minimums of Kubeflow / Ray jobs from their Kubernetes objects;
  Muster's adapters pass the minimum with the job.
- subgrouporder: orders a job's pod sets; Muster's KAI actions take unsatisfied pod sets first.
- nominatednode: prefers a pod's nominated node (a Kubernetes preemption artefact).
- dynamicresources: Kubernetes DRA claims; Muster has no DRA objects.
- minruntime: protects jobs younger than a configured minimum run time from eviction; Muster's
  snapshot has no run times yet (named in the issue's closing note).
- topology: KAI topology-aware placement (required / preferred levels); not implemented yet
  (named in the closing note), so jobs with a topology constraint are placed without it.
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


def _passive(plugin_name: str) -> type[Plugin]:
    return type(f"Passive_{plugin_name}", (_Passive,), {"name": plugin_name})


PASSIVE_PLUGINS: tuple[type[Plugin], ...] = tuple(
    _passive(n)
    for n in ("kubeflow", "ray", "subgrouporder", "nominatednode", "dynamicresources", "minruntime", "topology", "snapshot")
)
