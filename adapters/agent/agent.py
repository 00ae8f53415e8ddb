"""The fake bare-metal agent's backend: runs what Muster binds to it as real processes.

:class:`FakeAgent` implements the :class:`adapters.runtime.Backend` protocol over an inventory
(:mod:`adapters.agent.inventory`). It launches each bound task as a real subprocess (the bind's
``command``, or ``sleep <duration_seconds>``), reports Running / Succeeded / Failed (with the exit
code) as deltas, acknowledges every decision, and rejects a bind it cannot honour: unknown or
cordoned node, a task already running, or a request that does not fit the node's *own* free
resources (it never over-commits, whatever the server thinks). An evict kills the task's process
group (SIGTERM, then SIGKILL after ``kill_grace``); the applied ack is the report (the server
returns the task to Pending or cancels it), so no Failed delta follows an eviction. The inventory
file is re-read when it changes (nodes added, changed, removed are sent as deltas).

Restarts:
* server restart: the runtime reconnects with backoff and re-syncs; running tasks are in the
  snapshot, so nothing is started twice.
* agent restart: without ``state_dir`` the agent kills its tasks on exit (they would be
  orphans). An agent killed with SIGKILL cannot do that, so every task carries
  MUSTER_AGENT_INSTANCE (``name@server``) in its environment and a starting agent kills every
  process group so tagged that it did not adopt, before it reports anything: a task never runs
  twice at once because its first copy outlived its agent. With ``state_dir`` tasks run in their
  own session and survive the agent. ``tasks.json`` (one atomic write per change) records each
  task (pid, exit-code file), the binds being started and the outcome of every decision applied.
  A burst's binds are checked and reserved first; a job's binds in it start all or none (a gang);
  their intent is written in one write before any process starts. The next agent re-adopts running
  tasks, reports the ones that ended meanwhile, finishes starting a gang a crash interrupted (or
  rolls the gang back when that is impossible), and answers ``recall_outcomes`` for decisions the
  runtime's ledger holds in doubt, so a resent bind is re-acked, never re-applied.

Each task gets MUSTER_TASK_ID, MUSTER_JOB_ID, MUSTER_NODE, MUSTER_AGENT, MUSTER_DECISION_ID,
MUSTER_CYCLE_ID, what its bind decision's ``env`` holds (an array element's MUSTER_ARRAY_JOB_ID and
MUSTER_ARRAY_INDEX) and, when it holds GPUs, CUDA_VISIBLE_DEVICES / MUSTER_DEVICES in its
environment.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog
from anyio.abc import TaskGroup

from adapters.agent.inventory import InventoryError, InventoryNode, load_inventory
from adapters.agent.process import (
    EXIT_WRAPPER,
    alive,
    file_stem,
    group_alive,
    legacy_file_stem,
    mtime,
    read_exit_file,
    seconds_arg,
    signal_group,
    start_ticks,
    tagged_group_envs,
    tagged_groups,
)
from adapters.children import ChildProcess
from adapters.ledger import private_dir, write_private
from adapters.runtime import BackendRuntime, Outcome, Rejected, group_by_job
from muster.devices import NVIDIA_GPU, Device, device_needs, shared_gpu, visible_devices_env
from muster.quantity import MIN_RESOURCE, QuantityError, format_resources, parse_resources
from muster.timelimit import format_time_limit, time_limit_message
from muster.v1 import muster_pb2 as pb

log = structlog.get_logger("muster.agent")

# Ended tasks stay in snapshots this long, so a server that reconnects before their final
# delta arrives sees them ended rather than lost.
_ENDED_TTL = 600.0
_ENDED_MAX = 2000
# Outcomes of the latest decisions kept in the state dir, to answer recall_outcomes after a restart
# (the runtime only asks about its last burst: at most max_batch, 500, decisions).
_DECISIONS_MAX = 5000
_STATE_VERSION = 2


@dataclass(slots=True)
class LiveTask:
    task_id: str
    job_id: str
    node: str
    request: dict[str, float]
    devices: list[str]  # held whole
    decision_id: int
    pid: int  # 0: not started (yet)
    start_ticks: int  # /proc/<pid>/stat starttime: guards against pid reuse on adoption
    exit_file: str = ""
    evicted: bool = False
    gpu_fraction: float = 0.0  # KAI GPU sharing: the share of gpu_group the task holds
    cycle_id: int = 0
    argv: list[str] = field(default_factory=list)  # the command (before the exit-code wrapper)
    log_file: str = ""  # "": an agent before log_file was recorded (its name is legacy_file_stem's)
    # The GPU a fractional task shares ("": none; an agent before it was recorded kept it in devices).
    gpu_group: str = ""
    # What the bind adds to the task's environment (an array element's MUSTER_ARRAY_INDEX ...).
    env: dict[str, str] = field(default_factory=dict)
    # Its job's time limit (seconds, 0: none), counted from ``started_at`` (wall clock, when its
    # process was started); ``timed_out``: the agent ended it there (reported Failed, TimeLimit).
    time_limit: float = 0.0
    started_at: float = 0.0
    timed_out: bool = False


@dataclass(slots=True)
class EndedTask:
    task_id: str
    node: str
    status: pb.TaskStatus
    exit_code: int
    message: str
    ended_at: float = field(default_factory=time.time)


class FakeAgent:
    """The :class:`adapters.runtime.Backend` of a fake bare-metal cluster."""

    def __init__(
        self,
        name: str,
        inventory: list[InventoryNode],
        *,
        inventory_path: str | None = None,
        state_dir: str | None = None,
        kill_grace: float = 5.0,
    ) -> None:
        self.name = name
        self.nodes: dict[str, InventoryNode] = {n.name: n for n in inventory}
        self.inventory_path = inventory_path
        self.state_dir = Path(state_dir) if state_dir else None
        self.kill_grace = kill_grace
        self.live: dict[str, LiveTask] = {}
        # Per node, the tasks holding it: live ones and binds being started (reserved first, so
        # concurrent starts never over-commit a node).
        self._holding: dict[str, dict[str, LiveTask]] = {}
        # Binds reserved and not started yet (with a state dir, recorded before any is started).
        self._starting: dict[str, LiveTask] = {}
        self.ended: dict[str, EndedTask] = {}
        # Outcomes of the decisions applied: id -> (task id, applied, reason); with a state dir
        # they survive a restart and answer recall_outcomes. Keyed by the server identity.
        self.decisions: OrderedDict[int, tuple[str, bool, str]] = OrderedDict()
        self.server_id = ""
        self.runtime: BackendRuntime | None = None
        self._tg: TaskGroup | None = None
        self._processes: dict[str, ChildProcess] = {}
        # Tags every task's environment; ``run`` adds the server, so two agents of the same name
        # serving different servers never take each other's tasks for orphans.
        self.instance = name
        if self.state_dir:
            private_dir(self.state_dir)  # 0700: task commands, logs and exit codes are private
            private_dir(self.state_dir / "tasks")
        # Every task's output is kept (muster logs): beside its state, else in a directory of this run.
        self.log_dir = (
            self.state_dir / "tasks"
            if self.state_dir
            else Path(tempfile.mkdtemp(prefix=f"muster-agent-{name}-"))
        )
        self._log_offsets: dict[str, int] = {}  # task -> bytes of its log already sent
        self._log_files: dict[str, Path] = {}  # task -> its log, while it is being followed

    # -- resources ----------------------------------------------------------------------------

    def _holders(self, node: str) -> Iterable[LiveTask]:
        return self._holding.get(node, {}).values()

    def _hold(self, task: LiveTask) -> None:
        self._holding.setdefault(task.node, {})[task.task_id] = task

    def _release(self, task: LiveTask) -> None:
        held = self._holding.get(task.node)
        if held is not None and held.get(task.task_id) is task:
            del held[task.task_id]

    def _add_live(self, task: LiveTask) -> None:
        self.live[task.task_id] = task
        self._hold(task)

    def used(self, node: str) -> dict[str, float]:
        used: dict[str, float] = {}
        for task in self._holders(node):
            for res, value in task.request.items():
                used[res] = used.get(res, 0.0) + value
        return used

    def free(self, node: str) -> dict[str, float]:
        spec = self.nodes[node]
        used = self.used(node)
        return {res: cap - used.get(res, 0.0) for res, cap in spec.allocatable.items()}

    def free_devices(self, node: str) -> list[Device]:
        """Healthy devices of the node no live task holds (whole, or shared), in inventory order."""
        taken = {d for t in self._holders(node) for d in t.devices}
        taken |= {t.gpu_group for t in self._holders(node) if t.gpu_group}
        return [d for d in self.nodes[node].devices if d.healthy and d.id not in taken]

    def gpu_shares(self, node: str) -> dict[str, float]:
        """Shared GPUs of the node: device id -> the share its fractional tasks hold."""
        shares: dict[str, float] = {}
        for t in self._holders(node):
            if t.gpu_fraction and t.gpu_group:
                shares[t.gpu_group] = shares.get(t.gpu_group, 0.0) + t.gpu_fraction
        return shares

    def _check_share(self, bind: pb.BindDecision) -> str:
        """A fractional task's GPU: the one the server named (or, from a server that named none,
        the most shared GPU it fits on, else a free one); its shares may not pass one GPU."""
        f = bind.gpu_fraction
        if not 0 < f < 1:
            raise Rejected(f"bind.gpu_fraction: {f} is not a share of one GPU")
        shares = self.gpu_shares(bind.node)
        whole = {d for t in self._holders(bind.node) for d in t.devices}
        gpus = {d.id: d for d in self.nodes[bind.node].devices if d.type == NVIDIA_GPU}
        # (a decision issued before gpu_group existed names the shared GPU in devices)
        gpu, devices = shared_gpu(bind.gpu_group, bind.devices, f)
        if devices:
            raise Rejected(
                f"bind.devices: a fractional task shares one GPU, not {list(bind.devices)}"
            )
        if gpu:
            if gpu not in gpus or not gpus[gpu].healthy or gpu in whole:
                raise Rejected(
                    f"GPU {gpu} cannot be shared on node {bind.node} (held whole, unhealthy or unknown)"
                )
            if shares.get(gpu, 0.0) + f > 1 + MIN_RESOURCE:
                raise Rejected(
                    f"GPU {gpu} on node {bind.node} has {1 - shares.get(gpu, 0.0):g} left, the task asks {f:g}"
                )
            return gpu
        fitting = sorted(
            (-used, gid) for gid, used in shares.items() if used + f <= 1 + MIN_RESOURCE
        )
        if fitting:
            return fitting[0][1]
        free = [d.id for d in self.free_devices(bind.node) if d.type == NVIDIA_GPU]
        if not free:
            raise Rejected(f"node {bind.node} has no GPU with {f:g} left for task {bind.task_id}")
        return free[0]

    def _check_bind(self, bind: pb.BindDecision) -> tuple[dict[str, float], list[str], str]:
        """Validate a bind against the agent's own bookkeeping; returns (request, the devices it
        holds whole, the GPU it shares or "")."""
        if not bind.task_id:
            raise Rejected("bind.task_id is empty")
        if bind.node not in self.nodes:
            raise Rejected(f"unknown node {bind.node!r} (not in agent {self.name}'s inventory)")
        if self.nodes[bind.node].unschedulable:
            raise Rejected(f"node {bind.node} is cordoned")
        if bind.task_id in self.live:
            where = self.live[bind.task_id].node
            raise Rejected(f"task {bind.task_id} is already running on {where}")
        if bind.task_id in self._starting:
            raise Rejected(f"task {bind.task_id} is already being started")
        try:
            request = parse_resources(dict(bind.request.quantities))
        except QuantityError as exc:
            raise Rejected(f"bind.request.{exc}") from None
        free = self.free(bind.node)
        short = [
            f"{res} (requested {format_resources({res: want})[res]}, "
            f"free {format_resources({res: max(free.get(res, 0.0), 0.0)})[res]})"
            for res, want in sorted(request.items())
            if want > free.get(res, 0.0) + MIN_RESOURCE
        ]
        if short:
            raise Rejected(
                f"node {bind.node} cannot fit task {bind.task_id}: insufficient " + ", ".join(short)
            )
        if bind.gpu_fraction:
            return request, [], self._check_share(bind)
        free_devs = {d.id: d for d in self.free_devices(bind.node)}
        if bind.devices:
            bad = [d for d in bind.devices if d not in free_devs]
            if bad:
                raise Rejected(
                    f"devices {bad} are not free on node {bind.node} (held, unhealthy or unknown)"
                )
            return request, list(bind.devices), ""
        # A server that chose no ids (an older one): the lowest free ids of each device resource.
        chosen: list[str] = []
        for res, count in device_needs(request).items():
            ids = [d.id for d in free_devs.values() if d.type == res][:count]
            if len(ids) < count:
                raise Rejected(
                    f"node {bind.node} has {len(ids)} free {res} devices, the task needs {count}"
                )
            chosen += ids
        return request, chosen, ""

    # -- Backend protocol ---------------------------------------------------------------------

    async def list_nodes(self) -> list[pb.Node]:
        return [n.to_proto(self.name) for n in self.nodes.values()]

    async def list_tasks(self) -> list[pb.BackendTask]:
        self._expire_ended()
        tasks = [
            pb.BackendTask(
                task_id=t.task_id,
                node=t.node,
                request=pb.ResourceList(quantities=format_resources(t.request)),
                status=pb.TASK_STATUS_RUNNING,
                devices=t.devices,
                gpu_fraction=t.gpu_fraction,
                gpu_group=t.gpu_group,
            )
            for t in self.live.values()
            if not t.evicted and t.node in self.nodes  # a snapshot may only name its own nodes
        ]
        tasks += [
            pb.BackendTask(task_id=e.task_id, node=e.node, status=e.status)
            for e in self.ended.values()
            if e.node in self.nodes and e.task_id not in self.live
        ]
        return tasks

    async def apply_bind(self, decision: pb.Decision) -> Outcome:
        """One bind: a burst of one (raises :class:`Rejected` when it is refused)."""
        outcome = (await self.apply_batch([decision]))[0]
        if not outcome.applied:
            raise Rejected(outcome.reason)
        return outcome

    async def apply_batch(self, decisions: list[pb.Decision]) -> list[Outcome]:
        """A burst of decisions in order. Consecutive binds are checked one by one (each reserving
        its share of the node), a job's binds among them are kept all or none, their intent is
        saved, then they are started; an evict is applied in its place in the burst."""
        self._note_server()
        outcomes: list[Outcome] = []
        try:
            for binds, run in itertools.groupby(
                decisions, key=lambda d: d.WhichOneof("action") == "bind"
            ):
                if binds:
                    outcomes += await self._bind_run(list(run))
                else:
                    for decision in run:
                        outcome = await self._apply_rejecting(decision)
                        self._remember(decision.id, _task_of(decision), outcome)
                        outcomes.append(outcome)
        finally:
            self._save()
        return outcomes

    async def recall_outcomes(self, decisions: list[pb.Decision]) -> list[Outcome | None]:
        """What became of decisions the runtime's ledger holds in doubt (an agent died while
        applying them): the recorded outcome, or None for one this agent never applied."""
        self._note_server()
        answers: list[Outcome | None] = []
        for decision in decisions:
            known = self.decisions.get(decision.id)
            if known is None or known[0] != _task_of(decision):
                answers.append(None)
            else:
                answers.append(Outcome(known[1], known[2]))
        return answers

    async def _apply_rejecting(self, decision: pb.Decision) -> Outcome:
        action = decision.WhichOneof("action")
        if action != "evict":
            return Outcome.reject(f"unknown decision action {action!r}")
        try:
            return await self.apply_evict(decision)
        except Rejected as exc:
            return Outcome.reject(str(exc))

    async def _bind_run(self, decisions: list[pb.Decision]) -> list[Outcome]:
        """Consecutive binds: check and reserve each, keep each job's binds all or none, record
        the intent of all in one write, start them; a gang whose member fails to start is rolled
        back (its started members killed, every bind of it rejected)."""
        outcomes: list[Outcome | None] = [None] * len(decisions)
        reserved: dict[int, LiveTask] = {}
        for k, decision in enumerate(decisions):
            try:
                reserved[k] = self._reserve(decision)
            except Rejected as exc:
                outcomes[k] = Outcome.reject(str(exc))
        jobs = _indices_by_job(decisions)
        for job, ks in jobs.items():
            refused = next((k for k in ks if outcomes[k] is not None), None)
            if refused is None or len(ks) == 1:
                continue
            first_refusal = outcomes[refused]
            assert first_refusal is not None  # picked above for having an outcome
            why = (
                f"gang {job}: task {_task_of(decisions[refused])} was rejected "
                f"({first_refusal.reason}), so none of its {len(ks)} binds is applied"
            )
            for k in ks:
                if k in reserved:
                    self._unreserve(reserved.pop(k))
                    outcomes[k] = Outcome.reject(why)
        if reserved:
            for task in reserved.values():
                self._prepare_files(task)
                self._remember(task.decision_id, task.task_id, Outcome(True, "being started"))
            self._save()  # the intent of every gang here, in one write, before any process starts
            started: dict[int, ChildProcess] = {}
            failed: dict[str, str] = {}  # job -> why one of its tasks did not start
            for k, task in reserved.items():
                if task.job_id in failed:
                    continue
                try:
                    started[k] = self._spawn(task)
                except Rejected as exc:
                    failed[task.job_id] = str(exc)
            for job, why in failed.items():
                ks = [k for k in jobs[job] if k in reserved]
                await self._roll_back(
                    [reserved[k] for k in ks],
                    {reserved[k].task_id: started[k] for k in ks if k in started},
                )
                reason = (
                    why
                    if len(ks) == 1
                    else f"gang {job}: {why}; none of its {len(ks)} tasks was started"
                )
                for k in ks:
                    outcomes[k] = Outcome.reject(reason)
            for k, process in started.items():
                task = reserved[k]
                if task.job_id not in failed:
                    self._go_live(task, process)
                    outcomes[k] = Outcome(True, f"started pid {task.pid}")
        result = [o if o is not None else Outcome.reject("not started") for o in outcomes]
        for decision, outcome in zip(decisions, result, strict=True):
            self._remember(decision.id, decision.bind.task_id, outcome)
        return result

    def _reserve(self, decision: pb.Decision) -> LiveTask:
        """Check a bind and hold its share of the node until it is started (or fails to)."""
        bind = decision.bind
        request, devices, gpu_group = self._check_bind(bind)
        task = LiveTask(
            task_id=bind.task_id,
            job_id=bind.job_id,
            node=bind.node,
            request=request,
            devices=devices,
            decision_id=decision.id,
            pid=0,
            start_ticks=0,
            gpu_fraction=bind.gpu_fraction,
            gpu_group=gpu_group,
            cycle_id=decision.cycle_id,
            argv=list(bind.command) or ["sleep", seconds_arg(bind.duration_seconds)],
            env=dict(bind.env),
            time_limit=bind.time_limit_seconds,
        )
        self._starting[task.task_id] = task
        self._hold(task)
        return task

    def _unreserve(self, task: LiveTask) -> None:
        if self._starting.get(task.task_id) is task:
            del self._starting[task.task_id]
        self._release(task)

    def _prepare_files(self, task: LiveTask) -> None:
        """Name the task's log and exit-code files and remove what an earlier run of the same task
        left there (before the intent is recorded: a restart then reads only this run's files)."""
        stem = file_stem(task.task_id)
        task.log_file = str(self.log_dir / f"{stem}.log")
        Path(task.log_file).unlink(missing_ok=True)  # a task bound again starts a fresh log
        if self.state_dir:
            task.exit_file = str(self.state_dir / "tasks" / f"{stem}.exit")
            Path(task.exit_file).unlink(missing_ok=True)

    def _spawn(self, task: LiveTask) -> ChildProcess:
        """Start a reserved task's process (its pid and start time go into ``task``)."""
        argv = list(task.argv)
        env = dict(os.environ)
        env.update(task.env)  # the bind's (an array element's index); Muster's own below win
        env.update(
            MUSTER_TASK_ID=task.task_id,
            MUSTER_JOB_ID=task.job_id,
            MUSTER_NODE=task.node,
            MUSTER_AGENT=self.name,
            MUSTER_AGENT_INSTANCE=self.instance,
            MUSTER_DECISION_ID=str(task.decision_id),
            MUSTER_CYCLE_ID=str(task.cycle_id),
        )
        # The task sees the devices it holds whole and the GPU it shares alike.
        handed = [*task.devices, task.gpu_group] if task.gpu_group else task.devices
        if handed:
            known = {d.id: d for d in self.nodes[task.node].devices}
            env.update(visible_devices_env([known[d] for d in handed if d in known]))
            env["MUSTER_DEVICES"] = ",".join(handed)
        if task.exit_file:
            env["MUSTER_EXIT_FILE"] = task.exit_file
            argv = ["/bin/sh", "-c", EXIT_WRAPPER, "muster-task", *argv]
        stdout: Any = sys.stderr
        try:
            if not os.environ.get("MUSTER_AGENT_TASK_OUTPUT"):
                stdout = os.fdopen(
                    os.open(task.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab"
                )
            # Not an asyncio subprocess: with --state-dir the task must outlive the agent, and
            # asyncio's subprocess transport kills a running child when it is closed or collected
            # (with asyncio's pidfd watcher the restart test found the tasks' wrappers gone).
            process = ChildProcess.start(
                argv, stdin=None, stdout=stdout, stderr=stdout, env=env, start_new_session=True
            )
        except OSError as exc:
            raise Rejected(f"cannot start task {task.task_id}: {exc.strerror or exc}") from None
        finally:
            if stdout is not sys.stderr:
                stdout.close()
        task.pid, task.start_ticks = process.pid, start_ticks(process.pid)
        task.started_at = time.time()
        log.info("task started", task=task.task_id, node=task.node, pid=process.pid, argv=argv[-3:])
        return process

    def _go_live(self, task: LiveTask, process: ChildProcess) -> None:
        """A started task becomes live (its reservation already holds its share of the node)."""
        if self._starting.get(task.task_id) is task:
            del self._starting[task.task_id]
        self._add_live(task)
        self.ended.pop(task.task_id, None)
        self._processes[task.task_id] = process
        if not os.environ.get("MUSTER_AGENT_TASK_OUTPUT"):
            self._log_files[task.task_id] = Path(task.log_file)
            self._log_offsets[task.task_id] = 0
        self._report(task.task_id, pb.TASK_STATUS_RUNNING, task.node, f"pid {task.pid}")
        assert self._tg is not None, "FakeAgent.run() must be running"
        self._tg.start_soon(self._watch_child, task, process)
        if task.time_limit:
            self._tg.start_soon(self._enforce_time_limit, task)

    async def _roll_back(self, tasks: list[LiveTask], started: dict[str, ChildProcess]) -> None:
        """Undo a gang that could not be started whole: kill the members that did start (nothing
        is reported for them, as after an eviction) and free every member's reservation.
        ``started``: task id -> process of the members that were started."""
        for task in tasks:
            process = started.get(task.task_id)
            if process is not None:
                task.evicted = True
                self._processes[task.task_id] = process
                await self._kill(task)
                self._processes.pop(task.task_id, None)
            self._unreserve(task)
        log.warning("gang rolled back", job=tasks[0].job_id, tasks=[t.task_id for t in tasks])

    async def apply_evict(self, decision: pb.Decision) -> Outcome:
        evict = decision.evict
        task = self.live.get(evict.task_id)
        if task is None:
            return Outcome(True, f"task {evict.task_id} is not running")
        task.evicted = True
        how = await self._kill(task)
        self._forget(task)
        self._save()
        log.info("task evicted", task=task.task_id, node=task.node, reason=evict.reason, how=how)
        return Outcome(True, f"killed pid {task.pid} ({how})")

    def _remember(self, decision_id: int, task_id: str, outcome: Outcome) -> None:
        self.decisions[decision_id] = (task_id, outcome.applied, outcome.reason)
        self.decisions.move_to_end(decision_id)
        while len(self.decisions) > _DECISIONS_MAX:
            self.decisions.popitem(last=False)

    def _note_server(self) -> None:
        """Decision ids are per server identity: forget the outcomes of another server's."""
        current = getattr(self.runtime, "server_id", "") or ""
        if current and current != self.server_id:
            if self.server_id:
                self.decisions.clear()
            self.server_id = current

    # -- processes ----------------------------------------------------------------------------

    async def _kill(self, task: LiveTask) -> str:
        """SIGTERM the task's process group, SIGKILL after the grace period. Returns what it took."""
        process = self._processes.get(task.task_id)
        if not signal_group(task.pid, signal.SIGTERM):
            return "already gone"
        if await self._wait_gone(task, process, self.kill_grace):
            return "SIGTERM"
        signal_group(task.pid, signal.SIGKILL)
        await self._wait_gone(task, process, 5.0)
        return "SIGKILL"

    async def _wait_gone(
        self, task: LiveTask, process: ChildProcess | None, timeout: float
    ) -> bool:
        with anyio.move_on_after(timeout):
            if process is not None:
                await process.wait()
            else:
                while alive(task.pid, task.start_ticks):
                    await anyio.sleep(0.05)
            # The group may outlive its leader (a shell's children): wait for all of it.
            while group_alive(task.pid):
                await anyio.sleep(0.05)
            return True
        return False

    async def _enforce_time_limit(self, task: LiveTask) -> None:
        """End a task at its time limit, counted from its start (Slurm's ``--time``): its process
        group gets SIGTERM, SIGKILL after ``kill_grace``, and its watcher reports it Failed with
        ``TimeLimit: time limit 2m reached``."""
        if not task.started_at:  # adopted after a crash before its start was recorded
            task.started_at = time.time()
        await anyio.sleep(max(0.0, task.started_at + task.time_limit - time.time()))
        if task.evicted or self.live.get(task.task_id) is not task:
            return  # ended or evicted meanwhile
        if not alive(task.pid, task.start_ticks):
            return  # it ended just now: its watcher reports how
        task.timed_out = True
        self._save()
        log.info(
            "task reached its time limit",
            task=task.task_id,
            node=task.node,
            limit=format_time_limit(task.time_limit),
        )
        await self._kill(task)

    async def _watch_child(self, task: LiveTask, process: ChildProcess) -> None:
        code = await process.wait()
        self._finish(task, code)

    async def _watch_adopted(self, task: LiveTask) -> None:
        while alive(task.pid, task.start_ticks):
            await anyio.sleep(0.2)
        code = read_exit_file(task.exit_file)
        self._finish(task, code if code is not None else -1, lost=code is None)

    def _finish(self, task: LiveTask, code: int, *, lost: bool = False) -> None:
        """A task ended: live -> ended in one state write."""
        if task.evicted or self.live.get(task.task_id) is not task:
            return  # the evict path reports (through its ack) and frees
        if task.timed_out:  # whatever its exit status: the kill's
            status, message = pb.TASK_STATUS_FAILED, time_limit_message(task.time_limit)
        elif lost:
            status, message = pb.TASK_STATUS_FAILED, "process lost while the agent was down"
        elif code == 0:
            status, message = pb.TASK_STATUS_SUCCEEDED, "exit code 0"
        elif code < 0:
            status, message = pb.TASK_STATUS_FAILED, f"killed by signal {-code}"
        else:
            status, message = pb.TASK_STATUS_FAILED, f"exit code {code}"
        self._forget(task)
        self.ended[task.task_id] = EndedTask(task.task_id, task.node, status, code, message)
        self._save()
        self._report(task.task_id, status, task.node, message, exit_code=code)
        log.info(
            "task ended",
            task=task.task_id,
            node=task.node,
            status=pb.TaskStatus.Name(status),
            code=code,
        )

    async def _ship_logs(self, interval: float = 0.5) -> None:
        while True:
            self.ship_logs()
            await anyio.sleep(interval)

    def ship_logs(self, per_round: int = 256 * 1024) -> None:
        """Send each task's new output to the server; once a task ended and its log is read to
        the end, say so (eof) and stop following it."""
        if self.runtime is None:
            return
        for task_id, offset in list(self._log_offsets.items()):
            path = self._log_files.get(task_id) or self.log_dir / f"{file_stem(task_id)}.log"
            ended = task_id not in self.live
            data = b""
            try:
                if path.stat().st_size > offset:  # most rounds most tasks wrote nothing: no read
                    with open(path, "rb") as f:
                        f.seek(offset)
                        data = f.read(per_round)
            except OSError:
                pass
            done = ended and len(data) < per_round
            if data or done:
                self.runtime.send_task_log(task_id, data, eof=done)
                self._log_offsets[task_id] = offset + len(data)
            if done:
                del self._log_offsets[task_id]
                self._log_files.pop(task_id, None)

    def _forget(self, task: LiveTask) -> None:
        """Drop a task from memory (the caller saves the state)."""
        self.live.pop(task.task_id, None)
        self._release(task)
        self._processes.pop(task.task_id, None)

    def _report(
        self, task_id: str, status: pb.TaskStatus, node: str, message: str, exit_code: int = 0
    ) -> None:
        if self.runtime is not None:
            self.runtime.report_task_status(
                task_id, status, node=node, message=message, exit_code=exit_code
            )

    def _expire_ended(self) -> None:
        horizon = time.time() - _ENDED_TTL
        for task_id in [k for k, e in self.ended.items() if e.ended_at < horizon]:
            del self.ended[task_id]
        while len(self.ended) > _ENDED_MAX:
            self.ended.pop(next(iter(self.ended)))

    # -- state dir ----------------------------------------------------------------------------

    def _save(self) -> None:
        """Write the whole task state in one atomic, fsynced write (0600)."""
        if not self.state_dir:
            return
        data = {
            "version": _STATE_VERSION,
            "server_id": self.server_id,
            "live": [asdict(t) for t in self.live.values()],
            "starting": [asdict(t) for t in self._starting.values()],
            "ended": [asdict(e) for e in self.ended.values()],
            "decisions": [[k, *v] for k, v in self.decisions.items()],
        }
        write_private(self.state_dir / "tasks.json", json.dumps(data).encode())

    def _adopt(self) -> tuple[list[LiveTask], list[LiveTask]]:
        """Take over tasks of a previous agent run recorded in the state dir.

        Returns (still running, ended while the agent was away). Binds that run was starting
        are reserved again (``_starting``) for :meth:`_resolve_intents`.
        """
        running: list[LiveTask] = []
        gone: list[LiveTask] = []
        if not self.state_dir or not (self.state_dir / "tasks.json").exists():
            return running, gone
        try:
            data = json.loads((self.state_dir / "tasks.json").read_text())
            ended = [EndedTask(**raw) for raw in data.get("ended", [])]
            live = [LiveTask(**raw) for raw in data.get("live", [])]
            starting = [LiveTask(**raw) for raw in data.get("starting", [])]
            decisions = [
                (int(k), str(t), bool(a), str(r)) for k, t, a, r in data.get("decisions", [])
            ]
        except (OSError, ValueError, TypeError) as exc:
            log.warning("task state unreadable, ignoring", error=str(exc))
            return running, gone
        self.server_id = str(data.get("server_id", ""))
        for record in ended:
            self.ended[record.task_id] = record
        for decision_id, task_id, applied, reason in decisions:
            self.decisions[decision_id] = (task_id, applied, reason)
        for task in live + starting:
            if not task.log_file:  # recorded by an agent that named files with legacy_file_stem
                task.log_file = str(self.log_dir / f"{legacy_file_stem(task.task_id)}.log")
            # Recorded before gpu_group was: a fractional task's shared GPU is in devices.
            task.gpu_group, task.devices = shared_gpu(
                task.gpu_group, task.devices, task.gpu_fraction
            )
        for task in starting:
            self._starting[task.task_id] = task
            self._hold(task)
        for task in live:
            if task.evicted:
                continue
            self._add_live(task)
            if alive(task.pid, task.start_ticks):
                running.append(task)
                log.info("adopted running task", task=task.task_id, node=task.node, pid=task.pid)
            else:
                gone.append(task)
        return running, gone

    def _resolve_intents(self) -> tuple[list[LiveTask], list[LiveTask]]:
        """Binds a crashed run recorded as being started: each one's process is found by its
        environment (this instance, its decision id) and adopted, or it ended meanwhile (its exit
        file says so), or it never started (left reserved in ``_starting``).

        Returns (running, ended) like :meth:`_adopt`; both are live again."""
        running: list[LiveTask] = []
        gone: list[LiveTask] = []
        if not self._starting:
            return running, gone
        groups = {
            (env.get("MUSTER_TASK_ID", ""), env.get("MUSTER_DECISION_ID", "")): pgid
            for pgid, env in tagged_group_envs("MUSTER_AGENT_INSTANCE", self.instance).items()
        }
        for task in list(self._starting.values()):
            pgid = groups.get((task.task_id, str(task.decision_id)))
            code = read_exit_file(task.exit_file)
            if pgid is None and code is None:
                continue  # never started
            del self._starting[task.task_id]
            self._add_live(task)
            how = "ended"
            if pgid is not None and alive(pgid, 0):
                task.pid, task.start_ticks = pgid, start_ticks(pgid)
                running.append(task)
                how = f"running, pid {pgid}"
            else:  # ended (its exit file says how), or its leader is gone and the code with it
                task.pid = 0
                gone.append(task)
            self._remember(
                task.decision_id,
                task.task_id,
                Outcome(True, f"started before an agent restart ({how})"),
            )
            log.info("bind in progress at a crash had started", task=task.task_id, state=how)
        return running, gone

    async def _complete_gangs(self) -> None:
        """Start the binds a crash left unstarted (the rest of their gang is running or ended).
        A gang that cannot be completed (its node left the inventory, a start fails) is rolled
        back: members still running are killed unreported and every unfinished member's bind is
        recorded rejected, so the server, which saw none of it in the snapshot, binds the gang
        anew; a member that already ended is reported as it ended."""
        for job, tasks in _tasks_by_job(list(self._starting.values())).items():
            why = next(
                (
                    f"node {t.node} is no longer in the inventory"
                    for t in tasks
                    if t.node not in self.nodes
                ),
                "",
            )
            started: list[tuple[LiveTask, ChildProcess]] = []
            if not why:
                for task in tasks:
                    try:
                        started.append((task, self._spawn(task)))
                    except Rejected as exc:
                        why = str(exc)
                        break
            if not why:
                for task, process in started:
                    self._go_live(task, process)
                    self._remember(
                        task.decision_id,
                        task.task_id,
                        Outcome(
                            True, f"started pid {task.pid} (after an agent restart, with its gang)"
                        ),
                    )
                log.info(
                    "gang completed after a restart", job=job, started=[t.task_id for t in tasks]
                )
                continue
            cycle = tasks[0].cycle_id
            members = [t for t in self.live.values() if t.job_id == job and t.cycle_id == cycle]
            for task in members:
                task.evicted = True
                await self._kill(task)
                self._forget(task)
            await self._roll_back(tasks, {t.task_id: p for t, p in started})
            reason = f"gang {job} could not be completed after an agent restart: {why}"
            for task in [*members, *tasks]:
                self._remember(task.decision_id, task.task_id, Outcome.reject(reason))
            log.warning("gang rolled back after a restart", job=job, why=why)
        self._save()

    # -- inventory ----------------------------------------------------------------------------

    async def _watch_inventory(self, interval: float = 1.0) -> None:
        if not self.inventory_path:
            return
        path = Path(self.inventory_path)
        last = mtime(path)
        while True:
            await anyio.sleep(interval)
            now = mtime(path)
            if now == last:
                continue
            last = now
            try:
                nodes = {n.name: n for n in load_inventory(path)}
            except InventoryError as exc:
                log.warning("inventory change ignored", error=str(exc))
                continue
            self._apply_inventory(nodes)

    def _apply_inventory(self, nodes: dict[str, InventoryNode]) -> None:
        for name in [n for n in self.nodes if n not in nodes]:
            del self.nodes[name]
            if self.runtime:
                self.runtime.remove_node(name)
            log.info("node removed", node=name)
        for name, node in nodes.items():
            if name not in self.nodes or self.nodes[name] != node:
                self.nodes[name] = node
                if self.runtime:
                    self.runtime.upsert_node(node.to_proto(self.name))
                log.info("node upserted", node=name)

    # -- run ----------------------------------------------------------------------------------

    async def run(self, runtime: BackendRuntime) -> None:
        """Serve until the runtime stops; on exit kill tasks unless a state dir keeps them."""
        self.runtime = runtime
        self.instance = f"{self.name}@{runtime.server}"
        running, gone = self._adopt()
        more_running, more_gone = self._resolve_intents()
        running += more_running
        gone += more_gone
        await self._kill_orphans({task.pid for task in running})
        for task in gone:  # reported before the first sync is even attempted (queued deltas)
            code = read_exit_file(task.exit_file)
            self._finish(task, code if code is not None else -1, lost=code is None)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                await self._complete_gangs()  # before the first sync: the snapshot shows them
                for task in running:
                    tg.start_soon(self._watch_adopted, task)
                    if task.time_limit:  # its deadline still counts from its first start
                        tg.start_soon(self._enforce_time_limit, task)
                    # Follow an adopted task's output from here on (what came before was sent).
                    log_path = Path(task.log_file)
                    self._log_files[task.task_id] = log_path
                    self._log_offsets[task.task_id] = (
                        log_path.stat().st_size if log_path.exists() else 0
                    )
                tg.start_soon(self._watch_inventory)
                tg.start_soon(self._ship_logs)
                await runtime.run()
                tg.cancel_scope.cancel()
        finally:
            self._tg = None
            with anyio.CancelScope(shield=True):
                await self._shutdown()

    async def _kill_orphans(self, adopted: set[int]) -> None:
        """Kill tasks of an earlier run of this agent that nobody adopted (it was killed without a
        state dir, or died between starting a task and recording it): the server will bind them
        again, and the old copy must be gone first."""
        orphans = {
            pgid: task
            for pgid, task in tagged_groups("MUSTER_AGENT_INSTANCE", self.instance).items()
            if pgid not in adopted
        }
        for pgid, task_id in orphans.items():
            log.warning("killing an orphaned task of an earlier agent run", task=task_id, pgid=pgid)
            signal_group(pgid, signal.SIGTERM)
        with anyio.move_on_after(self.kill_grace):
            while any(group_alive(pgid) for pgid in orphans):
                await anyio.sleep(0.05)
        for pgid in orphans:
            if group_alive(pgid):
                signal_group(pgid, signal.SIGKILL)
        with anyio.move_on_after(5.0):
            while any(group_alive(pgid) for pgid in orphans):
                await anyio.sleep(0.05)

    async def _shutdown(self) -> None:
        if self.state_dir:
            self._save()
            log.info("agent stopped; tasks keep running", tasks=len(self.live))
            return
        for task in list(self.live.values()):
            task.evicted = True
            await self._kill(task)
            self._forget(task)
        shutil.rmtree(self.log_dir, ignore_errors=True)  # this run's logs: its tasks are gone
        log.info("agent stopped; tasks killed")


def _task_of(decision: pb.Decision) -> str:
    action = decision.WhichOneof("action")
    return getattr(decision, action).task_id if action else ""


def _indices_by_job(decisions: list[pb.Decision]) -> dict[str, list[int]]:
    """Positions of a run's binds per job (a gang), in order."""
    position = {id(d): k for k, d in enumerate(decisions)}
    return {job: [position[id(d)] for d in ds] for job, ds in group_by_job(decisions).items()}


def _tasks_by_job(tasks: Iterable[LiveTask]) -> dict[str, list[LiveTask]]:
    groups: dict[str, list[LiveTask]] = {}
    for task in tasks:
        groups.setdefault(task.job_id, []).append(task)
    return groups
