"""A heap ordered by a ``less(l, r)`` function (Volcano ``util.PriorityQueue``).

Actions build their queues of queues, jobs and tasks with the session's order functions
(``ssn.queue_order_fn``, ``ssn.job_order_fn``, ``ssn.task_order_fn``); equal items pop in push
order. Given a ``key`` with the same order (``ssn.job_order_key()``), an item's key is computed
once when it is pushed and the heap compares keys: the same order, without asking the plugins at
every comparison. Only for items whose order does not change while they wait.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any


class PriorityQueue:
    __slots__ = ("_heap", "_less", "_seq", "_key")

    class _Item:
        __slots__ = ("value", "less", "seq")

        def __init__(self, value: Any, less: Callable[[Any, Any], bool], seq: int) -> None:
            self.value, self.less, self.seq = value, less, seq

        def __lt__(self, other: PriorityQueue._Item) -> bool:
            if self.less(self.value, other.value):
                return True
            if self.less(other.value, self.value):
                return False
            return self.seq < other.seq

    def __init__(
        self,
        less: Callable[[Any, Any], bool],
        items: Iterable[Any] = (),
        key: Callable[[Any], Any] | None = None,
    ) -> None:
        self._less = less
        self._key = key
        self._seq = 0
        self._heap: list[Any] = []
        if key is not None:  # keys are unique (with the push count): heapify pops in the same order
            self._heap = [(key(it), seq, it) for seq, it in enumerate(items, 1)]
            self._seq = len(self._heap)
            heapq.heapify(self._heap)
            return
        for it in items:
            self.push(it)

    def push(self, value: Any) -> None:
        self._seq += 1
        if self._key is not None:
            heapq.heappush(self._heap, (self._key(value), self._seq, value))
        else:
            heapq.heappush(self._heap, PriorityQueue._Item(value, self._less, self._seq))

    def pop(self) -> Any:
        if self._key is not None:
            return heapq.heappop(self._heap)[2]
        return heapq.heappop(self._heap).value

    def empty(self) -> bool:
        return not self._heap

    def __len__(self) -> int:
        return len(self._heap)
