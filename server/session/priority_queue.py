"""A heap ordered by a ``less(l, r)`` function (Volcano ``util.PriorityQueue``).

Actions build their queues of queues, jobs and tasks with the session's order functions
(``ssn.queue_order_fn``, ``ssn.job_order_fn``, ``ssn.task_order_fn``); equal items pop in push
order.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any


class PriorityQueue:
    __slots__ = ("_heap", "_less", "_seq")

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

    def __init__(self, less: Callable[[Any, Any], bool], items: Iterable[Any] = ()) -> None:
        self._less = less
        self._seq = 0
        self._heap: list[PriorityQueue._Item] = []
        for it in items:
            self.push(it)

    def push(self, value: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, PriorityQueue._Item(value, self._less, self._seq))

    def pop(self) -> Any:
        return heapq.heappop(self._heap).value

    def empty(self) -> bool:
        return not self._heap

    def __len__(self) -> int:
        return len(self._heap)
