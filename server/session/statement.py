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
    UNEVICT = "unevict"  # an evicted task placed back where it is: the eviction is called off


@dataclass(slots=True)
class Operation:
    op: Op
    task: TaskInfo
    node: str
    previous_status: TaskStatus
    reason: str = ""
    # A task placed while it still held a node (an evicted victim placed again: KAI consolidation
    # moves it): where it was, with the GPU groups and device ids it held there.
    moved_from: str | None = None
    moved_groups: tuple[str, ...] = ()
    moved_devices: tuple[str, ...] = ()


class Statement:
    def __init__(self, ssn: Session) -> None:
        self.ssn = ssn
        self.operations: list[Operation] = []

    def __len__(self) -> int:
        return len(self.operations)

    def allocate(self, task: TaskInfo, node: str, gpu_groups: list[str] | None = None) -> None:
        prev = task.status
        self.ssn.place_task(task, node, TaskStatus.ALLOCATED, gpu_groups)
        self.operations.append(Operation(Op.ALLOCATE, task, node, prev))

    def pipeline(self, task: TaskInfo, node: str, gpu_groups: list[str] | None = None) -> None:
        """``gpu_groups``: for a fractional GPU task, the shared GPU it takes on ``node``."""
        prev = task.status
        if (
            task.node == node
            and task.status == TaskStatus.RELEASING
            and task.evicted_here
            and (gpu_groups is None or list(gpu_groups) == task.gpu_groups)
        ):
            self._unevict(task)  # placed back where it is (KAI: the eviction is called off)
            return
        if (
            task.node is not None and task.status == TaskStatus.RELEASING
        ):  # an evicted victim placed again: it moves
            origin = Operation(
                Op.PIPELINE,
                task,
                node,
                prev,
                moved_from=task.node,
                moved_groups=tuple(task.gpu_groups),
                moved_devices=tuple(task.devices),
            )
            self.ssn.lift_task(task)
            self.ssn.place_task(task, node, TaskStatus.PIPELINED, gpu_groups)
            self.operations.append(origin)
            return
        self.ssn.place_task(task, node, TaskStatus.PIPELINED, gpu_groups)
        self.operations.append(Operation(Op.PIPELINE, task, node, prev))

    def _unevict(self, task: TaskInfo) -> None:
        before = next(
            (
                o.previous_status
                for o in reversed(self.operations)
                if o.op is Op.EVICT and o.task is task
            ),
            TaskStatus.RUNNING,
        )
        self.ssn.change_status_on_node(task, before)
        task.evicted_here = False
        assert task.node is not None
        self.operations.append(Operation(Op.UNEVICT, task, task.node, TaskStatus.RELEASING))

    def convert_to_pipelined(self, job: str) -> None:
        """KAI: when one task of a gang could only be pipelined, the tasks of the job allocated by
        this statement are pipelined too (none binds before the whole gang can)."""
        for o in self.operations:
            if o.op is Op.ALLOCATE and o.task.job == job:
                self.ssn.change_status_on_node(o.task, TaskStatus.PIPELINED)
                if (
                    o.task.devices or o.task.gpu_fraction
                ):  # as a pipelined task takes them: released first
                    self.ssn.choose_devices_again(o.task)
                o.op = Op.PIPELINE

    def evict(self, task: TaskInfo, reason: str) -> None:
        prev = task.status
        assert task.node is not None, "only a task on a node can be evicted"
        self.ssn.change_status_on_node(task, TaskStatus.RELEASING)
        task.evicted_here = True
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
            o.task.evicted_here = False
        elif o.op is Op.UNEVICT:
            self.ssn.change_status_on_node(o.task, TaskStatus.RELEASING)
            o.task.evicted_here = True
        elif o.moved_from is not None:
            self.ssn.unplace_task(o.task, o.previous_status)
            o.task.gpu_groups, o.task.devices = list(o.moved_groups), list(o.moved_devices)
            self.ssn.return_task(o.task, o.moved_from, o.previous_status)
        else:
            self.ssn.unplace_task(o.task, o.previous_status)

    def commit(self) -> None:
        """Make the operations decisions: evictions first, then binds (Volcano's order)."""
        moves = {o.task.uid: o for o in self.operations if o.moved_from is not None}
        called_off = {o.task.uid for o in self.operations if o.op is Op.UNEVICT}
        for o in self.operations:
            if o.op is Op.EVICT and o.task.uid not in called_off:
                self.ssn.dispatch_evict(o.task, o.reason)
                move = moves.get(o.task.uid)
                if move is not None:
                    self.ssn.result.moved[o.task.uid] = (o.node, move.node)
            elif o.op is Op.ALLOCATE:
                self.ssn.dispatch_bind(o.task)
        self.operations = []

    def merge(self, other: Statement) -> None:
        """Adopt ``other``'s operations (already applied to the same session)."""
        self.operations.extend(other.operations)
        other.operations = []
