"""task-topology: affinity and anti-affinity between the roles of one job
(Volcano ``plugins/task-topology``).

A job declares, in its annotations:

* ``volcano.sh/task-topology-affinity: "ps,worker;ps,chief"`` -- groups of roles to co-locate
  (a group of one role: that role's tasks together);
* ``volcano.sh/task-topology-anti-affinity: "ps;worker,chief"`` -- groups of roles to keep apart;
* ``volcano.sh/task-topology-task-order: "ps,worker,chief"`` -- which roles to place first.

A role that is not a role of the job, or a role twice in a group, makes the whole declaration
invalid (ignored). At session open the tasks of each such job with pending tasks are grouped into
*buckets* (tasks meant to share a node): tasks already on a node form one bucket per node; each
other task, in task-order / topology-priority order, joins the bucket it has the highest affinity
with (ties: the bucket with the smaller request score), or a new bucket when every bucket repels
it. Registers:

* task_order -- tasks in buckets before tasks outside; within a job, bigger buckets first, then
  lower bucket index, then the roles' order; tasks of different jobs compare equal.
* node_order -- per node: the bucket's tasks already there, minus anti-affinity hits with roles on
  the node, plus the bucket's unplaced tasks, minus one for each of them that would not fit in the
  node's idle + releasing resources; times ``task-topology.weight`` (default 1), scaled to
  100 / the largest bucket size.
* an allocate event handler that records which role went to which node. As in Volcano there is no
  deallocate handler: a discarded placement keeps counting for the rest of the session.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import structlog

from muster.quantity import MIN_RESOURCE
from server.model import TaskStatus
from server.plugins.base import Plugin
from server.session.evaluator import Scorer
from server.session.extension_points import NODE_ORDER, EventHandler
from server.session.extension_points import TASK_ORDER as TASK_ORDER_POINT
from server.session.info import JobInfo, TaskInfo
from server.session.session import Session

WEIGHT = "task-topology.weight"
AFFINITY = "volcano.sh/task-topology-affinity"
ANTI_AFFINITY = "volcano.sh/task-topology-anti-affinity"
TASK_ORDER = "volcano.sh/task-topology-task-order"
TASK_SPEC = "volcano.sh/task-spec"
MAX_NODE_SCORE = 100.0

log = structlog.get_logger(__name__)

# Topology kinds and their priority when a role has several (Volcano affinityPriority).
SELF_ANTI_AFFINITY, INTER_AFFINITY, SELF_AFFINITY, INTER_ANTI_AFFINITY = 4, 3, 2, 1


@dataclass
class TaskTopology:
    affinity: list[list[str]] = field(default_factory=list)
    anti_affinity: list[list[str]] = field(default_factory=list)
    task_order: list[str] = field(default_factory=list)


def task_name(task: TaskInfo) -> str:
    """The task's role (Volcano reads the pod annotation ``volcano.sh/task-spec``)."""
    return task.spec.annotations.get(TASK_SPEC, task.role)


def _check(job: JobInfo, groups: list[list[str]]) -> None:
    roles = {t.role for t in job.tasks.values()}
    for group in groups:
        seen: set[str] = set()
        for role in group:
            if not role:
                continue
            if role not in roles:
                raise ValueError(f"task {role} do not exist in job <{job.namespace}/{job.name}>")
            if role in seen:
                raise ValueError(f"task {role} is duplicate in job <{job.namespace}/{job.name}>")
            seen.add(role)


def read_topology(job: JobInfo) -> TaskTopology | None:
    """Volcano readTopologyFromPgAnnotations: None without annotations, ValueError when invalid."""
    annotations = job.spec.annotations
    if not any(k in annotations for k in (AFFINITY, ANTI_AFFINITY, TASK_ORDER)):
        return None
    topo = TaskTopology()
    if AFFINITY in annotations:
        topo.affinity = [g.split(",") for g in annotations[AFFINITY].split(";")]
        _check(job, topo.affinity)
    if ANTI_AFFINITY in annotations:
        topo.anti_affinity = [g.split(",") for g in annotations[ANTI_AFFINITY].split(";")]
        _check(job, topo.anti_affinity)
    if TASK_ORDER in annotations:
        topo.task_order = annotations[TASK_ORDER].split(",")
        _check(job, [topo.task_order])
    return topo


class Bucket:
    def __init__(self, index: int, dims: int) -> None:
        self.index = index
        self.tasks: dict[str, TaskInfo] = {}  # unplaced tasks
        self.role_counts: dict[str, int] = {}
        self.req_score = 0.0
        self.request = np.zeros(dims)
        self.bound = 0
        self.nodes: dict[str, int] = {}

    def _req(self, task: TaskInfo, sign: float) -> None:
        r = task.resreq
        # Volcano CalcResReq: milli-cpu + memory in MiB + every other resource.
        self.req_score += sign * (r[0] + r[1] / 1024 / 1024 + float(r[2:].sum()))
        self.request += sign * r

    def add(self, name: str, task: TaskInfo) -> None:
        self.role_counts[name] = self.role_counts.get(name, 0) + 1
        if task.node:
            self.nodes[task.node] = self.nodes.get(task.node, 0) + 1
            self.bound += 1
            return
        self.tasks[task.uid] = task
        self._req(task, 1.0)

    def task_bound(self, task: TaskInfo) -> None:
        assert task.node is not None
        self.nodes[task.node] = self.nodes.get(task.node, 0) + 1
        self.bound += 1
        self.tasks.pop(task.uid, None)
        self._req(task, -1.0)


class JobManager:
    """Volcano JobManager: one job's topology, its buckets and where its roles landed."""

    def __init__(self, job: JobInfo, topo: TaskTopology, dims: int) -> None:
        self.job = job
        self.dims = dims
        self.buckets: list[Bucket] = []
        self.bucket_of: dict[str, int] = {}  # task uid -> bucket index (absent: out of bucket)
        self.role_of: dict[str, str] = {}
        self.priority: dict[str, int] = {}
        self.order: dict[str, int] = {}
        self.inter_affinity: dict[str, set[str]] = {}
        self.self_affinity: set[str] = set()
        self.inter_anti: dict[str, set[str]] = {}
        self.self_anti: set[str] = set()
        self.bucket_max_size = 0
        self.node_roles: dict[str, dict[str, int]] = {}
        self._apply(topo)
        self._construct()

    def _mark(self, name: str, kind: int) -> None:
        if kind > self.priority.get(name, 0):
            self.priority[name] = kind

    def _pairs(
        self,
        groups: list[list[str]],
        selfs: set[str],
        inter: dict[str, set[str]],
        self_kind: int,
        inter_kind: int,
    ) -> None:
        for group in groups:
            if len(group) == 1:
                selfs.add(group[0])
                self._mark(group[0], self_kind)
                continue
            for i, src in enumerate(group):
                for dst in group[:i]:
                    inter.setdefault(src, set()).add(dst)
                    inter.setdefault(dst, set()).add(src)
                self._mark(src, inter_kind)

    def _apply(self, topo: TaskTopology) -> None:
        self._pairs(
            topo.affinity, self.self_affinity, self.inter_affinity, SELF_AFFINITY, INTER_AFFINITY
        )
        self._pairs(
            topo.anti_affinity,
            self.self_anti,
            self.inter_anti,
            SELF_ANTI_AFFINITY,
            INTER_ANTI_AFFINITY,
        )
        n = len(topo.task_order)
        for i, name in enumerate(topo.task_order):
            self.order[name] = n - i

    def affinity_order(self, left: TaskInfo, right: TaskInfo) -> int:
        """Volcano taskAffinityOrder: > 0 when ``left``'s role ranks higher."""
        ln, rn = self.role_of.get(left.uid, ""), self.role_of.get(right.uid, "")
        if ln == rn:
            return 0
        lo, ro = self.order.get(ln, 0), self.order.get(rn, 0)
        if lo != ro:
            return 1 if lo > ro else -1
        lp, rp = self.priority.get(ln, 0), self.priority.get(rn, 0)
        if lp != rp:
            return 1 if lp > rp else -1
        return 0

    def set_affinity(self, name: str, counts: dict[str, int], only_anti: bool) -> int:
        """Volcano checkTaskSetAffinity: affinity hits minus anti-affinity hits with ``counts``."""
        score = 0
        if not name:
            return score
        for other, count in counts.items():
            same = other == name
            if not only_anti and (
                (name in self.self_affinity)
                if same
                else (other in self.inter_affinity.get(name, ()))
            ):
                score += count
            if (name in self.self_anti) if same else (other in self.inter_anti.get(name, ())):
                score -= count
        return score

    def _construct(self) -> None:
        members = []
        for task in self.job.tasks.values():
            name = task_name(task)
            if name and name in self.priority:
                self.role_of[task.uid] = name
                members.append(task)

        def before(a: TaskInfo, b: TaskInfo) -> int:
            # Volcano sorts by the reverse of TaskOrder.Less: placed tasks first (by node name),
            # then the higher-ranked role, then by task name.
            if a.node or b.node:
                if bool(a.node) != bool(b.node):
                    return -1 if a.node else 1
                return -1 if (a.node or "") < (b.node or "") else (1 if a.node != b.node else 0)
            r = self.affinity_order(a, b)
            if r:
                return -r
            return -1 if a.name < b.name else (1 if a.name > b.name else 0)

        members.sort(key=functools.cmp_to_key(before))
        by_node: dict[str, Bucket] = {}
        for task in members:
            name = self.role_of[task.uid]
            chosen: Bucket | None = None
            best = -(2**31)
            if task.node:
                best = 0
                chosen = by_node.get(task.node)
            else:
                for bucket in self.buckets:
                    aff = self.set_affinity(name, bucket.role_counts, False)
                    if aff > best:
                        best, chosen = aff, bucket
                    elif aff == best and chosen is not None and bucket.req_score < chosen.req_score:
                        chosen = bucket
            if best < 0 or chosen is None:
                chosen = Bucket(len(self.buckets), self.dims)
                self.buckets.append(chosen)
                if task.node:
                    by_node[task.node] = chosen
            self.bucket_of[task.uid] = chosen.index
            chosen.add(name, task)
            self.bucket_max_size = max(self.bucket_max_size, len(chosen.tasks) + chosen.bound)

    def bucket(self, task: TaskInfo) -> Bucket | None:
        i = self.bucket_of.get(task.uid)
        return None if i is None else self.buckets[i]

    def task_bound(self, task: TaskInfo) -> None:
        name = task_name(task)
        if name and task.node:
            roles = self.node_roles.setdefault(task.node, {})
            roles[name] = roles.get(name, 0) + 1
        bucket = self.bucket(task)
        if bucket is not None:
            bucket.task_bound(task)


class TaskTopologyPlugin(Plugin):
    name = "task-topology"
    ARGUMENTS = {WEIGHT: 1}

    def on_session_open(self, ssn: Session) -> None:
        weight = self.arg_int(WEIGHT, 1)
        managers: dict[str, JobManager] = {}
        self.managers = managers
        ignored: list[tuple[str, str]] = []
        for job in ssn.jobs.values():
            if not job.index[TaskStatus.PENDING]:
                continue
            try:
                topo = read_topology(job)
            except ValueError as exc:
                ignored.append((job.uid, str(exc)))
                continue
            if topo is not None:
                managers[job.uid] = JobManager(job, topo, ssn.space.size)
        if ignored:  # one line per cycle, however many jobs are wrong
            log.warning("task-topology annotations ignored", jobs=len(ignored), first=ignored[:3])
        if not managers:
            return
        nodes = ssn.nodes

        def task_order(left: TaskInfo, right: TaskInfo) -> int:
            lm, rm = managers.get(left.job), managers.get(right.job)
            if lm is None or rm is None:
                return 0
            lb, rb = lm.bucket(left), rm.bucket(right)
            if (lb is None) != (rb is None):
                return -1 if lb is not None else 1
            if left.job != right.job or lb is None or rb is None:
                return 0
            if len(lb.tasks) != len(rb.tasks):
                return -1 if len(lb.tasks) > len(rb.tasks) else 1
            if lb.index == rb.index:
                return -lm.affinity_order(left, right)
            return -1 if lb.index < rb.index else 1

        def score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            out = np.zeros(len(rows))
            manager = managers.get(task.job)
            if manager is None:
                return out
            bucket = manager.bucket(task)
            if bucket is None:
                return out
            capacity = nodes.idle[rows] + nodes.releasing[rows]
            fits = ~np.any(capacity + MIN_RESOURCE < task.resreq, axis=1)
            name = task_name(task)
            base = np.array([bucket.nodes.get(nodes.names[i], 0) for i in rows], dtype=float)
            for k, i in enumerate(rows):
                roles = manager.node_roles.get(nodes.names[i])
                if roles:
                    base[k] += min(manager.set_affinity(name, roles, True), 0)
            base += len(bucket.tasks)
            # Unplaced bucket-mates that would not fit next to it each cost one point.
            short = ~np.all(bucket.request <= capacity + MIN_RESOURCE, axis=1)
            if short.any():
                others = [t.resreq for uid, t in bucket.tasks.items() if uid != task.uid]
                if others:
                    remains = bucket.request - np.cumsum(np.array(others), axis=0)  # (k, dims)
                    ok = np.all(remains[None, :, :] <= capacity[:, None, :] + MIN_RESOURCE, axis=2)
                    first = np.where(ok.any(axis=1), ok.argmax(axis=1) + 1, len(others))
                    base -= np.where(short, first, 0)
            result = base * weight
            if manager.bucket_max_size:
                result = result * MAX_NODE_SCORE / manager.bucket_max_size
            out[fits] = result[fits]
            return out

        def on_allocate(task: TaskInfo) -> None:
            manager = managers.get(task.job)
            if manager is not None:
                manager.task_bound(task)

        ssn.register(TASK_ORDER_POINT, self.name, task_order)
        ssn.register(NODE_ORDER, self.name, Scorer("task", score))
        ssn.add_event_handler(EventHandler(allocate=on_allocate))
