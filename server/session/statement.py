"""Statement: a transaction of allocate / pipeline / evict operations over a session, and the only
way a cycle changes where tasks are (Volcano's ``framework/statement.go``).

Each operation changes the session at once (job status index, node arrays, device ids, plugin
event handlers), so later decisions in the same action see it. ``commit`` turns the operations into
decisions (binds, evictions); ``discard`` undoes them in reverse order. ``checkpoint`` /
``rollback`` undo only the operations after a mark, for nested attempts (e.g. one victim set).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from server.model import TaskStatus
from server.session.info import TaskInfo
from server.session.kai import new_group_name

if TYPE_CHECKING:  # the session builds statements: annotation only
    from server.session.session import Session


class Op(Enum):
    ALLOCATE = "allocate"
    PIPELINE = "pipeline"
    EVICT = "evict"
    UNEVICT = "unevict"  # an evicted task placed back where it is: the eviction is called off
    UNPIPELINE = "unpipeline"  # a pipelined task pending again (backfill takes it back)


# Bound once: an enum class attribute costs ~0.1-0.2 us per lookup, and these are read per
# placement and per status change (KAI's reclaim evicts and rolls back thousands per cycle).
_ALLOCATE, _PIPELINE, _EVICT = Op.ALLOCATE, Op.PIPELINE, Op.EVICT
_UNEVICT, _UNPIPELINE = Op.UNEVICT, Op.UNPIPELINE
_ALLOCATED, _BINDING = TaskStatus.ALLOCATED, TaskStatus.BINDING
_RELEASING, _PIPELINED, _RUNNING = TaskStatus.RELEASING, TaskStatus.PIPELINED, TaskStatus.RUNNING


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
        # A KAI victim search's simulation: the placements it undoes were never tried for real, so
        # they leave no ``last_tx_status`` (what a job's explanation counts as fitting).
        self.simulation = False
        # Per mark, the shape-class failures remembered when it was taken: a rollback to it frees
        # resources only for failures remembered since (see server/session/shape_classes.py).
        self._remembered: dict[int, int] = {0: ssn.shape_classes.remembered}

    def __len__(self) -> int:
        return len(self.operations)

    def allocate(self, task: TaskInfo, node: str, gpu_groups: list[str] | None = None) -> None:
        prev = task.status
        self._place(task, node, _ALLOCATED, gpu_groups)
        self.operations.append(Operation(_ALLOCATE, task, node, prev))

    def pipeline(self, task: TaskInfo, node: str, gpu_groups: list[str] | None = None) -> None:
        """``gpu_groups``: for a fractional GPU task, the shared GPU it takes on ``node``."""
        prev = task.status
        if (
            task.node == node
            and task.status == _RELEASING
            and task.evicted_here
            and (gpu_groups is None or list(gpu_groups) == task.gpu_groups)
        ):
            self._unevict(task)  # placed back where it is (KAI: the eviction is called off)
            return
        if (
            task.node is not None and task.status == _RELEASING
        ):  # an evicted victim placed again: it moves
            origin = Operation(
                _PIPELINE,
                task,
                node,
                prev,
                moved_from=task.node,
                moved_groups=tuple(task.gpu_groups),
                moved_devices=tuple(task.devices),
            )
            self._lift(task)
            self._place(task, node, _PIPELINED, gpu_groups)
            self.operations.append(origin)
            self.ssn.shape_classes.freed()  # the node it left has room again
            return
        self._place(task, node, _PIPELINED, gpu_groups)
        self.operations.append(Operation(_PIPELINE, task, node, prev))

    def unpipeline(self, task: TaskInfo) -> None:
        """A pipelined task leaves the node it waits for and is pending again (Volcano's
        ``Statement.UnPipeline``)."""
        assert task.node is not None, "only a pipelined task on a node can be unpipelined"
        origin = Operation(
            Op.UNPIPELINE,
            task,
            task.node,
            task.status,
            moved_groups=tuple(task.gpu_groups),
            moved_devices=tuple(task.devices),
        )
        self._unplace(task, TaskStatus.PENDING)
        self.operations.append(origin)
        self.ssn.shape_classes.freed()

    def _unevict(self, task: TaskInfo) -> None:
        before = next(
            (
                o.previous_status
                for o in reversed(self.operations)
                if o.op is _EVICT and o.task is task
            ),
            _RUNNING,
        )
        self._change_status(task, before)
        task.evicted_here = False
        assert task.node is not None
        self.operations.append(Operation(_UNEVICT, task, task.node, _RELEASING))

    def convert_to_pipelined(self, job: str) -> None:
        """KAI: when one task of a gang could only be pipelined, the tasks of the job allocated by
        this statement are pipelined too (none binds before the whole gang can)."""
        handlers = self.ssn.event_handlers
        for o in self.operations:
            if o.op is Op.ALLOCATE and o.task.job == job:
                self.ssn.shape_classes.freed()  # free resources it held now come back
                # As KAI unallocates the task and pipelines it again: the event handlers see it go
                # and come back (a queue's share counts it once), not a second allocation.
                for h in handlers:
                    if h.deallocate:
                        h.deallocate(o.task)
                self._change_status(o.task, TaskStatus.PIPELINED)
                if (
                    o.task.devices or o.task.gpu_fraction
                ):  # as a pipelined task takes them: released first
                    self._choose_devices_again(o.task)
                o.op = Op.PIPELINE

    def evict(self, task: TaskInfo, reason: str) -> None:
        prev = task.status
        assert task.node is not None, "only a task on a node can be evicted"
        self._change_status(task, _RELEASING)
        task.evicted_here = True
        self.operations.append(Operation(_EVICT, task, task.node, prev, reason))
        self.ssn.shape_classes.freed()  # what it holds comes back once it is gone

    def checkpoint(self) -> int:
        mark = len(self.operations)
        self._remembered[mark] = self.ssn.shape_classes.remembered
        return mark

    def rollback(self, mark: int) -> None:
        """Undo, newest first, every operation after ``mark``. The state is the mark's again: no
        easier than when a shape-class failure remembered before the mark was found, but easier
        than for one remembered since."""
        if len(self.operations) > mark:
            classes = self.ssn.shape_classes
            if self._remembered.get(mark) != classes.remembered:
                classes.freed()
        while len(self.operations) > mark:
            self._undo(self.operations.pop())

    def discard(self) -> None:
        self.rollback(0)

    def _undo(self, o: Operation) -> None:
        op = o.op
        if op is _EVICT:
            self._change_status(o.task, o.previous_status)
            o.task.evicted_here = False
        elif op is _UNEVICT:
            self._change_status(o.task, _RELEASING)
            o.task.evicted_here = True
        elif op is _UNPIPELINE:
            o.task.gpu_groups, o.task.devices = list(o.moved_groups), list(o.moved_devices)
            self._place(o.task, o.node, o.previous_status, list(o.moved_groups))
        elif o.moved_from is not None:
            self._unplace(o.task, o.previous_status)
            o.task.gpu_groups, o.task.devices = list(o.moved_groups), list(o.moved_devices)
            self._return(o.task, o.moved_from, o.previous_status)
        else:
            self._unplace(o.task, o.previous_status)

    def commit(self) -> None:
        """Make the operations decisions: evictions first, then binds (Volcano's order)."""
        operations = self.operations
        result = self.ssn.result
        # Most statements hold no move and no called-off eviction: nothing to look up then.
        moves: dict[str, Operation] = {}
        called_off: set[str] = set()
        if any(o.moved_from is not None or o.op is _UNEVICT for o in operations):
            moves = {o.task.uid: o for o in operations if o.moved_from is not None}
            called_off = {o.task.uid for o in operations if o.op is _UNEVICT}
        for o in operations:
            if o.op is _EVICT and o.task.uid not in called_off:
                result.evictions[o.task.uid] = o.reason
                move = moves.get(o.task.uid)
                if move is not None:
                    result.moved[o.task.uid] = (o.node, move.node)
            elif o.op is _ALLOCATE:
                self._bind(o.task)
        self.operations = []

    def merge(self, other: Statement) -> None:
        """Adopt ``other``'s operations (already applied to the same session)."""
        self.operations.extend(other.operations)
        other.operations = []
        # A rollback now undoes ``other``'s operations too, back to before ``other`` began.
        since = other._remembered.get(0, -1)
        self._remembered = {m: min(n, since) for m, n in self._remembered.items()}

    # -- the state changes the operations make ---------------------------------------------------
    def _place(
        self, task: TaskInfo, node: str, status: TaskStatus, gpu_groups: list[str] | None = None
    ) -> None:
        ssn = self.ssn
        ssn.jobs[task.job].update_task_status(task, status)
        task.node = node
        if gpu_groups is not None:
            task.gpu_groups = list(gpu_groups)
        nodes = ssn.nodes
        row = nodes.index[node]
        if task.device_needs and not task.devices:
            task.devices = ssn.choose_devices(task, row, status)
        nodes.add_task(row, task)
        for h in ssn.event_handlers:
            allocate = h.allocate
            if allocate:
                allocate(task)

    def _lift(self, task: TaskInfo) -> None:
        """An evicted task leaves its node to be placed elsewhere (KAI moves victims): its node,
        GPU groups and device ids are let go; ``_return`` undoes this."""
        assert task.node is not None
        nodes = self.ssn.nodes
        nodes.remove_task(nodes.index[task.node], task)
        task.node = None
        task.gpu_groups = []
        task.devices = []

    def _return(self, task: TaskInfo, node: str, status: TaskStatus) -> None:
        ssn = self.ssn
        ssn.jobs[task.job].update_task_status(task, status)
        task.node = node
        rivals = self._rivals(task)
        ssn.nodes.add_task(ssn.nodes.index[node], task)
        self._take_back_devices(task, rivals)

    def _unplace(self, task: TaskInfo, previous: TaskStatus) -> None:
        assert task.node is not None
        ssn = self.ssn
        ssn.nodes.remove_task(ssn.nodes.index[task.node], task)
        if not self.simulation:
            task.last_tx_status = task.status
        ssn.jobs[task.job].update_task_status(task, previous)
        task.node = None
        task.devices = []
        if task.gpu_fraction:
            task.gpu_groups = []
        for h in ssn.event_handlers:
            if h.deallocate:
                h.deallocate(task)

    def _change_status(self, task: TaskInfo, status: TaskStatus) -> None:
        """Evict / unevict: the task stays on its node with another status."""
        assert task.node is not None
        ssn = self.ssn
        nodes = ssn.nodes
        i = nodes.index[task.node]
        nodes.remove_task(i, task)
        job = ssn.jobs.get(task.job)
        if job is not None:
            job.update_task_status(task, status)
        else:
            task.status = status
        # Evicted (KAI's reclaim does it, and undoes it, thousands of times a cycle): no rivals
        # to look for and only the deallocate handlers, each path without the other's checks.
        if status == _RELEASING:
            nodes.add_task(i, task)
            for h in ssn.event_handlers:
                if h.deallocate:
                    h.deallocate(task)
            return
        rivals = self._rivals(task)
        nodes.add_task(i, task)
        self._take_back_devices(task, rivals)
        for h in ssn.event_handlers:
            if h.allocate:
                h.allocate(task)

    def _rivals(self, task: TaskInfo) -> tuple[list[TaskInfo], list[str]] | None:
        """Before a task takes its devices again (unevicted, a move undone): the pipelined tasks
        promised them while it was releasing, and the shared GPUs pipelined onto them; None when
        there are none."""
        if not task.devices or task.node is None or task.status == _RELEASING:
            return None
        nodes = self.ssn.nodes
        row = nodes.index[task.node]
        promised, shared = nodes.devices.promised[row], nodes.shared[row]
        # Most rows have no pipelined task promised a device and no shared GPU: no rival can be
        # there, and nothing is looked at per device.
        if not promised and not shared:
            return None
        whole = {
            id(t): t for d in task.devices if (t := promised.get(d)) is not None and t is not task
        }
        groups = [
            d
            for d in task.devices
            if shared.get(d) and all(t.status == _PIPELINED for t in shared[d])
        ]
        return list(whole.values()), groups

    def _take_back_devices(
        self, task: TaskInfo, rivals: tuple[list[TaskInfo], list[str]] | None
    ) -> None:
        """The rivals of a task that took its devices again take other ones."""
        if rivals is None:
            return
        whole, groups = rivals
        for other in whole:
            self._choose_devices_again(other)
        if groups:
            assert task.node is not None
            row = self.ssn.nodes.index[task.node]
            for name in groups:
                self._move_share(row, name)

    def _move_share(self, row: int, name: str) -> None:
        """The tasks of a pipelined shared GPU move to another GPU (one being released first)."""
        nodes = self.ssn.nodes
        holders = list(nodes.shared[row].get(name, ()))
        for t in holders:
            nodes.remove_task(row, t)
        new = new_group_name(nodes, row, releasing=True)
        for t in holders:
            t.gpu_groups = [new]
            nodes.add_task(row, t)

    def _choose_devices_again(self, task: TaskInfo) -> None:
        """A placed task's device ids chosen anew for its status, and the name of a shared GPU it
        is alone on (an allocation turned pipelined must not keep free devices that a later
        allocation of the cycle would then find promised)."""
        assert task.node is not None
        nodes = self.ssn.nodes
        row = nodes.index[task.node]
        if (
            task.gpu_fraction
            and task.gpu_groups
            and nodes.shared[row].get(task.gpu_groups[0]) == [task]
        ):
            self._move_share(row, task.gpu_groups[0])
        if task.devices:
            ledger = nodes.devices
            ledger.detach(row, task)
            task.devices = []
            task.devices = self.ssn.choose_devices(task, row, task.status)
            ledger.attach(row, task)

    def _bind(self, task: TaskInfo) -> None:
        """Commit of an allocation: the task is Binding, and a bind decision is emitted. Allocated
        and Binding hold a node the same way, so the node arrays (and evaluation caches) stay."""
        assert task.node is not None
        result = self.ssn.result
        self.ssn.jobs[task.job].update_task_status(task, _BINDING)
        result.binds[task.uid] = task.node
        if task.devices:
            result.bind_devices[task.uid] = list(task.devices)
        if task.gpu_groups:
            result.bind_gpu_groups[task.uid] = list(task.gpu_groups)
