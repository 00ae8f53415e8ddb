"""Task output as backends send it (``TaskLogChunk`` deltas), for ``GetTaskLogs`` and
``WatchTaskLogs`` (``muster logs [-f]``): kept in the state store, bounded per task.

Each task keeps at most ``per_task`` bytes of its output (``muster-server --task-log-limit``,
1 MiB by default): past that the oldest bytes are dropped, and counted (readers are told how many,
``muster logs`` prints ``[... N bytes dropped]``). Output reaches the store through the state's
write batches (``ClusterState.commit`` calls ``drain``), like every other change, never beside
them: a summary row per task (bytes written, bytes dropped, eof) and the kept bytes in segments of
at most ``SEGMENT`` bytes, numbered in order. A flush appends only the new bytes to a task's last
segment (in SQL) or starts the next one, and deletes whole segments from the front once they hold
only dropped bytes, so what a flush writes is what arrived since the last one.

Memory holds, per task that wrote recently (``tasks`` of them), an index of its segments and the
bytes not yet written: a read is the store's bytes followed by those. Entries whose bytes are all
written are forgotten first when there are too many, and read back from the store when the task
writes again. Without a store (a state built without one, as in unit tests) memory keeps the
output itself, for the ``tasks`` tasks that wrote most recently.

Followers of a task's output (``watch``) are woken when it grows or the task changes
(``notify``): on the leader by ingest and by each commit, on a follower by the change feed
(``server.service.replica``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import anyio

from server.service.store import TaskLogStore, WriteBatch

PER_TASK = 1024 * 1024  # bytes kept per task by default
MIN_PER_TASK = 4 * 1024  # the smallest bound a server takes
TASKS = 10_000  # tasks whose index (without a store: whose output) memory keeps
MAX_CHUNK = 1024 * 1024  # bytes in one TaskLogChunk, at most
SEGMENT = 16 * 1024  # bytes in one stored segment, at most
EVICTION_SCAN = 64  # entries looked at per eviction round


@dataclass(slots=True)
class TaskOutput:
    """A task's output as a reader sees it: ``data`` starts at byte ``start`` of all it wrote."""

    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False  # earlier output is not in data (start > 0)
    eof: bool = False
    start: int = 0
    size: int = 0  # bytes written in all


@dataclass(frozen=True, slots=True)
class LogState:
    """Where a task's output stands: bytes written in all, the oldest dropped, eof."""

    written: int
    dropped: int
    eof: bool


@dataclass(slots=True)
class _Segment:
    chunk: int
    start: int  # offset of its first kept byte in the whole output


@dataclass(slots=True, eq=False)
class _TaskLog:
    job_id: str
    written: int = 0
    dropped: int = 0
    eof: bool = False
    segments: deque[_Segment] = field(default_factory=deque)
    next_chunk: int = 0
    drained: int = 0  # bytes handed to a write batch
    saved: int = 0  # bytes the store has (their batch was written)
    unsaved: bytearray = field(default_factory=bytearray)  # bytes [unsaved_from, written)
    unsaved_from: int = 0
    trimmed: int = 0  # the first segment the store keeps, as last written

    def state(self) -> LogState:
        return LogState(self.written, self.dropped, self.eof)

    def _cut_unsaved(self) -> None:
        cut = max(self.saved, self.dropped) - self.unsaved_from
        if cut > 0:
            del self.unsaved[:cut]
            self.unsaved_from += cut


class LogWatch:
    """A follower of some tasks' output: ``wait`` returns when one of them changed (or after the
    timeout)."""

    def __init__(self, tasks: Iterable[str]) -> None:
        self.tasks = frozenset(tasks)
        self._changed = anyio.Event()

    def wake(self) -> None:
        self._changed.set()

    async def wait(self, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await self._changed.wait()
        self._changed = anyio.Event()  # what changes from now on wakes the next wait


class TaskLogs:
    """The output of every task, bounded (the module's docstring)."""

    def __init__(
        self, per_task: int = PER_TASK, tasks: int = TASKS, store: TaskLogStore | None = None
    ) -> None:
        self.per_task = per_task
        self.tasks = tasks
        self.store = store
        self._logs: OrderedDict[str, _TaskLog] = OrderedDict()  # most recently written last
        self._dirty: set[str] = set()
        self._watches: dict[str, set[LogWatch]] = {}
        self.closed = False  # the server is shutting down: streams end (``close_all``)

    @property
    def segment(self) -> int:
        return max(1, min(SEGMENT, self.per_task // 4))

    # -- writing ----------------------------------------------------------------------------

    def prepare(self, task_id: str) -> None:
        """Have the task's index in memory (reading it from the store if needed): ingest calls
        it while it validates, so ``append`` cannot fail half-way (``StoreUnavailable``)."""
        self._log(task_id)

    def append(self, task_id: str, data: bytes, eof: bool = False) -> None:
        """New output of a task, in order; ``eof``: its process ended (output after it is a new
        run's: the task was placed again)."""
        log = self._log(task_id)
        self._logs.move_to_end(task_id)
        if data:
            self._add(log, data)
        log.eof = eof
        self._dirty.add(task_id)
        self._evict()
        self.notify((task_id,))

    def _log(self, task_id: str) -> _TaskLog:
        log = self._logs.get(task_id)
        if log is not None:
            return log
        log = _TaskLog(job_id=task_id.partition("/")[0])
        stored = self.store.task_log(task_id) if self.store is not None else None
        if stored is not None:
            log.job_id = stored.job_id
            log.written = log.drained = log.saved = log.unsaved_from = stored.written
            log.dropped, log.eof = stored.dropped, stored.eof
            log.segments = deque(_Segment(chunk, start) for chunk, start in stored.segments)
            log.next_chunk = log.segments[-1].chunk + 1 if log.segments else 0
            log.trimmed = log.segments[0].chunk if log.segments else log.next_chunk
        self._logs[task_id] = log
        return log

    def _add(self, log: _TaskLog, data: bytes) -> None:
        if len(data) > self.per_task:  # only its tail can be kept: the rest is dropped at once
            skip = len(data) - self.per_task
            log.written += skip
            self._drop_to(log, log.written)
            data = data[skip:]
        size = self.segment
        pos = 0
        while pos < len(data):
            tail = log.segments[-1] if log.segments else None
            room = size - (log.written - tail.start) if tail is not None else 0
            if tail is None or room <= 0:
                log.segments.append(_Segment(log.next_chunk, log.written))
                log.next_chunk += 1
                room = size
            take = min(room, len(data) - pos)
            log.written += take
            pos += take
        log.unsaved += data
        if log.written - log.dropped > self.per_task:
            self._drop_to(log, log.written - self.per_task)

    def _drop_to(self, log: _TaskLog, to: int) -> None:
        """Drop the output before byte ``to``, and the segments holding only dropped bytes. A
        segment partly in the store keeps its bytes from its start up (its row grows only at its
        end): when bytes of it that were never written would go, it goes whole."""
        log.dropped = max(log.dropped, to)
        segments = log.segments
        while segments:
            first = segments[0]
            end = segments[1].start if len(segments) > 1 else log.written
            if end <= log.dropped:
                segments.popleft()
                continue
            if first.start < log.dropped:
                if log.drained > first.start:  # its row holds [start, drained)
                    if log.drained < log.dropped:
                        log.dropped = end
                        segments.popleft()
                        continue
                else:  # nothing of it is stored: it starts where the kept output starts
                    first.start = log.dropped
            break
        log._cut_unsaved()

    def drain(self, batch: WriteBatch) -> None:
        """Put what changed since the last drain into ``batch``: the summary rows, the bytes to
        append and the segments to delete. Once it is written the bytes are read from the store."""
        if not self._dirty:
            return
        marks: list[tuple[_TaskLog, int]] = []
        for task_id in sorted(self._dirty):
            log = self._logs.get(task_id)
            if log is None:
                continue  # forgotten (without a store: evicted with its output)
            low = max(log.drained, log.dropped)
            appends = []
            end = log.written
            for seg in reversed(log.segments):
                if end <= low:
                    break
                first = max(seg.start, low)
                if first < end:
                    data = log.unsaved[first - log.unsaved_from : end - log.unsaved_from]
                    appends.append((task_id, seg.chunk, seg.start, bytes(data)))
                end = seg.start
            batch.log_chunks.extend(reversed(appends))
            kept = log.segments[0].chunk if log.segments else log.next_chunk
            if kept != log.trimmed:
                batch.log_trims[task_id] = kept
                log.trimmed = kept
            batch.task_logs[task_id] = (task_id, log.job_id, log.written, log.dropped, log.eof)
            log.drained = log.written
            marks.append((log, log.written))
        self._dirty.clear()
        if self.store is not None:
            batch.after_write.append(lambda: self._saved(marks))

    def _saved(self, marks: list[tuple[_TaskLog, int]]) -> None:
        for log, upto in marks:
            log.saved = max(log.saved, upto)
            log._cut_unsaved()
        self._evict()

    def _evict(self) -> None:
        """Keep at most ``tasks`` entries: the least recently written whose bytes are all in the
        store (without a store: the least recently written, output and all)."""
        excess = len(self._logs) - self.tasks
        if excess <= 0:
            return
        leaving: list[str] = []
        for n, (task_id, log) in enumerate(self._logs.items()):
            if n >= EVICTION_SCAN or len(leaving) >= excess:
                break
            if self.store is None or (log.saved == log.written and task_id not in self._dirty):
                leaving.append(task_id)
        for task_id in leaving:
            del self._logs[task_id]
            self._dirty.discard(task_id)

    def forget(self, task_id: str) -> None:
        """Drop a task's entry (its output stays in the store; without one, it is gone)."""
        log = self._logs.get(task_id)
        if log is not None and (self.store is None or log.saved == log.written):
            del self._logs[task_id]
            self._dirty.discard(task_id)

    def clear(self) -> None:
        """Forget every entry (the state is reloaded from the store); followers stay."""
        self._logs.clear()
        self._dirty.clear()

    # -- reading ----------------------------------------------------------------------------

    def states(self, job_id: str, task_ids: Iterable[str]) -> dict[str, LogState]:
        """Where the output of each of ``task_ids`` (tasks of ``job_id``) stands; a task that
        wrote nothing known is left out."""
        out: dict[str, LogState] = {}
        missing = []
        for task_id in task_ids:
            log = self._logs.get(task_id)
            if log is None:
                missing.append(task_id)
            elif log.written or log.eof:  # (an index read for a write that was then refused)
                out[task_id] = log.state()
        if not missing or self.store is None:
            return out
        if len(missing) == 1:  # one indexed read, not the whole job's
            one = self.store.task_log(missing[0])
            stored = {one.task_id: one} if one is not None else {}
        else:
            stored = self.store.task_logs_of_job(job_id)
        for task_id in missing:
            row = stored.get(task_id)
            if row is not None:
                out[task_id] = LogState(row.written, row.dropped, row.eof)
        return out

    def read(self, task_id: str, start: int, end: int) -> tuple[int, bytes]:
        """The kept bytes of ``[start, end)`` (``end`` at most what ``states`` said was written):
        (where they start, the bytes). They start after ``start`` when the oldest are dropped."""
        log = self._logs.get(task_id)
        if log is None:
            if self.store is None or start >= end:
                return (max(start, end), b"")
            return self.store.task_log_bytes(task_id, start, end)
        low = max(start, log.dropped)
        end = min(end, log.written)
        if low >= end:
            return (max(low, end), b"")
        stored_end = min(end, log.saved)
        head = b""
        first = low
        if self.store is not None and low < stored_end:
            first, head = self.store.task_log_bytes(task_id, low, stored_end)
            if first + len(head) != stored_end:  # trimmed meanwhile: what follows is newer
                first, head = stored_end, b""
        at = max(low, stored_end, log.unsaved_from)
        tail = bytes(log.unsaved[at - log.unsaved_from : end - log.unsaved_from])
        if not head:
            return (at, tail)
        return (first, head + tail)

    def get(self, task_id: str) -> TaskOutput | None:
        """Everything kept of a task's output (None: nothing known)."""
        state = self.states(task_id.partition("/")[0], (task_id,)).get(task_id)
        if state is None:
            return None
        start, data = self.read(task_id, state.dropped, state.written)
        return TaskOutput(bytearray(data), start > 0, state.eof, start, state.written)

    # -- following --------------------------------------------------------------------------

    def watch(self, task_ids: Iterable[str]) -> LogWatch:
        watch = LogWatch(task_ids)
        for task_id in watch.tasks:
            self._watches.setdefault(task_id, set()).add(watch)
        return watch

    def unwatch(self, watch: LogWatch) -> None:
        for task_id in watch.tasks:
            watching = self._watches.get(task_id)
            if watching is not None:
                watching.discard(watch)
                if not watching:
                    del self._watches[task_id]

    def close_all(self) -> None:
        """Shutdown: every stream following output ends (and no new one starts)."""
        self.closed = True
        for watching in self._watches.values():
            for watch in watching:
                watch.wake()

    def notify(self, task_ids: Iterable[str]) -> None:
        """These tasks' output grew or their status changed: wake who follows them."""
        if not self._watches:
            return
        for task_id in task_ids:
            for watch in self._watches.get(task_id, ()):
                watch.wake()
