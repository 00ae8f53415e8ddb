"""The state file: one server per file (a lock naming its holder), a file deleted or replaced under
a running server refuses writes instead of losing them, a file that is not a Muster state database
is refused at start in one line, and a cycle worker that cannot start says so."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import structlog.testing
from conftest import server_options
from grpc_health.v1 import health_pb2, health_pb2_grpc
from server_test_helpers import WAIT, gang, rpc_error, wait_for

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service import commands
from server.service import main as server_main
from server.service.app import ServerHandle, start_server
from server.service.core_runner import CoreRunner, CoreWorkerStartError
from server.service.state import ClusterState
from server.service.store import SqliteStore, StateFileError, StateFileInUse, StateFileLost

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX locks and signals")


def muster_server(*args: str, timeout: float = WAIT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server.service.main", "--listen", "127.0.0.1:0", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[ServerHandle]:
    handle = await start_server(server_options(tmp_path, cycle_worker="thread"))
    try:
        yield handle
    finally:
        await handle.stop()


# -- one server per state file --------------------------------------------------------------------


async def test_a_second_server_on_the_same_state_file_is_refused_naming_the_holder(
    running: ServerHandle, tmp_path: Path
) -> None:
    state = running.server.options.state
    holder = f"is in use by muster-server pid {os.getpid()} on host {socket.gethostname()} since "

    # Another process: one line, the holder named, exit status 1, no traceback.
    proc = muster_server("--state", state)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"muster-server: state file {state} {holder}"), line
    assert "listening" not in proc.stdout

    # In the same process too (the lock is per open file, not per process).
    with pytest.raises(StateFileInUse, match=f"state file {state} {holder}"):
        await start_server(server_options(tmp_path, cycle_worker="thread"))

    # The refused starts changed nothing: the first server still writes and reads its jobs.
    async with grpc.aio.insecure_channel(running.address) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        assert (
            await stub.SubmitJob(pb.SubmitJobRequest(job=gang("still-mine", replicas=1)))
        ).created
        assert (await stub.GetJob(pb.GetJobRequest(id="still-mine"))).spec.id == "still-mine"


async def test_the_lock_is_released_when_the_server_stops(tmp_path: Path) -> None:
    opts = server_options(tmp_path, cycle_worker="thread")
    first = await start_server(opts)
    lock = Path(opts.state + ".lock")
    assert lock.exists()
    async with grpc.aio.insecure_channel(first.address) as ch:
        await pb_grpc.SchedulerStub(ch).SubmitJob(pb.SubmitJobRequest(job=gang("kept", replicas=1)))
    await first.stop()
    assert not lock.exists()  # a clean stop removes it

    second = await start_server(opts)
    try:
        assert "kept" in second.state.jobs
    finally:
        await second.stop()


def test_a_lock_held_by_a_killed_process_is_free(tmp_path: Path) -> None:
    state = str(tmp_path / "muster.db")
    store = SqliteStore(state)
    cluster = ClusterState()
    commands.submit_job(cluster, gang("before-the-crash", replicas=1))
    store.write(cluster.commit())
    store.close()

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, time
            from server.service.store import SqliteStore
            store = SqliteStore({state!r})
            print("locked", flush=True)
            time.sleep(120)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StateFileInUse, match=f"muster-server pid {holder.pid} on host"):
            SqliteStore(state)
        holder.send_signal(signal.SIGKILL)
        assert holder.wait(timeout=WAIT) == -signal.SIGKILL
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert Path(state + ".lock").exists()  # a killed holder cannot clean up: its file stays ...
    again = SqliteStore(state)  # ... but its lock went with the process
    try:
        assert [j.id for j in again.load().jobs] == ["before-the-crash"]
    finally:
        again.close()
    assert not Path(state + ".lock").exists()


def test_memory_stores_need_no_lock(tmp_path: Path) -> None:
    first, second = SqliteStore(":memory:"), SqliteStore(":memory:")
    first.close()
    second.close()
    assert not list(tmp_path.iterdir())
    assert not Path(":memory:.lock").exists()


# -- a state file deleted or replaced under a running server --------------------------------------


async def test_deleting_the_state_file_while_running_refuses_writes(running: ServerHandle) -> None:
    state = running.server.options.state
    assert running.server.service is not None
    lost: list[StateFileLost] = []
    running.server.service.writer.on_lost = lost.append
    async with grpc.aio.insecure_channel(running.address) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        assert (await stub.SubmitJob(pb.SubmitJobRequest(job=gang("saved", replicas=1)))).created
        with structlog.testing.capture_logs() as logs:
            os.remove(state)
            for attempt in range(2):  # refused, and again: never acknowledged as saved
                err = await rpc_error(
                    stub.SubmitJob(pb.SubmitJobRequest(job=gang("unsaved", replicas=1)))
                )
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, attempt
                assert err.details() == (
                    f"state file {state} was deleted while the server ran: changes can no longer be saved; "
                    "restart the server"
                )
            err = await rpc_error(stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="team"))))
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
            # Reads still answer, from memory.
            assert (await stub.GetJob(pb.GetJobRequest(id="saved"))).spec.id == "saved"

            # The submission woke the cycle loop: its flush found the file gone and it stopped
            # (no decision it could not save).
            async def loop_stopped() -> bool:
                return any(e["event"] == "cycle.stopped" for e in logs)

            await wait_for(loop_stopped, "the cycle loop to stop")
    assert [e["log_level"] for e in logs if e["event"] == "store.state_file_lost"] == [
        "error"
    ]  # once, loudly
    assert len(lost) == 1
    assert not Path(state).exists()  # nothing recreated it behind the refusals


async def test_replacing_the_state_file_while_running_refuses_writes(
    running: ServerHandle, tmp_path: Path
) -> None:
    state = running.server.options.state
    async with grpc.aio.insecure_channel(running.address) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        assert (await stub.SubmitJob(pb.SubmitJobRequest(job=gang("saved", replicas=1)))).created
        other = tmp_path / "other.db"
        shutil.copyfile(state, other)  # e.g. a backup put back under the running server
        os.replace(other, state)
        err = await rpc_error(stub.SubmitJob(pb.SubmitJobRequest(job=gang("unsaved", replicas=1))))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.details().startswith(
            f"state file {state} was replaced by another file while the server ran"
        )
        # Probes see it too: the health service says NOT_SERVING.
        health = health_pb2_grpc.HealthStub(ch)

        async def not_serving() -> bool:
            reply = await health.Check(health_pb2.HealthCheckRequest())
            return bool(reply.status == health_pb2.HealthCheckResponse.NOT_SERVING)

        await wait_for(not_serving, "health to say NOT_SERVING")


def test_a_store_refuses_writes_to_a_deleted_file(tmp_path: Path) -> None:
    path = tmp_path / "muster.db"
    store = SqliteStore(path)
    state = ClusterState()
    commands.submit_job(state, gang("a", replicas=1))
    store.write(state.commit())
    path.unlink()
    commands.submit_job(state, gang("b", replicas=1))
    with pytest.raises(StateFileLost, match="was deleted"):
        store.write(state.commit())
    with pytest.raises(StateFileLost):
        store.check()
    path.write_bytes(b"")  # a new file at the path is still not the one opened
    with pytest.raises(StateFileLost):
        store.check()
    store.close()


# -- start-up: a file that is not a Muster state database -----------------------------------------


def _random(path: Path) -> None:
    path.write_bytes(os.urandom(64 * 1024))


def _text(path: Path) -> None:
    path.write_text("job: not a database\n" * 100)


def _foreign_sqlite(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    db.execute("INSERT INTO users VALUES (1, 'ann')")
    db.commit()
    db.close()


def _foreign_jobs_table(
    path: Path,
) -> None:  # a table with one of Muster's names, and others' columns
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, cron TEXT)")
    db.commit()
    db.close()


def _truncated(path: Path) -> None:
    store = SqliteStore(path)
    state = ClusterState()
    for i in range(200):
        commands.submit_job(state, gang(f"job-{i}", replicas=4, annotations={"note": "x" * 200}))
    store.write(state.commit())
    store.close()  # checkpointed: everything is in the main file
    os.truncate(path, path.stat().st_size // 2)


CORRUPT = {
    "random-bytes": (_random, "sqlite: file is not a database"),
    "text-file": (_text, "sqlite: file is not a database"),
    "foreign-sqlite": (_foreign_sqlite, "it has tables Muster does not use: users"),
    "foreign-jobs-table": (
        _foreign_jobs_table,
        "its jobs table has no creation_index, spec, status column",
    ),
    "truncated": (_truncated, "sqlite: database disk image is malformed"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_a_file_that_is_not_a_muster_state_database_is_refused_in_one_line(
    tmp_path: Path, kind: str
) -> None:
    make, why = CORRUPT[kind]
    path = tmp_path / "corrupt.db"
    make(path)
    before = path.read_bytes()
    proc = muster_server("--state", str(path))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "listening" not in proc.stdout
    assert proc.stderr.strip().splitlines() == [
        f"muster-server: state file {path} is not a Muster state database ({why})"
    ]
    assert path.read_bytes() == before  # refused before anything was written to it
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "corrupt.db"
    ]  # no lock file, no -wal left


def test_a_store_written_by_muster_is_accepted_and_an_empty_file_is_a_new_store(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    SqliteStore(empty).close()
    _random(tmp_path / "r.db")
    with pytest.raises(StateFileError, match="not a Muster state database"):
        SqliteStore(tmp_path / "r.db")
    assert not Path(f"{tmp_path / 'r.db'}.lock").exists()  # the refused open let go of its lock
    SqliteStore(empty).close()  # and the good one reopens


# -- a cycle worker that cannot start -------------------------------------------------------------


async def test_a_worker_that_cannot_be_spawned_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        CoreRunner, "command", ("/nonexistent/python3", "-m", "server.service.core_runner")
    )
    runner = CoreRunner("process")
    with pytest.raises(
        CoreWorkerStartError,
        match=r"^scheduling worker process failed to start: "
        r"/nonexistent/python3: .*No such file",
    ):
        await runner.start()


async def test_a_worker_that_dies_before_it_is_ready_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(CoreRunner, "command", (sys.executable, "-c", "import sys; sys.exit(3)"))
    runner = CoreRunner("process")
    with pytest.raises(
        CoreWorkerStartError,
        match=r"^scheduling worker process failed to start: "
        r"it exited with code 3 before it was ready",
    ):
        await runner.start()
    await runner.aclose()


async def test_a_worker_that_hangs_before_it_is_ready_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        CoreRunner, "command", (sys.executable, "-c", "import time; time.sleep(60)")
    )
    monkeypatch.setattr(CoreRunner, "start_timeout", 0.5)
    runner = CoreRunner("process")
    with pytest.raises(CoreWorkerStartError, match="not ready after 0.5 s"):
        await runner.start()


def test_the_server_names_a_worker_that_cannot_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        CoreRunner, "command", (sys.executable, "-c", "raise SystemExit('no numpy here')")
    )
    monkeypatch.setattr(
        server_main, "tune_gc", lambda: None
    )  # process-wide settings: not in the tests'
    monkeypatch.setattr(server_main, "configure_logging", lambda *args: None)
    status = server_main.main(["--listen", "127.0.0.1:0", "--state", str(tmp_path / "m.db")])
    err = capfd.readouterr().err
    assert status == 1
    # The worker's own words (on the inherited stderr), then the server's one line.
    assert err.splitlines() == [
        "no numpy here",
        "muster-server: scheduling worker process failed to start: it exited with code 1 before it was ready "
        "(its error, if any, is on the server's stderr)",
    ]
    assert not Path(
        f"{tmp_path / 'm.db'}.lock"
    ).exists()  # the failed server let go of its state file


def test_failures_inside_exception_groups_are_reported_one_line_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    nested = ExceptionGroup(
        "outer",
        [
            ExceptionGroup("inner", [OSError("cannot listen on x")]),
            StateFileInUse("state file s is in use by muster-server pid 1"),
        ],
    )
    assert server_main.report_failure(nested) == 1
    assert capsys.readouterr().err.splitlines() == [
        "muster-server: cannot listen on x",
        "muster-server: state file s is in use by muster-server pid 1",
    ]
    assert (
        server_main.report_failure(ExceptionGroup("g", [StateFileError("state file s is not ...")]))
        == 2
    )
    capsys.readouterr()
    try:
        raise ZeroDivisionError("a bug")
    except ZeroDivisionError as exc:
        bug = exc
    assert server_main.report_failure(ExceptionGroup("g", [bug])) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert err.splitlines()[-1] == "muster-server: unexpected ZeroDivisionError: a bug"
