"""WatchTaskLogs: follow a task's output (or every task's of a job) until it ends, like
``kubectl logs -f`` (``muster logs -f``).

A stream first sends what the store keeps of each task's output (from the offset the caller
already has, for a stream resumed on another server), then new output as the backend reports it,
and ends once every followed task is done: it ended (Succeeded, Failed, Cancelled, or its job is
over and it holds no node) and its output is complete -- the backend sent its eof, or, for a
backend that sends none, nothing came for ``END_GRACE`` seconds after the end was seen (none is
waited for from a task that never was on a node and wrote nothing).

Any replica serves it: the output is read from the store (on the leader with what it received
and has not written yet). The leader wakes the stream when output arrives and when a commit
changes a followed task; a follower when the change feed brings either (docs/ha.md). A stream
also looks again every ``FOLLOW_TICK`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

from muster.v1 import muster_pb2 as pb
from server.model import ENDED, OCCUPYING
from server.service.api.queries import tasks_named
from server.service.errors import invalid
from server.service.state import ClusterState

FOLLOW_TICK = 1.0  # seconds between looks when nothing wakes the stream
END_GRACE = 2.0  # an ended task's output is complete after this long with nothing new and no eof
EVENT_BYTES = 1024 * 1024  # output in one TaskLogEvent, at most
ROUND_BYTES = 4 * 1024 * 1024  # output of one task sent before the others get their turn
MAX_FOLLOWED_TASKS = 1000  # tasks one stream follows, at most (name one task of a larger job)


class Follow:
    """One WatchTaskLogs stream's progress: per task, the bytes sent and whether it is done."""

    def __init__(
        self, state: ClusterState, job_id: str, tasks: list[str], offsets: dict[str, int]
    ) -> None:
        self.state = state
        self.job_id = job_id
        self.cursors = {t: offsets.get(t, 0) for t in tasks}
        self.open = list(tasks)  # not done yet, in task order
        self._ended_since: dict[str, float] = {}  # monotonic time the task was first seen ended
        self.closed = False  # the server is shutting down: the caller follows again elsewhere

    async def events(self) -> AsyncIterator[pb.TaskLogEvent]:
        logs = self.state.task_logs
        watch = logs.watch(self.open)
        try:
            while self.open:
                if logs.closed:
                    self.closed = True
                    return
                for event in self._round():
                    yield event
                if self.open:
                    await watch.wait(FOLLOW_TICK)
        finally:
            logs.unwatch(watch)

    def _round(self) -> Iterator[pb.TaskLogEvent]:
        logs = self.state.task_logs
        states = logs.states(self.job_id, self.open)
        now = time.monotonic()
        for task_id in list(self.open):
            cursor = self.cursors[task_id]
            st = states.get(task_id)
            end = st.written if st is not None else 0
            sent = 0
            while cursor < end and sent < ROUND_BYTES:
                first, data = logs.read(task_id, cursor, min(end, cursor + EVENT_BYTES))
                if first + len(data) <= cursor:
                    break  # nothing more there now (cannot happen: reads move on)
                yield pb.TaskLogEvent(
                    task_id=task_id, data=data, offset=first, dropped_bytes=first - cursor
                )
                sent += len(data)
                cursor = first + len(data)
            if cursor != self.cursors[task_id]:
                self.cursors[task_id] = cursor
                self._ended_since.pop(task_id, None)  # output still comes
            ended, placed = self._ended(task_id)
            if cursor < end or not ended:
                continue
            if (st is None and placed) or (st is not None and not st.eof):
                since = self._ended_since.setdefault(task_id, now)
                if now - since < END_GRACE:
                    continue  # its backend may still send the last of it
            self.open.remove(task_id)
            yield pb.TaskLogEvent(task_id=task_id, offset=cursor, eof=True)

    def _ended(self, task_id: str) -> tuple[bool, bool]:
        """Whether the task is over (it ended, or its job is over and it holds no node), and
        whether it was on a node (one that never was has no output to wait for)."""
        task = self.state.tasks.get(task_id)
        job = self.state.task_job.get(task_id)
        if task is None or job is None:
            # Its job left memory (over long ago), or is not here yet (a follower behind the
            # feed): the store's record says.
            job = self.state.jobs.get(self.job_id)
            task = next((t for t in job.tasks if t.uid == task_id), None) if job else None
            if job is None or task is None:
                return True, True
        ended = task.status in ENDED or (not job.active and task.status not in OCCUPYING)
        return ended, task.node is not None


def prepare_follow(state: ClusterState, req: pb.WatchTaskLogsRequest) -> Follow:
    """Check the request (``DomainError`` naming the field) and start following."""
    rec = state.job_or_error(req.job_id, "job_id")
    tasks = tasks_named(rec, req.task_id)
    if len(tasks) > MAX_FOLLOWED_TASKS:
        raise invalid(
            f"task_id: job {req.job_id!r} has {len(tasks):,} tasks; follow one of them (at most "
            f"{MAX_FOLLOWED_TASKS:,} are followed at once)"
        )
    for task_id in req.offsets:
        if task_id not in tasks:
            raise invalid(f"offsets: {task_id!r} is not a followed task of job {req.job_id!r}")
    return Follow(state, rec.id, tasks, dict(req.offsets))
