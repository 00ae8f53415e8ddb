"""conformance plugin: Volcano's plugins/conformance/conformance_test.go (``TestConformancePlugin``)
and conformance.go: critical and kube-system pods are never victims."""

from __future__ import annotations

from core_helpers import job, node, queue, res, session, snapshot, task

from server.model import JobSpec, PodGroupPhase
from server.session.session import Session

CONFIG = """
extension_points_not_listed: disabled
tiers:
- plugins:
  - {name: conformance, enablePreemptable: true, enableReclaimable: true}
"""


def _job(name: str, namespace: str, priority_class: str = "", pod_class: str = "") -> JobSpec:
    """One task running on test-node; ``pod_class``: the pod's priorityClassName annotation."""
    annotations = {"priorityClassName": pod_class} if pod_class else {}
    pod = task(f"{name}-0", name, res("1"), "test-node", ns=namespace, annotations=annotations)
    return job(
        name,
        ns=namespace,
        queue="q",
        tasks=[pod],
        min_member=1,
        phase=PodGroupPhase.PENDING,
        priority_class=priority_class,
    )


def _session(*jobs: JobSpec) -> Session:
    return session(snapshot([node("test-node", "4", "4G")], jobs, [queue("q")]), CONFIG)


def test_kube_system_pod_is_not_a_victim() -> None:
    """TestConformancePlugin "conformance plugin": of a kube-system pod and an ordinary pod, only
    the ordinary one is preemptable."""
    ssn = _session(_job("sys", "kube-system"), _job("app", "test-namespace"))
    candidates = [ssn.tasks["kube-system/sys-0"], ssn.tasks["test-namespace/app-0"]]
    preemptor = ssn.tasks["test-namespace/app-0"]
    assert [t.uid for t in ssn.preemptable(preemptor, candidates)] == ["test-namespace/app-0"]
    assert [t.uid for t in ssn.reclaimable(preemptor, candidates)] == ["test-namespace/app-0"]


def test_critical_priority_classes_are_not_victims() -> None:
    """conformance.go: system-cluster-critical / system-node-critical pods are skipped (the class of
    the job, or of the pod via its priorityClassName annotation)."""
    ssn = _session(
        _job("cluster-critical", "ns", priority_class="system-cluster-critical"),
        _job("node-critical", "ns", pod_class="system-node-critical"),
        _job("normal", "ns", priority_class="high"),
    )
    candidates = list(ssn.tasks.values())
    victims = ssn.preemptable(candidates[0], candidates)
    assert [t.uid for t in victims] == ["ns/normal-0"]


def test_only_critical_candidates_leave_no_victims() -> None:
    """An all-critical candidate list yields no victims (the tier's intersection is empty)."""
    ssn = _session(_job("sys", "kube-system"))
    assert ssn.preemptable(ssn.tasks["kube-system/sys-0"], [ssn.tasks["kube-system/sys-0"]]) == []
