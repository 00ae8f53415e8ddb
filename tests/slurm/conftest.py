"""Fixtures for the real-Slurm tests: a private 16-node cluster (scripts/slurm-up.sh in a temporary
directory), a Muster server and the Slurm adapter as real processes on loopback.

The cluster is hermetic: it never touches the machine's own Slurm (configuration, daemons, jobs),
which may be running beside it; test_hermetic.py proves that. It needs root (and apt-get when Slurm
is not installed yet); elsewhere every test that uses it is skipped with the reason. Every wait is
bounded.
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
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw, check=False)
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
        return "real Slurm tests need root (slurmd starts jobs as their users)"
    if not shutil.which("sinfo") and not shutil.which("apt-get"):
        return "Slurm is not installed and apt-get is not available to install it"
    return ""


# -- the private cluster ---------------------------------------------------------------------------
#
# scripts/slurm-up.sh starts it in a temporary directory: its own slurm.conf (SLURM_CONF for every
# client, here and in the processes the tests start; `-f` for the daemons), munged with its own key
# and socket, free ports, a unique cluster name, its own state, spool, PID and log files. The
# machine's own Slurm, if any, is never read, written or signalled (test_hermetic.py checks it).


class ClusterStartError(Exception):
    """scripts/slurm-up.sh failed; the message ends with the daemons' own last log lines."""


@dataclass
class SlurmCluster:
    dir: Path
    nodes: list[str]

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment of a client of this cluster (and of nothing else)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def pid_file(self, daemon: str) -> Path:
        """``slurmctld`` or ``slurmd-<node>``."""
        return self.dir / "run" / f"{daemon}.pid"

    def pids(self) -> dict[str, int]:
        """The daemons' PIDs by PID file name (``slurmctld``, ``slurmd-n1``, ``munged``)."""
        files = [*(self.dir / "run").glob("*.pid"), self.dir / "munge" / "munged.pid"]
        return {f.stem: int(f.read_text()) for f in files if f.exists()}

    def log_tails(self, lines: int = 25) -> str:
        logs = [
            self.dir / "log" / "slurmctld.log",
            *sorted((self.dir / "log").glob("slurmd-*.log")),
        ]
        logs.append(self.dir / "munge" / "munged.log")
        out = []
        for path in logs[:4]:
            if path.exists() and path.stat().st_size:
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"---- last lines of {path} ----\n" + "\n".join(tail))
        return "\n".join(out)


def start_cluster(
    directory: Path, nodes: int = NODES, gpu_nodes: int = GPU_NODES, timeout: float = 600
) -> SlurmCluster:
    """Start (or, when it runs already, check) the private cluster in ``directory``."""
    cluster = SlurmCluster(directory, [f"n{i}" for i in range(1, nodes + 1)])
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env.update(
        SLURM_DIR=str(directory),
        SLURM_NODES=str(nodes),
        SLURM_GPU_NODES=str(gpu_nodes),
        SLURMD_TIMEOUT="10",
    )
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm-up.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        message = proc.stderr[-6000:].rstrip()
        if "---- last lines of" not in message:  # it died before reading its daemons' logs
            message += "\n" + cluster.log_tails()
        raise ClusterStartError(f"scripts/slurm-up.sh failed (cluster in {directory}):\n{message}")
    return cluster


def stop_cluster(cluster: SlurmCluster, *, purge: bool = True) -> None:
    """Cancel its jobs and stop its daemons (only those: found through its own PID files)."""
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env.update(SLURM_DIR=str(cluster.dir), SLURM_DOWN_PURGE="1" if purge else "0")
    subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm-down.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def private_dir(prefix: str = "muster-slurm-") -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)  # jobs of user nobody read slurm.conf and reach the munge socket in there
    return path


# -- the machine's own Slurm, which the tests must leave alone --------------------------------------

HOST_FILES = ("/etc/slurm", "/etc/slurm-llnl", "/etc/munge", "/run/slurm", "/run/munge")
# Job steps (slurmstepd) are covered by the jobs check: a step's command line names no cluster.
HOST_DAEMONS = {"slurmctld", "slurmd", "munged", "slurmctld-wlm", "slurmd-wlm"}
MARKER = "# muster-hermetic-cluster"  # first line of a slurm.conf scripts/slurm-up.sh wrote


def _file_sums(roots: tuple[str, ...]) -> dict[str, str]:
    """Path -> sha256 (symlink -> its target) of every file under ``roots``; sockets and locks
    are listed by name only. Missing roots give nothing."""
    import hashlib

    sums: dict[str, str] = {}
    for root in roots:
        base = Path(root)
        if not base.exists():
            continue
        for path in [base, *sorted(base.rglob("*"))]:
            try:
                if path.is_symlink():
                    sums[str(path)] = "-> " + os.readlink(path)
                elif path.is_file():
                    sums[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
                elif path.is_dir():
                    sums[str(path)] = "dir"
                else:
                    sums[str(path)] = "other"
            except OSError as exc:  # unreadable: still compare that it stays so
                sums[str(path)] = f"error {exc.errno}"
    return sums


def _private(cmdline: str) -> bool:
    """A daemon of a private cluster (any test session's): a path on its command line lies in a
    directory whose slurm.conf scripts/slurm-up.sh wrote (-f D/slurm.conf, -S D/run/munge.sock)."""
    for token in cmdline.replace("=", " ").split():
        if not token.startswith("/"):
            continue
        for parent in list(Path(token).parents)[:2]:
            try:
                if MARKER in (parent / "slurm.conf").read_text(errors="replace").splitlines():
                    return True
            except OSError:
                continue
    return False


def cmdline_of(pid: int | str) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def _host_daemons() -> dict[int, str]:
    """PID -> command line of every live Slurm / munge daemon that is no private cluster's
    (slurmctld's helper `slurmctld: slurmscriptd` is judged by its parent)."""
    found: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "comm").read_text().strip() not in HOST_DAEMONS:
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] in ("Z", "X"):
                continue
            cmdline = cmdline_of(proc.name)
            if _private(cmdline) or ("/" not in cmdline and _private(cmdline_of(fields[1]))):
                continue
        except OSError:
            continue
        found[int(proc.name)] = cmdline
    return found


HOST_CONF = Path("/etc/slurm/slurm.conf")  # Debian's default, what a bare `squeue` reads


def _host_controller_here() -> bool | None:
    """Whether the machine's own slurm.conf puts its (first) slurmctld on this machine; None
    when there is no such file."""
    try:
        text = HOST_CONF.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.split("#", 1)[0].strip().partition("=")
        if key.strip().lower() in ("slurmctldhost", "controlmachine") and value.strip():
            host = value.strip().split("(", 1)[0].split(",", 1)[0].strip()
            return host in ("localhost", socket.gethostname().split(".")[0], socket.gethostname())
    return None


def _host_jobs() -> dict[str, str] | None:
    """Job id -> state on the machine's own slurmctld (its default slurm.conf, no SLURM_CONF);
    None when there is none to ask."""
    if not shutil.which("squeue") or not HOST_CONF.exists():
        return None
    here = _host_controller_here()
    if here and not any(
        cmd.split()[0].endswith(("slurmctld", "slurmctld-wlm")) for cmd in _host_daemons().values()
    ):
        return None  # its controller would be this machine and none runs: squeue waits 9 s for it
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    try:
        proc = subprocess.run(
            ["squeue", "-h", "-a", "-t", "all", "-o", "%i %T"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        return None
    return dict(line.split(None, 1) for line in proc.stdout.splitlines() if line.strip())


@dataclass
class HostSlurm:
    """What the tests must not change: the machine's Slurm and munge files, its daemons, its jobs."""

    files: dict[str, str]
    daemons: dict[int, str]
    jobs: dict[str, str] | None

    @classmethod
    def take(cls) -> HostSlurm:
        return cls(_file_sums(HOST_FILES), _host_daemons(), _host_jobs())

    def changes(self) -> list[str]:
        """How the machine's Slurm differs now from this snapshot (empty: untouched)."""
        now = _file_sums(HOST_FILES)
        out = [
            f"{path}: {self.files.get(path, 'absent')} -> {now.get(path, 'absent')}"
            for path in sorted(set(self.files) | set(now))
            if self.files.get(path) != now.get(path)
        ]
        alive = _host_daemons()
        out += [
            f"host daemon {pid} ({cmd}) is gone"
            for pid, cmd in self.daemons.items()
            if alive.get(pid) != cmd
        ]
        if self.jobs is not None:
            jobs = _host_jobs()
            if jobs is None:
                out.append("the host's slurmctld answered before the tests and does not now")
            else:
                out += [
                    f"host job {job} went {state} -> {jobs[job]}"
                    for job, state in self.jobs.items()
                    if jobs.get(job, "").startswith("CANCELLED")
                    and not state.startswith("CANCELLED")
                ]
        return out


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The check that the machine's Slurm is untouched runs after every other test."""
    last = [i for i in items if i.nodeid.endswith(HOST_CHECK)]
    if last:
        items[:] = [i for i in items if i not in last] + last


HOST_CHECK = "test_hermetic.py::test_the_machines_own_slurm_is_untouched"


@pytest.fixture(scope="session")
def host_slurm() -> HostSlurm:
    """The machine's own Slurm before this session's private cluster starts."""
    return HostSlurm.take()


@pytest.fixture(scope="session")
def slurm_instance(host_slurm: HostSlurm) -> Iterator[SlurmCluster]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    directory = private_dir()
    try:
        cluster = start_cluster(directory)
    except ClusterStartError as exc:
        stop_cluster(SlurmCluster(directory, []), purge=os.environ.get("MUSTER_KEEP_LOGS") != "1")
        pytest.fail(str(exc), pytrace=False)
    saved = os.environ.get("SLURM_CONF")
    # Every client from here on (this process, the adapters and servers it starts, `runuser`)
    # talks to the private cluster only.
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        stop_cluster(cluster, purge=os.environ.get("MUSTER_KEEP_LOGS") != "1")
        changes = host_slurm.changes()
        if changes:
            pytest.fail("the tests changed the machine's own Slurm:\n" + "\n".join(changes))


@pytest.fixture(scope="session")
def slurm_cluster(slurm_instance: SlurmCluster) -> list[str]:
    return slurm_instance.nodes


def active_jobs() -> list[str]:
    return run("squeue", "-h", "-t", "PD,R,CG,S,CF", "-o", "%i").split()


@pytest.fixture
def clean_slurm(slurm_instance: SlurmCluster) -> list[str]:
    """No job left from an earlier test, every node back up."""
    # Every job of the private cluster was submitted by these tests; never anyone else's.
    assert os.environ.get("SLURM_CONF") == str(slurm_instance.conf)
    for user in ("root", "nobody"):
        run("scancel", "-u", user, check=False)
    wait_until("jobs of earlier tests to end", lambda: not active_jobs(), timeout=60)
    try:  # restarts a slurmd a test killed, resumes its node
        start_cluster(slurm_instance.dir, timeout=120)
    except ClusterStartError as exc:
        pytest.fail(str(exc), pytrace=False)
    return slurm_instance.nodes


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
        # MUSTER_SERVER_CMD: another way to start a server (e.g. a development build).
        command = os.environ.get("MUSTER_SERVER_CMD", str(BIN / "muster-server")).split()
        # The child gets its own copy of the log's descriptor: this one can close at once.
        with open(self.workdir / "server.log", "ab") as log:
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
            [str(BIN / "muster"), "--server", self.address, "queues"],
            capture_output=True,
            check=False,
        )
        return proc.returncode == 0

    def start_adapter(self, *extra: str) -> None:
        self.adapter_runs += 1
        with open(self.workdir / f"adapter-{self.adapter_runs}.log", "ab") as log:
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
            check=False,
        )


@pytest.fixture
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
            subprocess.run(["scancel", "-u", user], capture_output=True, check=False)
        if os.environ.get("MUSTER_KEEP_LOGS") != "1":
            shutil.rmtree(workdir, ignore_errors=True)
