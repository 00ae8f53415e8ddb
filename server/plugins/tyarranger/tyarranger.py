"""tyarranger: TY-Arranger's job queue policies, pod policies and TYJob states.

A TYJob is one Leader task (role ``leaderRole``) and worker tasks (every other role, TY-Arranger's
WorkerSets); its gang is the Leader plus ``minWorkersNum`` workers (set when the job is read), the
other workers are placed in later cycles as room appears. Only jobs with a ``schedulerPolicy`` are
ordered and scored here; the formulas are in docs/plugins/tyarranger.md.

Registers:

* ``job_valid``: a TYJob has exactly one Leader and at least ``minWorkersNum`` workers.
* ``job_order``: between two TYJobs of the same job queue policy: ``Priority``, the higher TY
  priority (1-10) first; ``DRF``, the lower dominant share (allocated / cluster total, at its
  largest resource) first. Jobs of different policies, or not TYJobs: no opinion.
* ``task_order``: a TYJob's Leader before its workers (the Leader is created first).
* ``node_order`` (task scope, only when a TYJob with a pod policy is in the session): the job's
  ``basicPolicy`` (BinPack, LeaderFirst, MinFragment, JobAffinity, JobAntiAffinity; Gang adds no
  score), scaled by ``tyarranger.weight`` so that the policy decides over other plugins' scores.
* on close: each TYJob's schedule state (Unscheduled, ScheduledSucceed, ScheduledFailed,
  ScheduledPartly) and stage (Pending, Starting, Running, Rescheduling, Succeeded, Failed).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from muster.devices import is_device_resource
from muster.quantity import CPU, MEMORY, MIN_RESOURCE
from server.model import ALLOCATED, TaskStatus, TYJobSpec, ty_schedule_state, ty_stage
from server.plugins.base import Plugin
from server.session.evaluator import Scorer
from server.session.extension_points import (
    JOB_ORDER,
    JOB_VALID,
    NODE_ORDER,
    TASK_ORDER,
    ValidateResult,
)
from server.session.info import JobInfo, NodeTable, TaskInfo, dominant_share
from server.session.outcomes import can_ever_fit
from server.session.session import Session

MAX_SCORE = 100.0
HOLDS_NODE = frozenset({*ALLOCATED, TaskStatus.RELEASING, TaskStatus.PIPELINED})
PLACED = frozenset({*ALLOCATED, TaskStatus.SUCCEEDED})

PolicyScore = Callable[[TaskInfo, JobInfo, TYJobSpec, np.ndarray], np.ndarray]


def is_leader(task: TaskInfo, ty: TYJobSpec) -> bool:
    return task.role == ty.leader_role


def validate(job: JobInfo) -> ValidateResult | None:
    ty = job.spec.tyjob
    if ty is None:
        return None
    leaders = sum(1 for t in job.tasks.values() if is_leader(t, ty))
    if leaders != 1:
        return ValidateResult(
            False,
            "TYJobInvalid",
            f"a TYJob has one Leader (role {ty.leader_role!r}); found {leaders}",
        )
    workers = len(job.tasks) - 1
    if workers < ty.min_workers:
        return ValidateResult(
            False,
            "TYJobInvalid",
            f"minWorkersNum is {ty.min_workers} but the job has {workers} workers",
        )
    return None


class Utilisation:
    """Per-resource utilisation of candidate nodes: (used [+ request]) / allocatable."""

    def __init__(self, nodes: NodeTable, dims: dict[str, int]) -> None:
        self.nodes = nodes
        self.dims = dims  # resource name -> column

    def of(self, rows: np.ndarray, name: str, request: float = 0.0) -> np.ndarray:
        d = self.dims.get(name)
        if d is None:
            return np.zeros(len(rows))
        cap = self.nodes.allocatable[rows, d]
        used = self.nodes.used[rows, d] + request
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(cap > MIN_RESOURCE, used / np.where(cap > MIN_RESOURCE, cap, 1.0), 0.0)

    def weighted(self, rows: np.ndarray, weights: dict[str, float]) -> np.ndarray:
        """Weighted mean over the resources each node has (current use, before placing)."""
        total = np.zeros(len(rows))
        weight_sum = np.zeros(len(rows))
        for name, w in weights.items():
            d = self.dims[name]
            has = self.nodes.allocatable[rows, d] > MIN_RESOURCE
            total += np.where(has, w * self.of(rows, name), 0.0)
            weight_sum += np.where(has, w, 0.0)
        return np.where(weight_sum > 0, total / np.where(weight_sum > 0, weight_sum, 1.0), 0.0)


class TYArrangerPlugin(Plugin):
    name = "tyarranger"
    ARGUMENTS = {
        "tyarranger.weight": 1000,  # scales every pod policy's 0-100 score
        "tyarranger.leaderFirst.raisedWeight": 5,  # LeaderFirst: GPU weight (Leader), CPU weight (workers)
    }

    def on_session_open(self, ssn: Session) -> None:
        ty_jobs = [j for j in ssn.jobs.values() if j.spec.tyjob is not None]
        if not ty_jobs:
            return
        ssn.register(JOB_VALID, self.name, validate)
        total = ssn.total_resource

        def job_order(left: JobInfo, right: JobInfo) -> int:
            lt, rt = left.spec.tyjob, right.spec.tyjob
            if (
                lt is None
                or rt is None
                or not lt.job_queue_policy
                or lt.job_queue_policy != rt.job_queue_policy
            ):
                return 0
            if lt.job_queue_policy == "Priority":
                return (right.priority > left.priority) - (right.priority < left.priority)
            ls, rs = dominant_share(left.allocated, total), dominant_share(right.allocated, total)
            return (ls > rs) - (ls < rs)

        def task_order(left: TaskInfo, right: TaskInfo) -> int:
            if left.job != right.job:
                return 0
            job = ssn.jobs.get(left.job)
            ty = job.spec.tyjob if job is not None else None
            if ty is None:
                return 0
            return is_leader(right, ty) - is_leader(left, ty)

        ssn.register(JOB_ORDER, self.name, job_order)
        ssn.register(TASK_ORDER, self.name, task_order)
        if any(
            j.spec.tyjob is not None and j.spec.tyjob.basic_policy not in ("", "Gang")
            for j in ty_jobs
        ):
            ssn.register(NODE_ORDER, self.name, Scorer("task", self._scorer(ssn)))

    def _scorer(self, ssn: Session) -> Callable[[TaskInfo, np.ndarray], np.ndarray]:
        nodes, space = ssn.nodes, ssn.space
        util = Utilisation(nodes, space.index)
        weight = self.arg_float("tyarranger.weight", 1000.0)
        raised = self.arg_float("tyarranger.leaderFirst.raisedWeight", 5.0)
        devices = [n for n in space.dims if is_device_resource(n)]

        def binpack(task: TaskInfo, job: JobInfo, ty: TYJobSpec, rows: np.ndarray) -> np.ndarray:
            asked = [(n, task.resreq[d]) for n, d in space.index.items() if task.resreq[d] > 0]
            if not asked:
                return np.zeros(len(rows))
            total = np.zeros(len(rows))
            for n, r in asked:
                total += util.of(rows, n, r)
            return MAX_SCORE * total / len(asked)

        def leader_first(
            task: TaskInfo, job: JobInfo, ty: TYJobSpec, rows: np.ndarray
        ) -> np.ndarray:
            weights = dict.fromkeys((CPU, MEMORY, *devices), 1.0)
            if is_leader(task, ty):
                weights.update(dict.fromkeys(devices, raised))
                return MAX_SCORE * (1.0 - util.weighted(rows, weights))
            weights[CPU] = raised
            return MAX_SCORE * util.weighted(rows, weights)

        def min_fragment(
            task: TaskInfo, job: JobInfo, ty: TYJobSpec, rows: np.ndarray
        ) -> np.ndarray:
            cpu = util.of(rows, CPU, task.resreq[space.index[CPU]])
            mem = util.of(rows, MEMORY, task.resreq[space.index[MEMORY]])
            scores: np.ndarray = MAX_SCORE * (1.0 - np.abs(cpu - mem))
            return scores

        def job_tasks_on(job: JobInfo, rows: np.ndarray) -> np.ndarray:
            return np.array(
                [
                    sum(
                        1
                        for t in nodes.tasks[r].values()
                        if t.job == job.uid and t.status in HOLDS_NODE
                    )
                    for r in rows
                ],
                dtype=float,
            )

        def job_affinity(
            task: TaskInfo, job: JobInfo, ty: TYJobSpec, rows: np.ndarray
        ) -> np.ndarray:
            return MAX_SCORE * job_tasks_on(job, rows) / max(len(job.tasks), 1)

        def job_anti_affinity(
            task: TaskInfo, job: JobInfo, ty: TYJobSpec, rows: np.ndarray
        ) -> np.ndarray:
            return MAX_SCORE * (1.0 - job_tasks_on(job, rows) / max(len(job.tasks), 1))

        policies: dict[str, PolicyScore] = {
            "BinPack": binpack,
            "LeaderFirst": leader_first,
            "MinFragment": min_fragment,
            "JobAffinity": job_affinity,
            "JobAntiAffinity": job_anti_affinity,
        }

        def score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            job = ssn.jobs.get(task.job)
            ty = job.spec.tyjob if job is not None else None
            policy = policies.get(ty.basic_policy) if ty is not None else None
            if job is None or ty is None or policy is None:
                return np.zeros(len(rows))
            return weight * policy(task, job, ty, rows)

        return score

    def on_session_close(self, ssn: Session) -> None:
        for job in ssn.jobs.values():
            ty = job.spec.tyjob
            if ty is None:
                continue
            job.schedule_state = schedule_state(ssn, job, ty)
            job.stage = stage(job, ty, job.schedule_state)


def schedule_state(ssn: Session, job: JobInfo, ty: TYJobSpec) -> str:
    """``ty_schedule_state``, where a job can never be scheduled when it is invalid, or when a
    gang member fits no node of the cluster even empty; a failed Leader with restarts left is
    Unscheduled (it will be placed again)."""
    tasks = list(job.tasks.values())
    leader = next((t for t in tasks if is_leader(t, ty)), None)
    leader_placed = leader is not None and leader.status in PLACED
    workers_placed = sum(1 for t in tasks if not is_leader(t, ty) and t.status in PLACED)
    if leader is not None and leader.status == TaskStatus.FAILED:
        failed = ty.leader_restarts >= ty.restart_limit
    else:
        gang = [t for t in tasks if is_leader(t, ty)] + [t for t in tasks if not is_leader(t, ty)][
            : ty.min_workers
        ]
        failed = job.uid in ssn.invalid_jobs or any(
            t.status == TaskStatus.PENDING and not can_ever_fit(ssn, t) for t in gang
        )
    return ty_schedule_state(ty, leader_placed, workers_placed, len(tasks) - 1, failed)


def stage(job: JobInfo, ty: TYJobSpec, state: str) -> str:
    leader = next((t.status for t in job.tasks.values() if is_leader(t, ty)), None)
    running = sum(
        1 for t in job.tasks.values() if not is_leader(t, ty) and t.status == TaskStatus.RUNNING
    )
    return ty_stage(ty, leader, running, state)
