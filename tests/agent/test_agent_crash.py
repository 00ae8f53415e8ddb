"""``muster-agent --state-dir`` killed (SIGKILL) at chosen moments, then restarted on the same state
dir against the in-test server: nothing ends up lost, run twice, or half a gang.

A kill is simulated in-process and deterministically: at the chosen point (right after a process
was spawned, after a state save, after a ledger write) :class:`Crash` raises :class:`Killed`, a
``BaseException`` that unwinds the whole agent, and from then on the dead agent writes nothing more
(its state and ledger writes are no-ops) and the server hears nothing more from it. Its task
processes, started in their own session, keep running, as they would after a real SIGKILL. Every
task appends a line to a file when it starts, so starts are counted; tasks wait for a gate file,
never for a sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from urllib.parse import unquote

import anyio
import grpc
import pytest
from muster_fake_server import FakeScheduler, FakeServerHandle, bind, eventually

from adapters.agent.agent import FakeAgent
from adapters.agent.inventory import parse_inventory
from adapters.agent.process import file_stem, tagged_groups
from adapters.children import ChildProcess
from adapters.runtime import BackendRuntime, FileDecisionLedger
from muster.v1 import muster_pb2 as pb

INVENTORY = "nodes:\n  - {name: n1, cpu: 8}\n  - {name: n2, cpu: 8}\n"
ONLY_N2 = "nodes:\n  - {name: n2, cpu: 8}\n"


class Killed(BaseException):
    """The simulated SIGKILL of an in-process agent."""


class Crash:
    """Kills an agent at a chosen point: once :meth:`kill` ran, the agent's state and ledger writes
    do nothing and the server refuses what it sends (a dead process writes and sends nothing)."""

    def __init__(self, agent: FakeAgent, ledger: FileDecisionLedger, server: Scheduler) -> None:
        self.dead = False
        self.server = server
        self.after_save: Callable[[], bool] | None = None  # kill right after a save when true
        self.after_flush: Callable[[], bool] | None = (
            None  # kill right after a ledger flush when true
        )
        save, flush = agent._save, ledger.flush
        begin = getattr(ledger, "begin", None)

        def guarded_save() -> None:
            if self.dead:
                return
            save()
            if self.after_save is not None and self.after_save():
                self.kill()

        def guarded_flush() -> None:
            if self.dead:
                return
            flush()
            if self.after_flush is not None and self.after_flush():
                self.kill()

        agent._save = guarded_save  # type: ignore[method-assign]
        ledger.flush = guarded_flush  # type: ignore[method-assign]
        if begin is not None:
            ledger.begin = lambda ids: None if self.dead else begin(ids)  # type: ignore[method-assign]

    def kill(self) -> None:
        self.dead = True
        self.server.deaf = True
        raise Killed


class Scheduler(FakeScheduler):
    """The fake server, which can stop hearing acks and deltas (from an agent that died)."""

    deaf = False

    async def AckDecisions(self, request, context):
        if self.deaf:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the sender is dead")
        return await super().AckDecisions(request, context)

    async def SendDeltas(self, request, context):
        if self.deaf:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the sender is dead")
        return await super().SendDeltas(request, context)

    async def push_all(self, decisions: list[pb.Decision]) -> None:
        """Several decisions at once (one batch on the stream: one burst for the agent)."""
        async with self._new:
            self.decisions.extend(decisions)
            self._new.notify_all()

    def acks(self, decision_id: int) -> list[pb.DecisionAck]:
        return [a for a in self.rec.acks if a.decision_id == decision_id]

    def statuses(self, task_id: str) -> list[int]:
        return [
            d.task_status.status
            for d in self.rec.deltas
            if d.WhichOneof("change") == "task_status" and d.task_status.task_id == task_id
        ]


class Spawns:
    """Counts task processes started (by any agent of the test); ``after(n)`` runs after the n-th;
    a dead agent (``crash``) starts nothing more."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.after: Callable[[int], None] | None = None
        self.crash: Crash | None = None
        real = ChildProcess.start.__func__  # type: ignore[attr-defined]

        def start(cls, argv, **kwargs):
            if self.crash is not None and self.crash.dead:
                raise Killed
            process = real(cls, argv, **kwargs)
            self.count += 1
            if self.after is not None:
                self.after(self.count)
            return process

        monkeypatch.setattr(ChildProcess, "start", classmethod(start))


class AgentRun:
    """One life of ``muster-agent --state-dir``, in-process, against the fake server."""

    def __init__(self, state: Path, handle: FakeServerHandle, inventory: str = INVENTORY) -> None:
        self.agent = FakeAgent(
            "rack", parse_inventory(inventory), state_dir=str(state), kill_grace=0.5
        )
        # As adapters/agent/main.py wires it.
        self.ledger = FileDecisionLedger(state / "ledger.json")
        self.runtime = BackendRuntime(
            self.agent,
            server=handle.address,
            name="rack",
            ledger=self.ledger,
            backoff_initial=0.05,
            backoff_max=0.2,
            batch_linger=0.2,
        )
        self.crash = Crash(self.agent, self.ledger, handle.servicer)  # type: ignore[arg-type]
        self.killed = False
        self.done = anyio.Event()

    async def serve(self) -> None:
        try:
            await self.agent.run(self.runtime)
        except BaseException as exc:
            if not _a_kill(exc):
                raise
            self.killed = True
        finally:
            self.done.set()

    async def died(self) -> None:
        with anyio.fail_after(10):
            await self.done.wait()
        assert self.killed


def _a_kill(exc: BaseException) -> bool:
    """Whether ``exc`` is a simulated kill (possibly grouped with the cancellations it caused)."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = list(_leaves(exc))
        return any(isinstance(e, Killed) for e in leaves) and all(
            isinstance(e, Killed | anyio.get_cancelled_exc_class()) for e in leaves
        )
    return isinstance(exc, Killed)


def _leaves(group: BaseExceptionGroup) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


def gated(
    task: str, starts: Path, gate: Path, node: str = "n1", *, decision_id: int, job: str
) -> pb.Decision:
    """A bind whose task notes its start in ``starts`` and runs until ``gate`` exists."""
    decision = bind(decision_id, task, node=node, job=job, cpu="1")
    decision.bind.command.extend(
        [
            "sh",
            "-c",
            f'echo "$MUSTER_TASK_ID" >> {starts}; while [ ! -e {gate} ]; do sleep 0.02; done',
        ]
    )
    return decision


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[FakeServerHandle]:
    handle = FakeServerHandle(Scheduler())
    await handle.start()
    yield handle
    await handle.stop()
    (tmp_path / "gate").touch()  # every task of the test ends by itself...
    for pgid in tagged_groups(
        "MUSTER_AGENT_INSTANCE", f"rack@{handle.address}"
    ):  # ...or is made to
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def tasks_alive(handle: FakeServerHandle) -> set[str]:
    return set(tagged_groups("MUSTER_AGENT_INSTANCE", f"rack@{handle.address}").values())


async def test_a_task_that_ends_just_before_a_kill_is_reported_ended_not_lost(
    tmp_path, server, monkeypatch
):
    """The move of a task from running to ended is one state write: a kill right after the first
    write that follows the task's end leaves it recorded as ended."""
    servicer: Scheduler = server.servicer  # type: ignore[assignment]
    state, starts, gate = tmp_path / "state", tmp_path / "starts", tmp_path / "gate"
    spawns = Spawns(monkeypatch)
    async with anyio.create_task_group() as tg:
        first = AgentRun(state, server)
        tg.start_soon(first.serve)
        await servicer.push(gated("j/t-0", starts, gate, decision_id=1, job="j"))
        await eventually(lambda: servicer.acks(1) and lines(starts) == ["j/t-0"])
        first.crash.after_save = lambda: (
            "j/t-0" not in first.agent.live
        )  # the first write after its end
        gate.touch()
        await first.died()

        servicer.deaf = False
        snapshots = len(servicer.rec.snapshots)
        second = AgentRun(state, server)
        tg.start_soon(second.serve)
        await eventually(lambda: len(servicer.rec.snapshots) > snapshots)
        reported = {t.task_id: t.status for t in servicer.rec.snapshots[snapshots].tasks}
        assert reported.get("j/t-0") == pb.TASK_STATUS_SUCCEEDED, reported
        assert lines(starts) == ["j/t-0"]
        assert spawns.count == 1
        second.runtime.stop()


@pytest.mark.parametrize(
    "kill_point", ["after the process started", "after the outcome was recorded"]
)
async def test_a_bind_applied_but_not_acked_is_reacked_after_a_restart_never_rerun(
    tmp_path, server, monkeypatch, kill_point
):
    """Killed after starting a task but before the ack reached the server; the task ends while the
    agent is down. The restarted agent reports it ended, and when the server resends the bind it is
    acknowledged as applied, not started again."""
    servicer: Scheduler = server.servicer  # type: ignore[assignment]
    state, starts, gate = tmp_path / "state", tmp_path / "starts", tmp_path / "gate"
    spawns = Spawns(monkeypatch)
    async with anyio.create_task_group() as tg:
        first = AgentRun(state, server)
        if kill_point == "after the process started":
            spawns.after, spawns.crash = (lambda n: first.crash.kill()), first.crash
        else:
            first.crash.after_flush = lambda: first.ledger.get(1) is not None
        tg.start_soon(first.serve)
        await first.runtime.wait_ready()
        await servicer.push(gated("j/t-0", starts, gate, decision_id=1, job="j"))
        await first.died()
        spawns.after = spawns.crash = None
        assert servicer.acks(1) == []
        assert spawns.count == 1
        await eventually(lambda: lines(starts) == ["j/t-0"])
        gate.touch()
        await eventually(lambda: not tasks_alive(server))  # it ended while no agent ran

        servicer.deaf = False
        second = AgentRun(state, server)
        tg.start_soon(second.serve)
        await eventually(lambda: servicer.acks(1), timeout=5)
        assert all(a.applied for a in servicer.acks(1)), servicer.acks(1)
        await eventually(
            lambda: (
                pb.TASK_STATUS_SUCCEEDED in servicer.statuses("j/t-0")
                or any(
                    t.task_id == "j/t-0" and t.status == pb.TASK_STATUS_SUCCEEDED
                    for t in servicer.rec.snapshots[-1].tasks
                )
            )
        )
        assert spawns.count == 1, "the resent bind was applied again"
        assert "j/t-0" not in second.agent.live
        assert lines(starts) == ["j/t-0"]
        second.runtime.stop()


async def test_a_gang_cut_by_a_kill_is_completed_by_the_restarted_agent(
    tmp_path, server, monkeypatch
):
    """Killed after the first of a gang's three processes started: the gang's intent was recorded
    before any started, so the next agent adopts the one running and starts the other two before it
    even syncs; the resent binds are re-acked. Each task starts exactly once."""
    servicer: Scheduler = server.servicer  # type: ignore[assignment]
    state, starts, gate = tmp_path / "state", tmp_path / "starts", tmp_path / "gate"
    spawns = Spawns(monkeypatch)
    gang = [gated(f"g/w-{i}", starts, gate, decision_id=i + 1, job="g") for i in range(3)]
    async with anyio.create_task_group() as tg:
        first = AgentRun(state, server)
        spawns.after, spawns.crash = (lambda n: first.crash.kill()), first.crash
        tg.start_soon(first.serve)
        await first.runtime.wait_ready()
        await servicer.push_all(gang)
        await first.died()
        spawns.after = spawns.crash = None
        assert spawns.count == 1
        await eventually(lambda: lines(starts) == ["g/w-0"])

        servicer.deaf = False
        snapshots = len(servicer.rec.snapshots)
        second = AgentRun(state, server)
        tg.start_soon(second.serve)
        await eventually(lambda: all(servicer.acks(i) for i in (1, 2, 3)))
        assert all(a.applied for i in (1, 2, 3) for a in servicer.acks(i))
        # All three were running when the restarted agent first reported.
        reported = {t.task_id: t.status for t in servicer.rec.snapshots[snapshots].tasks}
        assert reported == dict.fromkeys(("g/w-0", "g/w-1", "g/w-2"), pb.TASK_STATUS_RUNNING)
        assert sorted(second.agent.live) == ["g/w-0", "g/w-1", "g/w-2"]
        await eventually(lambda: len(lines(starts)) == 3)
        assert sorted(lines(starts)) == ["g/w-0", "g/w-1", "g/w-2"], "a task started twice"
        assert spawns.count == 3
        second.runtime.stop()


async def test_a_gang_that_cannot_be_completed_after_a_kill_is_rolled_back(
    tmp_path, server, monkeypatch
):
    """Same kill, but the node left the inventory meanwhile: the started member is killed, none of
    the gang is reported, and every resent bind of it is rejected (the server binds it anew)."""
    servicer: Scheduler = server.servicer  # type: ignore[assignment]
    state, starts, gate = tmp_path / "state", tmp_path / "starts", tmp_path / "gate"
    spawns = Spawns(monkeypatch)
    gang = [gated(f"g/w-{i}", starts, gate, decision_id=i + 1, job="g") for i in range(3)]
    async with anyio.create_task_group() as tg:
        first = AgentRun(state, server)
        spawns.after, spawns.crash = (lambda n: first.crash.kill()), first.crash
        tg.start_soon(first.serve)
        await first.runtime.wait_ready()
        await servicer.push_all(gang)
        await first.died()
        spawns.after = spawns.crash = None
        await eventually(lambda: tasks_alive(server) == {"g/w-0"})

        servicer.deaf = False
        snapshots = len(servicer.rec.snapshots)
        second = AgentRun(state, server, inventory=ONLY_N2)
        tg.start_soon(second.serve)
        await eventually(lambda: all(servicer.acks(i) for i in (1, 2, 3)))
        assert not any(a.applied for i in (1, 2, 3) for a in servicer.acks(i))
        assert "could not be completed" in servicer.acks(2)[0].reason
        assert list(servicer.rec.snapshots[snapshots].tasks) == []
        assert tasks_alive(server) == set()
        assert second.agent.live == {}
        assert spawns.count == 1
        second.runtime.stop()


async def test_a_jobs_binds_in_a_burst_start_all_or_none(tmp_path, server):
    """A gang member that does not fit keeps its whole gang from starting; another job's gang in
    the same burst starts whole."""
    servicer: Scheduler = server.servicer  # type: ignore[assignment]
    state, starts, gate = tmp_path / "state", tmp_path / "starts", tmp_path / "gate"
    burst = [gated(f"a/w-{i}", starts, gate, decision_id=i + 1, job="a") for i in range(2)]
    too_big = gated("a/w-2", starts, gate, decision_id=3, job="a")
    too_big.bind.request.quantities["cpu"] = "7"  # n1 has 8 CPUs, a/w-0 and a/w-1 take 2
    burst.append(too_big)
    burst += [
        gated(f"b/w-{i}", starts, gate, node="n2", decision_id=i + 4, job="b") for i in range(2)
    ]
    async with anyio.create_task_group() as tg:
        run = AgentRun(state, server)
        tg.start_soon(run.serve)
        await run.runtime.wait_ready()
        await servicer.push_all(burst)
        await eventually(lambda: all(servicer.acks(i) for i in range(1, 6)))
        applied = {i: servicer.acks(i)[0].applied for i in range(1, 6)}
        assert applied == {1: False, 2: False, 3: False, 4: True, 5: True}
        assert "gang a" in servicer.acks(1)[0].reason
        assert "insufficient cpu" in servicer.acks(1)[0].reason
        assert sorted(run.agent.live) == ["b/w-0", "b/w-1"]
        assert run.agent.free("n1")["cpu"] == 8000
        await eventually(lambda: len(lines(starts)) == 2)
        assert sorted(lines(starts)) == ["b/w-0", "b/w-1"]
        run.runtime.stop()


async def test_task_ids_that_used_to_share_files_get_their_own(tmp_path, server):
    """``x/y_z-0`` and ``x_y/z-0`` used to map to one log file and one exit file."""
    assert file_stem("x/y_z-0") != file_stem("x_y/z-0")
    for task_id in ("x/y_z-0", "x_y/z-0", "a b/%2F-0", "é/ü"):
        assert unquote(file_stem(task_id)) == task_id
        assert "/" not in file_stem(task_id)
    long_ids = ["j" * 300 + "/w-0", "j" * 300 + "/w-1"]
    assert len({file_stem(t) for t in long_ids}) == 2
    assert all(len(file_stem(t)) <= 200 for t in long_ids)

    servicer: Scheduler = server.servicer  # type: ignore[assignment]
    state = tmp_path / "state"
    async with anyio.create_task_group() as tg:
        run = AgentRun(state, server)
        tg.start_soon(run.serve)
        await run.runtime.wait_ready()
        first, second = bind(1, "x/y_z-0", job="x"), bind(2, "x_y/z-0", job="x_y")
        first.bind.command.extend(["sh", "-c", 'echo "I am $MUSTER_TASK_ID"; exit 3'])
        second.bind.command.extend(["sh", "-c", 'echo "I am $MUSTER_TASK_ID"; exit 4'])
        await servicer.push_all([first, second])
        await eventually(lambda: not run.agent.live and len(run.agent.ended) == 2)
        files = state / "tasks"
        for task_id, code in (("x/y_z-0", 3), ("x_y/z-0", 4)):
            assert (files / f"{file_stem(task_id)}.log").read_text() == f"I am {task_id}\n"
            assert (files / f"{file_stem(task_id)}.exit").read_text().strip() == str(code)
            assert run.agent.ended[task_id].exit_code == code
        run.runtime.stop()


async def test_state_dir_and_files_are_private_whatever_the_umask(tmp_path, server):
    servicer: Scheduler = server.servicer  # type: ignore[assignment]
    state = tmp_path / "state"
    state.mkdir(mode=0o755)  # made by someone else, too open
    old = os.umask(0o022)
    try:
        async with anyio.create_task_group() as tg:
            run = AgentRun(state, server)
            tg.start_soon(run.serve)
            await run.runtime.wait_ready()
            task = bind(1, "p/w-0", job="p")
            task.bind.command.extend(["sh", "-c", "echo secret"])
            await servicer.push(task)
            await eventually(lambda: servicer.acks(1) and "p/w-0" in run.agent.ended)
            run.runtime.stop()
    finally:
        os.umask(old)
    stem = file_stem("p/w-0")
    paths = [
        state,
        state / "tasks",
        state / "tasks.json",
        state / "ledger.json",
        state / "ledger.json.applying",
        state / "tasks" / f"{stem}.log",
        state / "tasks" / f"{stem}.exit",
    ]
    modes = {
        str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode))
        for p in paths
        if p.exists()
    }
    assert modes == {
        str(p.relative_to(tmp_path)): "0o700" if p.name in ("state", "tasks") else "0o600"
        for p in paths
    }
    assert [p.name for p in state.iterdir() if p.name.endswith(".tmp")] == []  # no temp file left


async def test_state_written_by_the_previous_agent_is_still_adopted(tmp_path):
    """tasks.json of an agent before this format (no intents, no decisions, no file names, the
    lossy file stem): its running task is adopted with its log, its ended task still reported."""
    state = tmp_path / "state"
    (state / "tasks").mkdir(parents=True)
    (state / "tasks" / "j_long-0.log").write_bytes(b"before\n")
    sleeper = ChildProcess.start(["sleep", "30"], start_new_session=True)
    try:
        ticks = int(Path(f"/proc/{sleeper.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        (state / "tasks.json").write_text(
            json.dumps(
                {
                    "live": [
                        {
                            "task_id": "j/long-0",
                            "job_id": "j",
                            "node": "n1",
                            "request": {"cpu": 1000.0},
                            "devices": [],
                            "decision_id": 1,
                            "pid": sleeper.pid,
                            "start_ticks": ticks,
                            "exit_file": str(state / "tasks" / "j_long-0.exit"),
                            "evicted": False,
                            "gpu_fraction": 0.0,
                        }
                    ],
                    "ended": [
                        {
                            "task_id": "j/short-0",
                            "node": "n1",
                            "status": pb.TASK_STATUS_SUCCEEDED,
                            "exit_code": 0,
                            "message": "exit code 0",
                            "ended_at": time.time(),
                        }
                    ],
                }
            )
        )
        agent = FakeAgent("rack", parse_inventory(INVENTORY), state_dir=str(state))
        running, gone = agent._adopt()
        assert [t.task_id for t in running] == ["j/long-0"]
        assert gone == []
        assert running[0].log_file == str(state / "tasks" / "j_long-0.log")
        assert agent.free("n1")["cpu"] == 7000
        assert {t.task_id: t.status for t in await agent.list_tasks()} == {
            "j/long-0": pb.TASK_STATUS_RUNNING,
            "j/short-0": pb.TASK_STATUS_SUCCEEDED,
        }
    finally:
        os.killpg(sleeper.pid, signal.SIGKILL)
        await sleeper.wait()
