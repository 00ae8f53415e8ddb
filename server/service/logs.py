"""Task output as backends send it (``TaskLogChunk`` deltas), for ``GetTaskLogs`` / ``muster logs``.

Memory only and bounded: the last ``PER_TASK`` bytes of each task, for the ``TASKS`` tasks that
wrote most recently (older ones are forgotten whole). A server restart forgets them; the backend
keeps the full output (the fake agent: in its state or log directory)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

PER_TASK = 64 * 1024
TASKS = 2_000
MAX_CHUNK = 1024 * 1024


@dataclass(slots=True)
class TaskOutput:
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    eof: bool = False


class TaskLogs:
    def __init__(self, per_task: int = PER_TASK, tasks: int = TASKS) -> None:
        self.per_task = per_task
        self.tasks = tasks
        self._logs: OrderedDict[str, TaskOutput] = OrderedDict()

    def append(self, task_id: str, data: bytes, eof: bool = False) -> None:
        out = self._logs.pop(task_id, None) or TaskOutput()
        out.data += data
        if len(out.data) > self.per_task:
            del out.data[: len(out.data) - self.per_task]
            out.truncated = True
        out.eof = out.eof or eof
        self._logs[task_id] = out  # most recent last
        while len(self._logs) > self.tasks:
            self._logs.popitem(last=False)

    def get(self, task_id: str) -> TaskOutput | None:
        return self._logs.get(task_id)

    def forget(self, task_id: str) -> None:
        self._logs.pop(task_id, None)
