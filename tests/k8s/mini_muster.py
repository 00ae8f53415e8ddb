"""A small in-test Muster server for the Kubernetes adapter tests.

It speaks the real gRPC API (backend and client RPCs the adapter uses) and schedules with a plain
gang first-fit (all-or-nothing up to min_member, honouring node capacity, foreign tasks,
NotReady and cordoned nodes). It stands in for ``server/service/app.py`` so that the adapter's
behaviour is tested in isolation from the scheduling core; its state survives ``stop()`` /
``start()`` on the same port, like the real server's SQLite store.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

import grpc

from muster.gang import gang_minimum
from muster.quantity import MIN_RESOURCE, QuantityError, parse_resources
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.:]{0,251}[A-Za-z0-9])?$")
OCCUPYING = (pb.TASK_STATUS_BINDING, pb.TASK_STATUS_BOUND, pb.TASK_STATUS_RUNNING)


@dataclass
class JobRecord:
    spec: pb.JobSpec
    tasks: list[pb.Task]
    requests: dict[str, dict[str, float]]
    phase: int = pb.JOB_PHASE_PENDING
    conditions: list[pb.Condition] = field(default_factory=list)
    order: int = 0

    def view(self) -> pb.Job:
        counts = {s: sum(1 for t in self.tasks if t.status == s) for s in range(10)}
        status = pb.JobStatus(
            phase=self.phase,
            conditions=self.conditions,
            pending=counts[pb.TASK_STATUS_PENDING],
            running=counts[pb.TASK_STATUS_RUNNING] + counts[pb.TASK_STATUS_BOUND],
            succeeded=counts[pb.TASK_STATUS_SUCCEEDED],
            failed=counts[pb.TASK_STATUS_FAILED],
        )
        return pb.Job(spec=self.spec, status=status, tasks=self.tasks)


class MiniMuster(pb_grpc.SchedulerServicer):
    def __init__(self, server_id: str = "mini-1") -> None:
        self.server_id = server_id
        self.backend = ""
        self.nodes: dict[str, pb.Node] = {}
        self.foreign: dict[str, pb.BackendTask] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.queues: dict[str, pb.Queue] = {
            "root": pb.Queue(name="root"),
            "default": pb.Queue(name="default"),
        }
        self.decisions: list[pb.Decision] = []
        self.acked: dict[int, pb.DecisionAck] = {}
        self.snapshots = 0
        self.deltas: list[pb.Delta] = []
        self.cycles = 0
        self._changed = asyncio.Event()
        self._new_decision = asyncio.Condition()
        self._watchers: list[asyncio.Queue[pb.JobEvent]] = []

    # ------------------------------------------------------------------ scheduling

    def _task(self, task_id: str) -> tuple[JobRecord, pb.Task] | None:
        job_id = task_id.rsplit("/", 1)[0]
        job = self.jobs.get(job_id)
        if job is None:
            return None
        for t in job.tasks:
            if t.id == task_id:
                return job, t
        return None

    def _idle(self) -> dict[str, dict[str, float]]:
        idle = {
            n.name: parse_resources(dict(n.allocatable.quantities)) for n in self.nodes.values()
        }
        used = [
            (t.node, parse_resources(dict(t.request.quantities))) for t in self.foreign.values()
        ]
        for job in self.jobs.values():
            used += [(t.node, job.requests[t.role]) for t in job.tasks if t.status in OCCUPYING]
        for node, req in used:
            if node in idle:
                for r, v in req.items():
                    idle[node][r] = idle[node].get(r, 0.0) - v
        return idle

    def cycle(self) -> None:
        self.cycles += 1
        idle = self._idle()
        usable = sorted(
            n.name for n in self.nodes.values() if not n.not_ready and not n.unschedulable
        )
        for job in sorted(self.jobs.values(), key=lambda j: (-j.spec.priority, j.order)):
            if job.phase == pb.JOB_PHASE_CANCELLED:
                continue
            pending = [t for t in job.tasks if t.status == pb.TASK_STATUS_PENDING]
            if not pending:
                continue
            placed = sum(
                1
                for t in job.tasks
                if t.status in OCCUPYING or t.status == pb.TASK_STATUS_SUCCEEDED
            )
            need = gang_minimum(job.spec.min_member, len(job.tasks)) - placed
            trial: list[tuple[pb.Task, str]] = []
            for t in pending:
                req = job.requests[t.role]
                for name in usable:
                    free = idle[name]
                    if all(free.get(r, 0.0) + MIN_RESOURCE >= v for r, v in req.items()):
                        for r, v in req.items():
                            free[r] = free.get(r, 0.0) - v
                        trial.append((t, name))
                        break
            if len(trial) >= need:
                for t, name in trial:
                    t.status, t.node = pb.TASK_STATUS_BINDING, name
                    self._decide(
                        pb.Decision(
                            bind=pb.BindDecision(
                                task_id=t.id,
                                job_id=job.spec.id,
                                node=name,
                                request=next(
                                    tg.request for tg in job.spec.task_groups if tg.role == t.role
                                ),
                            )
                        )
                    )
                job.phase = pb.JOB_PHASE_RUNNING
                job.conditions = [pb.Condition(type="Scheduled", status="True", reason="Scheduled")]
            else:
                for t, name in trial:
                    for r, v in job.requests[t.role].items():
                        idle[name][r] += v
                not_ready = len(self.nodes) - len(usable)
                msg = (
                    f"0/{len(self.nodes)} nodes are available: {len(trial)}/{len(pending)} tasks in gang "
                    f"fit, gang needs {need}"
                    + (f"; {not_ready} node(s) not ready or cordoned" if not_ready else "")
                )
                job.phase = pb.JOB_PHASE_INQUEUE
                new = [
                    pb.Condition(
                        type="Unschedulable",
                        status="True",
                        reason="NotEnoughResources",
                        message=msg,
                    )
                ]
                if list(job.conditions) == new:
                    continue
                job.conditions = new
            self._publish(job)

    def _decide(self, decision: pb.Decision) -> None:
        decision.id = len(self.decisions) + 1
        decision.cycle_id = self.cycles
        decision.backend = self.backend
        self.decisions.append(decision)

    def _publish(self, job: JobRecord, kind: int = pb.JobEvent.TYPE_MODIFIED) -> None:
        for q in self._watchers:
            q.put_nowait(pb.JobEvent(type=kind, job=job.view()))

    def poke(self) -> None:
        self._changed.set()

    async def loop(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            self.cycle()
            async with self._new_decision:
                self._new_decision.notify_all()
            await asyncio.sleep(0.02)

    # ------------------------------------------------------------------ backend RPCs

    async def RegisterBackend(self, request, context):
        self.backend = request.name
        return pb.RegisterBackendResponse(
            name=request.name, server_id=self.server_id, last_decision_id=len(self.decisions)
        )

    async def SyncSnapshot(self, request, context):
        self.snapshots += 1
        self.nodes = {n.name: n for n in request.nodes}
        self.foreign = {t.task_id: t for t in request.tasks if t.foreign_task}
        for t in request.tasks:
            if not t.foreign_task:
                found = self._task(t.task_id)
                if found is None:
                    await context.abort(
                        grpc.StatusCode.NOT_FOUND, f"tasks[{t.task_id}]: unknown task"
                    )
                found[1].status, found[1].node = t.status, t.node
        self.poke()
        return pb.SyncSnapshotResponse(nodes=len(request.nodes), tasks=len(request.tasks))

    async def SendDeltas(self, request, context):
        for d in request.deltas:
            self.deltas.append(d)
            change = d.WhichOneof("change")
            if change == "node_upserted":
                self.nodes[d.node_upserted.name] = d.node_upserted
            elif change == "node_removed":
                self.nodes.pop(d.node_removed, None)
            elif change == "foreign_task_upserted":
                self.foreign[d.foreign_task_upserted.task_id] = d.foreign_task_upserted
            elif change == "foreign_task_removed":
                self.foreign.pop(d.foreign_task_removed, None)
            elif change == "task_status":
                found = self._task(d.task_status.task_id)
                if found is not None:
                    found[1].status = d.task_status.status
                    found[1].node = d.task_status.node or found[1].node
                    self._publish(found[0])
        self.poke()
        return pb.SendDeltasResponse(applied=len(request.deltas))

    async def StreamDecisions(self, request, context):
        async for batch in self._feed(request):
            for decision in batch:
                yield decision

    async def StreamDecisionBatches(self, request, context):
        async for batch in self._feed(request):
            yield pb.DecisionBatch(decisions=batch)

    async def _feed(self, request):
        sent = 0
        while True:
            async with self._new_decision:
                while sent >= len(self.decisions):
                    await self._new_decision.wait()
                batch = self.decisions[sent:]
                sent = len(self.decisions)
            batch = [
                d for d in batch if d.id > request.after_decision_id and d.id not in self.acked
            ]
            if batch:
                yield batch

    async def AckDecisions(self, request, context):
        for ack in request.acks:
            if ack.decision_id in self.acked:
                continue
            self.acked[ack.decision_id] = ack
            decision = self.decisions[ack.decision_id - 1]
            action = decision.WhichOneof("action")
            found = self._task(getattr(decision, action).task_id)
            if found is None:
                continue
            job, task = found
            if action == "bind":
                # As the real server (server/service/ingest.py): an ack only settles a task still binding
                # by this decision. A task placed meanwhile (the adapter reported where its pod
                # really is) stays put: sending it back to Pending would make the next cycle bind
                # it again, the adapter refuse again, and so on forever.
                if task.status != pb.TASK_STATUS_BINDING or task.node != decision.bind.node:
                    continue
                if ack.applied:
                    task.status = pb.TASK_STATUS_BOUND
                else:
                    task.status, task.node, task.message = pb.TASK_STATUS_PENDING, "", ack.reason
            elif ack.applied:
                task.status = pb.TASK_STATUS_FAILED
            self._publish(job)
        self.poke()
        return pb.AckDecisionsResponse(accepted=len(request.acks))

    # ------------------------------------------------------------------ client RPCs

    async def SubmitJob(self, request, context):
        spec = request.job
        if not _NAME.match(spec.id):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"job.id: {spec.id!r} is not a valid job id"
            )
        if spec.queue not in self.queues:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"job.queue: no queue named {spec.queue!r}"
            )
        existing = self.jobs.get(spec.id)
        if existing is not None:
            if existing.spec == spec:
                return pb.SubmitJobResponse(job=existing.view(), created=False)
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS, f"job.id: {spec.id} exists with another spec"
            )
        tasks, requests = [], {}
        for tg in spec.task_groups:
            try:
                requests[tg.role] = parse_resources(dict(tg.request.quantities))
            except QuantityError as exc:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"job.task_groups.request.{exc}"
                )
            for i in range(tg.replicas):
                tasks.append(
                    pb.Task(
                        id=f"{spec.id}/{tg.role}-{i}",
                        job_id=spec.id,
                        role=tg.role,
                        index=i,
                        status=pb.TASK_STATUS_PENDING,
                    )
                )
        if spec.min_member > len(tasks):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "job.min_member: more than the job's tasks"
            )
        job = JobRecord(spec=spec, tasks=tasks, requests=requests, order=len(self.jobs))
        self.jobs[spec.id] = job
        self._publish(job, pb.JobEvent.TYPE_ADDED)
        self.poke()
        return pb.SubmitJobResponse(job=job.view(), created=True)

    async def GetJob(self, request, context):
        job = self.jobs.get(request.id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"id: no job {request.id!r}")
        return job.view()

    async def CancelJob(self, request, context):
        job = self.jobs.get(request.id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"id: no job {request.id!r}")
        job.phase = pb.JOB_PHASE_CANCELLED
        for t in job.tasks:
            if t.status in OCCUPYING:
                self._decide(
                    pb.Decision(
                        evict=pb.EvictDecision(
                            task_id=t.id, job_id=job.spec.id, node=t.node, reason="cancel"
                        )
                    )
                )
            elif t.status == pb.TASK_STATUS_PENDING:
                t.status = pb.TASK_STATUS_FAILED
        self._publish(job)
        self.poke()
        return pb.CancelJobResponse(job=job.view())

    async def WatchJobs(self, request, context):
        q: asyncio.Queue[pb.JobEvent] = asyncio.Queue()
        self._watchers.append(q)
        try:
            if request.send_initial:
                for job in self.jobs.values():
                    yield pb.JobEvent(type=pb.JobEvent.TYPE_ADDED, job=job.view())
            while True:
                yield await q.get()
        finally:
            self._watchers.remove(q)

    async def Explain(self, request, context):
        job = self.jobs.get(request.job_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job_id: no job {request.job_id!r}")
        summary = job.conditions[0].message if job.conditions else ""
        return pb.ExplainResponse(
            job_id=request.job_id, phase=job.phase, gate="placement", summary=summary
        )

    async def CreateQueue(self, request, context):
        if request.queue.name in self.queues:
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS, f"queue.name: {request.queue.name} exists"
            )
        self.queues[request.queue.name] = request.queue
        return request.queue

    async def UpdateQueue(self, request, context):
        if request.queue.name not in self.queues:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"queue.name: no queue {request.queue.name}"
            )
        self.queues[request.queue.name] = request.queue
        return request.queue

    async def DeleteQueue(self, request, context):
        if request.name not in self.queues:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"name: no queue {request.name}")
        del self.queues[request.name]
        return pb.DeleteQueueResponse()


class MiniMusterHandle:
    """Runs a MiniMuster on 127.0.0.1; ``restart()`` keeps its state (a server restart)."""

    def __init__(self, servicer: MiniMuster | None = None) -> None:
        self.servicer = servicer or MiniMuster()
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self._loop_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.server = grpc.aio.server()
        pb_grpc.add_SchedulerServicer_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self.server.start()
        self._loop_task = asyncio.create_task(self.servicer.loop())

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            self._loop_task = None
        if self.server is not None:
            await self.server.stop(grace=None)
            self.server = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"
