"""Failover under load: three ``muster-server`` replicas on one PostgreSQL (started here, in a temp
dir, PostgreSQL's durability defaults), a steady stream of submissions, a null backend that
applies every bind and counts what must never happen, and faults injected into the leader one
after the other: kill -9, SIGSTOP past the lease then SIGCONT, its database connections cut, a
graceful handover (SIGTERM). A killed or handed-over replica is started again before the next
fault, so three replicas run throughout.

    .venv/bin/python bench/failover.py --faults 100 --rate 2000
    .venv/bin/python bench/failover.py --cold-start 1000000     # restart with 1M waiting jobs
    .venv/bin/python bench/failover.py --cold-start 1000000 --lookback 1000  # ... with a window

Per fault it prints the time from the fault to the first decision the backend received from the
new leader (a later term; for a connection cut, from any leader), and at the end the totals: jobs
acknowledged and lost, tasks started twice, decisions of a replaced leader delivered, decision
ids that said two things, nodes over-committed, writes the fence refused, and the placement rate
sustained over the run. Bounded by ``--timeout``. Run by hand, not in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from muster.v1 import muster_pb2 as pb  # noqa: E402
from tests.ha.harness import (  # noqa: E402
    CALL_TIMEOUT,
    RETRY_CODES,
    Deployment,
    Follower,
    RecordingBackend,
    ServerProc,
    job_spec,
    refused_writes,
    unfinished,
)
from tests.pgserver import PostgresServer  # noqa: E402

FAULTS = ("kill", "pause", "cut", "handover")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class BatchSubmitter:
    """SubmitJobs of ``rate / 10`` jobs every 100 ms to wherever the leader is; a batch is
    acknowledged (durable) or retried whole (resubmitting the same specs is a no-op)."""

    def __init__(self, addresses: list[str]) -> None:
        self.follower = Follower(addresses)
        self.acked: list[str] = []
        self.retries = 0
        self._ids = itertools.count()

    async def run(self, rate: float, stop: asyncio.Event) -> None:
        per_tick = max(1, int(rate / 10))
        next_tick = time.monotonic()
        while not stop.is_set():
            ids = [f"f{next(self._ids):08d}" for _ in range(per_tick)]
            while True:
                try:
                    await self.follower.stub().SubmitJobs(
                        pb.SubmitJobsRequest(jobs=[job_spec(i) for i in ids]), timeout=CALL_TIMEOUT
                    )
                    self.acked.extend(ids)
                    break
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in RETRY_CODES:
                        raise
                    self.retries += 1
                    self.follower.moved(exc)
                    await asyncio.sleep(0.05)
            next_tick += 0.1
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))


async def inject(
    dep: Deployment, fault: str, backend: RecordingBackend, args: argparse.Namespace
) -> float:
    """One fault into the current leader; seconds to the first decision after it (from a
    later term unless the fault keeps the leader's term possible)."""
    leader = await dep.leader(timeout=60)
    old_term = backend.record.max_term
    seen = len(backend.record.received)
    faulted = time.monotonic()
    if fault == "kill":
        leader.kill()
    elif fault == "pause":
        leader.signal(signal.SIGSTOP)
    elif fault == "cut":
        dep.terminate_store_sessions(leader)
    elif fault == "handover":
        leader.signal(signal.SIGTERM)
    needs_new_term = fault != "cut"
    recovered: float | None = None
    deadline = faulted + 60
    while recovered is None and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
        for t, term in backend.record.received[seen:]:
            if t > faulted and (term > old_term or not needs_new_term):
                recovered = t - faulted
                break
    if fault == "pause":
        await asyncio.sleep(max(0.0, args.lease * 1.5 - (time.monotonic() - faulted)))
        leader.signal(signal.SIGCONT)
    elif fault in ("kill", "handover"):
        leader.wait(30)
        leader.start()  # three replicas again
    return recovered if recovered is not None else float("inf")


async def run_faults(args: argparse.Namespace) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="muster-failover-"))
    with PostgresServer(fast=False) as pg:
        dsn = pg.new_database("failover")
        servers = [
            ServerProc(
                i,
                dsn,
                work,
                lease_duration=args.lease,
                lease_renew=args.renew,
                cycle_worker="process",
            )
            for i in range(3)
        ]
        dep = Deployment(servers)
        dep.start()
        backend = RecordingBackend(dep.addresses, nodes=args.nodes, hold=args.hold)
        submitter = BatchSubmitter(dep.addresses)
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(backend.run()),
            asyncio.create_task(backend.report_loop()),
        ]
        results: list[tuple[str, float]] = []
        began = time.monotonic()
        try:
            await dep.leader(timeout=60)
            while backend.record.sessions == 0:
                await asyncio.sleep(0.05)
            submitting = asyncio.create_task(submitter.run(args.rate, stop))
            tasks.append(submitting)
            await asyncio.sleep(args.settle)
            placed_before = len(backend.record.starts)
            load_began = time.monotonic()
            for n, fault in zip(range(args.faults), itertools.cycle(FAULTS), strict=False):
                if time.monotonic() - began > args.timeout:
                    break
                seconds = await inject(dep, fault, backend, args)
                results.append((fault, seconds))
                print(
                    f"fault {n + 1:3d} {fault:9s} -> first decision after {seconds:6.2f} s",
                    flush=True,
                )
                await asyncio.sleep(args.settle)
            load_seconds = time.monotonic() - load_began
            placed = len(backend.record.starts) - placed_before
            stop.set()
            await asyncio.wait_for(submitting, 30)
            drain_deadline = time.monotonic() + 120
            while (
                len(backend.record.done) < len(submitter.acked)
                and time.monotonic() < drain_deadline
            ):
                await asyncio.sleep(0.2)
            missing = await unfinished(dep.addresses, submitter.acked)
            deadline = time.monotonic() + 60
            while missing and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                missing = await unfinished(dep.addresses, missing)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            dep.stop()
        record = backend.record
        times = [s for _f, s in results]
        by_kind = {
            kind: {
                "count": sum(1 for f, _s in results if f == kind),
                "p50_s": round(pct([s for f, s in results if f == kind], 0.5), 3),
                "max_s": round(max((s for f, s in results if f == kind), default=float("nan")), 3),
            }
            for kind in FAULTS
        }
        return {
            "faults": len(results),
            "failover_p50_s": round(pct(times, 0.5), 3),
            "failover_p99_s": round(pct(times, 0.99), 3),
            "failover_max_s": round(max(times, default=float("nan")), 3),
            "failover_mean_s": round(statistics.fmean(times), 3) if times else None,
            "by_fault": by_kind,
            "jobs_acknowledged": len(submitter.acked),
            "lost": len(missing),
            "started_twice": record.started_twice,
            "stale_term_decisions_delivered": record.stale_term,
            "decision_ids_reused": record.conflicting,
            "overcommitted_binds": record.overcommits,
            "writes_refused_by_fence": refused_writes([s.log_path for s in servers]),
            "submit_retries": submitter.retries,
            "placements_per_s_during_faults": round(placed / load_seconds, 1)
            if load_seconds
            else None,
            "rate_asked": args.rate,
            "lease_s": args.lease,
            "renew_s": args.renew,
            "logs": str(work),
        }


async def cold_start(args: argparse.Namespace) -> dict[str, object]:
    """Fill the store with ``--cold-start`` waiting jobs (one task each), then start a replica and
    time it to serving and to its first decision; report its peak RSS."""
    from server.service.pgstore import PostgresStore
    from server.service.records import JobStatusRecord, TaskRecord
    from server.service.store import WriteBatch

    work = Path(tempfile.mkdtemp(prefix="muster-coldstart-"))
    with PostgresServer(fast=False) as pg:
        dsn = pg.new_database("coldstart")
        store = PostgresStore(dsn)
        filled = time.monotonic()
        status = JobStatusRecord(phase=pb.JOB_PHASE_PENDING).to_json()
        chunk = 20_000
        for start in range(0, args.cold_start, chunk):
            batch = WriteBatch()
            for i in range(start, min(args.cold_start, start + chunk)):
                job_id = f"c{i:08d}"
                spec = job_spec(job_id)
                spec.queue, spec.namespace = "default", "default"
                batch.jobs[job_id] = (
                    job_id,
                    i + 1,
                    spec.SerializeToString(deterministic=True),
                    status,
                    "default",
                    "default",
                    int(pb.JOB_PHASE_PENDING),
                    0.0,
                    "",
                )
                task = TaskRecord(f"{job_id}/worker-0", job_id, "worker", 0)
                batch.tasks[task.uid] = task.row()
            batch.meta["next_creation_index"] = str(min(args.cold_start, start + chunk) + 1)
            store.write(batch)
        store.close()
        fill_seconds = time.monotonic() - filled
        # The server's default: the core in a worker process that keeps the cluster between cycles.
        server = ServerProc(
            0,
            dsn,
            work,
            lease_duration=args.lease,
            lease_renew=args.renew,
            cycle_worker="process",
        )
        if args.lookback:  # the queue window: a cycle opens the first N waiting jobs of a queue
            from server.config import DEFAULT_CONFIG_YAML

            config = work / "config.yaml"
            config.write_text(
                DEFAULT_CONFIG_YAML + f"session: {{maxQueueLookback: {args.lookback}}}\n"
            )
            server.args += ["--config", str(config)]
        started = time.monotonic()
        server.start()
        peak = 0
        dep = Deployment([server])
        backend = RecordingBackend([server.address], nodes=args.nodes, hold=3600)
        serving = first = None
        tasks: list[asyncio.Task[None]] = []
        try:
            while first is None and time.monotonic() - started < args.timeout:
                peak = max(peak, _rss_kib(server.pid))
                if serving is None:
                    try:
                        await dep.leader(timeout=0.5)
                        serving = time.monotonic() - started
                        tasks.append(asyncio.create_task(backend.run()))
                    except TimeoutError:
                        pass
                if backend.record.received:
                    first = backend.record.received[0][0] - started
                await asyncio.sleep(0.2)
            steady_until = time.monotonic() + max(3.0, args.steady)
            while time.monotonic() < steady_until:  # the steady state after the first decision
                peak = max(peak, _rss_kib(server.pid))
                await asyncio.sleep(0.3)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            dep.stop()
        return {
            "waiting_jobs": args.cold_start,
            "max_queue_lookback": args.lookback,
            "fill_seconds": round(fill_seconds, 1),
            "start_to_leading_s": round(serving, 2) if serving is not None else None,
            "start_to_first_decision_s": round(first, 2) if first is not None else None,
            "peak_rss_mib": round(peak / 1024, 1),
            # Each cycle's seconds (the server's cycle.done), the first one included.
            "cycle_seconds": [
                round(float(e["seconds"]), 2)
                for e in _log_events(server.log_path)
                if e.get("event") == "cycle.done"
            ],
            "logs": str(work),
        }


def _log_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def _rss_kib(pid: int) -> int:
    out = subprocess.run(
        ["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True, check=False
    )
    return int(out.stdout.strip() or 0)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--faults", type=int, default=100)
    p.add_argument("--rate", type=float, default=2000.0, help="jobs submitted per second")
    p.add_argument("--nodes", type=int, default=200, help="null nodes of 4 CPUs (1 per task)")
    p.add_argument("--hold", type=float, default=0.2, help="seconds a task runs")
    p.add_argument("--lease", type=float, default=3.0)
    p.add_argument("--renew", type=float, default=1.0)
    p.add_argument("--settle", type=float, default=2.0, help="seconds between faults")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--cold-start", type=int, default=0, help="instead: restart with N waiting jobs")
    p.add_argument("--lookback", type=int, default=0, help="cold start: maxQueueLookback")
    p.add_argument(
        "--steady",
        type=float,
        default=3.0,
        help="cold start: seconds to run after the first decision",
    )
    args = p.parse_args()
    result = asyncio.run(cold_start(args) if args.cold_start else run_faults(args))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
