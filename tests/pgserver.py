"""A throwaway PostgreSQL cluster for tests: its own temp directory, socket directory and loopback
port, started from the Debian binaries (``apt-get install postgresql``), never the machine's own
cluster. initdb refuses root, so as root the cluster runs as the ``postgres`` user."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

import psycopg

ADMIN_APP = "muster-test-admin"
USER = "muster"


class PostgresNotFound(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def find_bin_dir() -> Path:
    """The bin directory of the newest PostgreSQL installed under /usr/lib/postgresql."""
    found: list[tuple[int, Path]] = []
    for initdb in Path("/usr/lib/postgresql").glob("*/bin/initdb"):
        match = re.fullmatch(r"\d+", initdb.parent.parent.name)
        if match and os.access(initdb, os.X_OK):
            found.append((int(initdb.parent.parent.name), initdb.parent))
    if not found:
        raise PostgresNotFound("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
    return max(found)[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PostgresServer:
    """``with PostgresServer() as pg: pg.dsn``. ``fast``: no fsync (tests need no durability
    across a power cut, and a cluster with fsync is several times slower)."""

    def __init__(self, *, fast: bool = False, bin_dir: Path | None = None) -> None:
        self.bin_dir = bin_dir or find_bin_dir()
        self.fast = fast
        self.root = Path(tempfile.mkdtemp(prefix="muster-pg-"))
        self.data = self.root / "data"
        self.sock = self.root / "sock"
        self.log = self.root / "pg.log"
        self.port = 0
        self.running = False
        self._as_postgres = os.geteuid() == 0
        try:
            self.sock.mkdir(mode=0o700)
            if self._as_postgres:
                entry = pwd.getpwnam("postgres")
                for path in (self.root, self.sock):
                    os.chown(path, entry.pw_uid, entry.pw_gid)
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                USER,
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            )
            self.start()
            self._admin(f'CREATE DATABASE "{USER}"')
        except BaseException:
            self.cleanup()
            raise

    @property
    def dsn(self) -> str:
        return self.dsn_for(USER)

    def dsn_for(self, database: str) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / tool), *args]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, cwd=self.root, check=False
        )
        if proc.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{tool} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
                + (f"\n--- server log ---\n{log}" if log else "")
            )
        return proc

    def start(self) -> None:
        """Start (again) on the same data directory; a new free port the first time only."""
        options = [
            f"-k {self.sock}",
            "-c listen_addresses=127.0.0.1",
            "-c max_connections=300",
        ]
        if self.fast:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        # A port free a moment ago can be taken before the server binds it: try a few.
        for attempt in range(3):
            port = self.port or free_port()
            try:
                self._run(
                    "pg_ctl",
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-w",
                    "-t",
                    "60",
                    "start",
                    "-o",
                    " ".join([f"-p {port}", *options]),
                )
            except RuntimeError:
                if self.port or attempt == 2:
                    raise
                continue
            self.port = port
            self.running = True
            return

    def stop(self, mode: str = "fast") -> None:
        """``fast``: a clean shutdown; ``immediate``: as if the server crashed."""
        if mode not in ("fast", "immediate", "smart"):
            raise ValueError(f"unknown stop mode {mode!r}")
        if self.running:
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")
            self.running = False

    def _admin(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        with psycopg.connect(
            self.dsn_for("postgres"), autocommit=True, application_name=ADMIN_APP
        ) as conn:
            cur = conn.execute(sql, params or None)
            return list(cur.fetchall()) if cur.description else []

    def new_database(self, name: str) -> str:
        """Create an empty database; its DSN."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"not a plain database name: {name!r}")
        self._admin(f'CREATE DATABASE "{name}"')
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        """Drop it, cutting whatever is still connected to it."""
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def terminate(self, application_name: str) -> int:
        """Cut every connection with that application_name; how many were cut."""
        rows = self._admin(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()) AS cut",
            (application_name,),
        )
        count = rows[0][0]
        assert isinstance(count, int)
        return count

    def cleanup(self) -> None:
        try:
            if self.running:
                self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
