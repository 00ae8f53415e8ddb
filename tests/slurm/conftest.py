"""Fixtures for the real-Slurm tests: a local 16-node cluster (scripts/slurm-up.sh), a Muster
server and the Slurm adapter as real processes on loopback.

The cluster needs root (and apt-get when Slurm is not installed yet); elsewhere every test
that uses it is skipped with the reason. Every wait is bounded.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NODES = 16
GPU_NODES = 4
CLUSTER_ENV = {"SLURM_NODES": str(NODES), "SLURM_GPU_NODES": str(GPU_NODES), "SLURMD_TIMEOUT": "10"}


def run(*argv: str, check: bool = True, timeout: float = 60, **kw: Any) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} -> {proc.returncode}: {proc.stderr or proc.stdout}")
    return proc.stdout


def wait_until(
    what: str, predicate: Callable[[], Any], timeout: float = 60, interval: float = 0.25
) -> Any:
    """Poll ``predicate`` until truthy (returned) or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _skip_reason() -> str:
    if os.environ.get("MUSTER_SKIP_SLURM") == "1":
        return "MUSTER_SKIP_SLURM=1"
    if sys.platform != "linux":
        return "real Slurm tests need Linux"
    if os.geteuid() != 0:
        return "real Slurm tests need root (they install Slurm and start slurmctld + one slurmd per node)"
    if not shutil.which("sinfo") and not shutil.which("apt-get"):
        return "Slurm is not installed and apt-get is not available to install it"
    return ""


LOCK_PATH = "/run/lock/muster-slurm.lock"  # shared with bench/slurm_e2e.py


def hold_cluster_lock(timeout: float) -> Any:
    """One user of the local Slurm cluster at a time (test runs scancel every job)."""
    import fcntl

    Path(LOCK_PATH).parent.mkdir(parents=True, exist_ok=True)
    handle = open(LOCK_PATH, "w")  # noqa: SIM115 - held for the whole session
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if time.monotonic() > deadline:
                handle.close()
                return None
            time.sleep(1)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[list[str]]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    lock = hold_cluster_lock(timeout=600)
    if lock is None:
        pytest.skip(f"another run has held the local Slurm cluster ({LOCK_PATH}) for 10 minutes")
    env = {**os.environ, **CLUSTER_ENV}
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm-up.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        lock.close()
        pytest.fail(f"scripts/slurm-up.sh failed:\n{proc.stderr[-3000:]}")
    try:
        yield [f"n{i}" for i in range(1, NODES + 1)]
    finally:
        # Keep the daemons (fast re-runs); leave no job behind.
        subprocess.run(["scancel", "-u", "root"], capture_output=True)
        subprocess.run(["scancel", "-u", "nobody"], capture_output=True)
        lock.close()


def active_jobs() -> list[str]:
    return run("squeue", "-h", "-t", "PD,R,CG,S,CF", "-o", "%i").split()


@pytest.fixture()
def clean_slurm(slurm_cluster: list[str]) -> list[str]:
    """No job left from an earlier test, every node back up."""
    for user in ("root", "nobody"):
        run("scancel", "-u", user, check=False)
    wait_until("jobs of earlier tests to end", lambda: not active_jobs(), timeout=60)
    env = {**os.environ, **CLUSTER_ENV}
    subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm-up.sh")],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return slurm_cluster


def sbatch(*args: str, user: str = "root", script: str = "sleep 120") -> int:
    argv = ["sbatch", "--parsable", "-o", "/dev/null", "--chdir=/tmp", *args, "--wrap", script]
    if user != "root":
        argv = ["runuser", "-u", user, "--", *argv]
    return int(run(*argv).strip().split(";")[0])


def job_info(job_id: int) -> dict[str, str]:
    """A few fields of ``scontrol show job -o``."""
    from adapters.slurm.parse import parse_scontrol_job

    record = parse_scontrol_job(run("scontrol", "show", "job", "-o", str(job_id)))
    return {
        **record.raw,
        "_nodes": ",".join(sorted(record.nodes, key=_node_key)),
        "_req": ",".join(sorted(record.required_nodes, key=_node_key)),
    }


def _node_key(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    return head, int(name[len(head) :] or 0)


def sort_nodes(names: Any) -> list[str]:
    return sorted(names, key=_node_key)


@dataclass
class Muster:
    """A Muster server and the Slurm adapter, as subprocesses."""

    workdir: Path
    port: int = field(default_factory=free_port)
    server: subprocess.Popen[bytes] | None = None
    adapter: subprocess.Popen[bytes] | None = None
    adapter_runs: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_server(self) -> None:
        log = open(self.workdir / "server.log", "ab")  # noqa: SIM115 - closed with the process
        # MUSTER_SERVER_CMD: another way to start a server (e.g. a development build).
        command = os.environ.get("MUSTER_SERVER_CMD", str(BIN / "muster-server")).split()
        self.server = subprocess.Popen(
            [*command, "--listen", self.address, "--state", str(self.workdir / "muster.db")],
            stdout=log,
            stderr=log,
            cwd=REPO,
        )
        wait_until("the Muster server to answer", self._server_up, timeout=30)

    def _server_up(self) -> bool:
        assert self.server is not None
        if self.server.poll() is not None:
            raise AssertionError(
                f"muster-server exited: {(self.workdir / 'server.log').read_text()[-2000:]}"
            )
        proc = subprocess.run(
            [str(BIN / "muster"), "--server", self.address, "queues"], capture_output=True
        )
        return proc.returncode == 0

    def start_adapter(self, *extra: str) -> None:
        self.adapter_runs += 1
        log = open(self.workdir / f"adapter-{self.adapter_runs}.log", "ab")  # noqa: SIM115
        self.adapter = subprocess.Popen(
            [
                str(BIN / "muster-slurm-adapter"),
                "--server",
                self.address,
                "--staging-partition",
                "staging",
                "--run-partition",
                "batch",
                "--poll-interval",
                "0.3s",
                "--state-dir",
                str(self.workdir / "adapter"),
                *extra,
            ],
            stdout=log,
            stderr=log,
            cwd=REPO,
        )

    def stop_adapter(self, sig: int = signal.SIGTERM) -> None:
        if self.adapter is not None and self.adapter.poll() is None:
            self.adapter.send_signal(sig)
            try:
                self.adapter.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.adapter.kill()
                self.adapter.wait(timeout=5)
        self.adapter = None

    def adapter_log(self) -> str:
        return "".join(
            (self.workdir / f"adapter-{i}.log").read_text() for i in range(1, self.adapter_runs + 1)
        )

    def stop(self) -> None:
        self.stop_adapter()
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(timeout=5)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "muster"), "--server", self.address, *args],
            capture_output=True,
            text=True,
            timeout=30,
        )


@pytest.fixture()
def muster(clean_slurm: list[str]) -> Iterator[Muster]:
    for tool in ("muster-server", "muster", "muster-slurm-adapter"):
        if not (BIN / tool).exists():
            pytest.fail(f"{tool} is not installed in the venv: run `.venv/bin/pip install -e .`")
    workdir = Path(tempfile.mkdtemp(prefix="muster-slurm-"))
    m = Muster(workdir)
    try:
        m.start_server()
        yield m
    finally:
        m.stop()
        for user in ("root", "nobody"):
            subprocess.run(["scancel", "-u", user], capture_output=True)
        if os.environ.get("MUSTER_KEEP_LOGS") != "1":
            shutil.rmtree(workdir, ignore_errors=True)
