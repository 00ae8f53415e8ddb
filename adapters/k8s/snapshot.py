"""Nodes and pods as the server sees them: the snapshot, then deltas.

The snapshot names every node, every pod mapped to a Muster task (with its status) and every
other bound pod as a foreign task (it only holds capacity). After it, informer events become
deltas, and only real changes are sent (a kubelet heartbeat changes a node's resourceVersion, not
the node). A task's status is reported once per change; BOUND too, so that when a bind decision
expired on the server while the pod was in fact bound, the server learns where the pod really is
(it ignores BOUND for tasks it already knows placed).
"""

from __future__ import annotations

from adapters.k8s import translate as tr
from adapters.k8s.common import JobBook, Obj
from adapters.k8s.informer import Informer
from adapters.runtime import BackendRuntime
from muster.v1 import muster_pb2 as pb

REPORTED_STATUSES = (
    pb.TASK_STATUS_BOUND,
    pb.TASK_STATUS_RUNNING,
    pb.TASK_STATUS_SUCCEEDED,
    pb.TASK_STATUS_FAILED,
)


class ClusterReporter:
    """Snapshot and deltas of nodes, Muster pods (as tasks) and other pods (as foreign tasks)."""

    def __init__(
        self, runtime: BackendRuntime, book: JobBook, *, nodes: Informer, pods: Informer
    ) -> None:
        self.runtime = runtime
        self.book = book
        self.nodes = nodes
        self.pods = pods
        self.reported: dict[str, pb.TaskStatus] = {}  # task id -> last status reported
        self.sent_nodes: dict[str, bytes] = {}
        self.sent_foreign: dict[str, bytes] = {}
        self.streaming = False  # deltas flow once the first snapshot has been taken

    # -- snapshot -----------------------------------------------------------------------------

    def list_nodes(self) -> list[pb.Node]:
        nodes = [tr.node_to_pb(n) for n in self.nodes.cache.values()]
        self.sent_nodes = {n.name: n.SerializeToString(deterministic=True) for n in nodes}
        self.streaming = True
        return nodes

    def list_tasks(self) -> list[pb.BackendTask]:
        tasks: list[pb.BackendTask] = []
        self.sent_foreign = {}
        for key, pod in self.pods.cache.items():
            node = tr.pod_node(pod)
            if not node:
                continue
            task_id = self.book.pod_task.get(key)
            if task_id is not None:
                status = tr.pod_task_status(pod)
                tasks.append(
                    pb.BackendTask(
                        task_id=task_id,
                        node=node,
                        status=status,
                        request=pb.ResourceList(quantities=tr.pod_request(pod)),
                        **tr.gpu_share(pod),
                    )
                )
                self.reported[task_id] = status
            elif tr.pod_active_on_node(pod):
                task = tr.foreign_task(pod)
                self.sent_foreign[key] = task.SerializeToString(deterministic=True)
                tasks.append(task)
        return tasks

    # -- deltas -------------------------------------------------------------------------------

    def on_node(self, kind: str, node: Obj, old: Obj | None) -> None:
        if not self.streaming:
            return
        name = tr.meta(node)["name"]
        if kind == "DELETED":
            if self.sent_nodes.pop(name, None) is not None:
                self.runtime.remove_node(name)
            return
        message = tr.node_to_pb(node)
        data = message.SerializeToString(deterministic=True)
        if self.sent_nodes.get(name) != data:  # kubelet heartbeats change the RV, not the node
            self.sent_nodes[name] = data
            self.runtime.upsert_node(message)

    def on_unmapped_pod(self, kind: str, pod: Obj) -> None:
        """A pod that is no Muster task (another scheduler's, or ours not yet mapped): a bound
        pod only holds capacity."""
        if not self.streaming:
            return
        key = tr.key_of(pod)
        if kind != "DELETED" and tr.pod_active_on_node(pod):
            task = tr.foreign_task(pod)
            data = task.SerializeToString(deterministic=True)
            if self.sent_foreign.get(key) != data:
                self.sent_foreign[key] = data
                self.runtime.upsert_foreign_task(task)
        elif self.sent_foreign.pop(key, None) is not None:
            self.runtime.remove_foreign_task(tr.foreign_task_id(pod))

    def report_pod(self, task_id: str, pod: Obj, *, deleted: bool, force: bool = False) -> None:
        if not self.streaming:
            return
        status = tr.pod_task_status(pod)
        message = tr.pod_failure_message(pod)  # DeadlineExceeded: the TimeLimit reason
        if deleted and status not in (pb.TASK_STATUS_SUCCEEDED, pb.TASK_STATUS_FAILED):
            if not tr.pod_node(pod):
                return  # a pending pod went away: the job controller cancels or shrinks the job
            status, message = pb.TASK_STATUS_FAILED, "pod deleted"
        if status not in REPORTED_STATUSES or (self.reported.get(task_id) == status and not force):
            return
        self.reported[task_id] = status
        self.runtime.report_task_status(
            task_id, status, node=tr.pod_node(pod), message=message, exit_code=tr.pod_exit_code(pod)
        )

    def mapped(self, task_id: str, pod_key: str) -> None:
        """A pod has just been mapped to a task: report what happened to it meanwhile (e.g.
        Running), and it is no longer a foreign task."""
        pod = self.pods.cache.get(pod_key)
        if pod is not None and task_id not in self.reported and tr.pod_node(pod):
            if self.sent_foreign.pop(pod_key, None) is not None:
                self.runtime.remove_foreign_task(tr.foreign_task_id(pod))
            self.report_pod(task_id, pod, deleted=False)

    def forget_reports(self) -> None:
        """Every task is reported afresh (the job mapping is being rebuilt)."""
        self.reported.clear()
