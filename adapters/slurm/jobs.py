"""What the Slurm adapter knows about each Slurm job it manages, and its settings.

A :class:`TrackedJob` is one attempt at running a Slurm job through Muster: the Muster job id
(``<prefix><slurm id>``, or ``<prefix><slurm id>.a<N>`` for the N-th attempt after Slurm requeued
it), its size (K nodes = K tasks), where it was placed, what was reported. ``version`` is bumped
by every action on the job, so a poll read before an action is never applied after it.
:class:`JobTable` finds a job by Slurm id (polls) or by Muster id (decisions).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from adapters.slurm.translate import task_ids
from muster.v1 import muster_pb2 as pb

# AdminComment prefix marking a job this adapter placed (a restarted adapter recognises it).
MARKER = "muster:"
# AdminComment prefix of a job the adapter cannot translate (left pending in staging; not MARKER).
REFUSED = "muster-refused: "
# Slurm reasons meaning the job is waiting for its own hold, not for nodes.
HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin", "job_requeued_in_held_state"})
# Slurm reasons meaning the job waits for its --dependency (Slurm evaluates it, also in staging).
DEPENDENCY_REASONS = frozenset({"Dependency", "DependencyNeverSatisfied"})
# A staged job waiting for one of these is not submitted to Muster until Slurm clears it: Muster
# would otherwise place it on nodes Slurm does not start it on.
WAITING_REASONS = HELD_REASONS | DEPENDENCY_REASONS
# Reasons a placed job can never start where Muster put it (Slurm evaluates the node list only
# at its next scheduling pass, after the update was accepted and verified).
BAD_PLACEMENT_REASONS = ("BadConstraints", "ReqNodeNotAvail", "PartitionConfig", "NodeDown")


@dataclass(slots=True)
class Settings:
    staging_partition: str = "staging"
    run_partition: str = "batch"
    queue_from: str = "account"
    default_queue: str = "default"
    job_prefix: str = "slurm-"
    poll_interval: float = 0.25
    node_poll_interval: float = 1.0
    submit_parallel: int = 16
    # Run jobs submitted to Muster directly as this user ('' = off; see adapters.slurm.native).
    native_user: str = ""
    native_group: str = ""
    native_workdir: str = "/tmp"  # a native job's working directory unless its task names one


@dataclass(slots=True)
class TrackedJob:
    """A Slurm job Muster manages."""

    slurm_id: int
    muster_id: str
    size: int  # K: nodes = tasks
    attempt: int = 0
    submitted: bool = False
    submitting: bool = False  # a SubmitJob is under way
    placed: list[str] | None = None  # node of task i, once enforced
    ran: bool = False  # seen RUNNING since the last placement
    confirmed: bool = False  # Slurm was seen showing the latest placement (read back or polled)
    reported: dict[str, pb.TaskStatus] = field(default_factory=dict)  # task id -> last status sent
    version: int = 0  # bumped by every action, so a poll read before it is not applied after it
    done: bool = False
    refused: str = ""  # why it is not submitted (untranslatable; '' when it is fine)
    time_limit: int = 0  # Slurm's own (``--time``), seconds, as last polled; 0: UNLIMITED
    held: bool = False  # held in Slurm after its submission to Muster: held in Muster too
    checked: tuple[str, int] | None = None  # (constraint, nodes) that `refused` was worked out for
    # A native job (submitted to Muster directly; the adapter made the Slurm job at bind time):
    # its Muster task ids, in node order. None: the derived ``<muster id>/node-<i>``.
    native_tasks: list[str] | None = None
    # Wall-clock stamps of the latest placement's path (logged with "placed"; 0 = unknown).
    seen_at: float = 0.0  # first poll that listed it
    submitted_at: float = 0.0  # SubmitJob returned
    bind_at: float = 0.0  # its binds reached the backend
    updated_at: float = 0.0  # `scontrol update` returned

    @property
    def native(self) -> bool:
        return self.native_tasks is not None

    @property
    def tasks(self) -> list[str]:
        return (
            self.native_tasks
            if self.native_tasks is not None
            else task_ids(self.muster_id, self.size)
        )


class JobTable:
    """The tracked jobs, by Slurm job id and by Muster job id."""

    def __init__(self, job_prefix: str) -> None:
        self.job_prefix = job_prefix
        self.jobs: dict[int, TrackedJob] = {}
        self.by_muster_id: dict[str, TrackedJob] = {}

    def track(
        self,
        slurm_id: int,
        size: int,
        *,
        muster_id: str = "",
        attempt: int = 0,
        native_tasks: list[str] | None = None,
    ) -> TrackedJob:
        """Start tracking (a new attempt of) a Slurm job; replaces an earlier attempt."""
        base = f"{self.job_prefix}{slurm_id}"
        if not muster_id:
            muster_id = base if attempt == 0 else f"{base}.a{attempt}"
        job = TrackedJob(
            slurm_id=slurm_id,
            muster_id=muster_id,
            size=max(1, size),
            attempt=attempt,
            seen_at=time.time(),
            native_tasks=native_tasks,
        )
        old = self.jobs.get(slurm_id)
        if old is not None:
            self.by_muster_id.pop(old.muster_id, None)
        self.jobs[slurm_id] = job
        self.by_muster_id[muster_id] = job
        return job
