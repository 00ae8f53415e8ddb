"""``make demo``: a server, two fake bare-metal agents, the example gangs placed and completed.

    python scripts/demo.py [--exit-when-done] [--timeout S] [--port N]

Starts ``muster-server`` (fresh state under ./var/demo) and two ``muster-agent`` processes on
loopback, waits until the server is healthy and all four nodes have registered, submits
examples/jobs-demo.yaml and shows the jobs progressing (a live table on a terminal, one line per
change otherwise) until every job has ended. Then it keeps running until Ctrl-C (or exits with
``--exit-when-done``: 0 if every job completed). Ctrl-C / SIGTERM stop every child cleanly.
Logs of the children are in var/demo/*.log.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import grpc
from rich.console import Console
from rich.live import Live
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clients.client import MusterClient  # noqa: E402
from clients.jobfile import load_job_file  # noqa: E402
from muster.v1 import muster_pb2 as pb  # noqa: E402

ENDED = {pb.JOB_PHASE_COMPLETED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}
SERVER = "import sys; from server.service.main import main; sys.exit(main())"


def cli_path() -> str:
    """The CLI as a command that works before `make install`: the venv's entry point."""
    exe = Path(sys.executable).parent / "muster"
    try:
        return str(exe.relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


AGENT = "import sys; from adapters.agent.main import main; sys.exit(main())"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Children:
    """The demo's child processes: started in their own session, stopped with SIGTERM then SIGKILL."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, code: str, args: list[str]) -> None:
        # The child gets its own copy of the log's descriptor: the demo's copy can close at once.
        with open(self.log_dir / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-c", code, *args],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a terminal Ctrl-C reaches only the demo, which stops them in order
            )

    def dead(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is not None]

    def stop(self, grace: float = 10.0) -> None:
        # Agents first (they kill their tasks), then the server.
        for group in ([n for n in self.procs if n != "server"], ["server"]):
            for name in group:
                proc = self.procs.get(name)
                if proc and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            for name in group:
                proc = self.procs.get(name)
                if proc is None:
                    continue
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def render(jobs: list[pb.Job]) -> Table:
    table = Table(title="Muster demo: gang jobs", title_justify="left")
    for column in ("JOB", "PHASE", "PENDING", "RUNNING", "DONE", "FAILED", "PLACEMENT"):
        table.add_column(column)
    for job in jobs:
        st = job.status
        placement = " ".join(
            f"{t.role}-{t.index}@{t.node}"
            for t in job.tasks
            if t.node and t.status != pb.TASK_STATUS_PENDING
        )
        table.add_row(
            job.spec.id,
            pb.JobPhase.Name(st.phase).removeprefix("JOB_PHASE_").capitalize(),
            str(st.pending),
            str(st.running),
            str(st.succeeded),
            str(st.failed),
            placement or _reason(job),
        )
    return table


def _reason(job: pb.Job) -> str:
    for cond in reversed(job.status.conditions):
        if cond.type == "Unschedulable" and cond.status == "True":
            return f"waiting: {cond.message or cond.reason}"
    return ""


def summary_line(job: pb.Job) -> str:
    st = job.status
    placed = ",".join(f"{t.role}-{t.index}@{t.node}" for t in job.tasks if t.node)
    return (
        f"{job.spec.id:<12} {pb.JobPhase.Name(st.phase).removeprefix('JOB_PHASE_'):<10} pending={st.pending} "
        f"running={st.running} succeeded={st.succeeded} failed={st.failed} {placed or _reason(job)}"
    )


async def fetch_jobs(client: MusterClient, ids: list[str]) -> list[pb.Job]:
    return [await client.get_job(job_id) for job_id in ids]


async def run_demo(args: argparse.Namespace, children: Children, console: Console) -> int:
    state = args.state_dir
    port = args.port or free_port()
    address = f"127.0.0.1:{port}"
    children.start(
        "server",
        SERVER,
        # The built-in configuration plus the priority classes the examples name (high-priority),
        # so every example in `muster submit --help` runs against the demo as shipped.
        ["--listen", address, "--state", str(state / "muster.db"), "--cycle-period", "0.5"]
        + ["--config", str(ROOT / "examples" / "config-volcano.yaml")],
    )
    for rack in ("a", "b"):
        children.start(
            f"agent-{rack}",
            AGENT,
            [
                "--server",
                address,
                "--name",
                f"rack-{rack}",
                "--inventory",
                str(ROOT / "examples" / f"inventory-{rack}.yaml"),
            ],
        )
    console.print(f"server on {address}; agents rack-a and rack-b; logs in {state}/")

    async with MusterClient(address, timeout=10) as client:
        try:
            await client.wait_until_serving(timeout=30)
        except TimeoutError:
            console.print(
                f"error: the server did not become healthy within 30 s (see {state}/server.log)"
            )
            return 1
        with anyio.move_on_after(30) as scope:
            while len(await client.list_nodes()) < 4:
                if children.dead():
                    break
                await anyio.sleep(0.2)
        nodes = await client.list_nodes()
        if scope.cancelled_caught or len(nodes) < 4:
            console.print(
                f"error: only {len(nodes)} of 4 nodes registered (see {state}/agent-*.log)"
            )
            return 1
        console.print(f"{len(nodes)} nodes registered: " + ", ".join(n.node.name for n in nodes))

        specs = load_job_file(ROOT / "examples" / "jobs-demo.yaml")
        for spec in specs:
            await client.submit_job(spec)
        ids = [s.id for s in specs]
        console.print(f"submitted {len(ids)} jobs from examples/jobs-demo.yaml")

        jobs = await watch_until_done(client, ids, children, console, args.timeout)
        if jobs is None:
            return 1
        completed = sum(1 for j in jobs if j.status.phase == pb.JOB_PHASE_COMPLETED)
        console.print(f"all jobs ended: {completed}/{len(jobs)} completed")
        if args.exit_when_done:
            return 0 if completed == len(jobs) else 1
        console.print(
            f"still running: try `{cli_path()} --server {address} jobs` or `nodes`; Ctrl-C to stop"
        )
        while not children.dead():
            await anyio.sleep(0.5)
        console.print(f"error: {', '.join(children.dead())} exited unexpectedly")
        return 1


async def watch_until_done(
    client: MusterClient, ids: list[str], children: Children, console: Console, timeout: float
) -> list[pb.Job] | None:
    deadline = anyio.current_time() + timeout
    last: dict[str, str] = {}
    live = Live(console=console, refresh_per_second=4) if console.is_terminal else None
    if live:
        live.start()
    try:
        while True:
            jobs = await fetch_jobs(client, ids)
            if live:
                live.update(render(jobs))
            else:
                for job in jobs:
                    line = summary_line(job)
                    if last.get(job.spec.id) != line:
                        last[job.spec.id] = line
                        console.print(line)
            if all(j.status.phase in ENDED for j in jobs):
                return jobs
            if children.dead():
                console.print(
                    f"error: {', '.join(children.dead())} exited unexpectedly (see the logs)"
                )
                return None
            if anyio.current_time() > deadline:
                console.print(f"error: jobs did not finish within {timeout:g} s")
                return None
            await anyio.sleep(0.5)
    finally:
        if live:
            live.stop()


async def main_async(args: argparse.Namespace) -> int:
    state = args.state_dir
    shutil.rmtree(state, ignore_errors=True)  # a fresh demo every time
    state.mkdir(parents=True)
    console = Console(highlight=False, soft_wrap=True)
    children = Children(state)
    code = 130
    try:
        async with anyio.create_task_group() as tg:

            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        nonlocal code
                        code = 0  # Ctrl-C is how a demo ends
                        console.print("stopping ...")
                        tg.cancel_scope.cancel()
                        return

            async def demo() -> None:
                nonlocal code
                try:
                    code = await run_demo(args, children, console)
                except grpc.aio.AioRpcError as exc:
                    console.print(f"error: {exc.code().name}: {exc.details()}")
                    code = 1
                tg.cancel_scope.cancel()

            tg.start_soon(on_signal)
            tg.start_soon(demo)
    finally:
        children.stop()
        console.print("stopped server and agents")
        console.print(
            "next: `make install` puts the `muster` command on PATH (try `muster jobs` against a server)"
        )
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--exit-when-done", action="store_true", help="exit once every job has ended"
    )
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="give up if jobs are not done after S seconds"
    )
    parser.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    parser.add_argument(
        "--state-dir", type=Path, default=ROOT / "var" / "demo", help="state and logs (wiped first)"
    )
    args = parser.parse_args(argv)
    args.state_dir = args.state_dir.resolve()
    return anyio.run(main_async, args, backend="asyncio")


if __name__ == "__main__":
    sys.exit(main())
