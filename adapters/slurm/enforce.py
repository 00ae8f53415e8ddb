"""Enforcement: Muster's binds and evictions applied to Slurm jobs with ``scontrol``.

Slurm runs a gang as one allocation, so the K binds of a job are honoured together or not at all:
when all K are in hand, one ``scontrol update JobId=N Partition=<run> NodeList=<K nodes>
StartTime=now AdminComment=muster:<id>``, then Slurm's record must show exactly that partition
and node list (else the job goes back to staging and the binds are rejected with the reason).
A burst's gangs are placed together: the updates as ``scontrol`` stdin chunks, then one
``squeue`` verifying them all. An evict -> ``scontrol requeuehold``, back to staging with no node
list, ``scontrol release`` (or ``scancel`` when the job is cancelled).

Native jobs (submitted to Muster directly; ``Settings.native_user``): the binds that arrived
together become one new Slurm job, ``sbatch``ed pinned to their nodes (:mod:`adapters.slurm.native`);
an eviction is ``scancel``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import anyio
import structlog

from adapters.runtime import APPLIED, Outcome, group_by_job
from adapters.slurm.cli import LIVE_STATES, SlurmCLI, SlurmError
from adapters.slurm.jobs import (
    BAD_PLACEMENT_REASONS,
    HELD_REASONS,
    MARKER,
    JobTable,
    Settings,
    TrackedJob,
)
from adapters.slurm.native import NativeJob, native_job
from adapters.slurm.parse import JobRecord, SlurmJob
from adapters.slurm.translate import Untranslatable
from muster.v1 import muster_pb2 as pb

log = structlog.get_logger("muster.slurm")

# Fewest updates worth their own `scontrol` process. A process costs about as much CPU as 2
# updates, but each update is a round trip (munge, slurmctld) that mostly waits: on a busy host 8
# processes of 8 updates placed 64 jobs 3-4x faster than 4 of 16.
_MIN_UPDATES_PER_PROCESS = 4
# A longer node list is placed with its own process (scontrol's stdin line buffer is finite).
_MAX_BATCHED_NODELIST = 2000


@dataclass(slots=True)
class _Placement:
    """A gang whose binds are consistent, to be enforced with the rest of its burst."""

    job: TrackedJob
    nodes: list[str]
    binds: list[pb.Decision]
    started: float  # perf_counter when the binds were checked
    time_limit: int = 0  # TimeLimit to set (Muster's, lower than Slurm's own); 0: leave it


@dataclass(slots=True)
class _NativePlacement:
    """Binds of a job submitted to Muster directly: a new Slurm job on their nodes (``sbatch``)."""

    spec: NativeJob
    binds: list[pb.Decision]
    received: float  # wall clock: the binds reached the adapter
    started: float  # perf_counter when the binds were checked


def staged_time_limit(muster: int, own: int) -> int:
    """The TimeLimit a staged job is placed with: Muster's time limit (the bind's: the job's, or
    its queue's default) when it is lower than the job's own ``--time`` (``own``, 0: UNLIMITED);
    0, leave the job's own, otherwise. A user's shorter ``--time`` is never raised."""
    return muster if muster and (not own or muster < own) else 0


class Enforcer:
    """Applies a burst of decisions to the Slurm jobs in ``table``; see the module docstring."""

    def __init__(self, cli: SlurmCLI, settings: Settings, table: JobTable) -> None:
        self.cli = cli
        self.settings = settings
        self.table = table
        self.placements = 0  # successful enforcement RPCs (tests: nothing placed twice)
        self.place_seconds: list[float] = []
        self.native_in_flight = (
            0  # native ``sbatch``es under way (the poll must not call them foreign)
        )

    def is_native_id(self, job_id: str) -> bool:
        """Whether a Muster job id names a job submitted to Muster directly, run by this adapter when
        native jobs are on (ids of staged Slurm jobs carry the job prefix)."""
        return bool(self.settings.native_user) and not job_id.startswith(self.table.job_prefix)

    def needs_new_slurm_job(self, job_id: str) -> bool:
        """Whether binds of ``job_id`` would make a new Slurm job: a native job with no live Slurm job
        here (never placed, or its last one ended or was evicted)."""
        job = self.table.by_muster_id.get(job_id)
        return self.is_native_id(job_id) if job is None else job.native and job.done

    async def apply_batch(self, decisions: list[pb.Decision]) -> list[Outcome]:
        received = time.time()
        outcomes: dict[int, Outcome] = {}
        updated: list[_Placement] = []  # `scontrol update` accepted, not verified yet
        native: list[_NativePlacement] = []  # to be submitted

        async def one_job(job_id: str, group: list[pb.Decision]) -> None:
            try:
                outcomes.update(await self._apply_job(job_id, group, updated, native, received))
            except Exception as exc:  # one job's failure must not sink the batch
                log.exception("apply failed", job=job_id)
                outcomes.update({d.id: Outcome.reject(f"adapter error: {exc}") for d in group})

        async with anyio.create_task_group() as tg:
            for job_id, group in group_by_job(decisions).items():
                tg.start_soon(one_job, job_id, group)
        if updated:
            for placement, outcome in zip(updated, await self._place_all(updated), strict=True):
                outcomes.update({d.id: outcome for d in placement.binds})
        if native:
            async with anyio.create_task_group() as tg:
                for submission in native:
                    tg.start_soon(self._submit_native, submission, outcomes)
        return [outcomes.get(d.id, Outcome.reject("not handled")) for d in decisions]

    async def _place_all(self, placements: list[_Placement]) -> list[Outcome]:
        """Enforce a burst's gangs in few processes: the updates as ``scontrol`` stdin chunks.

        A chunk whose updates all succeeded (scontrol's exit status) is applied at once: the next
        poll reads those jobs anyway and checks that Slurm shows the placement (the backend's
        ``_observe``), so no extra read sits between this burst and the next. A chunk with a
        failed update is read back with one ``squeue``: the gangs it placed are applied, the
        others retried on their own, so a rejection carries Slurm's own message."""
        short = [p for p in placements if sum(len(n) + 1 for n in p.nodes) <= _MAX_BATCHED_NODELIST]
        single = [p for p in placements if sum(len(n) + 1 for n in p.nodes) > _MAX_BATCHED_NODELIST]
        outcomes: dict[int, Outcome] = {}
        unsure: list[_Placement] = []  # in a chunk with a failed update

        async def place_chunk(chunk: list[_Placement]) -> None:
            result = await self.cli.place_many(
                [(p.job.slurm_id, p.nodes, MARKER + p.job.muster_id, p.time_limit) for p in chunk],
                self.settings.run_partition,
            )
            now = time.time()
            for p in chunk:
                p.job.updated_at = now
                if result.returncode == 0:
                    outcomes[id(p)] = self._settle(p, confirmed=False)
                else:
                    unsure.append(p)

        # Spread over the CLI's parallelism: slurmctld overlaps the RPCs of concurrent processes.
        size = max(_MIN_UPDATES_PER_PROCESS, -(-len(short) // max(1, self.cli.parallel)))
        async with anyio.create_task_group() as tg:
            for i in range(0, len(short), size):
                tg.start_soon(place_chunk, short[i : i + size])
        retry: list[_Placement] = []
        records = await self._read_records(unsure) if unsure else {}
        for p in unsure:
            if records is not None and not self.check_placement(
                records.get(p.job.slurm_id), p.nodes
            ):
                outcomes[id(p)] = self._settle(p, confirmed=True)
            else:
                retry.append(p)  # its update may have failed: learn why, on its own

        async def one(p: _Placement) -> None:
            outcomes[id(p)] = await self._place_one(p)

        async with anyio.create_task_group() as tg:
            for p in single + retry:
                tg.start_soon(one, p)
        return [outcomes[id(p)] for p in placements]

    async def _read_records(self, placements: list[_Placement]) -> dict[int, SlurmJob] | None:
        try:
            return {
                sj.job_id: sj
                for sj in await self.cli.jobs_by_id([p.job.slurm_id for p in placements])
            }
        except SlurmError as exc:
            # squeue refuses a list naming a job that has just vanished: verify one by one.
            log.info("batch verification failed, verifying one by one", error=exc.message)
            return None

    async def _place_one(self, placement: _Placement) -> Outcome:
        job, nodes = placement.job, placement.nodes
        try:
            await self.cli.place(
                job.slurm_id,
                self.settings.run_partition,
                nodes,
                marker=MARKER + job.muster_id,
                time_limit=placement.time_limit,
            )
        except SlurmError as exc:
            return Outcome.reject(f"scontrol update refused: {exc.message}")
        job.updated_at = time.time()
        problem = await self._verify_one(job.slurm_id, nodes)
        if problem:
            await self.unstage_quietly(job.slurm_id)
            job.version += 1
            return Outcome.reject(problem)
        return self._settle(placement, confirmed=True)

    async def _apply_job(
        self,
        job_id: str,
        group: list[pb.Decision],
        updated: list[_Placement],
        native: list[_NativePlacement],
        received: float,
    ) -> dict[int, Outcome]:
        job = self.table.by_muster_id.get(job_id)
        out: dict[int, Outcome] = {}
        evicts = [d for d in group if d.WhichOneof("action") == "evict"]
        binds = [d for d in group if d.WhichOneof("action") == "bind"]
        if job is None and not self.is_native_id(job_id):
            reason = f"job {job_id!r} is not a Slurm job this adapter manages"
            return {d.id: Outcome.reject(reason) for d in group}
        if evicts:
            # A native job with no Slurm job here has nothing to stop.
            outcome = APPLIED if job is None else await self.evict(job, evicts[0].evict.reason)
            out.update({d.id: outcome for d in evicts})
        if binds and self.needs_new_slurm_job(job_id):
            try:
                spec = native_job(job_id, [d.bind for d in binds])
            except Untranslatable as exc:
                out.update({d.id: Outcome.reject(str(exc)) for d in binds})
            else:
                native.append(_NativePlacement(spec, binds, received, time.perf_counter()))
        elif binds and job is not None:
            job.bind_at = received
            placement_or_outcome = await self._bind(job, binds)
            if isinstance(placement_or_outcome, _Placement):
                updated.append(placement_or_outcome)
            else:
                out.update({d.id: placement_or_outcome for d in binds})
        return out

    async def _bind(self, job: TrackedJob, binds: list[pb.Decision]) -> Outcome | _Placement:
        """Check the binds; the burst's gangs are then enforced together (``_place_all``)."""
        chosen: dict[int, str] = {}
        position = {task_id: i for i, task_id in enumerate(job.tasks)}  # task i runs on node i
        for decision in binds:
            index = position.get(decision.bind.task_id)
            if index is None:
                return Outcome.reject(
                    f"task {decision.bind.task_id!r} is not a task of job {job.muster_id}"
                )
            chosen[index] = decision.bind.node
        if job.done:
            return Outcome.reject(f"Slurm job {job.slurm_id} has already ended")
        if job.placed is not None:
            # A resent or repeated bind: fine if it names the placement Slurm already has.
            if all(job.placed[i] == node for i, node in chosen.items()):
                return APPLIED
            return Outcome.reject(
                f"Slurm job {job.slurm_id} is already placed on {','.join(job.placed)}"
            )
        if len(chosen) != job.size:
            # Slurm runs a gang as one allocation: a partial set of binds cannot be honoured.
            return Outcome.reject(
                f"gang incomplete: {len(chosen)} of {job.size} binds arrived together"
            )
        nodes = [chosen[i] for i in range(job.size)]
        if len(set(nodes)) != job.size:
            return Outcome.reject(
                f"Slurm needs {job.size} distinct nodes for job {job.slurm_id}, got {','.join(nodes)}"
            )
        job.version += 1  # a poll read from now on must not act on this job
        limit = staged_time_limit(binds[0].bind.time_limit_seconds, job.time_limit)
        return _Placement(job, nodes, binds, time.perf_counter(), limit)

    async def _submit_native(
        self, placement: _NativePlacement, outcomes: dict[int, Outcome]
    ) -> None:
        """``sbatch`` the placement's Slurm job; tracked (and its binds applied) once Slurm took it.
        The next poll checks Slurm shows it on exactly those nodes, as for a staged job."""
        spec = placement.spec
        argv = spec.sbatch_argv(
            partition=self.settings.run_partition,
            user=self.settings.native_user,
            group=self.settings.native_group,
            workdir=self.settings.native_workdir,
        )
        self.native_in_flight += 1
        try:
            try:
                slurm_id = await self.cli.submit(argv)
            except SlurmError as exc:
                # A failed sbatch (a timeout above all) may still have made the job; rejecting the
                # binds then would have Muster place the tasks again while it runs.
                found = await self._find_submitted(spec)
                if found is None:
                    outcomes.update(
                        {
                            d.id: Outcome.reject(f"sbatch refused: {exc.message}")
                            for d in placement.binds
                        }
                    )
                    return
                log.warning(
                    "sbatch failed but Slurm has the job",
                    slurm_job=found,
                    job=spec.job_id,
                    error=exc.message,
                )
                slurm_id = found
        finally:
            self.native_in_flight -= 1
        job = self.table.track(
            slurm_id, len(spec.nodes), muster_id=spec.job_id, native_tasks=list(spec.tasks)
        )
        job.submitted = True
        job.bind_at = placement.received
        job.updated_at = time.time()
        settled = self._settle(
            _Placement(job, list(spec.nodes), placement.binds, placement.started), confirmed=False
        )
        outcomes.update({d.id: settled for d in placement.binds})

    async def _find_submitted(self, spec: NativeJob) -> int | None:
        """The live Slurm job this adapter submitted for ``spec`` (same name, user and comment, not
        tracked yet), or None (none, or Slurm cannot say)."""
        try:
            jobs = await self.cli.jobs_named(
                spec.job_id, self.settings.native_user, states=LIVE_STATES
            )
        except SlurmError as exc:
            log.warning(
                "cannot look for a native job after a failed sbatch",
                job=spec.job_id,
                error=exc.message,
            )
            return None
        ids = [
            sj.job_id
            for sj in jobs
            if sj.comment == spec.comment and sj.job_id not in self.table.jobs
        ]
        return max(ids) if ids else None

    def _settle(self, placement: _Placement, *, confirmed: bool) -> Outcome:
        """Slurm took the placement: record it. ``confirmed``: read back already (else the next
        poll checks it)."""
        job, nodes = placement.job, placement.nodes
        job.placed = nodes
        job.ran = False
        job.confirmed = confirmed
        job.version += 1
        self.placements += 1
        now = time.time()
        self.place_seconds.append(time.perf_counter() - placement.started)
        # The latency breakdown (bench/slurm_e2e.py reads these wall-clock stamps from the log).
        log.info(
            "placed",
            slurm_job=job.slurm_id,
            job=job.muster_id,
            nodes=",".join(nodes),
            seen_at=round(job.seen_at, 4),
            submitted_at=round(job.submitted_at, 4),
            bind_at=round(job.bind_at, 4),
            updated_at=round(job.updated_at, 4),
            verified_at=round(now, 4),
        )
        return APPLIED

    def check_placement(
        self, record: SlurmJob | JobRecord | None, nodes: list[str], *, reasons: bool = True
    ) -> str:
        """'' when Slurm's record shows exactly the placement, else what is wrong. ``reasons``:
        also a pending reason meaning the job can never start there."""
        if record is None:
            return "cannot verify placement: Slurm no longer lists the job"
        if record.partition != self.settings.run_partition:
            return f"placement mismatch: Slurm shows partition {record.partition!r}"
        if sorted(record.required_nodes) != sorted(nodes):
            return f"placement mismatch: Slurm shows ReqNodeList={','.join(record.required_nodes)}"
        if record.nodes and sorted(record.nodes) != sorted(nodes):
            return f"placement mismatch: Slurm runs the job on {','.join(record.nodes)}"
        if reasons and record.reason.startswith(BAD_PLACEMENT_REASONS):
            return f"Slurm cannot start the job on these nodes: {record.reason}"
        return ""

    async def _verify_one(self, slurm_id: int, nodes: list[str]) -> str:
        try:
            record = await self.cli.show_job(slurm_id)
        except SlurmError as exc:
            return f"cannot verify placement: {exc.message}"
        return self.check_placement(record, nodes)

    async def evict(self, job: TrackedJob, reason: str) -> Outcome:
        job.version += 1
        if job.done:
            return APPLIED
        if reason == "cancel" or job.native:  # a native job is placed again as a new Slurm job
            try:
                await self.cli.cancel(job.slurm_id)
            except SlurmError as exc:
                return Outcome.reject(f"scancel failed: {exc.message}")
            job.done = True
            return APPLIED
        try:
            record = await self.cli.show_job(job.slurm_id)
        except SlurmError as exc:
            return Outcome.reject(f"cannot read job {job.slurm_id}: {exc.message}")
        held = False
        if record.state in ("RUNNING", "SUSPENDED", "CONFIGURING"):
            try:
                await self.cli.requeuehold(job.slurm_id)
                held = True
            except SlurmError as exc:
                return Outcome.reject(f"scontrol requeuehold refused: {exc.message}")
        elif record.state not in ("PENDING", "COMPLETING"):
            job.done = True  # it ended by itself meanwhile: nothing left to evict
            return APPLIED
        try:
            if record.partition != self.settings.staging_partition or record.required_nodes:
                await self.cli.unstage(job.slurm_id, self.settings.staging_partition)
            if held or record.reason in HELD_REASONS:
                await self.cli.release(job.slurm_id)
        except SlurmError as exc:
            return Outcome.reject(
                f"moving job {job.slurm_id} back to staging failed: {exc.message}"
            )
        job.placed = None
        job.ran = False
        job.reported.clear()
        job.version += 1
        log.info("evicted", slurm_job=job.slurm_id, job=job.muster_id, reason=reason)
        return APPLIED

    async def withdraw(self, sj: SlurmJob) -> None:
        """Take a job whose placement failed back to staging, stopping it first if Slurm started
        it (``requeuehold``, then released once staged); failures are logged."""
        if sj.active:
            try:
                await self.cli.requeuehold(sj.job_id)
            except SlurmError as exc:
                log.warning("could not requeue job", slurm_job=sj.job_id, error=exc.message)
                return
        await self.unstage_quietly(sj.job_id)
        if sj.active:  # our own hold (a user's hold stays)
            try:
                await self.cli.release(sj.job_id)
            except SlurmError as exc:
                log.warning("could not release job", slurm_job=sj.job_id, error=exc.message)

    async def unstage_quietly(self, slurm_id: int) -> None:
        try:
            await self.cli.unstage(slurm_id, self.settings.staging_partition)
        except SlurmError as exc:
            log.warning("could not move job back to staging", slurm_job=slurm_id, error=exc.message)
