"""The Slurm backend: polls Slurm, feeds Muster, enforces Muster's decisions.

Life of a job (``sbatch -N K``), see docs/slurm.md:

1. The job lands in the DOWN ``staging`` partition (job_submit.lua forces it there), so Slurm
   never starts it. The poll sees it, creates the queue (first sight) and submits a Muster job
   ``<prefix><jobid>`` that is a gang of K tasks.
2. Muster binds the K tasks. When all K binds are in hand: one
   ``scontrol update JobId=N Partition=<run> NodeList=<K nodes> StartTime=now AdminComment=muster:<id>``,
   then ``scontrol show job`` must show exactly that partition and node list (else the job goes
   back to staging and the binds are rejected with the reason). Slurm's error text is the reject
   reason when the update itself fails.
3. The poll reports Running / Succeeded / Failed. An evict -> ``scontrol requeuehold``, back to
   staging with no node list, ``scontrol release``: the job waits for Muster again.

Jobs that Slurm itself requeues (node failure) are reported Failed and resubmitted as a new
attempt (``<id>.a<N>``). Jobs Muster does not manage (submitted straight to the run partition by
root, say) are foreign tasks that only consume capacity. The AdminComment marker lets a
restarted adapter recognise what it placed, so nothing is placed twice.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
import grpc
import structlog
from anyio.abc import TaskGroup

from adapters.runtime import APPLIED, BackendRuntime, Outcome, group_by_job
from adapters.slurm.cli import SlurmCLI, SlurmError
from adapters.slurm.parse import JobRecord, SlurmJob, SlurmNode
from adapters.slurm.translate import (
    foreign_tasks,
    job_to_spec,
    node_to_pb,
    queue_of,
    task_ids,
    task_index,
)
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

log = structlog.get_logger("muster.slurm")

MARKER = "muster:"
# Fewest updates worth their own `scontrol` process (a process costs about as much as 2 updates).
_MIN_UPDATES_PER_PROCESS = 8
# A longer node list is placed with its own process (scontrol's stdin line buffer is finite).
_MAX_BATCHED_NODELIST = 2000
# Slurm reasons meaning the job is waiting for its own hold, not for nodes.
_HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin", "job_requeued_in_held_state"})
# Reasons a placed job can never start where Muster put it (Slurm evaluates the node list only
# at its next scheduling pass, after the update was accepted and verified).
_BAD_PLACEMENT_REASONS = ("BadConstraints", "ReqNodeNotAvail", "PartitionConfig", "NodeDown")


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
    reported: dict[str, int] = field(default_factory=dict)  # task id -> last status sent
    version: int = 0  # bumped by every action, so a poll read before it is not applied after it
    done: bool = False
    # Wall-clock stamps of the latest placement's path (logged with "placed"; 0 = unknown).
    seen_at: float = 0.0  # first poll that listed it
    submitted_at: float = 0.0  # SubmitJob returned
    bind_at: float = 0.0  # its binds reached the backend
    updated_at: float = 0.0  # `scontrol update` returned

    @property
    def tasks(self) -> list[str]:
        return task_ids(self.muster_id, self.size)


@dataclass(slots=True)
class _Placement:
    """A gang whose binds are consistent, to be enforced with the rest of its burst."""

    job: TrackedJob
    nodes: list[str]
    binds: list[pb.Decision]
    started: float  # perf_counter when the binds were checked


class SlurmBackend:
    """Implements the runtime's Backend protocol (plus ``apply_batch`` for gangs)."""

    def __init__(self, cli: SlurmCLI, settings: Settings, *, name: str = "slurm") -> None:
        self.cli = cli
        self.settings = settings
        self.name = name
        self.runtime: BackendRuntime | None = None
        self.client: pb_grpc.SchedulerStub | None = None
        self.jobs: dict[int, TrackedJob] = {}
        self._by_muster_id: dict[str, TrackedJob] = {}
        self._queues: set[str] = set()
        self._nodes: dict[str, pb.Node] = {}  # last poll
        self._foreign: dict[str, pb.BackendTask] = {}  # last poll
        self._sent_nodes: dict[str, pb.Node] = {}  # what the server has
        self._node_cache: list[SlurmNode] | None = None
        self._node_read_at = 0.0
        self._sent_foreign: dict[str, pb.BackendTask] = {}
        self._polled = anyio.Event()
        self._adopted = False
        self.polls = 0
        self.placements = 0  # successful enforcement RPCs (tests: nothing placed twice)
        self.place_seconds: list[float] = []
        # Shared by overlapping submission bursts, so together they stay within submit_parallel.
        self._submit_limiter = anyio.CapacityLimiter(settings.submit_parallel)

    def attach(self, runtime: BackendRuntime, client: pb_grpc.SchedulerStub) -> None:
        self.runtime = runtime
        self.client = client

    # -- Backend protocol: snapshot -----------------------------------------------------------

    async def list_nodes(self) -> Sequence[pb.Node]:
        await self._polled.wait()
        # A new session may face a server that lost its state: submit waiting jobs and create
        # queues again (SubmitJob of an identical spec is a no-op).
        self._queues.clear()
        for job in self.jobs.values():
            if job.placed is None and not job.done:
                job.submitted = False
        self._sent_nodes = dict(self._nodes)
        return list(self._nodes.values())

    async def list_tasks(self) -> Sequence[pb.BackendTask]:
        await self._polled.wait()
        self._sent_foreign = dict(self._foreign)
        tasks = list(self._foreign.values())
        for job in self.jobs.values():
            if job.placed is None or job.done:
                continue
            status = pb.TASK_STATUS_RUNNING if job.ran else pb.TASK_STATUS_BOUND
            for task_id, node in zip(job.tasks, job.placed, strict=True):
                tasks.append(pb.BackendTask(task_id=task_id, node=node, status=status))
                job.reported[task_id] = status
        return tasks

    # -- Backend protocol: decisions ----------------------------------------------------------

    async def apply_bind(self, decision: pb.Decision) -> Outcome:
        return (await self.apply_batch([decision]))[0]

    async def apply_evict(self, decision: pb.Decision) -> Outcome:
        return (await self.apply_batch([decision]))[0]

    async def apply_batch(self, decisions: list[pb.Decision]) -> list[Outcome]:
        received = time.time()
        outcomes: dict[int, Outcome] = {}
        updated: list[_Placement] = []  # `scontrol update` accepted, not verified yet

        async def one_job(job_id: str, group: list[pb.Decision]) -> None:
            try:
                outcomes.update(await self._apply_job(job_id, group, updated, received))
            except Exception as exc:  # noqa: BLE001 - one job's failure must not sink the batch
                log.exception("apply failed", job=job_id)
                outcomes.update({d.id: Outcome.reject(f"adapter error: {exc}") for d in group})

        async with anyio.create_task_group() as tg:
            for job_id, group in group_by_job(decisions).items():
                tg.start_soon(one_job, job_id, group)
        if updated:
            for placement, outcome in zip(updated, await self._place_all(updated), strict=True):
                outcomes.update({d.id: outcome for d in placement.binds})
        return [outcomes.get(d.id, Outcome.reject("not handled")) for d in decisions]

    async def _place_all(self, placements: list[_Placement]) -> list[Outcome]:
        """Enforce a burst's gangs in few processes: the updates as ``scontrol`` stdin chunks, then
        one ``squeue`` verifying them all. A gang the batch did not place is retried on its own,
        so its rejection carries Slurm's own message."""
        short = [p for p in placements if sum(len(n) + 1 for n in p.nodes) <= _MAX_BATCHED_NODELIST]
        single = [p for p in placements if sum(len(n) + 1 for n in p.nodes) > _MAX_BATCHED_NODELIST]
        batch_failed = False

        async def place_chunk(chunk: list[_Placement]) -> None:
            nonlocal batch_failed
            result = await self.cli.place_many(
                [(p.job.slurm_id, p.nodes, MARKER + p.job.muster_id) for p in chunk], self.settings.run_partition)
            batch_failed |= result.returncode != 0
            now = time.time()
            for p in chunk:
                p.job.updated_at = now

        # Spread over the CLI's parallelism: slurmctld overlaps the RPCs of concurrent processes.
        size = max(_MIN_UPDATES_PER_PROCESS, -(-len(short) // max(1, self.cli.parallel)))
        async with anyio.create_task_group() as tg:
            for i in range(0, len(short), size):
                tg.start_soon(place_chunk, short[i:i + size])
        outcomes: dict[int, Outcome] = {}
        retry: list[_Placement] = []
        records = await self._read_records(short) if short else {}
        for p in short:
            problem = self._check_placement(records.get(p.job.slurm_id), p.nodes) if records is not None else "?"
            if not problem:
                outcomes[id(p)] = self._settle(p)
            elif batch_failed or records is None:
                retry.append(p)  # the update itself may have failed: learn why, one by one
            else:
                await self._unstage_quietly(p.job.slurm_id)
                p.job.version += 1
                outcomes[id(p)] = Outcome.reject(problem)

        async def one(p: _Placement) -> None:
            outcomes[id(p)] = await self._place_one(p)

        async with anyio.create_task_group() as tg:
            for p in single + retry:
                tg.start_soon(one, p)
        return [outcomes[id(p)] for p in placements]

    async def _read_records(self, placements: list[_Placement]) -> dict[int, SlurmJob] | None:
        try:
            return {sj.job_id: sj for sj in await self.cli.jobs_by_id([p.job.slurm_id for p in placements])}
        except SlurmError as exc:
            # squeue refuses a list naming a job that has just vanished: verify one by one.
            log.info("batch verification failed, verifying one by one", error=exc.message)
            return None

    async def _place_one(self, placement: _Placement) -> Outcome:
        job, nodes = placement.job, placement.nodes
        try:
            await self.cli.place(job.slurm_id, self.settings.run_partition, nodes, marker=MARKER + job.muster_id)
        except SlurmError as exc:
            return Outcome.reject(f"scontrol update refused: {exc.message}")
        job.updated_at = time.time()
        problem = await self._verify_one(job.slurm_id, nodes)
        if problem:
            await self._unstage_quietly(job.slurm_id)
            job.version += 1
            return Outcome.reject(problem)
        return self._settle(placement)

    async def _apply_job(self, job_id: str, group: list[pb.Decision], updated: list[_Placement],
                         received: float) -> dict[int, Outcome]:
        job = self._by_muster_id.get(job_id)
        out: dict[int, Outcome] = {}
        evicts = [d for d in group if d.WhichOneof("action") == "evict"]
        binds = [d for d in group if d.WhichOneof("action") == "bind"]
        if job is None:
            reason = f"job {job_id!r} is not a Slurm job this adapter manages"
            return {d.id: Outcome.reject(reason) for d in group}
        if evicts:
            outcome = await self._evict(job, evicts[0].evict.reason)
            out.update({d.id: outcome for d in evicts})
        if binds:
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
        for decision in binds:
            index = task_index(decision.bind.task_id)
            if index is None or index >= job.size or decision.bind.task_id not in job.tasks:
                return Outcome.reject(f"task {decision.bind.task_id!r} is not a task of job {job.muster_id}")
            chosen[index] = decision.bind.node
        if job.done:
            return Outcome.reject(f"Slurm job {job.slurm_id} has already ended")
        if job.placed is not None:
            # A resent or repeated bind: fine if it names the placement Slurm already has.
            if all(job.placed[i] == node for i, node in chosen.items()):
                return APPLIED
            return Outcome.reject(f"Slurm job {job.slurm_id} is already placed on {','.join(job.placed)}")
        if len(chosen) != job.size:
            # Slurm runs a gang as one allocation: a partial set of binds cannot be honoured.
            return Outcome.reject(f"gang incomplete: {len(chosen)} of {job.size} binds arrived together")
        nodes = [chosen[i] for i in range(job.size)]
        if len(set(nodes)) != job.size:
            return Outcome.reject(f"Slurm needs {job.size} distinct nodes for job {job.slurm_id}, got {','.join(nodes)}")
        job.version += 1  # a poll read from now on must not act on this job
        return _Placement(job, nodes, binds, time.perf_counter())

    def _settle(self, placement: _Placement) -> Outcome:
        """Slurm shows the placement: record it."""
        job, nodes = placement.job, placement.nodes
        job.placed = nodes
        job.ran = False
        job.version += 1
        self.placements += 1
        now = time.time()
        self.place_seconds.append(time.perf_counter() - placement.started)
        # The latency breakdown (bench/slurm_e2e.py reads these wall-clock stamps from the log).
        log.info("placed", slurm_job=job.slurm_id, job=job.muster_id, nodes=",".join(nodes),
                 seen_at=round(job.seen_at, 4), submitted_at=round(job.submitted_at, 4),
                 bind_at=round(job.bind_at, 4), updated_at=round(job.updated_at, 4), verified_at=round(now, 4))
        return APPLIED

    def _check_placement(self, record: SlurmJob | JobRecord | None, nodes: list[str]) -> str:
        """'' when Slurm's record shows exactly the placement, else what is wrong."""
        if record is None:
            return "cannot verify placement: Slurm no longer lists the job"
        if record.partition != self.settings.run_partition:
            return f"placement mismatch: Slurm shows partition {record.partition!r}"
        if sorted(record.required_nodes) != sorted(nodes):
            return f"placement mismatch: Slurm shows ReqNodeList={','.join(record.required_nodes)}"
        if record.nodes and sorted(record.nodes) != sorted(nodes):
            return f"placement mismatch: Slurm runs the job on {','.join(record.nodes)}"
        if record.reason.startswith(_BAD_PLACEMENT_REASONS):
            return f"Slurm cannot start the job on these nodes: {record.reason}"
        return ""

    async def _verify_one(self, slurm_id: int, nodes: list[str]) -> str:
        try:
            record = await self.cli.show_job(slurm_id)
        except SlurmError as exc:
            return f"cannot verify placement: {exc.message}"
        return self._check_placement(record, nodes)

    async def _evict(self, job: TrackedJob, reason: str) -> Outcome:
        job.version += 1
        if job.done:
            return APPLIED
        if reason == "cancel":
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
            if held or record.reason in _HELD_REASONS:
                await self.cli.release(job.slurm_id)
        except SlurmError as exc:
            return Outcome.reject(f"moving job {job.slurm_id} back to staging failed: {exc.message}")
        job.placed = None
        job.ran = False
        job.reported.clear()
        job.version += 1
        log.info("evicted", slurm_job=job.slurm_id, job=job.muster_id, reason=reason)
        return APPLIED

    async def _unstage_quietly(self, slurm_id: int) -> None:
        try:
            await self.cli.unstage(slurm_id, self.settings.staging_partition)
        except SlurmError as exc:
            log.warning("could not move job back to staging", slurm_job=slurm_id, error=exc.message)

    # -- polling ------------------------------------------------------------------------------

    async def run_poller(self) -> None:
        """Poll Slurm forever (cancel to stop); one failed poll is logged and retried."""
        async with anyio.create_task_group() as submitter:
            while True:
                try:
                    await self.poll_once(submitter=submitter)
                except SlurmError as exc:
                    log.warning("poll failed", error=exc.message)
                await anyio.sleep(self.settings.poll_interval)

    async def poll_once(self, *, submitter: TaskGroup | None = None) -> None:
        """One poll. New jobs are submitted to Muster before it returns, or, with ``submitter``,
        in that task group while the next polls go on (a big burst of sbatch then does not
        delay the poll that sees the next jobs)."""
        if not self._adopted:
            await self._adopt()
        versions = {sid: job.version for sid, job in self.jobs.items()}
        nodes, jobs = await self._read_state()
        self._nodes = {n.name: node_to_pb(n) for n in nodes if self.settings.run_partition in n.partitions}
        seen: set[int] = set()
        foreign: dict[str, pb.BackendTask] = {}
        to_submit: list[tuple[TrackedJob, SlurmJob]] = []
        ended: list[tuple[TrackedJob, SlurmJob]] = []
        for sj in jobs:
            seen.add(sj.job_id)
            tracked = self.jobs.get(sj.job_id)
            if tracked is not None and versions.get(sj.job_id, -1) != tracked.version:
                continue  # an action ran on it while we were reading: trust the next poll
            if tracked is None:
                if sj.partition == self.settings.staging_partition and sj.state == "PENDING":
                    tracked = self._track(sj.job_id, sj.num_nodes)
                elif sj.active:
                    for task in foreign_tasks(sj):
                        if task.node in self._nodes:  # the server only knows run-partition nodes
                            foreign[task.task_id] = task
                    continue
                else:
                    continue
            if sj.finished:
                if not tracked.done:
                    ended.append((tracked, sj))
                continue
            await self._observe(tracked, sj, to_submit)
        for sid, tracked in list(self.jobs.items()):
            if sid not in seen and versions.get(sid, -1) == tracked.version and sid in versions:
                self._vanished(tracked)
        self._foreign = foreign
        async with anyio.create_task_group() as tg:  # exit codes are looked up concurrently
            for tracked, sj in ended:
                tg.start_soon(self._finished, tracked, sj)
        for job, _ in to_submit:
            job.submitting = True
        if submitter is None:
            await self._submit(to_submit)
        elif to_submit:
            submitter.start_soon(self._submit, to_submit)
        self._send_deltas()
        self.polls += 1
        self._polled.set()

    async def _read_state(self) -> tuple[list[SlurmNode], list[SlurmJob]]:
        nodes: list[SlurmNode] = []
        jobs: list[SlurmJob] = []

        async def read_nodes() -> None:
            # Nodes change rarely and `sinfo --json` is the costliest read: every
            # node_poll_interval, the last answer in between (jobs are read every poll).
            now = time.monotonic()
            if self._node_cache is None or now - self._node_read_at >= self.settings.node_poll_interval:
                self._node_cache = await self.cli.nodes()
                self._node_read_at = now
            nodes.extend(self._node_cache)

        async def read_jobs() -> None:
            jobs.extend(await self.cli.jobs())

        async with anyio.create_task_group() as tg:
            tg.start_soon(read_nodes)
            tg.start_soon(read_jobs)
        return nodes, jobs

    async def _adopt(self) -> None:
        """After a restart: recognise the jobs this adapter placed earlier (AdminComment)."""
        for sj in await self.cli.jobs_full():
            if not sj.admin_comment.startswith(MARKER) or sj.finished:
                continue
            muster_id = sj.admin_comment[len(MARKER):]
            job = self._track(sj.job_id, sj.num_nodes, muster_id=muster_id)
            job.submitted = True
            if sj.partition == self.settings.run_partition and len(sj.required_nodes) == job.size:
                job.placed = list(sj.required_nodes)
                job.ran = sj.active
        self._adopted = True
        if self.jobs:
            log.info("adopted jobs placed before a restart", count=len(self.jobs))

    def _track(self, slurm_id: int, size: int, *, muster_id: str = "", attempt: int = 0) -> TrackedJob:
        base = f"{self.settings.job_prefix}{slurm_id}"
        if not muster_id:
            muster_id = base if attempt == 0 else f"{base}.a{attempt}"
        job = TrackedJob(slurm_id=slurm_id, muster_id=muster_id, size=max(1, size), attempt=attempt,
                         seen_at=time.time())
        old = self.jobs.get(slurm_id)
        if old is not None:
            self._by_muster_id.pop(old.muster_id, None)
        self.jobs[slurm_id] = job
        self._by_muster_id[muster_id] = job
        return job

    async def _observe(self, job: TrackedJob, sj: SlurmJob, to_submit: list[tuple[TrackedJob, SlurmJob]]) -> None:
        staging, run = self.settings.staging_partition, self.settings.run_partition
        if sj.partition == staging and sj.state == "PENDING":
            if not job.submitted and not job.submitting and sj.reason not in _HELD_REASONS:
                to_submit.append((job, sj))
            return
        if sj.partition != run or job.placed is None:
            return
        if sj.active:
            job.ran = True
            for task_id, node in zip(job.tasks, job.placed, strict=True):
                self._report(job, task_id, pb.TASK_STATUS_RUNNING, node)
        elif sj.state == "PENDING" and (job.ran or sj.reason.startswith(_BAD_PLACEMENT_REASONS)):
            # Slurm requeued it by itself (node failure), or it can never start on the chosen
            # nodes: this attempt failed; back to staging, and through Muster again as a new attempt.
            why = f"requeued by Slurm ({sj.reason})" if job.ran else f"Slurm cannot start it there: {sj.reason}"
            for task_id, node in zip(job.tasks, job.placed, strict=True):
                self._report(job, task_id, pb.TASK_STATUS_FAILED, node, message=why)
            job.done = True
            log.warning("placement attempt failed", slurm_job=sj.job_id, job=job.muster_id, reason=why)
            await self._unstage_quietly(sj.job_id)
            self._track(sj.job_id, sj.num_nodes, attempt=job.attempt + 1)

    async def _finished(self, job: TrackedJob, sj: SlurmJob) -> None:
        if job.done:
            return
        job.done = True
        job.version += 1
        if job.placed is None:
            # Ended before Muster placed it (scancel while staged): cancel the Muster job.
            if job.submitted and self.client is not None:
                try:
                    await self.client.CancelJob(pb.CancelJobRequest(id=job.muster_id))
                except grpc.aio.AioRpcError as exc:
                    log.info("cancel of an ended job failed", job=job.muster_id, code=exc.code().name)
            return
        exit_code, message = 0, sj.state
        if sj.state not in ("COMPLETED", "CANCELLED"):  # cancelled: nothing more to learn
            try:
                record = await self.cli.show_job(sj.job_id)
                exit_code = record.exit_code or record.signal
                message = f"{record.state} {record.reason}".strip()
            except SlurmError:
                exit_code = 1
        status = pb.TASK_STATUS_SUCCEEDED if sj.state == "COMPLETED" else pb.TASK_STATUS_FAILED
        for task_id, node in zip(job.tasks, job.placed, strict=True):
            self._report(job, task_id, status, node, message=message, exit_code=exit_code)

    def _vanished(self, job: TrackedJob) -> None:
        if job.done:
            return
        job.done = True
        if job.placed is not None:
            for task_id, node in zip(job.tasks, job.placed, strict=True):
                self._report(job, task_id, pb.TASK_STATUS_FAILED, node, message="job vanished from Slurm")

    def _report(self, job: TrackedJob, task_id: str, status: int, node: str, *, message: str = "",
                exit_code: int = 0) -> None:
        if job.reported.get(task_id) == status:
            return
        job.reported[task_id] = status
        if self.runtime is not None:
            self.runtime.report_task_status(task_id, status, node=node, message=message, exit_code=exit_code)

    async def _submit(self, items: list[tuple[TrackedJob, SlurmJob]]) -> None:
        try:
            await self._submit_all(items)
        finally:
            for job, _ in items:
                job.submitting = False

    async def _submit_all(self, items: list[tuple[TrackedJob, SlurmJob]]) -> None:
        if not items or self.client is None:
            return
        limiter = self._submit_limiter

        async def submit(job: TrackedJob, sj: SlurmJob) -> None:
            async with limiter:
                queue = queue_of(sj, self.settings.queue_from, self.settings.default_queue)
                assert self.client is not None
                try:
                    await self._ensure_queue(queue)
                    spec = job_to_spec(sj, muster_id=job.muster_id, queue=queue)
                    await self.client.SubmitJob(pb.SubmitJobRequest(job=spec))
                    job.submitted = True
                    job.submitted_at = time.time()
                    log.info("submitted", slurm_job=sj.job_id, job=job.muster_id, queue=queue, gang=job.size)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.ALREADY_EXISTS:
                        job.submitted = True  # a different spec under this id: keep the server's
                        log.warning("job id taken on the server", job=job.muster_id, details=exc.details())
                    else:
                        log.warning("submit failed", job=job.muster_id, code=exc.code().name, details=exc.details())

        async with anyio.create_task_group() as tg:
            for job, sj in items:
                tg.start_soon(submit, job, sj)

    async def _ensure_queue(self, name: str) -> None:
        if name in self._queues or self.client is None:
            return
        try:
            await self.client.CreateQueue(pb.QueueRequest(queue=pb.Queue(name=name)))
            log.info("queue created", queue=name)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
        self._queues.add(name)

    def _send_deltas(self) -> None:
        """Only what changed since the server last heard: node upserts/removals, foreign tasks."""
        if self.runtime is None:
            return
        for name, node in self._nodes.items():
            if self._sent_nodes.get(name) != node:
                self.runtime.upsert_node(node)
        for name in set(self._sent_nodes) - set(self._nodes):
            self.runtime.remove_node(name)
        for task_id, task in self._foreign.items():
            if self._sent_foreign.get(task_id) != task:
                self.runtime.upsert_foreign_task(task)
        for task_id in set(self._sent_foreign) - set(self._foreign):
            self.runtime.remove_foreign_task(task_id)
        self._sent_nodes = dict(self._nodes)
        self._sent_foreign = dict(self._foreign)

