"""fgd: fragmentation gradient descent -- place a task where it grows the expected GPU fragmentation
least (Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent", USENIX ATC'23).

The *workload* is the session's own tasks (every task of every job, placed or pending, ended ones
left out), grouped into task types by request (cpu, whole GPUs or the share of one GPU; memory with
``fgd.memory``); a type's *popularity* is its share of the tasks. The static predicates (node
selector, affinity, taints: a GPU model constraint) decide which nodes a type may use at all.

A node's fragmentation for one task type is the free GPU capacity of the node that tasks of the
type could not use even if the node were filled with them: all of it when the type cannot run on the
node (it asks no GPU, the node is not open to it, its cpu does not fit, or too few GPUs have the
share it asks free); otherwise what is left over the type's shares on each GPU (a GPU with less
free than the share: all of it) -- and, when cpu runs out before the GPUs do, the GPUs the type's
tasks could not reach for want of cpu (in proportion). The paper's measure is the same without the
two refinements (it counts a GPU that holds one share as wholly usable, and looks at one task's cpu
only); on the Alibaba trace they raise the allocated share (docs/plugins/fgd.md).
The node's *expected fragmentation* is the popularity-weighted sum over the types, in GPUs.

A task scores a node, and on the chosen node ``gpu_order`` scores a GPU for a fractional task (a
shared GPU, or a whole free GPU), by the FGD simulator's score, ``weight x int(100 x
sigmoid(-growth))``, growth being how much the placement grows the node's expected fragmentation (in
GPUs): whole numbers as the scheduler framework's scores are, so growths within ~0.04 GPU of each
other tie and go by node name (the simulator's rule too), which packs nodes in that order. A
fractional task is scored on the node's best GPU for it.

Arguments: ``fgd.weight`` (1: the score's multiplier; 0 turns the plugin off),
``fgd.popularityThreshold`` (1.0: the types kept, most popular first, until they cover this share
of the tasks -- the FGD simulator's "typical pods"; the kept popularities are re-normalised to sum
to 1, as there) and ``fgd.memory`` (false: also count memory like cpu). Registers node_order (shape scope: a node's
score changes only when the node does) and gpu_order; a node's state and expected fragmentation
are kept until the node changes (``NodeTable.change_log``). Free resources are counted once
releasing tasks are gone.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import ClassVar

import numpy as np

from muster.quantity import CPU, MEMORY, MIN_RESOURCE
from server.model import ENDED
from server.plugins.base import Plugin
from server.session.extension_points import GPU_ORDER, NODE_ORDER, Scorer
from server.session.info import NodeTable, TaskInfo
from server.session.kai import task_quantities
from server.session.session import Session

_EPS = 1e-6
# Free GPU shares are rounded to this many decimals in the memo keys (a milli-GPU is 3).
_DECIMALS = 6
# Memoised fragmentation values kept per session before the memo is cleared (bounds memory).
_MEMO_LIMIT = 500_000
# The score's scale: the scheduler framework's node score, 0 .. 100.
MAX_SCORE = 100


def fgd_score(growth: float) -> float:
    """The FGD score of a placement that grows the node's expected fragmentation by ``growth`` GPUs:
    ``int(MAX_SCORE x sigmoid(-growth))`` (0 .. 100; 50 for no change) -- the paper's simulator's
    score, whole numbers as the scheduler framework's node scores are. Placements within ~0.04 GPU of
    each other score alike and go by node name, which packs the nodes first in that order and keeps
    the rest whole for large tasks."""
    if growth >= 40.0:  # exp overflows far beyond any node's GPUs; the score is 0 long before
        return 0.0
    return float(int(MAX_SCORE / (1.0 + math.exp(growth))))


@dataclass(frozen=True)
class TaskType:
    """One kind of task of the workload: its request and the share of the tasks that are of it."""

    cpu: float  # millicores
    memory: float  # bytes
    gpus: int  # GPUs asked: whole GPUs, or 1 for a share of one GPU; 0: none
    share: float  # per GPU: 1.0 for whole GPUs, the fraction for a shared GPU, 0 when no GPU
    popularity: float
    constraints: int = 0  # which static constraints (node selector, affinity ...): an index


@dataclass(frozen=True)
class NodeState:
    """What fragmentation depends on: free cpu, memory and the free share of each GPU."""

    cpu: float
    memory: float
    gpus: tuple[float, ...]  # free share of each GPU that has any, sorted descending


class Workload:
    """The task types as arrays, for fragmentation over all of them at once."""

    def __init__(self, types: list[TaskType]) -> None:
        self.types = types
        self.cpu = np.array([t.cpu for t in types], dtype=float)
        self.memory = np.array([t.memory for t in types], dtype=float)
        self.gpus = np.array([t.gpus for t in types], dtype=float)
        self.share = np.array([t.share for t in types], dtype=float)
        self.popularity = np.array([t.popularity for t in types], dtype=float)
        self.asks_gpu = self.gpus > 0
        # Divisors for tasks per GPU, cpu and memory (1 where the type asks none: masked out).
        self._share_div = np.where(self.share > 0, self.share, 1.0)[:, None]
        self._gpus_div = np.maximum(self.gpus, 1.0)
        self._cpu_div = np.where(self.cpu > 0, self.cpu, 1.0)
        self._memory_div = np.where(self.memory > 0, self.memory, 1.0)
        self._shared = self.share < 1.0 - _EPS

    def fragmentation(self, state: NodeState, access: np.ndarray | None = None) -> float:
        """Expected fragmented GPU capacity of a node in ``state`` (GPUs). ``access``: per type,
        may it use the node at all (None: every type may)."""
        if not state.gpus or not len(self.types):
            return 0.0
        free = np.asarray(state.gpus, dtype=float)
        total = float(free.sum())
        fits = (
            free[None, :] >= self.share[:, None] - _EPS
        )  # types x GPUs: the GPU holds the type's share
        held = fits.sum(axis=1)
        # How many tasks of each type the GPUs hold (a shared GPU several shares), and the cpu and memory.
        per_gpu = np.where(fits, np.floor(free[None, :] / self._share_div + _EPS), 0.0)
        by_gpu = np.where(self._shared, per_gpu.sum(axis=1), np.floor(held / self._gpus_div))
        by_cpu = np.where(
            self.cpu > 0, np.floor((state.cpu + MIN_RESOURCE) / self._cpu_div), np.inf
        )
        by_memory = np.where(
            self.memory > 0, np.floor((state.memory + MIN_RESOURCE) / self._memory_div), np.inf
        )
        tasks = np.minimum(by_gpu, np.minimum(by_cpu, by_memory))
        runs = self.asks_gpu & (held >= self.gpus) & (tasks >= 1)
        if access is not None:
            runs &= access
        # What a type can use: its shares that fit on each GPU (a whole GPU per whole-GPU task) -- in
        # proportion, when cpu or memory run out before the GPUs do.
        usable = (per_gpu * self.share[:, None]).sum(axis=1) * np.minimum(
            1.0, tasks / np.maximum(by_gpu, 1.0)
        )
        per_type = np.where(runs, total - usable, total)
        return float(self.popularity @ per_type)


Request = tuple[float, float, int, float]  # cpu, memory, gpus, share (as ``TaskType``)
Key = tuple[float, float, int, float, int]  # a Request and the constraints index


def typical_types(tasks: list[Key], threshold: float = 1.0) -> list[TaskType]:
    """Task types from (cpu, memory, gpus, share, constraints) per task: the most popular first,
    kept until they cover ``threshold`` of the tasks (ties: by key); the kept types' popularities
    are their shares of the kept tasks (they sum to 1, as the FGD simulator's typical pods do)."""
    counts = Counter(tasks)
    n = len(tasks)
    kept: list[tuple[Key, int]] = []
    covered = 0
    for key, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if kept and covered >= threshold * n - _EPS:
            break
        kept.append((key, count))
        covered += count
    return [
        TaskType(key[0], key[1], key[2], key[3], count / covered, key[4]) for key, count in kept
    ]


def node_state(nodes: NodeTable, row: int, cpu_dim: int | None, mem_dim: int | None) -> NodeState:
    """The row's free resources once releasing tasks are gone (pipelined ones counted)."""
    idle = nodes.future_idle(row)
    gpus: list[float] = []
    if nodes.gpu_dim is not None:
        _, whole = nodes.whole_gpus(row)
        gpus.extend([1.0] * max(int(round(whole)), 0))
        for group in nodes.shared[row]:
            _, free = nodes.group_fractions(row, group)
            if free > _EPS:
                gpus.append(round(free, _DECIMALS))
    gpus.sort(reverse=True)
    return NodeState(
        float(idle[cpu_dim]) if cpu_dim is not None else 0.0,
        float(idle[mem_dim]) if mem_dim is not None else 0.0,
        tuple(gpus),
    )


def after_placing(
    state: NodeState, cpu: float, memory: float, gpus: int, share: float, gpu: int | None
) -> NodeState | None:
    """The state once a task asking ``gpus`` GPUs of ``share`` each (on GPU index ``gpu`` for a
    share) is placed; None when it does not fit."""
    if cpu > state.cpu + MIN_RESOURCE or memory > state.memory + MIN_RESOURCE:
        return None
    free = state.gpus
    if gpus:
        if (
            gpu is None
        ):  # whole GPUs: the first ``gpus`` (free shares sorted descending: whole ones first)
            if len(free) < gpus or free[gpus - 1] < 1.0 - _EPS:
                return None
            free = tuple(f for f in free[gpus:] if f > _EPS)
        else:
            if free[gpu] < share - _EPS:
                return None
            left = list(free)
            left[gpu] = round(free[gpu] - share, _DECIMALS)
            free = tuple(sorted((f for f in left if f > _EPS), reverse=True))
    return NodeState(state.cpu - cpu, state.memory - memory, free)


class FgdPlugin(Plugin):
    name: ClassVar[str] = "fgd"
    ARGUMENTS: ClassVar[dict[str, object]] = {
        "fgd.weight": 1,
        "fgd.popularityThreshold": 1.0,
        "fgd.memory": False,
    }

    @classmethod
    def validate_arguments(cls, arguments: dict[str, object]) -> None:
        super().validate_arguments(arguments)
        threshold = arguments.get("fgd.popularityThreshold", 1.0)
        try:
            ok = 0 < float(threshold) <= 1  # type: ignore[arg-type]
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(
                f"fgd.popularityThreshold: {threshold!r} is not a share above 0, at most 1"
            )

    def on_session_open(self, ssn: Session) -> None:
        weight = self.arg_float("fgd.weight", 1.0)
        if weight == 0:
            return
        threshold = self.arg_float("fgd.popularityThreshold", 1.0)
        # Memory counts only when asked: the paper's measure (and its best results) use cpu and GPUs.
        use_memory = self.arg_bool("fgd.memory", False)
        nodes = ssn.nodes
        dims = ssn.space.index
        cpu_dim = dims.get(CPU)
        mem_dim = dims.get(MEMORY) if use_memory else None

        def request(task: TaskInfo) -> Request:
            q = task_quantities(task, dims)
            memory = q.memory if use_memory else 0.0
            if task.gpu_fraction:
                return q.cpu, memory, 1, round(task.gpu_fraction, _DECIMALS)
            whole = int(round(q.gpu))
            return q.cpu, memory, whole, 1.0 if whole else 0.0

        # The workload: every task of the session, by request and static key (one task of each
        # static key tells which nodes its type may use).
        keyed: list[Key] = []
        representative: list[TaskInfo] = []
        constraints: dict[object, int] = {}
        for task in ssn.tasks.values():
            if task.status in ENDED:
                continue
            c = constraints.get(task.static_key)
            if c is None:
                c = constraints[task.static_key] = len(representative)
                representative.append(task)
            keyed.append((*request(task), c))
        workload = Workload(typical_types(keyed, threshold))
        if not workload.types:
            return

        @cache
        def access_classes() -> tuple[np.ndarray, list[np.ndarray | None]]:
            """Per node row its access class; per class, per type, may the type use such nodes
            (None: every type may). Built on first use, once the evaluator is configured."""
            masks_by_constraints = [ssn.evaluator.static_mask(task) for task in representative]
            matrix = np.array(
                [masks_by_constraints[t.constraints] for t in workload.types], dtype=bool
            ).T
            ids: dict[bytes, int] = {}
            row_class = np.zeros(len(nodes), dtype=np.int64)
            masks: list[np.ndarray | None] = []
            for i, access in enumerate(matrix):
                key = access.tobytes()
                if key not in ids:
                    ids[key] = len(masks)
                    masks.append(None if access.all() else access.copy())
                row_class[i] = ids[key]
            return row_class, masks

        memo: dict[tuple[int, NodeState], float] = {}

        def frag(cls: int, s: NodeState) -> float:
            value = memo.get((cls, s))
            if value is None:
                if len(memo) >= _MEMO_LIMIT:
                    memo.clear()
                value = memo[(cls, s)] = workload.fragmentation(s, access_classes()[1][cls])
            return value

        # Per row: its access class, state and expected fragmentation, kept until the row changes
        # (``change_log``): every shape re-scoring a changed row, and gpu_order, share them.
        rows_known: dict[int, tuple[int, NodeState, float]] = {}
        log_seen = 0

        def forget_changed() -> None:
            """Drop the rows changed since the last call (once per score or order call, not per row)."""
            nonlocal log_seen
            log = nodes.change_log
            if log_seen < len(log):
                for changed in log[log_seen:]:
                    rows_known.pop(changed, None)
                log_seen = len(log)

        def row_state(row: int) -> tuple[int, NodeState, float]:
            known = rows_known.get(row)
            if known is None:
                cls = int(access_classes()[0][row])
                state = node_state(nodes, row, cpu_dim, mem_dim)
                known = rows_known[row] = (cls, state, frag(cls, state))
            return known

        def delta(req: Request, fractional: bool, row: int, group: str | None) -> float | None:
            """Growth of the row's expected fragmentation if a task asking ``req`` is placed there
            (a share: on ``group``, "" a whole free GPU, None the best GPU); None: it does not fit."""
            cls, before, base = row_state(row)
            cpu, memory, gpus, share = req
            if not fractional:
                after = after_placing(before, cpu, memory, gpus, share, None)
                return None if after is None else frag(cls, after) - base
            if group is not None:
                free = 1.0 if not group else round(nodes.group_fractions(row, group)[1], _DECIMALS)
                candidates = [k for k, f in enumerate(before.gpus) if abs(f - free) <= _EPS][:1]
            else:  # one GPU of each free share it fits (equal shares are adjacent: sorted)
                free_gpus = before.gpus
                candidates = [
                    k
                    for k, f in enumerate(free_gpus)
                    if f >= share - _EPS and (k == 0 or f != free_gpus[k - 1])
                ]
            best: float | None = None
            for k in candidates:
                after = after_placing(before, cpu, memory, gpus, share, k)
                if after is not None:
                    d = frag(cls, after) - base
                    best = d if best is None or d < best else best
            return best

        def score(task: TaskInfo, rows: np.ndarray) -> np.ndarray:
            forget_changed()
            req, fractional = request(task), bool(task.gpu_fraction)
            out = np.zeros(len(rows))
            for k, i in enumerate(rows):
                d = delta(req, fractional, int(i), None)
                if d is not None:
                    out[k] = weight * fgd_score(d)
            return out

        def order(task: TaskInfo, row: int, group: str) -> float:
            if not task.gpu_fraction:
                return 0.0
            forget_changed()
            d = delta(request(task), True, row, group)
            return 0.0 if d is None else weight * fgd_score(d)

        ssn.register(NODE_ORDER, self.name, Scorer("shape", score, plugin=self.name))
        ssn.register(GPU_ORDER, self.name, order)
