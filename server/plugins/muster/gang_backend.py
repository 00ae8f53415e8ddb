"""gang-backend: a gang's tasks all go to nodes of one backend (Muster; no Volcano equivalent).

Backends bind independently, so a gang split over two of them starts member by member as each
backend acts (seen: seconds of skew, some gangs never all running at once). Until decisions are
fenced across backends, a job with more than one task is kept inside one backend:

* a task of a job that already holds nodes (running, binding, allocated or pipelined in this
  session) passes only nodes of that backend;
* the first task of a job passes only nodes of backends whose free resources (idle plus
  releasing, minus pipelined, summed over the backend's schedulable nodes) cover the tasks the
  gang still needs, so a gang that fits in backend B but not in A is placed in B. This is an
  aggregate test: a backend with enough room in total but too fragmented makes the gang wait for
  a later cycle (Volcano's hypernode search with a hypernode per backend is the exact variant).

Not in the tiers of a configuration: ``SchedulerCore`` adds it as a last tier unless the
configuration says ``session: {gangAcrossBackends: true}``. A no-op while every node belongs to
one backend (simulate, a single adapter).

The predicate is a ``DomainPredicate`` whose domains are the backends: it tells the evaluator which
backends a task may use, and placing a task looks only at those backends' nodes (a task held to
one backend costs what a single-backend cluster costs).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from server.plugins.base import Plugin
from server.session.evaluator import DomainPredicate
from server.session.extension_points import PREDICATE, EventHandler
from server.session.info import JobInfo, TaskInfo
from server.session.session import Session

NAME = "gang-backend"
REASON = "node(s) belong to another backend than the rest of the gang"
NO_ROOM = "node(s) belong to a backend without room for the whole gang"


class GangBackendPlugin(Plugin):
    name = NAME

    def on_session_open(self, ssn: Session) -> None:
        nodes = ssn.nodes
        names = sorted({spec.backend for spec in nodes.specs})
        if len(names) <= 1:
            return
        code = {b: i for i, b in enumerate(names)}
        node_backend = np.array([code[spec.backend] for spec in nodes.specs], dtype=np.int64)
        # Free resources per backend, kept current through the statement's events.
        free = np.zeros((len(names), ssn.space.size))
        rows = nodes.schedulable
        np.add.at(free, node_backend[rows], nodes.future_idle()[rows])
        # Which backend each placed task holds (uid -> backend), and per job how many per backend.
        # Kept by uid: the session clears ``task.node`` before it reports a deallocation.
        placed: dict[str, int] = {}
        holding: dict[str, dict[int, int]] = {}

        def hold(task: TaskInfo, b: int, sign: int) -> None:
            per_job = holding.setdefault(task.job, {})
            per_job[b] = per_job.get(b, 0) + sign
            if per_job[b] <= 0:
                del per_job[b]

        def on_allocate(task: TaskInfo) -> None:
            i = nodes.index.get(task.node) if task.node is not None else None
            if i is None or task.uid in placed:
                return
            b = placed[task.uid] = int(node_backend[i])
            free[b] -= task.resreq
            hold(task, b, 1)

        def on_deallocate(task: TaskInfo) -> None:
            b = placed.pop(task.uid, None)
            if b is not None:
                free[b] += task.resreq
                hold(task, b, -1)

        for i, on_node in enumerate(nodes.tasks):  # what holds a node when the session opens
            for task in on_node.values():
                placed[task.uid] = int(node_backend[i])
                hold(task, int(node_backend[i]), 1)

        def needed(job: JobInfo, task: TaskInfo) -> np.ndarray:
            # The gang's missing members, each counted at this task's request (tasks of one
            # gang usually share a shape; the test is approximate either way, see above).
            missing = max(job.min_available - sum(holding.get(job.uid, {}).values()), 1)
            return task.resreq * missing

        def allowed(task: TaskInfo) -> Collection[int] | None:
            """Backends this task may use (their codes), None: any."""
            job = ssn.jobs.get(task.job)
            if job is None or len(job.tasks) <= 1:
                return None
            held = holding.get(job.uid)
            if held:
                return held.keys()
            return list(np.flatnonzero(np.all(free >= needed(job, task) - 1e-9, axis=1)).tolist())

        def check(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            backends = allowed(task)
            if backends is None:
                return np.ones(len(rows), dtype=bool)
            mask = np.zeros(len(names), dtype=bool)
            mask[list(backends)] = True
            on_rows: np.ndarray = mask[node_backend[rows]]
            return on_rows

        def reasons(task: TaskInfo, rows: np.ndarray) -> list[str]:
            job = ssn.jobs.get(task.job)
            reason = REASON if job is not None and holding.get(job.uid) else NO_ROOM
            return [reason] * len(rows)

        predicate = DomainPredicate(
            "task", check, reasons=reasons, domain_of=node_backend, allowed=allowed
        )
        ssn.register(PREDICATE, self.name, predicate)
        ssn.add_event_handler(EventHandler(on_allocate, on_deallocate))
