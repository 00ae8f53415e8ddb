"""Statement: a transaction of allocate / pipeline / evict operations over a session.

Each operation changes the session at once (job status index, node arrays, plugin event
handlers), so later decisions in the same action see it. ``commit`` turns the operations into
decisions (binds, evictions); ``discard`` undoes them in reverse order. ``checkpoint`` /
``rollback`` undo only the operations after a mark, for nested attempts (e.g. one victim set).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from server.model import TaskStatus
from server.session.info import TaskInfo

if TYPE_CHECKING:  # the session builds statements: annotation only
    from server.session.session import Session


class Op(Enum):
    ALLOCATE = "allocate"
    PIPELINE = "pipeline"
    EVICT = "evict"


@dataclass(slots=True)
class Operation:
    op: Op
    task: TaskInfo
    node: str
    previous_status: TaskStatus
    reason: str = ""


class Statement:
    def __init__(self, ssn: Session) -> None:
        self.ssn = ssn
        self.operations: list[Operation] = []

    def __len__(self) -> int:
        return len(self.operations)

    def allocate(self, task: TaskInfo, node: str) -> None:
        prev = task.status
        self.ssn.place_task(task, node, TaskStatus.ALLOCATED)
        self.operations.append(Operation(Op.ALLOCATE, task, node, prev))

    def pipeline(self, task: TaskInfo, node: str) -> None:
        prev = task.status
        self.ssn.place_task(task, node, TaskStatus.PIPELINED)
        self.operations.append(Operation(Op.PIPELINE, task, node, prev))

    def evict(self, task: TaskInfo, reason: str) -> None:
        prev = task.status
        assert task.node is not None, "only a task on a node can be evicted"
        self.ssn.change_status_on_node(task, TaskStatus.RELEASING)
        self.operations.append(Operation(Op.EVICT, task, task.node, prev, reason))

    def checkpoint(self) -> int:
        return len(self.operations)

    def rollback(self, mark: int) -> None:
        """Undo, newest first, every operation after ``mark``."""
        while len(self.operations) > mark:
            self._undo(self.operations.pop())

    def discard(self) -> None:
        self.rollback(0)

    def _undo(self, o: Operation) -> None:
        if o.op is Op.EVICT:
            self.ssn.change_status_on_node(o.task, o.previous_status)
        else:
            self.ssn.unplace_task(o.task, o.previous_status)

    def commit(self) -> None:
        """Make the operations decisions: evictions first, then binds (Volcano's order)."""
        for o in self.operations:
            if o.op is Op.EVICT:
                self.ssn.dispatch_evict(o.task, o.reason)
            elif o.op is Op.ALLOCATE:
                self.ssn.dispatch_bind(o.task)
        self.operations = []

    def merge(self, other: Statement) -> None:
        """Adopt ``other``'s operations (already applied to the same session)."""
        self.operations.extend(other.operations)
        other.operations = []
