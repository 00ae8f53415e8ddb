"""The queue window: with ``maxQueueLookback`` L, a cycle opens only the first L waiting jobs of
each queue (Armada's ``maxQueueLookback``), so its cost follows what it can place, not how deep
the queues are.

A session opens every job that holds anything (a task not Pending) and, per queue, the first L
jobs that wait whole (every task Pending), in the order allocate would take them. The others are
*beyond the window*: the session does not build them, and no action sees them this cycle. What
they ask still counts for their queue's fair share: each queue's ``Beyond`` (how many, their
requests, the minResources of the Inqueue ones) is added by proportion, capacity and overcommit
to the queue's request and inqueue resources, as each of those jobs would have added its own, so
the deserved shares are the ones the whole queue gives.

The order is computed from the job specs alone, which is exact only where every job-order plugin
of the configuration ranks waiting jobs by what a spec says: priority (job priority), gang (a job
ready with no task placed: minMember 0, or best-effort tasks enough), drf (a waiting job's share
is 0) and the session's ties (creation order, then uid). A configuration with another job-order
plugin (sla, tdm, TY-Arranger), hierarchical drf (its queue order counts every job's request in
the tree) or ``profile: kai`` (whose own bound is ``queueDepthPerAction``) opens every job; its
allocate still considers at most L jobs per queue.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from muster.quantity import MIN_RESOURCE
from server.model import (
    BeyondWindow,
    ClusterSnapshot,
    JobSpec,
    PodGroupPhase,
    Resources,
    TaskSpec,
    TaskStatus,
    WaitingSummary,
)
from server.session.extension_points import HIERARCHY_SWITCH, JOB_ORDER
from server.session.options import SchedulerConfig

LOOKBACK = "maxQueueLookback"  # session parameter: the most waiting jobs of a queue a cycle opens
# The Volcano-profile plugins that register a job order (a test holds this list to what they
# register): those whose order of waiting jobs a spec tells, and the others (no window with them).
SPEC_ORDERED = frozenset({"priority", "gang", "drf"})
ORDERED_OTHERWISE = frozenset({"sla", "tdm", "tyarranger"})


@dataclass(slots=True)
class Beyond:
    """A queue's waiting jobs past the window."""

    jobs: int = 0
    first: str = ""  # the first of them in the queue's order
    request: Resources = field(default_factory=dict)  # what their tasks ask, in all
    # The minResources of those that are Inqueue (admitted: they count as inqueue resources).
    inqueue: Resources = field(default_factory=dict)


def lookback_of(config: SchedulerConfig) -> int:
    value = config.session.get(LOOKBACK, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# A waiting job's place in its queue, from its spec and how many of its tasks are best-effort.
OrderKey = Callable[[JobSpec, int], tuple[Any, ...]]


def waiting_order(config: SchedulerConfig) -> OrderKey | None:
    """The order allocate takes whole-waiting jobs in, from their specs; None when the
    configuration orders them by something else (no window then)."""
    if config.profile != "volcano":
        return None
    keys: list[str] = []
    for tier in config.tiers:
        for option in tier:
            if option.name == "drf" and option.enabled(HIERARCHY_SWITCH.name):
                return None
            if JOB_ORDER.switch is not None and not option.enabled(JOB_ORDER.switch.name):
                continue
            if option.name in ORDERED_OTHERWISE:
                return None
            if option.name in SPEC_ORDERED and option.name != "drf":  # drf: every share is 0
                keys.append(option.name)
    # priority: higher first; gang: not ready first (a job with no task placed is ready when its
    # best-effort tasks make its minimum, server.session.info.JobInfo.is_ready). Then the
    # session's ties: creation order, uid. Spelled out: this runs for every waiting job.
    if keys == ["priority", "gang"]:
        return lambda j, be: (-j.priority, _ready(j, be), j.creation_index, j.uid)
    if keys == ["gang", "priority"]:
        return lambda j, be: (_ready(j, be), -j.priority, j.creation_index, j.uid)
    if keys == ["priority"]:
        return lambda j, be: (-j.priority, j.creation_index, j.uid)
    if keys == ["gang"]:
        return lambda j, be: (_ready(j, be), j.creation_index, j.uid)
    if not keys:
        return lambda j, be: (j.creation_index, j.uid)
    return None  # a plugin named twice: let allocate order them


def _ready(job: JobSpec, best_effort: int) -> bool:
    return best_effort >= (job.min_member if job.min_member is not None else len(job.tasks))


def summarize(tasks: Iterable[TaskSpec]) -> WaitingSummary:
    """A job's ``WaitingSummary``: it waits whole when every task is Pending and one of them asks
    for resources (a job of best-effort tasks only is backfill's, which places them anywhere)."""
    pending = TaskStatus.PENDING
    best_effort = count = 0
    request: Resources = {}
    for task in tasks:
        count += 1
        if task.status is not pending:
            best_effort = -1
        elif best_effort >= 0 and max(task.request.values(), default=0.0) < MIN_RESOURCE:
            best_effort += 1
        for name, value in task.request.items():
            request[name] = request.get(name, 0.0) + value
    return WaitingSummary(best_effort if 0 <= best_effort < count else -1, request)


def _waiting(job: JobSpec) -> WaitingSummary:
    return job.waiting if job.waiting is not None else summarize(job.tasks)


def waits_whole(job: JobSpec) -> bool:
    """Does the job wait whole (every task Pending, one asking for resources)? The jobs a
    queue's lookback counts, in the window and in allocate alike."""
    return _waiting(job).best_effort >= 0


@dataclass(slots=True)
class Window:
    """What a session opened of its queues."""

    # Per queue with jobs past its window, those jobs.
    beyond: dict[str, Beyond] = field(default_factory=dict)
    # The queues that have jobs, in the order of their first job in the whole snapshot (the order
    # the share plugins meet queues in, which their float sums follow).
    queue_order: list[str] = field(default_factory=list)
    lookback: int = 0  # maxQueueLookback (0: no window)

    def report(self) -> dict[str, BeyondWindow]:
        """Per queue, what the cycle's result says of the jobs past its window."""
        return {q: BeyondWindow(self.lookback, b.jobs, b.first) for q, b in self.beyond.items()}


def open_window(
    snapshot: ClusterSnapshot, config: SchedulerConfig
) -> tuple[ClusterSnapshot, Window]:
    """The snapshot a session opens, and what of each queue waits beyond its window (no window:
    the snapshot itself and nothing beyond)."""
    lookback = lookback_of(config)
    order = waiting_order(config) if lookback > 0 else None
    if order is None:
        return snapshot, Window()
    queues = {q.name for q in snapshot.queues}
    # Per queue, its whole-waiting jobs as (place, index in the snapshot).
    waiting: dict[str, list[tuple[tuple[Any, ...], int]]] = {}
    seen: dict[str, None] = {}
    jobs = snapshot.jobs
    summaries: list[WaitingSummary | None] = [None] * len(jobs)
    for i, job in enumerate(jobs):
        if job.queue not in queues:
            continue
        seen[job.queue] = None
        summary = summaries[i] = _waiting(job)
        if summary.best_effort >= 0:
            waiting.setdefault(job.queue, []).append((order(job, summary.best_effort), i))
    beyond: dict[str, Beyond] = {}
    hidden: set[int] = set()
    for queue, places in waiting.items():
        if len(places) <= lookback:
            continue
        first = heapq.nsmallest(lookback + 1, places)
        opened = {i for _, i in first[:lookback]}
        past = Beyond(first=jobs[first[lookback][1]].uid)
        request, inqueue = past.request, past.inqueue
        for _, i in places:
            if i in opened:
                continue
            hidden.add(i)
            job = jobs[i]
            past.jobs += 1
            asked = summaries[i]
            assert asked is not None  # every whole-waiting job was summarised above
            for name, value in asked.request.items():
                request[name] = request.get(name, 0.0) + value
            if job.phase == PodGroupPhase.INQUEUE and job.min_resources:
                for name, value in job.min_resources.items():
                    inqueue[name] = inqueue.get(name, 0.0) + value
        beyond[queue] = past
    if not beyond:
        return snapshot, Window()
    # In the snapshot's order, which the session's ties and the result's order follow.
    trimmed = replace(snapshot, jobs=[j for i, j in enumerate(jobs) if i not in hidden])
    return trimmed, Window(beyond, list(seen), lookback)
