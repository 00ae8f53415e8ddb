"""Helpers for end-to-end tests: a real muster-server and real muster-agent processes on loopback.

Every wait is a poll with a bounded deadline (a failure bound, never a verdict on speed).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[2]
SERVER = "import sys; from server.service.main import main; sys.exit(main())"
AGENT = "import sys; from adapters.agent.main import main; sys.exit(main())"
DEADLINE = 30.0


def free_port() -> int:
    """A free port *below* the ephemeral range.

    The server is restarted on the same port while agents keep dialing it; with a port from the
    ephemeral range, one of those dials can be given that very port as its source and connect to
    itself (TCP simultaneous open), and the restarted server then cannot bind.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1025, low // 2), low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


class Proc:
    """A child process with its output in a log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, *self.argv],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                await anyio.to_thread.run_sync(self.proc.wait, timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await anyio.to_thread.run_sync(self.proc.wait)
        code = self.proc.returncode
        self.proc = None
        return code

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def json_events(self, event: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log().splitlines():
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict) and data.get("event") == event:
                out.append(data)
        return out


class Cluster:
    """One server and any number of agents, all under ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.state = workdir / "muster.db"
        self.server: Proc | None = None
        self.agents: dict[str, Proc] = {}

    def start_server(self, config: str | None = None, extra: Sequence[str] = ()) -> Proc:
        """The server; ``config``: scheduler configuration YAML (default: the built-in one);
        ``extra``: more command-line arguments."""
        argv = [
            "-c",
            SERVER,
            "--listen",
            self.address,
            "--state",
            str(self.state),
            "--cycle-period",
            "0.2",
            "--log-format",
            "json",
        ]
        if config is not None:
            path = self.workdir / "scheduler.yaml"
            path.write_text(config)
            argv += ["--config", str(path)]
        argv += list(extra)
        self.server = Proc("server", argv, self.workdir / "server.log").start()
        return self.server

    def start_agent(self, name: str, inventory: str, *, state_dir: bool = False) -> Proc:
        inv = self.workdir / f"inventory-{name}.yaml"
        inv.write_text(inventory)
        argv = [
            "-c",
            AGENT,
            "--server",
            self.address,
            "--name",
            name,
            "--inventory",
            str(inv),
            "--log-format",
            "json",
            "--backoff-max",
            "1",
            "--kill-grace",
            "2",
        ]
        if state_dir:
            argv += ["--state-dir", str(self.workdir / f"state-{name}")]
        proc = Proc(name, argv, self.workdir / f"agent-{name}.log").start()
        self.agents[name] = proc
        return proc

    async def stop_all(self) -> None:
        for proc in self.agents.values():
            await proc.stop()
        if self.server is not None:
            await self.server.stop()

    def logs(self) -> str:
        parts = []
        for proc in [self.server, *self.agents.values()]:
            if proc is not None:
                parts.append(f"----- {proc.name} -----\n{proc.log()[-6000:]}")
        return "\n".join(parts)


async def until(
    check: Callable[[], Awaitable[Any]], what: str, timeout: float = DEADLINE, interval: float = 0.1
) -> Any:
    """Poll an async ``check`` until it returns a truthy value; AssertionError after ``timeout``."""
    last_error: BaseException | None = None
    with anyio.move_on_after(timeout):
        while True:
            try:
                value = await check()
                if value:
                    return value
            except Exception as exc:  # noqa: BLE001 - e.g. the server is restarting
                last_error = exc
            await anyio.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what}"
        + (f" (last error: {last_error})" if last_error else "")
    )


def pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            alive.append(pid)
    return alive


# The muster CLI as a user runs it, in a child process (its own argument parsing and exit code).
CLI = "import sys; from clients.cli import main; sys.exit(main())"


async def cli(address: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``muster --server address argv...``, bounded to a minute."""
    return await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-c", CLI, "--server", address, *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    )
