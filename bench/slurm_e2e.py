"""End-to-end rate of Muster placing jobs on a real local Slurm, beside Slurm's own scheduler.

    .venv/bin/python bench/slurm_e2e.py [--nodes 64] [--singles 600] [--gangs 40] [--gang-size 8]

Needs root (it runs scripts/slurm-up.sh). For each workload (single-node jobs, then K-node
gangs) and each scheduler:

* muster: jobs go to the DOWN staging partition; muster-server + muster-slurm-adapter decide
  and move them to ``batch`` on the chosen nodes;
* slurm: the same jobs submitted by root straight to ``batch`` (job_submit.lua lets root
  choose), so Slurm's own scheduler (sched/backfill + cons_tres) places them.

Latency per job = first time an observer (``squeue`` every 0.1 s) sees it RUNNING minus the
time its ``sbatch`` returned. Rate = jobs / (last start - first submit). For Muster it also
checks every running job's node list against Muster's binds (``mismatches``) and breaks the
latency down by step (``breakdown``: p50 / p95 seconds of sbatch -> adapter's poll sees the job ->
SubmitJob returned -> binds reach the adapter -> ``scontrol update`` returned -> verified ->
observed RUNNING), from the stamps of the adapter's "placed" log lines. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from muster.v1 import muster_pb2 as pb  # noqa: E402
from muster.v1 import muster_pb2_grpc as pb_grpc  # noqa: E402

T = TypeVar("T")
BIN = Path(sys.executable).parent


def sh(*argv: str, check: bool = True) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")
    return proc.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drain_cluster(timeout: float = 120) -> None:
    for user in ("root", "nobody"):  # nobody: the native jobs' user
        sh("scancel", "-u", user, check=False)
    deadline = time.monotonic() + timeout
    while sh("squeue", "-h", "-t", "PD,R,CG,S,CF", "-o", "%i").strip():
        if time.monotonic() > deadline:
            raise RuntimeError("jobs did not end")
        time.sleep(0.3)


class Observer(threading.Thread):
    """Records when each job is first seen RUNNING, and on which nodes: by Slurm job id, and by job
    name (a native job's Slurm name is its Muster job id)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.started: dict[int | str, float] = {}
        self.nodes: dict[int | str, str] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            out = sh("squeue", "-h", "-a", "-t", "R", "-o", "%i|%N|%j", check=False)
            now = time.time()
            for line in out.splitlines():
                jid, _, rest = line.partition("|")
                nodes, _, name = rest.partition("|")
                if jid.isdigit() and int(jid) not in self.started:
                    for key in (int(jid), name):
                        self.started.setdefault(key, now)
                        self.nodes.setdefault(key, nodes)
            time.sleep(0.1)


def submit_parallel(
    items: Sequence[T], submit_one: Callable[[T], int | str], parallel: int = 4
) -> dict[int | str, float]:
    """Submit every item, ``parallel`` at a time: when each submission returned, by the job key
    ``submit_one`` gives (a Slurm job id, or a Muster job id)."""
    submitted: dict[int | str, float] = {}
    lock = threading.Lock()

    def one(item: T) -> None:
        key = submit_one(item)
        with lock:
            submitted[key] = time.time()

    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, items))
    return submitted


def sbatch_one(extra: list[str]) -> int:
    return int(
        sh("sbatch", "--parsable", "-o", "/dev/null", "--chdir=/tmp", *extra, "--wrap", "sleep 300")
        .strip()
        .split(";")[0]
    )


def submit_native(specs: list[pb.JobSpec], stub: pb_grpc.SchedulerStub) -> dict[int | str, float]:
    """The same jobs submitted to Muster directly, one ``SubmitJob`` each, as many at once as the
    ``sbatch`` submitters."""

    def one(spec: pb.JobSpec) -> str:
        stub.SubmitJob(pb.SubmitJobRequest(job=spec), timeout=60)
        return spec.id

    return submit_parallel(specs, one)


def native_specs(tag: str, args_list: list[list[str]]) -> list[pb.JobSpec]:
    """``sbatch`` argument lists of the bench (``-N<k>``) -> Muster jobs asking the same: k tasks of
    1 CPU and 1 GiB, all of them the gang minimum, running ``sleep 300``."""
    specs = []
    for i, argv in enumerate(args_list):
        nodes = int(next(a[2:] for a in argv if a.startswith("-N")))
        specs.append(
            pb.JobSpec(
                id=f"{tag}-{i:05d}",
                queue="default",
                task_groups=[
                    pb.TaskGroup(
                        role="w",
                        replicas=nodes,
                        request=pb.ResourceList(quantities={"cpu": "1", "memory": "1Gi"}),
                        command=["sleep", "300"],
                        annotations={"slurm.schedmd.com/output": "/dev/null"},
                    )
                ],
            )
        )
    return specs


def measure(
    name: str,
    args_list: list[list[str]],
    timeout: float,
    submit: Callable[[], Mapping[int | str, float]] | None = None,
) -> dict[str, object]:
    observer = Observer()
    observer.start()
    submitted = submit() if submit is not None else submit_parallel(args_list, sbatch_one)
    deadline = time.monotonic() + timeout
    while len([j for j in submitted if j in observer.started]) < len(submitted):
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    observer.stop.set()
    observer.join()
    lat = sorted(observer.started[j] - t for j, t in submitted.items() if j in observer.started)
    done = len(lat)
    first = min(submitted.values())
    last = max((observer.started[j] for j in submitted if j in observer.started), default=first)
    return {
        "workload": name,
        "jobs": len(submitted),
        "running": done,
        "seconds": round(last - first, 2),
        "jobs_per_s": round(done / (last - first), 1) if last > first else None,
        "p50_s": round(statistics.median(lat), 3) if lat else None,
        "p95_s": round(lat[int(0.95 * (len(lat) - 1))], 3) if lat else None,
        "_nodes": {j: observer.nodes[j] for j in submitted if j in observer.nodes},
        "_submitted": submitted,
        "_started": {j: observer.started[j] for j in submitted if j in observer.started},
    }


# The adapter's "placed" log line stamps each step of a placement (wall clock, seconds).
_STEPS = (
    ("sbatch->seen", "sbatch", "seen_at"),
    ("seen->submitted", "seen_at", "submitted_at"),
    ("submitted->bind", "submitted_at", "bind_at"),
    ("bind->updated", "bind_at", "updated_at"),
    ("updated->verified", "updated_at", "verified_at"),
    ("verified->running", "verified_at", "running"),
)
# A native job: SubmitJob returned ("sbatch" here) -> binds reach the adapter -> its sbatch
# returned -> observed RUNNING.
_NATIVE_STEPS = (
    ("submit->bind", "sbatch", "bind_at"),
    ("bind->sbatch-returned", "bind_at", "updated_at"),
    ("sbatch-returned->running", "updated_at", "running"),
)


def breakdown(
    log_path: Path, result: dict[str, object], *, native: bool = False
) -> dict[str, dict[str, float]]:
    """p50 / p95 of each step of the Muster path, for the jobs of this workload."""
    submitted: dict[int | str, float] = result["_submitted"]  # type: ignore[assignment]
    started: dict[int | str, float] = result["_started"]  # type: ignore[assignment]
    stamps: dict[int | str, dict[str, float]] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        jid = (
            event.get("job" if native else "slurm_job") if event.get("event") == "placed" else None
        )
        if jid in submitted and jid in started:
            stamps[jid] = {**event, "sbatch": submitted[jid], "running": started[jid]}
    out: dict[str, dict[str, float]] = {}
    for name, begin, end in _NATIVE_STEPS if native else _STEPS:
        values = sorted(s[end] - s[begin] for s in stamps.values() if s.get(begin) and s.get(end))
        if values:
            out[name] = {
                "p50": round(statistics.median(values), 3),
                "p95": round(values[int(0.95 * (len(values) - 1))], 3),
            }
    return out


def expand(nodes: str) -> list[str]:
    from adapters.slurm.parse import expand_hostlist

    return sorted(expand_hostlist(nodes))


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process, its reaped children and its live descendants (the
    server's cycle worker is a child process)."""
    tick = os.sysconf("SC_CLK_TCK")

    def walk(p: int) -> float:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            return 0.0
        own = sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
        return own + sum(walk(int(c)) for c in children)

    return round(walk(pid), 2)


def run_muster(
    workloads: list[tuple[str, list[list[str]]]], args: argparse.Namespace, *, native: bool = False
) -> list[dict[str, object]]:
    """Muster's runs: the jobs ``sbatch``ed into staging, or with ``native`` submitted to Muster
    directly (the adapter runs them with ``--native-jobs-user nobody``)."""
    workdir = Path(tempfile.mkdtemp(prefix="muster-bench-"))
    port = free_port()
    address = f"127.0.0.1:{port}"
    server_argv = [
        str(BIN / "muster-server"),
        "--listen",
        address,
        "--state",
        str(workdir / "m.db"),
    ]
    if args.min_cycle_interval is not None:
        server_argv += ["--min-cycle-interval", str(args.min_cycle_interval)]
    # Each child gets its own copy of its log's descriptor, so this process's copy can close at once.
    with open(workdir / "server.log", "wb") as server_log:
        server = subprocess.Popen(server_argv, stdout=server_log, stderr=subprocess.STDOUT)
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.SchedulerStub(channel)
    adapter = None
    try:
        grpc.channel_ready_future(channel).result(timeout=30)
        with open(workdir / "adapter.log", "wb") as adapter_log:
            adapter = subprocess.Popen(
                [
                    str(BIN / "muster-slurm-adapter"),
                    "--server",
                    address,
                    "--poll-interval",
                    args.poll_interval,
                    "--log-level",
                    "info",
                    *(["--native-jobs-user", "nobody"] if native else []),
                    *args.adapter_arg,
                ],
                stdout=adapter_log,
                stderr=subprocess.STDOUT,
            )
        # Measure from a ready adapter (its first poll and snapshot reached the server), as Slurm's
        # own scheduler is ready before its run starts: a burst submitted while the adapter is
        # still starting would count its start-up as scheduling latency.
        deadline = time.monotonic() + 60
        while len(stub.ListNodes(pb.ListNodesRequest(), timeout=10).nodes) < args.nodes:
            if time.monotonic() > deadline or adapter.poll() is not None:
                raise RuntimeError(f"the adapter did not report {args.nodes} nodes")
            time.sleep(0.1)
        results = []
        if native:
            try:
                stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="default")), timeout=10)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                    raise
        for n, (name, args_list) in enumerate(workloads):
            cpu_before = cpu_seconds(adapter.pid), cpu_seconds(server.pid)
            submit: Callable[[], Mapping[int | str, float]] | None = None
            if native:
                specs = native_specs(f"native{n}", args_list)

                def submit(specs: list[pb.JobSpec] = specs) -> Mapping[int | str, float]:
                    return submit_native(specs, stub)

            result = measure(name, args_list, args.timeout, submit)
            result["cpu_s"] = {
                "adapter": round(cpu_seconds(adapter.pid) - cpu_before[0], 2),
                "server": round(cpu_seconds(server.pid) - cpu_before[1], 2),
            }
            mismatches = 0
            for jid, nodes in result["_nodes"].items():  # type: ignore[attr-defined]
                try:
                    job = stub.GetJob(
                        pb.GetJobRequest(id=jid if native else f"slurm-{jid}"), timeout=10
                    )
                except grpc.RpcError:
                    mismatches += 1  # running, yet Muster never saw it
                    continue
                if sorted(t.node for t in job.tasks) != expand(nodes):
                    mismatches += 1
            result["mismatches"] = mismatches
            result["breakdown"] = breakdown(workdir / "adapter.log", result, native=native)
            results.append(result)
            drain_cluster()
        return results
    finally:
        for proc in (adapter, server):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
        channel.close()
        if args.keep_logs:
            shutil.copytree(workdir, args.keep_logs, dirs_exist_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--singles", type=int, default=600)
    p.add_argument("--gangs", type=int, default=40)
    p.add_argument("--gang-size", type=int, default=8)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument(
        "--poll-interval", default="0.2s", help="the adapter's --poll-interval (default 0.2s)"
    )
    p.add_argument(
        "--min-cycle-interval",
        type=float,
        default=None,
        help="the server's --min-cycle-interval (default: the server's own)",
    )
    p.add_argument(
        "--adapter-arg",
        action="append",
        default=[],
        help="extra adapter argument (repeatable), e.g. --adapter-arg=--parallel=8",
    )
    p.add_argument(
        "--native",
        action="store_true",
        help="also run the workloads as jobs submitted to Muster directly (SubmitJob, 4 at a time "
        "like the sbatch submitters), which the adapter sbatches pinned at bind time",
    )
    p.add_argument(
        "--keep-logs", type=Path, default=None, help="copy the server and adapter logs here"
    )
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench/slurm_e2e.py needs root (it starts a local Slurm)", file=sys.stderr)
        return 2
    # A private cluster in a temp dir (scripts/slurm-up.sh): its own slurm.conf, daemons, ports
    # and munged, never the machine's Slurm. SLURM_CONF in our environment reaches every sbatch /
    # squeue this bench runs and the adapters it starts.
    slurm_dir = tempfile.mkdtemp(prefix="muster-slurm-bench-")
    os.chmod(slurm_dir, 0o755)
    os.environ["SLURM_CONF"] = f"{slurm_dir}/slurm.conf"
    env = {**os.environ, "SLURM_DIR": slurm_dir, "SLURM_NODES": str(args.nodes)}
    env["SLURM_GPU_NODES"] = "0"
    subprocess.run(["bash", str(REPO / "scripts" / "slurm-up.sh")], env=env, check=True)
    try:
        return _bench(args)
    finally:
        down = {**env, "SLURM_DOWN_PURGE": "1"}
        subprocess.run(["bash", str(REPO / "scripts" / "slurm-down.sh")], env=down, check=False)


def _bench(args: argparse.Namespace) -> int:
    drain_cluster()
    single = [["-N1", "-c", "1", "--mem=1G"]] * args.singles
    gang = [[f"-N{args.gang_size}", "--ntasks-per-node=1", "-c", "1", "--mem=1G"]] * args.gangs
    workloads = [
        (f"{args.singles} single-node jobs", single),
        (f"{args.gangs} {args.gang_size}-node gangs", gang),
    ]
    out: dict[str, object] = {"nodes": args.nodes, "cpus": os.cpu_count()}
    out["muster"] = run_muster(workloads, args)
    native_results = run_muster(workloads, args, native=True) if args.native else []
    if args.native:
        out["muster_native"] = native_results
    slurm_results = []
    for name, args_list in workloads:
        slurm_results.append(measure(name, [["-p", "batch", *a] for a in args_list], args.timeout))
        drain_cluster()
    out["slurm"] = slurm_results
    for results in (out["muster"], native_results, slurm_results):
        for r in results:  # type: ignore[attr-defined]
            for key in ("_nodes", "_submitted", "_started"):
                r.pop(key, None)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
