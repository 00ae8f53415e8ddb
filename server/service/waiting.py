"""The resident queue window: the server keeps its waiting jobs in queue order between cycles.

With ``maxQueueLookback`` L under a spec-ordered job order (``server.session.window``), a cycle
opens only the first L jobs of each queue that wait whole. Finding them by looking at every job
each cycle costs a pass over the whole queue (a million jobs: seconds, in capture, in the delta
to the core's worker, in the worker's copy and in the core). ``WaitingIndex`` keeps, per queue,
the jobs that wait whole and need nothing else decided about them (*plain*: active, not held,
not quarantined, no dependencies, not an array element) sorted in that order, with their
requests summed; every other job is kept in ``others``. A capture then walks ``others`` (what
holds something, and the jobs whose gates a cycle decides) and the first L + 1 entries of each
queue: its cost follows what can be placed, not the depth of the queues.

The index follows the state through its change set: every change of a job or of one of its
tasks is in ``ChangeSet`` (the store must write it), so ``StateTables`` marks each changed job
``touch``-ed, and ``settle`` (at capture) files the touched jobs again. A restore, a reset or a
new configuration order files every job again.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import anyio
from sortedcontainers import SortedList

from muster.quantity import MIN_RESOURCE
from muster.v1 import muster_pb2 as pb
from server.model import Beyond, Resources, TaskStatus, WaitingSummary, Window
from server.service.convert import parsed_requests
from server.service.records import JobRecord
from server.session.window import (
    OrderKey,
    add_resources,
    count_beyond,
    inqueue_resources,
)

PENDING = TaskStatus.PENDING
# Jobs filed between two yields to the event loop when every job is filed (a restart): about
# 40 ms of filing, so the API and the agents' liveness calls (answered within a second) are
# served while a million jobs are filed.
FILING_STEP = 5_000


@dataclass(slots=True)
class _Entry:
    queue: str
    created: int  # its creation index
    key: tuple[object, ...]
    summary: WaitingSummary
    inqueue: Resources | None  # its minResources while Inqueue


@dataclass(frozen=True, slots=True)
class _Demand:
    """What a waiting job asks, from its task groups' requests and replicas and its minResources:
    one object per distinct demand (``_demand``), shared by every job that asks alike."""

    summary: WaitingSummary
    min_resources: Resources | None


@functools.lru_cache(maxsize=4096)
def _demand(groups: tuple[tuple[bytes, int], ...], min_resources: bytes) -> _Demand | None:
    """The demand of task groups (each its request, serialized, and its replicas) and
    minResources (serialized); None when the bounds refuse a quantity (the capture quarantines
    the job) or every task is best-effort (backfill's). Sums in ``summarize``'s order."""
    spec = pb.JobSpec()
    for request, replicas in groups:
        spec.task_groups.add(replicas=replicas).request.ParseFromString(request)
    spec.min_resources.ParseFromString(min_resources)
    requests, parsed_min, refusal = parsed_requests(spec)
    if refusal:
        return None
    best_effort = count = 0
    asked_in_all: Resources = {}
    for (_, replicas), asked in zip(groups, requests, strict=True):
        count += replicas
        if max(asked.values(), default=0.0) < MIN_RESOURCE:
            best_effort += replicas
        for _ in range(replicas):  # (per task, as summarize adds them)
            for name, value in asked.items():
                asked_in_all[name] = asked_in_all.get(name, 0.0) + value
    if best_effort >= count:
        return None
    return _Demand(WaitingSummary(best_effort, asked_in_all), parsed_min or None)


@dataclass(frozen=True, slots=True)
class _Place:
    """What a job's place in its queue is read from (``server.session.window.Ordered``), taken
    from its stored spec: a job filed here needs no template (a restart builds none)."""

    uid: str
    priority: int
    creation_index: int
    min_member: int
    tasks: range


def _waiting_entry(rec: JobRecord, order: OrderKey) -> _Entry | None:
    """The job's place in its queue when it waits whole (every task Pending, one asking for
    resources) and its spec is valid, else None. Read from its spec alone (no template, no task
    objects): what ``server.session.window.summarize`` of its tasks would say."""
    if not rec.all_pending():
        return None
    spec = rec.peek_spec()
    demand = _demand(
        tuple(
            (g.request.SerializeToString(deterministic=True), g.replicas) for g in spec.task_groups
        ),
        spec.min_resources.SerializeToString(deterministic=True),
    )
    if demand is None:
        return None
    summary = demand.summary
    # (the record's id and one string per queue name: not a fresh copy of each per job)
    place = _Place(rec.id, spec.priority, rec.creation_index, rec.min_member, range(rec.task_count))
    return _Entry(
        rec.queue,
        rec.creation_index,
        order(place, summary.best_effort),
        summary,
        inqueue_resources(rec.status.sched_phase, demand.min_resources),
    )


def _filed(rec: JobRecord, order: OrderKey) -> _Entry | None:
    """The job's entry when nothing but its place decides whether it is in a cycle (active, not
    held, not quarantined, no dependencies, not an array element: the gates of
    ``server.service.control.CycleGates`` decide those each cycle) and it waits whole."""
    st = rec.status
    if not rec.active or st.hold or st.quarantined or rec.controlled:
        return None
    return _waiting_entry(rec, order)


@dataclass
class _Queue:
    """One queue's plain waiting jobs: in order, by creation, and their requests summed."""

    ordered: SortedList = field(default_factory=SortedList)  # (key, job id)
    created: SortedList = field(default_factory=SortedList)  # creation indexes
    request: dict[str, float] = field(default_factory=dict)
    inqueue: dict[str, float] = field(default_factory=dict)

    # While every job is filed anew: the rows, sorted once at the end (``sort``), not one by one.
    unsorted: list[tuple[tuple[object, ...], str]] | None = None
    unsorted_created: list[int] = field(default_factory=list)

    def sort(self) -> None:
        if self.unsorted is not None:
            self.ordered = SortedList(self.unsorted)
            self.created = SortedList(self.unsorted_created)
            self.unsorted, self.unsorted_created = None, []

    def add(self, job_id: str, entry: _Entry, sign: float) -> None:
        if self.unsorted is not None:  # (filing every job: only additions)
            self.unsorted.append((entry.key, job_id))
            self.unsorted_created.append(entry.created)
        elif sign > 0:
            self.ordered.add((entry.key, job_id))
            self.created.add(entry.created)
        else:
            self.ordered.remove((entry.key, job_id))
            self.created.remove(entry.created)
        add_resources(self.request, entry.summary.request, sign)
        if entry.inqueue:
            add_resources(self.inqueue, entry.inqueue, sign)
        if not self.ordered and self.unsorted is None:  # nothing left: no rounding either
            self.request.clear()
            self.inqueue.clear()


def _settle_rounding(values: dict[str, float]) -> None:
    """A sum less the window's part: what is left of a resource no job past the window asks is
    rounding, not a request (a millionth of a unit is below any quantity a job can ask)."""
    for name, value in values.items():
        if abs(value) < 1e-6:
            values[name] = 0.0


@dataclass
class WindowPick:
    """A capture's jobs under the window: the records it opens (in creation order) and what
    waits past each queue's window."""

    jobs: list[JobRecord]
    window: Window


class WaitingIndex:
    """The plain waiting jobs of each queue in queue order, and the other jobs (module docstring)."""

    def __init__(self) -> None:
        self.order: OrderKey | None = None
        self.lookback = 0
        # Told of each job filed (the state makes its record compact again: ``compact_job``).
        self.on_filed: Callable[[JobRecord], None] | None = None
        self.rebuilds = 0  # how many times every job was filed again (tests, metrics)
        self.clear()

    def clear(self) -> None:
        """Forget every job; the next ``settle`` files every job of the table again."""
        self._entries: dict[str, _Entry] = {}
        self._queues: dict[str, _Queue] = {}
        self.others: dict[str, None] = {}  # job id -> None: every job not filed in a queue
        self._touched: set[str] = set()
        self._all_touched = True
        self._filing = False  # every job being filed anew (rows sorted at the end)

    @property
    def enabled(self) -> bool:
        return self.lookback > 0 and self.order is not None

    def configure(self, lookback: int, order: OrderKey | None) -> None:
        """The configuration's window; a new order (or none) files every job again."""
        if order is not self.order or (lookback > 0) != (self.lookback > 0):
            self.clear()
        self.order, self.lookback = order, lookback

    def touch(self, job_id: str) -> None:
        if self.enabled:  # (off, nothing is filed: turning it on files every job)
            self._touched.add(job_id)

    def touch_all(self) -> None:
        self._all_touched = True

    def unfiled(self) -> list[str] | None:
        """The ids of the jobs that may hold something: those not filed and those touched since
        they were (a filed job waits whole, every task Pending); None while the index is off or
        has not filed every job (then any job may)."""
        if not self.enabled or self._all_touched or self._filing:
            return None
        ids = dict.fromkeys(self.others)
        ids.update(dict.fromkeys(self._touched))
        return list(ids)

    def __len__(self) -> int:
        """How many jobs are filed in queues."""
        return len(self._entries)

    def settle(self, jobs: dict[str, JobRecord]) -> None:
        """File the touched jobs again (every job after a ``clear`` or ``touch_all``); ``jobs``
        is the state's table, read as a plain dict (not through to the store)."""
        for _ in self._filing_steps(jobs, max(len(jobs), 1)):
            pass

    async def settle_in_steps(self, jobs: dict[str, JobRecord], step: int = FILING_STEP) -> None:
        """``settle``, yielding to the event loop after every ``step`` jobs filed: filing every
        job of a restart (a million: seconds) must not stall the loop (the lease's renewals,
        the API). Jobs that change meanwhile are touched, and filed again by the next settle."""
        for _ in self._filing_steps(jobs, step):
            await anyio.sleep(0)

    def _filing_steps(self, jobs: dict[str, JobRecord], step: int) -> Iterator[None]:
        """``settle``, a step of ``step`` jobs filed anew at a time; then the touched ones."""
        if self._all_touched:
            self.rebuilds += 1
            self._all_touched = False
            self._entries.clear()
            self._queues.clear()
            self.others = {}
            self._touched = set()
            self._filing = True  # (each queue's rows sorted at once at the end)
            ids = list(jobs)
            for start in range(0, len(ids), step):
                for job_id in ids[start : start + step]:
                    self._file(job_id, dict.get(jobs, job_id))
                yield
            self._filing = False
            for queue in self._queues.values():
                queue.sort()
        touched, self._touched = self._touched, set()
        for job_id in touched:
            self._file(job_id, dict.get(jobs, job_id))

    def _file(self, job_id: str, rec: JobRecord | None) -> None:
        old = self._entries.pop(job_id, None)
        if old is not None:
            self._queues[old.queue].add(job_id, old, -1)
        if rec is None:
            self.others.pop(job_id, None)
            return
        entry = _filed(rec, self.order) if self.order is not None and self.enabled else None
        if entry is None:
            self.others[job_id] = None
            return
        self.others.pop(job_id, None)
        if self.on_filed is not None:
            self.on_filed(rec)
        self._entries[job_id] = entry
        queue = self._queues.get(entry.queue)
        if queue is None:
            queue = self._queues[entry.queue] = _Queue(unsorted=[] if self._filing else None)
        queue.add(job_id, entry, 1)

    def pick(
        self,
        jobs: Mapping[str, JobRecord],
        queues: Iterable[str],
        others: list[JobRecord],
    ) -> WindowPick:
        """The jobs a cycle opens: ``others`` (the capture's choice among the jobs not filed
        here, in creation order) and the first ``lookback`` waiting jobs of each known queue,
        ``others`` that wait whole competing for those places in the same order; what waits
        past them per queue. Jobs of a queue that does not exist are opened, all of them, as
        ``server.session.window.open_window`` leaves them."""
        assert self.order is not None
        known = set(queues)
        lookback = self.lookback
        # Per queue, the others that wait whole: they compete with the filed jobs.
        contenders: dict[str, list[tuple[tuple[object, ...], JobRecord, _Entry]]] = {}
        opened: list[JobRecord] = []
        first_created: dict[str, int] = {}
        for rec in others:
            entry = _waiting_entry(rec, self.order) if rec.queue in known else None
            if entry is None:
                opened.append(rec)
            else:
                contenders.setdefault(rec.queue, []).append((entry.key, rec, entry))
            if rec.queue in known:
                first_created.setdefault(rec.queue, rec.creation_index)
        beyond: dict[str, Beyond] = {}
        for name, queue in self._queues.items():
            if not queue.ordered:
                continue
            if name not in known:
                opened += (jobs[job_id] for _, job_id in queue.ordered)
                continue
            created = queue.created[0]
            first_created[name] = min(first_created.get(name, created), created)
            head = [
                (key, jobs[job_id], self._entries[job_id])
                for key, job_id in itertools.islice(queue.ordered, lookback + 1)
            ]
            mine = contenders.pop(name, [])
            places = sorted(head + mine, key=lambda place: place[0]) if mine else head
            opened += (rec for _, rec, _ in places[:lookback])
            waiting = len(queue.ordered) + len(mine)
            if waiting <= lookback:
                continue
            # Past the window: every filed job but those of the head in the window (the sums
            # kept, less theirs), and the contenders past it.
            past = Beyond(
                jobs=len(queue.ordered),
                first=places[lookback][1].id,
                request=dict(queue.request),
                inqueue=dict(queue.inqueue),
            )
            for _, rec, entry in places[:lookback]:
                if rec.id in self._entries:
                    past.jobs -= 1
                    add_resources(past.request, entry.summary.request, -1)
                    if entry.inqueue:
                        add_resources(past.inqueue, entry.inqueue, -1)
            for _, rec, entry in places[lookback:]:
                if rec.id not in self._entries:
                    count_beyond(past, entry.summary, entry.inqueue)
            _settle_rounding(past.request)
            _settle_rounding(past.inqueue)
            beyond[name] = past
        for name, mine in contenders.items():  # queues with no filed jobs: contenders alone
            mine.sort(key=lambda place: place[0])
            opened += (rec for _, rec, _ in mine[:lookback])
            if len(mine) > lookback:
                past = Beyond(first=mine[lookback][1].id)
                for _, _, entry in mine[lookback:]:
                    count_beyond(past, entry.summary, entry.inqueue)
                beyond[name] = past
        opened.sort(key=lambda rec: rec.creation_index)
        if not beyond:  # every waiting job opened: no window (as open_window says it)
            return WindowPick(opened, Window())
        queue_order = sorted(first_created, key=first_created.__getitem__)
        return WindowPick(opened, Window(beyond, queue_order, lookback))
