"""conformance: never evict critical system workloads (Volcano ``plugins/conformance``).

Registers preemptable and reclaimable: tasks in ``kube-system`` or with the priority class
``system-cluster-critical`` / ``system-node-critical`` are never victims.
"""

from __future__ import annotations

from server.plugins.base import Plugin
from server.session.extension_points import PERMIT, PREEMPTABLE, RECLAIMABLE
from server.session.info import TaskInfo
from server.session.session import Session

CRITICAL_CLASSES = {"system-cluster-critical", "system-node-critical"}
SYSTEM_NAMESPACE = "kube-system"


class ConformancePlugin(Plugin):
    name = "conformance"

    def on_session_open(self, ssn: Session) -> None:
        def evictable(evictor: TaskInfo, candidates: list[TaskInfo]) -> tuple[list[TaskInfo], int]:
            victims = []
            for t in candidates:
                job = ssn.jobs.get(t.job)
                pclass = job.spec.priority_class if job else ""
                pod_class = t.spec.annotations.get("priorityClassName", "")
                if (
                    t.namespace == SYSTEM_NAMESPACE
                    or pclass in CRITICAL_CLASSES
                    or pod_class in CRITICAL_CLASSES
                ):
                    continue
                victims.append(t)
            return victims, PERMIT

        ssn.register(PREEMPTABLE, self.name, evictable)
        ssn.register(RECLAIMABLE, self.name, evictable)
