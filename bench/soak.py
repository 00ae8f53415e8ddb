"""Soak test: a real ``muster-server`` and M ``muster-agent`` processes on loopback, N clients
submitting short jobs and polling them for a bounded duration (run by hand, not in CI).

Each client loops: submit a one-task job (``sleep --task-seconds`` on an agent), poll GetJob until
the job ends, and now and then GetJob of an older finished job (answered from the store once it
has left memory) and ListJobs (one page). Every interval prints the RPC errors, GetJob and
ListJobs latency percentiles, jobs submitted / finished and the server's RSS (``VmRSS`` from
``/proc/PID/status``); at the end one JSON summary (RSS at start and end, growth, lost jobs: those
submitted that did not finish within ``--drain`` seconds after the load stopped).

    .venv/bin/python bench/soak.py --duration 300 --clients 50 --agents 4
    .venv/bin/python bench/soak.py --duration 300 --server-arg=--job-retention=60
    .venv/bin/python bench/soak.py --code /tmp/other-checkout   # the server and agents of another tree
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[1]
SERVER = "import sys; from server.service.main import main; sys.exit(main())"
AGENT = "import sys; from adapters.agent.main import main; sys.exit(main())"
TERMINAL = {pb.JOB_PHASE_COMPLETED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def child_pids(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (e.g. the server's cycle worker)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rpartition(")")[2].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    return out


def pct(samples: list[float], q: float) -> float:
    """The q-quantile in milliseconds (nearest rank); 0 when there are no samples."""
    if not samples:
        return 0.0
    s = sorted(samples)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 2)


@dataclass
class Window:
    """What the clients saw during one interval."""

    get_job: list[float] = field(default_factory=list)
    list_jobs: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    submitted: int = 0
    finished: int = 0

    def error(self, rpc: str, exc: grpc.aio.AioRpcError) -> None:
        key = f"{rpc}:{exc.code().name}"
        self.errors[key] = self.errors.get(key, 0) + 1


class Load:
    def __init__(self, stub: pb_grpc.SchedulerStub, args: argparse.Namespace) -> None:
        self.stub = stub
        self.args = args
        self.window = Window()
        self.submitting = True
        self.finished_ids: list[str] = []
        self.unfinished: set[str] = set()
        self.total_errors = 0

    def take_window(self) -> Window:
        w, self.window = self.window, Window()
        self.total_errors += sum(w.errors.values())
        return w

    async def get_job(self, job_id: str) -> pb.Job | None:
        t0 = time.perf_counter()
        try:
            job = await self.stub.GetJob(pb.GetJobRequest(id=job_id), timeout=30)
        except grpc.aio.AioRpcError as exc:
            self.window.error("GetJob", exc)
            return None
        self.window.get_job.append(time.perf_counter() - t0)
        return job

    async def client(self, n: int) -> None:
        rng = random.Random(n)
        args = self.args
        seq = 0
        while self.submitting:
            job_id = f"soak-{n:03d}-{seq:06d}"
            seq += 1
            spec = pb.JobSpec(
                id=job_id,
                task_groups=[
                    pb.TaskGroup(
                        role="w",
                        replicas=1,
                        request=pb.ResourceList(quantities={"cpu": "100m", "memory": "64Mi"}),
                        duration_seconds=args.task_seconds,
                    )
                ],
            )
            try:
                await self.stub.SubmitJob(pb.SubmitJobRequest(job=spec), timeout=30)
            except grpc.aio.AioRpcError as exc:
                self.window.error("SubmitJob", exc)
                await asyncio.sleep(args.poll)
                continue
            self.window.submitted += 1
            self.unfinished.add(job_id)
            while True:  # bounded: the load stops at --duration, then --drain bounds the rest
                await asyncio.sleep(args.poll)
                job = await self.get_job(job_id)
                if job is not None and job.status.phase in TERMINAL:
                    self.unfinished.discard(job_id)
                    self.finished_ids.append(job_id)
                    self.window.finished += 1
                    break
                if not self.submitting and job_id in self.unfinished:
                    break  # the drain phase follows this job
                if rng.random() < 0.2 and self.finished_ids:
                    await self.get_job(rng.choice(self.finished_ids))  # older: maybe from the store
                if rng.random() < 0.1:
                    await self.list_jobs()

    async def list_jobs(self) -> None:
        t0 = time.perf_counter()
        try:
            await self.stub.ListJobs(pb.ListJobsRequest(page_size=50), timeout=30)
        except grpc.aio.AioRpcError as exc:
            self.window.error("ListJobs", exc)
            return
        self.window.list_jobs.append(time.perf_counter() - t0)

    async def drain(self, seconds: float) -> None:
        """Wait (bounded) for the jobs still running when the load stopped."""
        deadline = time.monotonic() + seconds
        while self.unfinished and time.monotonic() < deadline:
            for job_id in list(self.unfinished):
                job = await self.get_job(job_id)
                if job is not None and job.status.phase in TERMINAL:
                    self.unfinished.discard(job_id)
                    self.finished_ids.append(job_id)
            await asyncio.sleep(0.5)


def start(argv: list[str], log: Path, code: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(code))
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, *argv],
            cwd=code,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def wait_nodes(stub: pb_grpc.SchedulerStub, count: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            nodes = await stub.ListNodes(pb.ListNodesRequest(), timeout=5)
            if len(nodes.nodes) >= count:
                return
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"fewer than {count} nodes registered after {seconds}s")


async def soak(args: argparse.Namespace, workdir: Path) -> dict[str, object]:
    # SIGTERM (and SIGINT, which a shell's background job ignores) stops the children too.
    main_task = asyncio.current_task()
    assert main_task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, main_task.cancel)
    code = Path(args.code).resolve()
    address = f"127.0.0.1:{free_port()}"
    server = start(
        [
            "-c",
            SERVER,
            "--listen",
            address,
            "--state",
            str(workdir / "muster.db"),
            "--cycle-period",
            "1",
            "--log-format",
            "json",
            "--log-level",
            "warning",
            *args.server_arg,
        ],
        workdir / "server.log",
        code,
    )
    agents: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(args.agents):
            inventory = workdir / f"inventory-{i}.yaml"
            inventory.write_text(
                f"nodes:\n  - name: n{i}\n    count: {args.nodes}\n    cpu: 64\n    memory: 256Gi\n"
            )
            agents.append(
                start(
                    [
                        "-c",
                        AGENT,
                        "--server",
                        address,
                        "--name",
                        f"agent-{i}",
                        "--inventory",
                        str(inventory),
                        "--log-format",
                        "json",
                        "--log-level",
                        "warning",
                    ],
                    workdir / f"agent-{i}.log",
                    code,
                )
            )
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.SchedulerStub(channel)
            await wait_nodes(stub, args.agents * args.nodes, 60)
            load = Load(stub, args)
            rss_start = rss_kib(server.pid)
            print(
                f"server pid {server.pid} on {address}; RSS at start {rss_start / 1024:.1f} MiB",
                flush=True,
            )
            print(
                f"{'t(s)':>6} {'sub':>6} {'done':>6} {'err':>5} {'get p50':>8} {'get p99':>8} "
                f"{'list p50':>8} {'list p99':>8} {'RSS MiB':>8}",
                flush=True,
            )
            intervals: list[dict[str, object]] = []
            clients = [asyncio.create_task(load.client(n)) for n in range(args.clients)]
            t0 = time.monotonic()
            while (elapsed := time.monotonic() - t0) < args.duration:
                await asyncio.sleep(min(args.interval, args.duration - elapsed))
                if server.poll() is not None:
                    raise RuntimeError(
                        f"the server exited ({server.returncode}); see {workdir}/server.log"
                    )
                w = load.take_window()
                row = {
                    "t": round(time.monotonic() - t0),
                    "submitted": w.submitted,
                    "finished": w.finished,
                    "errors": w.errors,
                    "get_job_p50_ms": pct(w.get_job, 0.5),
                    "get_job_p99_ms": pct(w.get_job, 0.99),
                    "list_jobs_p50_ms": pct(w.list_jobs, 0.5),
                    "list_jobs_p99_ms": pct(w.list_jobs, 0.99),
                    "rss_mib": round(rss_kib(server.pid) / 1024, 1),
                }
                intervals.append(row)
                print(
                    f"{row['t']:>6} {w.submitted:>6} {w.finished:>6} {sum(w.errors.values()):>5} "
                    f"{row['get_job_p50_ms']:>8} {row['get_job_p99_ms']:>8} {row['list_jobs_p50_ms']:>8} "
                    f"{row['list_jobs_p99_ms']:>8} {row['rss_mib']:>8}"
                    + (f"  {w.errors}" if w.errors else ""),
                    flush=True,
                )
            load.submitting = False
            await asyncio.wait_for(asyncio.gather(*clients), timeout=args.drain + 60)
            await load.drain(args.drain)
            load.take_window()
            rss_end = rss_kib(server.pid)
            submitted = len(load.finished_ids) + len(load.unfinished)
    finally:
        for proc in agents:
            stop(proc)
        stop(server)
    first, last = intervals[0], intervals[-1]
    return {
        "duration_s": args.duration,
        "clients": args.clients,
        "agents": args.agents,
        "server_args": args.server_arg,
        "jobs_submitted": submitted,
        "jobs_lost": len(load.unfinished),
        "errors": load.total_errors,
        "get_job_ms": {
            "start": [first["get_job_p50_ms"], first["get_job_p99_ms"]],
            "end": [last["get_job_p50_ms"], last["get_job_p99_ms"]],
        },
        "rss_mib": {
            "start": round(rss_start / 1024, 1),
            "first_interval": first["rss_mib"],
            "end": round(rss_end / 1024, 1),
        },
        "rss_growth_pct": round(100 * (rss_end - rss_start) / rss_start, 1),
        "rss_growth_after_first_interval_pct": round(
            100 * (rss_end / 1024 - float(first["rss_mib"])) / float(first["rss_mib"]), 1
        ),  # type: ignore[arg-type]
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=4, help="nodes per agent (64 CPUs each)")
    ap.add_argument("--interval", type=float, default=30.0, help="seconds per printed row")
    ap.add_argument("--poll", type=float, default=0.2, help="seconds between a client's polls")
    ap.add_argument("--task-seconds", type=int, default=1, help="how long each job's task sleeps")
    ap.add_argument(
        "--drain", type=float, default=60.0, help="seconds to wait for running jobs at the end"
    )
    ap.add_argument(
        "--code", default=str(ROOT), help="checkout whose server and agent run (PYTHONPATH)"
    )
    ap.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra muster-server argument (repeatable)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, state)")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="muster-soak-"))
    try:
        summary = asyncio.run(soak(args, workdir))
    except asyncio.CancelledError:
        sys.exit("soak: stopped by a signal (server and agents stopped)")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"work directory: {workdir}", file=sys.stderr)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
