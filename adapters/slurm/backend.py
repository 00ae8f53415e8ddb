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

Jobs submitted to Muster directly run too with ``--native-jobs-user``: the adapter ``sbatch``es
each at bind time, pinned to Muster's nodes (:mod:`adapters.slurm.native`, docs/slurm.md).

This module is the polling side (Slurm -> tracked jobs, submissions, reports, deltas);
:mod:`adapters.slurm.enforce` applies decisions (step 2 and evictions); :mod:`adapters.slurm.jobs`
holds the tracked jobs both work on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import anyio
import grpc
import structlog
from anyio.abc import TaskGroup

from adapters.retry import Backoff
from adapters.runtime import BackendRuntime, Outcome, group_by_job
from adapters.slurm.cli import LIVE_STATES, SlurmCLI, SlurmError
from adapters.slurm.enforce import Enforcer
from adapters.slurm.jobs import (
    BAD_PLACEMENT_REASONS,
    HELD_REASONS,
    MARKER,
    REFUSED,
    WAITING_REASONS,
    JobTable,
    Settings,
    TrackedJob,
)
from adapters.slurm.native import NATIVE_MARKER, binds_needed, parse_comment
from adapters.slurm.parse import SlurmJob, SlurmNode
from adapters.slurm.translate import (
    foreign_tasks,
    job_to_spec,
    node_to_pb,
    queue_of,
    untranslatable,
)
from muster.timelimit import TIME_LIMIT_REASON, time_limit_message
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

log = structlog.get_logger("muster.slurm")

# Jobs per SubmitJobs (the server takes up to 10,000; smaller batches keep each write short).
_SUBMIT_BATCH = 1000
# SubmitJobs answers meaning "something in this batch is wrong" (or "no batch RPC here"): retry
# the jobs one by one, so one bad job does not hold back the rest.
_BATCH_REFUSED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)

__all__ = ["Settings", "SlurmBackend", "TrackedJob"]


class SlurmBackend:
    """Implements the runtime's Backend protocol (plus ``apply_batch`` for gangs): polls Slurm,
    submits and reports; decisions go to the :class:`~adapters.slurm.enforce.Enforcer`."""

    def __init__(self, cli: SlurmCLI, settings: Settings, *, name: str = "slurm") -> None:
        self.cli = cli
        self.settings = settings
        self.name = name
        self.runtime: BackendRuntime | None = None
        self.client: pb_grpc.SchedulerStub | None = None
        self.table = JobTable(settings.job_prefix)
        self.enforcer = Enforcer(cli, settings, self.table)
        self._queues: set[str] = set()
        self._nodes: dict[str, pb.Node] = {}  # last poll
        self._foreign: dict[str, pb.BackendTask] = {}  # last poll
        self._sent_nodes: dict[str, pb.Node] = {}  # what the server has
        self._node_cache: list[SlurmNode] | None = None
        self._node_read_at = 0.0
        self._nodes_of_read = -1.0  # the read ``_nodes`` was converted from
        self._sent_foreign: dict[str, pb.BackendTask] = {}
        self._polled = anyio.Event()
        self._adopted = False
        self.polls = 0
        # Shared by overlapping submission bursts, so together they stay within submit_parallel.
        self._submit_limiter = anyio.CapacityLimiter(settings.submit_parallel)

    @property
    def jobs(self) -> dict[int, TrackedJob]:
        """Tracked jobs by Slurm job id."""
        return self.table.jobs

    @property
    def placements(self) -> int:
        """Successful enforcement RPCs (tests: nothing placed twice)."""
        return self.enforcer.placements

    @property
    def place_seconds(self) -> list[float]:
        return self.enforcer.place_seconds

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
        return await self.enforcer.apply_batch(decisions)

    def incomplete_gangs(self, decisions: list[pb.Decision]) -> bool:
        """Whether some job waiting for a placement has only part of its K binds in ``decisions``
        (the rest of its cycle is probably still on the way)."""
        for job_id, group in group_by_job(decisions).items():
            binds = [d.bind for d in group if d.WhichOneof("action") == "bind"]
            if not binds:
                continue
            tasks = {b.task_id for b in binds}
            job = self.table.by_muster_id.get(job_id)
            if job is not None and job.placed is None and not job.done and len(tasks) < job.size:
                return True
            if self.enforcer.needs_new_slurm_job(job_id) and len(tasks) < binds_needed(binds):
                return True
        return False

    # -- polling ------------------------------------------------------------------------------

    async def run_poller(self) -> None:
        """Poll Slurm forever (cancel to stop). A failed poll is logged and retried, at growing
        intervals while Slurm keeps failing (up to 5 s), every ``poll_interval`` once it answers."""
        interval = self.settings.poll_interval
        backoff = Backoff(initial=2 * interval, factor=2.0, max=max(2 * interval, 5.0), jitter=0.5)
        async with anyio.create_task_group() as submitter:
            while True:
                try:
                    await self.poll_once(submitter=submitter)
                except SlurmError as exc:
                    delay = backoff.next()
                    log.warning("poll failed", error=exc.message, retry_in=round(delay, 2))
                else:
                    backoff.reset()
                    delay = interval
                await anyio.sleep(delay)

    async def poll_once(self, *, submitter: TaskGroup | None = None) -> None:
        """One poll. New jobs are submitted to Muster before it returns, or, with ``submitter``,
        in that task group while the next polls go on (a big burst of sbatch then does not
        delay the poll that sees the next jobs)."""
        if not self._adopted:
            await self._adopt()
        versions = {sid: job.version for sid, job in self.jobs.items()}
        nodes, jobs = await self._read_state()
        if (
            self._nodes_of_read != self._node_read_at
        ):  # converted once per `sinfo` read, not per poll
            self._nodes = {
                n.name: node_to_pb(n) for n in nodes if self.settings.run_partition in n.partitions
            }
            self._nodes_of_read = self._node_read_at
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
                    tracked = self.table.track(sj.job_id, sj.num_nodes)
                elif sj.active:
                    if self.enforcer.native_in_flight and self._is_native(sj):
                        continue  # its sbatch has not returned yet: tracked once it does
                    for task in foreign_tasks(sj, self._nodes):
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
            if (
                self._node_cache is None
                or now - self._node_read_at >= self.settings.node_poll_interval
            ):
                self._node_cache = await self.cli.nodes()
                self._node_read_at = now
            nodes.extend(self._node_cache)

        async def read_jobs() -> None:
            jobs.extend(await self.cli.jobs(states=LIVE_STATES))
            # Tracked jobs that left the live states have ended (or were purged): their final
            # state, by id. Jobs Slurm no longer knows at all are left out (the poll calls them
            # vanished).
            live = {sj.job_id for sj in jobs}
            gone = sorted(sid for sid, job in self.jobs.items() if not job.done and sid not in live)
            if gone:
                jobs.extend(
                    sj
                    for sj in await self.cli.jobs_by_id(gone, missing_ok=True)
                    if sj.job_id not in live
                )

        async with anyio.create_task_group() as tg:
            tg.start_soon(read_nodes)
            tg.start_soon(read_jobs)
        return nodes, jobs

    async def _adopt(self) -> None:
        """After a restart: recognise the jobs this adapter placed earlier (AdminComment)."""
        for sj in await self.cli.jobs_full():
            if sj.finished:
                continue
            native = parse_comment(sj.comment) if self._is_native(sj) else None
            if native is not None:
                muster_id, tasks, nodes = native
                job = self.table.track(
                    sj.job_id, len(tasks), muster_id=muster_id, native_tasks=tasks
                )
                job.submitted = True
                job.placed = nodes
                job.ran = sj.active
                continue
            if not sj.admin_comment.startswith(MARKER):
                continue
            muster_id = sj.admin_comment[len(MARKER) :]
            job = self.table.track(sj.job_id, sj.num_nodes, muster_id=muster_id)
            job.submitted = True
            if sj.partition == self.settings.run_partition and len(sj.required_nodes) == job.size:
                job.placed = list(sj.required_nodes)
                job.ran = sj.active
                job.confirmed = True
        self._adopted = True
        if self.jobs:
            log.info("adopted jobs placed before a restart", count=len(self.jobs))

    def _is_native(self, sj: SlurmJob) -> bool:
        """A job this adapter submitted for a native Muster job (its user and comment say so)."""
        user = self.settings.native_user
        return bool(user) and sj.user == user and sj.comment.startswith(NATIVE_MARKER)

    async def _observe(
        self, job: TrackedJob, sj: SlurmJob, to_submit: list[tuple[TrackedJob, SlurmJob]]
    ) -> None:
        staging, run = self.settings.staging_partition, self.settings.run_partition
        job.time_limit = sj.time_limit  # a bind's time limit may only lower it
        if sj.partition == staging and sj.state == "PENDING" and job.placed is None:
            if not job.submitted and not job.submitting and sj.reason not in WAITING_REASONS:
                if await self._refuse(job, sj):
                    return
                to_submit.append((job, sj))
            elif job.submitted and (sj.reason in HELD_REASONS) != job.held:
                await self._mirror_hold(job, sj)
            return
        if job.placed is None:
            return
        if not job.confirmed:
            # A burst whose `scontrol update`s all succeeded is acknowledged without reading the
            # jobs back; the first poll after it checks each one (the same check the enforcer
            # makes when it reads back). A job that does not show Muster's placement is this
            # attempt failed, taken back to staging and placed again as a new attempt.
            problem = self.enforcer.check_placement(sj, job.placed, reasons=False)
            if problem:
                await self._placement_failed(job, sj, problem)
                return
            job.confirmed = True
        if sj.partition != run:
            return
        if sj.active:
            job.ran = True
            for task_id, node in zip(job.tasks, job.placed, strict=True):
                self._report(job, task_id, pb.TASK_STATUS_RUNNING, node)
        elif sj.state == "PENDING" and (job.ran or sj.reason.startswith(BAD_PLACEMENT_REASONS)):
            # Slurm requeued it by itself (node failure), or it can never start on the chosen
            # nodes: this attempt failed; back to staging, and through Muster again as a new attempt.
            why = (
                f"requeued by Slurm ({sj.reason})"
                if job.ran
                else f"Slurm cannot start it there: {sj.reason}"
            )
            await self._placement_failed(job, sj, why)

    async def _mirror_hold(self, job: TrackedJob, sj: SlurmJob) -> None:
        """``scontrol hold`` / ``release`` of a job Muster has not placed yet: the Muster job is
        held / released alike (HoldJob, ReleaseJob), so Muster does not place a job Slurm would
        not start. Tried once per change (a job Muster placed meanwhile is not held there)."""
        job.held = sj.reason in HELD_REASONS
        if self.client is None:
            return
        try:
            if job.held:
                await self.client.HoldJob(pb.HoldJobRequest(id=job.muster_id))
            else:
                await self.client.ReleaseJob(pb.ReleaseJobRequest(id=job.muster_id))
        except grpc.aio.AioRpcError as exc:
            log.info(
                "hold not mirrored in Muster",
                job=job.muster_id,
                held=job.held,
                code=exc.code().name,
                error=exc.details(),
            )
            return
        log.info("hold mirrored in Muster", slurm_job=sj.job_id, job=job.muster_id, held=job.held)

    async def _placement_failed(self, job: TrackedJob, sj: SlurmJob, why: str) -> None:
        """This attempt failed (reported so); the job goes back to staging, and through Muster again
        as a new attempt."""
        assert job.placed is not None
        for task_id, node in zip(job.tasks, job.placed, strict=True):
            self._report(job, task_id, pb.TASK_STATUS_FAILED, node, message=why)
        job.done = True
        log.warning("placement attempt failed", slurm_job=sj.job_id, job=job.muster_id, reason=why)
        if job.native:  # the adapter's own Slurm job: gone; the Muster job decides what comes next
            try:
                await self.cli.cancel(sj.job_id)
            except SlurmError as exc:
                log.warning("could not cancel job", slurm_job=sj.job_id, error=exc.message)
            return
        await self.enforcer.withdraw(sj)
        self.table.track(sj.job_id, sj.num_nodes, attempt=job.attempt + 1)

    async def _refuse(self, job: TrackedJob, sj: SlurmJob) -> bool:
        """A job Muster cannot place as Slurm would (``--constraint 'a*2'``, ...) is not submitted:
        it stays pending in staging, with the reason logged and written to its AdminComment
        (``scontrol show job`` shows it to the user). Checked again whenever a poll sees its
        constraint or node count changed, so a job the user fixes
        (``scontrol update JobId=N Features=...``) is submitted then."""
        checked = (sj.features, sj.num_nodes)
        if checked != job.checked:
            job.checked = checked
            reason, previous = untranslatable(sj), job.refused
            job.refused = reason
            if reason and reason != previous:
                log.warning(
                    "job not submitted: Muster cannot place it as Slurm would",
                    slurm_job=sj.job_id,
                    job=job.muster_id,
                    reason=reason,
                )
                try:
                    await self.cli.set_admin_comment(sj.job_id, REFUSED + reason)
                except SlurmError as exc:
                    log.info("cannot set AdminComment", slurm_job=sj.job_id, error=exc.message)
        return bool(job.refused)

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
                    log.info(
                        "cancel of an ended job failed", job=job.muster_id, code=exc.code().name
                    )
            return
        exit_code, message = 0, sj.state
        if sj.state not in ("COMPLETED", "CANCELLED"):  # cancelled: nothing more to learn
            try:
                record = await self.cli.show_job(sj.job_id)
                exit_code = record.exit_code or record.signal
                message = f"{record.state} {record.reason}".strip()
            except SlurmError:
                exit_code = 1
        if sj.state == "TIMEOUT":  # Slurm ended it at its --time: the TimeLimit reason
            limit = sj.time_limit or job.time_limit
            message = time_limit_message(limit) if limit else f"{TIME_LIMIT_REASON}: {message}"
        status = pb.TASK_STATUS_SUCCEEDED if sj.state == "COMPLETED" else pb.TASK_STATUS_FAILED
        for task_id, node in zip(job.tasks, job.placed, strict=True):
            self._report(job, task_id, status, node, message=message, exit_code=exit_code)

    def _vanished(self, job: TrackedJob) -> None:
        if job.done:
            return
        job.done = True
        if job.placed is not None:
            for task_id, node in zip(job.tasks, job.placed, strict=True):
                self._report(
                    job, task_id, pb.TASK_STATUS_FAILED, node, message="job vanished from Slurm"
                )

    def _report(
        self,
        job: TrackedJob,
        task_id: str,
        status: pb.TaskStatus,
        node: str,
        *,
        message: str = "",
        exit_code: int = 0,
    ) -> None:
        if job.reported.get(task_id) == status:
            return
        job.reported[task_id] = status
        if self.runtime is not None:
            self.runtime.report_task_status(
                task_id, status, node=node, message=message, exit_code=exit_code
            )

    async def _submit(self, items: list[tuple[TrackedJob, SlurmJob]]) -> None:
        try:
            await self._submit_all(items)
        finally:
            for job, _ in items:
                job.submitting = False

    async def _submit_all(self, items: list[tuple[TrackedJob, SlurmJob]]) -> None:
        """One ``SubmitJobs`` for the whole burst (one server write and one cycle wake-up instead of
        one per job). The batch is all or nothing on the server, so when it is refused (a job id
        taken with another spec, a spec the server finds invalid, a server without SubmitJobs) the
        jobs go one ``SubmitJob`` each, and only the offending ones stay unsubmitted."""
        if not items or self.client is None:
            return
        prepared: list[tuple[TrackedJob, SlurmJob, pb.JobSpec]] = []
        for job, sj in items:
            queue = queue_of(sj, self.settings.queue_from, self.settings.default_queue)
            prepared.append((job, sj, job_to_spec(sj, muster_id=job.muster_id, queue=queue)))
        for queue in sorted({spec.queue for _, _, spec in prepared}):
            try:
                await self._ensure_queue(queue)
            except grpc.aio.AioRpcError as exc:
                # Its jobs stay unsubmitted: a later poll tries again.
                log.warning(
                    "queue creation failed",
                    queue=queue,
                    code=exc.code().name,
                    details=exc.details(),
                )
                prepared = [p for p in prepared if p[2].queue != queue]
        for i in range(0, len(prepared), _SUBMIT_BATCH):
            chunk = prepared[i : i + _SUBMIT_BATCH]
            if len(chunk) == 1:
                await self._submit_each(chunk)
                continue
            try:
                await self.client.SubmitJobs(
                    pb.SubmitJobsRequest(jobs=[spec for _, _, spec in chunk])
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _BATCH_REFUSED:
                    log.info(
                        "batch submit refused, submitting one by one",
                        jobs=len(chunk),
                        code=exc.code().name,
                        details=exc.details(),
                    )
                    await self._submit_each(chunk)
                else:
                    log.warning(
                        "submit failed",
                        jobs=len(chunk),
                        code=exc.code().name,
                        details=exc.details(),
                    )
                continue
            now = time.time()
            for job, sj, spec in chunk:
                _submitted(job, sj, spec, now)

    async def _submit_each(self, prepared: list[tuple[TrackedJob, SlurmJob, pb.JobSpec]]) -> None:
        """One ``SubmitJob`` per job (up to ``submit_parallel`` at once)."""
        limiter = self._submit_limiter

        async def submit(job: TrackedJob, sj: SlurmJob, spec: pb.JobSpec) -> None:
            async with limiter:
                assert self.client is not None
                try:
                    await self.client.SubmitJob(pb.SubmitJobRequest(job=spec))
                    _submitted(job, sj, spec, time.time())
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.ALREADY_EXISTS:
                        job.submitted = True  # a different spec under this id: keep the server's
                        log.warning(
                            "job id taken on the server", job=job.muster_id, details=exc.details()
                        )
                    else:
                        log.warning(
                            "submit failed",
                            job=job.muster_id,
                            code=exc.code().name,
                            details=exc.details(),
                        )

        async with anyio.create_task_group() as tg:
            for job, sj, spec in prepared:
                tg.start_soon(submit, job, sj, spec)

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


def _submitted(job: TrackedJob, sj: SlurmJob, spec: pb.JobSpec, at: float) -> None:
    """The server took the job (``at``: when its submit returned)."""
    job.submitted = True
    job.submitted_at = at
    log.info("submitted", slurm_job=sj.job_id, job=job.muster_id, queue=spec.queue, gang=job.size)
