"""huaweiNPU: Ascend 910 chip affinity (the name Ascend's own Volcano plugin registers).

A 910 x8 node has 8 chips in two HCCS rings (chips 0-3 and 4-7); chips of one pod must share a
ring when the pod asks for 4 or fewer. The plugin follows the Ascend 910 affinity rules
(docs/plugins/huaweiNPU.md has them in English):

* ``job_valid``: a job asking 8 chips or fewer runs as one pod asking 1, 2, 4 or 8; a job asking
  more asks 8 x N, 8 per pod; a pod asking virtual NPUs (``huawei.com/Ascend910-<N>c``) asks exactly
  one. A job breaking a rule stays unscheduled with an Unschedulable condition saying which.
* ``predicate``: a pod asking 1, 2 or 4 chips needs one ring with that many free chips, a pod
  asking 8 a node whose 8 chips are all free. A chip still being released is not given out in
  this session, not even to a pipelined pod (the design's concurrency rule: "判断资源是否处于待释放
  状态。若是，则本次不分配"). Only the chips of a pod this session evicts itself (preempt, reclaim)
  may take a pipelined pod: eviction and pipelining are one decision of the session, and the next
  session sees those chips as being released like any other.
* ``node_order``: the A-D priority table (which ring count the request leaves, then the other
  ring's count), on nodes with all 8 chips healthy first, then on nodes with 7 (a broken chip
  counts as used), then the rest; the rank dominates every other plugin's score.
* ``device_choice``: the chips of the ring the table picked, lowest ids first.

The session's device ledger keeps chips from being given twice within a cycle (Ascend's
``AddEventHandler``), and the server's state across cycles.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from muster.devices import ASCEND910, UNIT, Device, chip_number
from server.model import TaskStatus
from server.plugins.base import Plugin
from server.session.evaluator import Predicate, Scorer
from server.session.extension_points import (
    DEVICE_CHOICE,
    JOB_VALID,
    NODE_ORDER,
    PREDICATE,
    ValidateResult,
)
from server.session.info import JobInfo, TaskInfo
from server.session.session import Session

NODE_CHIPS = 8
RING_CHIPS = 4
VNPU = re.compile(r"^huawei\.com/Ascend\d+[A-Za-z]*-\d+c$")

# Per chips asked: groups A, B, C, D in order; each (free chips in the ring the pod takes,
# free chips of the other ring in order of preference).
PRIORITY_TABLE: dict[int, list[tuple[int, list[int]]]] = {
    1: [(1, [0, 1, 2, 3, 4]), (3, [0, 2, 3, 4]), (2, [0, 2, 4]), (4, [0, 4])],
    2: [(2, [0, 1, 2, 3, 4]), (4, [0, 1, 3, 4]), (3, [0, 1])],
    4: [(4, [0, 1, 2, 3, 4])],
}
# Rank layout: capacity class (8 healthy, 7 healthy, other) x group (A-D, then fallback) x position.
_CLASS_STEP, _GROUP_STEP, _FALLBACK_GROUP = 100, 10, 5
_FUTURE_OFFSET = 300  # ranks of nodes that fit only once releasing chips are free
_WORST = 1000
RANK_SCORE = 1e7  # one rank step outweighs any other plugin's node score
RING_REASON = "node(s) didn't have the Ascend 910 chips in one HCCS ring"
RELEASING_REASON = (
    "node(s) had the Ascend 910 chips in one HCCS ring only with chips still being released "
    "(not given out before they are free)"
)


def chips_asked(task: TaskInfo) -> int:
    return task.device_needs.get(ASCEND910, 0)


def validate_job(job: JobInfo) -> ValidateResult | None:
    """The Ascend 910 request rules; None when the job asks no NPU."""
    asking: list[tuple[TaskInfo, float]] = []
    for task in job.tasks.values():
        vnpus = {name: v for name, v in task.spec.request.items() if VNPU.match(name) and v > 0}
        chips = task.spec.request.get(ASCEND910, 0.0) / UNIT
        if vnpus and (len(vnpus) > 1 or chips or next(iter(vnpus.values())) != UNIT):
            asked = ", ".join(f"{v / UNIT:g} {n}" for n, v in sorted(vnpus.items()))
            return _invalid(
                f"task {task.name} asks {asked}{' and whole chips' if chips else ''}: "
                "a pod asks for exactly 1 virtual NPU of one kind"
            )
        if chips:
            asking.append((task, chips))
    if not asking:
        return None
    total = sum(c for _, c in asking)
    for task, chips in asking:
        if chips != int(chips):
            return _invalid(f"task {task.name} asks {chips:g} {ASCEND910}: chips are whole")
    if total <= NODE_CHIPS:
        if len(asking) > 1:
            return _invalid(
                f"the job asks {total:g} chips in {len(asking)} pods: a job of 8 chips or fewer is one pod"
            )
        task, chips = asking[0]
        if chips not in (1, 2, 4, 8):
            return _invalid(
                f"task {task.name} asks {chips:g} chips: a pod asks for 1, 2, 4 or 8 "
                "(1, 2 and 4 inside one HCCS ring, 8 for a whole node)"
            )
        return None
    if total % NODE_CHIPS:
        return _invalid(f"the job asks {total:g} chips: more than 8 must be 8 x N")
    for task, chips in asking:
        if chips != NODE_CHIPS:
            return _invalid(
                f"task {task.name} asks {chips:g} chips: in a job of more than 8 chips every pod asks 8"
            )
    return None


def _invalid(message: str) -> ValidateResult:
    return ValidateResult(False, "InvalidNPURequest", message)


def ring_counts(devices: Sequence[Device], rings: Sequence[Device] = ()) -> dict[str, int]:
    """Free chips per ring; every ring of ``rings`` (the node's chips) appears, empty ones as 0."""
    counts: dict[str, int] = {d.group: 0 for d in rings}
    for d in devices:
        counts[d.group] = counts.get(d.group, 0) + 1
    return counts


def fits(counts: dict[str, int], chips: int) -> bool:
    if chips <= RING_CHIPS:
        return any(n >= chips for n in counts.values())
    return chips == NODE_CHIPS and sum(counts.values()) >= NODE_CHIPS


def best_ring(counts: dict[str, int], chips: int) -> tuple[int, str | None]:
    """(group * 10 + position, ring) of the best placement by the A-D table, or by the fallback
    (a ring with room, leaving an even number first, then fewest left); (worst, None) if none."""
    best: tuple[int, str | None] = (_WORST, None)
    rings = sorted(counts)
    if len(rings) == 2 and chips in PRIORITY_TABLE:
        for group, (want, others) in enumerate(PRIORITY_TABLE[chips]):
            for r in rings:
                other = counts[rings[1 - rings.index(r)]]
                if counts[r] == want and other in others:
                    best = min(best, (group * _GROUP_STEP + others.index(other), r))
            if best[1] is not None:
                return best
    for r in rings:
        left = counts[r] - chips
        if left >= 0:
            best = min(best, (_FALLBACK_GROUP * _GROUP_STEP + (left % 2) * 5 + min(left, 4), r))
    return best


class HuaweiNPUPlugin(Plugin):
    name = "huaweiNPU"

    def on_session_open(self, ssn: Session) -> None:
        ssn.register(JOB_VALID, self.name, validate_job)
        ledger = ssn.nodes.devices

        def now_free(row: int) -> list[Device]:
            return ledger.available(row, ASCEND910, TaskStatus.ALLOCATED)

        def future_free(row: int) -> list[Device]:
            """Chips a pipelined pod may wait for: free ones, and those of pods this session
            evicted; not those of pods that were already being released when it opened."""
            held = ledger.held[row]
            return [
                d
                for d in ledger.available(row, ASCEND910, TaskStatus.PIPELINED)
                if _releasable_here(held.get(d.id))
            ]

        def all_releasing(row: int) -> list[Device]:  # every chip being released counted
            return ledger.available(row, ASCEND910, TaskStatus.PIPELINED)

        def check_with(
            free: Callable[[int], list[Device]],
        ) -> Callable[[TaskInfo, np.ndarray], np.ndarray]:
            def check(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
                chips = chips_asked(task)
                if not chips:
                    return np.ones(len(rows), dtype=bool)
                return np.array([fits(ring_counts(free(int(r))), chips) for r in rows], dtype=bool)

            return check

        check_future, check_all = check_with(future_free), check_with(all_releasing)

        def reasons(task: TaskInfo, rows: np.ndarray) -> list[str]:
            waiting = check_all(task, rows)
            return [RELEASING_REASON if w else RING_REASON for w in waiting]

        ssn.register(
            PREDICATE,
            self.name,
            Predicate(
                "shape",
                check_future,
                reasons=reasons,
                reason=RING_REASON,
                now=check_with(now_free),
            ),
        )

        def rank(task: TaskInfo, row: int) -> tuple[int, str | None]:
            chips = chips_asked(task)
            healthy = ledger.healthy_count(row, ASCEND910)
            capacity_class = 0 if healthy == NODE_CHIPS else 1 if healthy == NODE_CHIPS - 1 else 2
            chips_of_node = ledger.of(row).get(ASCEND910, [])
            for offset, free in ((0, now_free(row)), (_FUTURE_OFFSET, future_free(row))):
                counts = ring_counts(free, chips_of_node)
                if chips > RING_CHIPS:
                    if fits(counts, chips):
                        return offset + capacity_class * _CLASS_STEP, None
                    continue
                within, ring = best_ring(counts, chips)
                if ring is not None:
                    return offset + capacity_class * _CLASS_STEP + within, ring
            return _WORST, None

        def score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            if not chips_asked(task):
                return np.zeros(len(rows))
            return np.array([(_WORST - rank(task, int(r))[0]) * RANK_SCORE for r in rows])

        ssn.register(NODE_ORDER, self.name, Scorer("shape", score))

        def choose(
            task: TaskInfo, row: int, resource: str, count: int, candidates: list[Device]
        ) -> list[str] | None:
            if resource != ASCEND910:
                return None
            held = ledger.held[row]
            candidates = [d for d in candidates if _releasable_here(held.get(d.id))]
            if count > RING_CHIPS:
                return [d.id for d in candidates[:count]]
            ring = best_ring(ring_counts(candidates, ledger.of(row).get(ASCEND910, [])), count)[1]
            if ring is None:
                return None
            return [
                d.id
                for d in sorted((d for d in candidates if d.group == ring), key=_chip_order)[:count]
            ]

        ssn.register(DEVICE_CHOICE, self.name, choose)


def _releasable_here(holder: TaskInfo | None) -> bool:
    """A chip no pod holds, or one held by a pod this session evicted (a chip whose pod was
    already being released when the session opened is not given out in it)."""
    return holder is None or holder.evicted_here


def _chip_order(d: Device) -> tuple[int, str]:
    """Chip number order (Ascend910-2 before Ascend910-10), then id."""
    number = chip_number(d.id)
    return (number if number is not None else 1 << 30, d.id)
