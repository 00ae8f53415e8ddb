"""The adapter runtime, with decision bursts shaped for Slurm's enforcement.

Enforcing a burst costs a round of ``scontrol`` processes whatever its size, and bursts are
applied one after the other, so under load the runtime's default shaping (one burst per cycle,
after a fixed linger) leaves decisions queued behind rounds of a few jobs each. Here:

* a burst is everything already received, plus what arrives within ``batch_linger``; while a
  gang of the burst still lacks some of its binds (a cycle's decisions straddling the linger),
  it waits up to ``gang_wait`` more for them, since Slurm can only place a gang whole and a
  partial one would be rejected and placed again a cycle later;
* consecutive cycles' runs are applied together when no job has decisions in more than one of
  them (binds of different jobs commute; a job bound in one cycle and evicted in the next keeps
  its order, in separate runs).
"""

from __future__ import annotations

from typing import Any

import anyio
from anyio.abc import ObjectReceiveStream
from anyio.streams.memory import MemoryObjectReceiveStream

from adapters.backend import group_by_job
from adapters.runtime import BackendRuntime, runs_by_cycle
from adapters.slurm.backend import SlurmBackend
from muster.v1 import muster_pb2 as pb


def merge_runs(decisions: list[pb.Decision]) -> list[list[pb.Decision]]:
    """Split a burst into runs of one cycle (stream order kept), then join consecutive runs whose
    jobs are disjoint: each returned run names every job it touches in one cycle only."""
    runs: list[list[pb.Decision]] = []
    jobs: set[str] = set()  # jobs of the last returned run
    for run in runs_by_cycle(decisions):
        run_jobs = set(group_by_job(run))
        if runs and not (jobs & run_jobs):
            runs[-1].extend(run)
            jobs |= run_jobs
        else:
            runs.append(run)
            jobs = run_jobs
    return runs


class SlurmRuntime(BackendRuntime):
    """:class:`~adapters.runtime.BackendRuntime` with Slurm-shaped bursts; see the module docstring."""

    def __init__(self, backend: SlurmBackend, *, gang_wait: float = 0.25, **kwargs: Any) -> None:
        super().__init__(backend, **kwargs)
        self.slurm = backend
        self.gang_wait = gang_wait

    def runs(self, burst: list[pb.Decision]) -> list[list[pb.Decision]]:
        return merge_runs(burst)

    async def gather(
        self, receive: ObjectReceiveStream[pb.Decision], burst: list[pb.Decision]
    ) -> None:
        """Add to ``burst`` what has arrived, what arrives within ``batch_linger``, and, while a
        gang of it lacks binds, what arrives within ``gang_wait`` (both from now)."""
        start = anyio.current_time()
        linger_end, gang_end = (
            start + self.batch_linger,
            start + max(self.batch_linger, self.gang_wait),
        )
        while len(burst) < self.max_batch:
            if isinstance(receive, MemoryObjectReceiveStream):  # what the runtime gives
                try:
                    burst.append(receive.receive_nowait())
                    continue
                except anyio.WouldBlock:
                    pass
            now = anyio.current_time()
            end = linger_end
            if now >= linger_end and self.slurm.incomplete_gangs(burst):
                end = gang_end
            if now >= end:
                return
            with anyio.move_on_after(end - now):
                burst.append(await receive.receive())
