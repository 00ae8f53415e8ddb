"""Cycle loop coalescing and failure isolation; store round trip; the muster-server process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import grpc
import pytest
from server_test_helpers import WAIT, gang, node

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.model import CycleResult
from server.service import commands, ingest, snapshot
from server.service.apply import apply
from server.service.loop import ConfigManager, CycleLoop
from server.service.state import ClusterState
from server.service.store import SqliteStore, StoreWriter


class BlockingCore:
    """A core whose first cycle blocks until released, counting calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def update_config(self, config: object) -> None:
        pass

    def run_cycle(self, snapshot, cycle_id: int) -> CycleResult:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            self.release.wait(WAIT)
        return CycleResult(cycle_id)


class FailingCore(BlockingCore):
    def run_cycle(self, snapshot, cycle_id: int) -> CycleResult:
        self.calls += 1
        raise RuntimeError("core bug")


def make_loop(tmp_path: Path, core: object) -> tuple[CycleLoop, ClusterState, SqliteStore]:
    store = SqliteStore(tmp_path / "s.db")
    state = ClusterState()
    # Test doubles of the core live in this process: run them in a thread.
    loop = CycleLoop(
        state,
        StoreWriter(store),
        ConfigManager(),
        period=3600,
        expire_interval=3600,
        worker="thread",
    )
    loop.core = core  # type: ignore[assignment]
    state.on_change = loop.wake
    return loop, state, store


async def test_wakeups_are_coalesced(tmp_path: Path) -> None:
    core = BlockingCore()
    loop, state, store = make_loop(tmp_path, core)
    async with anyio.create_task_group() as tg:
        tg.start_soon(loop.run)
        loop.wake()
        with anyio.fail_after(WAIT):
            await anyio.to_thread.run_sync(core.entered.wait)
        for i in range(100):  # 100 wake-ups while a cycle runs ...
            commands.submit_job(state, gang(f"j{i}", replicas=1))
        core.release.set()
        with anyio.fail_after(WAIT):
            await loop.wait_cycles(2)
        await anyio.sleep(0.1)  # room for (wrong) extra cycles to show up
        tg.cancel_scope.cancel()
    assert core.calls == 2  # ... give exactly one more cycle
    store.close()


class CountingCore(BlockingCore):
    """A core that never blocks, counting calls."""

    def run_cycle(self, snapshot, cycle_id: int) -> CycleResult:
        self.calls += 1
        return CycleResult(cycle_id)


async def test_a_burst_of_changes_between_cycles_makes_one_cycle(tmp_path: Path) -> None:
    """min_interval: wakes that come while no cycle runs, but sooner than the interval after the
    last cycle started, wait and coalesce (without it each would start a cycle of its own)."""
    core = CountingCore()
    loop, state, store = make_loop(tmp_path, core)
    loop.min_interval = 1.0
    async with anyio.create_task_group() as tg:
        tg.start_soon(loop.run)
        with anyio.fail_after(WAIT):
            await loop.next_cycle()
        assert core.calls == 1
        for i in range(20):  # a burst, each submission waking the loop, the last cycle long done
            commands.submit_job(state, gang(f"j{i}", replicas=1))
            await anyio.sleep(0.01)
        assert core.calls == 1  # still inside the interval: nothing started yet
        with anyio.fail_after(WAIT):
            await loop.wait_cycles(1)
        await anyio.sleep(0.2)  # room for (wrong) extra cycles
        tg.cancel_scope.cancel()
    assert core.calls == 2  # the whole burst: one cycle
    store.close()


async def test_a_failing_core_does_not_stop_the_loop(tmp_path: Path) -> None:
    core = FailingCore()
    loop, state, store = make_loop(tmp_path, core)
    async with anyio.create_task_group() as tg:
        tg.start_soon(loop.run)
        with anyio.fail_after(WAIT):
            await loop.next_cycle()
            await loop.next_cycle()
        tg.cancel_scope.cancel()
    assert loop.failures == 2
    assert core.calls == 2
    store.close()


def test_store_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    state = ClusterState()
    ingest.register_backend(
        state, pb.RegisterBackendRequest(name="a", kind="slurm", labels={"site": "x"})
    )
    ingest.sync_snapshot(state, pb.SyncSnapshotRequest(backend="a", nodes=[node("n0")]))
    commands.create_queue(
        state, pb.Queue(name="team", capability=pb.ResourceList(quantities={"cpu": "-1"}))
    )
    commands.submit_job(state, gang("g", replicas=2, queue="team"))
    capture = snapshot.capture(state)
    apply(state, capture, CycleResult(capture.cycle_id, binds={"g/worker-0": "n0"}))
    store = SqliteStore(path)
    store.write(state.commit())
    store.close()

    again = ClusterState()
    store = SqliteStore(path)
    again.restore(store.load())
    assert again.server_id == state.server_id
    assert again.queues["team"].spec.capability == {"cpu": float("inf")}
    rec = again.jobs["g"]
    assert rec.spec == state.jobs["g"].spec
    assert [(t.status.name, t.node) for t in rec.tasks] == [("BINDING", "n0"), ("PENDING", None)]
    assert list(again.decisions.pending) == list(state.decisions.pending)
    assert again.next_cycle_id == state.next_cycle_id
    assert again.decisions.next_id == state.decisions.next_id
    assert again.backends["a"].labels == {"site": "x"}
    assert not again.nodes  # nodes come back with the adapters' re-sync
    states = store.decision_states([1, 99])
    assert states[1][:2] == ("a", "pending")
    assert 99 not in states
    store.close()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_muster_server_process_starts_and_stops_on_sigterm(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "server.service.main",
            "--listen",
            "127.0.0.1:0",
            "--state",
            str(tmp_path / "m.db"),
            "--log-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).parents[2],
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("muster-server listening on 127.0.0.1:"), line + proc.stderr.read()
        address = line.split()[-1]
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SchedulerStub(channel)
            created = stub.SubmitJob(pb.SubmitJobRequest(job=gang("p", replicas=1)), timeout=WAIT)
            assert created.created
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 0
        logs = proc.stderr.read()
        assert '"event": "server.stopped"' in logs
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The job survived the restart of the process.
    store = SqliteStore(tmp_path / "m.db")
    assert [j.id for j in store.load().jobs] == ["p"]
    store.close()


def test_bad_config_file_exits_nonzero(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("actions: [unclosed")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "server.service.main",
            "--listen",
            "127.0.0.1:0",
            "--state",
            str(tmp_path / "m.db"),
            "--config",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=WAIT,
        cwd=Path(__file__).parents[2],
        check=False,
    )
    assert proc.returncode == 2
    assert "--config" in proc.stderr
