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
from collections.abc import Callable, Iterable, Mapping, Sized
from dataclasses import replace
from typing import Any, Protocol

from muster.quantity import MIN_RESOURCE
from server.model import (
    Beyond,
    ClusterSnapshot,
    JobSpec,
    PodGroupPhase,
    Resources,
    TaskSpec,
    TaskStatus,
    WaitingSummary,
    Window,
)
from server.session.extension_points import HIERARCHY_SWITCH, JOB_ORDER
from server.session.options import SchedulerConfig

LOOKBACK = "maxQueueLookback"  # session parameter: the most waiting jobs of a queue a cycle opens
# The Volcano-profile plugins that register a job order (a test holds this list to what they
# register): those whose order of waiting jobs a spec tells, and the others (no window with them).
SPEC_ORDERED = frozenset({"priority", "gang", "drf"})
ORDERED_OTHERWISE = frozenset({"sla", "tdm", "tyarranger"})


def lookback_of(config: SchedulerConfig) -> int:
    value = config.session.get(LOOKBACK, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class Ordered(Protocol):
    """What a waiting job's place in its queue is read from (a ``JobSpec`` has it all)."""

    @property
    def uid(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def creation_index(self) -> int: ...
    @property
    def min_member(self) -> int | None: ...
    @property
    def tasks(self) -> Sized: ...


# A waiting job's place in its queue, from its spec and how many of its tasks are best-effort.
OrderKey = Callable[[Ordered, int], tuple[Any, ...]]


def waiting_order(config: SchedulerConfig) -> OrderKey | None:
    """The order allocate takes whole-waiting jobs in, from their specs; None when the
    configuration orders them by something else (no window then). The same configuration order
    gives the same function (the server's resident window compares them)."""
    keys = _order_plugins(config)
    return None if keys is None else _ORDERS.get(keys)


def _order_plugins(config: SchedulerConfig) -> tuple[str, ...] | None:
    """The spec-ordered job-order plugins of the configuration in tier order; None: another
    job order decides."""
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
    return tuple(keys)


# priority: higher first; gang: not ready first (a job with no task placed is ready when its
# best-effort tasks make its minimum, server.session.info.JobInfo.is_ready). Then the session's
# ties: creation order, uid. Spelled out: this runs for every waiting job. A plugin named twice
# has no entry: allocate orders those jobs.
_ORDERS: dict[tuple[str, ...], OrderKey] = {
    ("priority", "gang"): lambda j, be: (-j.priority, _ready(j, be), j.creation_index, j.uid),
    ("gang", "priority"): lambda j, be: (_ready(j, be), -j.priority, j.creation_index, j.uid),
    ("priority",): lambda j, be: (-j.priority, j.creation_index, j.uid),
    ("gang",): lambda j, be: (_ready(j, be), j.creation_index, j.uid),
    (): lambda j, be: (j.creation_index, j.uid),
}


def _ready(job: Ordered, best_effort: int) -> bool:
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


def open_window(
    snapshot: ClusterSnapshot, config: SchedulerConfig
) -> tuple[ClusterSnapshot, Window]:
    """The snapshot a session opens, and what of each queue waits beyond its window (no window:
    the snapshot itself and nothing beyond). A snapshot its maker already windowed (the
    server's resident state, ``ClusterSnapshot.window``) is opened as it is."""
    if snapshot.window is not None:
        return snapshot, snapshot.window
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
        for _, i in places:
            if i in opened:
                continue
            hidden.add(i)
            job = jobs[i]
            asked = summaries[i]
            assert asked is not None  # every whole-waiting job was summarised above
            count_beyond(past, asked, inqueue_resources(job.phase, job.min_resources))
        beyond[queue] = past
    if not beyond:
        return snapshot, Window()
    # In the snapshot's order, which the session's ties and the result's order follow.
    trimmed = replace(snapshot, jobs=[j for i, j in enumerate(jobs) if i not in hidden])
    return trimmed, Window(beyond, list(seen), lookback)


def inqueue_resources(phase: PodGroupPhase, min_resources: Resources | None) -> Resources | None:
    """What a waiting job adds to its queue's inqueue resources: its minResources once admitted."""
    return min_resources if phase == PodGroupPhase.INQUEUE and min_resources else None


def count_beyond(past: Beyond, summary: WaitingSummary, inqueue: Resources | None) -> None:
    """Count one more job (its summary, its ``inqueue_resources``) past a queue's window."""
    past.jobs += 1
    add_resources(past.request, summary.request)
    if inqueue:
        add_resources(past.inqueue, inqueue)


def add_resources(into: dict[str, float], values: Mapping[str, float], sign: float = 1.0) -> None:
    """Add ``values`` (times ``sign``) into ``into``, resource by resource."""
    for name, value in values.items():
        into[name] = into.get(name, 0.0) + sign * value
