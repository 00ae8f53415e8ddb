"""End to end (issue 30): a big gang starts at its reserved time while short jobs fill the gap.

A real muster-server with examples/config-reservation.yaml (the `reserve` action, the
`reservation` plugin at a 1 s resolution) and a real muster-agent with
examples/inventory-reservation.yaml (r-0 .. r-3, 4 CPU each) run examples/jobs-reservation.yaml,
submitted as shipped with `muster submit`: long-train holds r-0 until its 12 s time limit ends it;
big-gang (all four nodes) waits for it with a reservation; fill-1 .. fill-6 (limit 4 s) run on the
idle, reserved r-1 .. r-3 meanwhile; late-eval (limit 1m) would overrun the reservation and is held
back. The test polls (bounded) what the server says while it runs, and prints a timeline
(`pytest -s` shows it).

Tolerances, all from the configuration rather than from this machine's speed: the reservation is
long-train's start + its limit rounded up to the resolution (1 s), so within [end, end + 1 s]
(a look while long-train's bind is still in flight may see it a step later);
big-gang cannot start before long-train's end (it needs r-0) and is due at the reservation, which
it must not miss by more than two resolution steps plus one cycle period (the agent ends
long-train at its limit, reports it, the next cycle places the gang). An implementation without
reservations starts late-eval on an idle node before the gang; one that enforces reservations too
strictly keeps the fills off the reserved nodes until the gang has run.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from datetime import datetime

from muster_e2e import ROOT, Cluster, cli, until

from clients.client import MusterClient
from muster.v1 import muster_pb2 as pb

EXAMPLES = ROOT / "examples"
ENDED = {pb.JOB_PHASE_COMPLETED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}
PLACED = {
    pb.TASK_STATUS_ALLOCATED,
    pb.TASK_STATUS_PIPELINED,
    pb.TASK_STATUS_BINDING,
    pb.TASK_STATUS_BOUND,
    pb.TASK_STATUS_RUNNING,
}
NODES = ["r-0", "r-1", "r-2", "r-3"]
GANG = "big-gang"
LONG = "long-train"
LATE = "late-eval"
FILLS = [f"fill-{i}" for i in range(1, 7)]
JOBS = [LONG, GANG, *FILLS, LATE]
LONG_LIMIT = 12.0  # long-train's time_limit in the job file
RESOLUTION = 1.0  # the reservation plugin's resolution in the configuration
CYCLE = 0.2  # Cluster.start_server's --cycle-period
LATE_BY = 2 * RESOLUTION + CYCLE  # how late the gang may start after its reservation
DEADLINE = 40.0  # every job ended: a failure bound, not a speed verdict


@dataclass
class Seen:
    """What the polls saw, with this machine's clock (the server's is the same one)."""

    reserved: list[tuple[float, float, tuple[str, ...]]] = field(default_factory=list)
    first_estimate: dict[str, pb.JobStatus] = field(default_factory=dict)
    gang_first_placed: list[pb.Task] | None = None
    late_reasons: set[str] = field(default_factory=set)


def ts(stamp: object) -> float | None:
    """A protobuf Timestamp in seconds, None when unset."""
    seconds = stamp.seconds + stamp.nanos / 1e9  # type: ignore[attr-defined]
    return seconds or None


def agent_times(cluster: Cluster, event: str) -> dict[str, float]:
    """task id -> when the agent logged ``event`` ("task started", "task ended")."""
    out = {}
    for agent in cluster.agents.values():
        for e in agent.json_events(event):
            out[e["task"]] = datetime.fromisoformat(e["timestamp"]).timestamp()
    return out


async def poll(client: MusterClient, seen: Seen) -> dict[str, pb.Job]:
    """One look at every job; records estimates, the gang's first placement, late-eval's
    reasons."""
    jobs = {j.spec.id: j async for j in client.list_jobs()}
    at = time.time()
    for jid, job in jobs.items():
        st = job.status
        if st.HasField("estimated_start") and jid not in seen.first_estimate:
            seen.first_estimate[jid] = st
    gang = jobs.get(GANG)
    if gang is not None and gang.status.reserved:
        start = ts(gang.status.estimated_start)
        assert start is not None, gang.status
        seen.reserved.append((at, start, tuple(gang.status.estimated_nodes)))
    if gang is not None and seen.gang_first_placed is None:
        if any(t.status in PLACED or t.node for t in gang.tasks):
            seen.gang_first_placed = list(gang.tasks)
        elif LATE in jobs and jobs[LATE].status.phase == pb.JOB_PHASE_INQUEUE:
            why = await client.explain(LATE)
            seen.late_reasons.add(why.summary)
    return jobs


def clock(at: float | None, t0: float) -> str:
    return "-" if at is None else f"+{at - t0:.1f}"


def timeline(jobs: dict[str, pb.Job], seen: Seen, t0: float) -> str:
    """One row per job: submitted, the first estimate seen while it waited, start (its gang
    placed), end, phase, nodes; times in seconds from ``t0``."""
    rows = [("JOB", "SUBMITTED", "ESTIMATE", "START", "END", "PHASE", "NODES")]
    for jid in JOBS:
        job = jobs[jid]
        first = seen.first_estimate.get(jid)
        estimate = "-"
        if first is not None:
            kind = "reserved" if first.reserved else "estimated"
            estimate = f"{clock(ts(first.estimated_start), t0)} {kind}"
        rows.append(
            (
                jid,
                clock(ts(job.status.submit_time), t0),
                estimate,
                clock(ts(job.status.start_time), t0),
                clock(ts(job.status.finish_time), t0),
                pb.JobPhase.Name(job.status.phase).removeprefix("JOB_PHASE_"),
                ",".join(sorted({t.node for t in job.tasks if t.node})),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if seen.reserved:
        at, start, nodes = seen.reserved[0]
        lines.append(
            f"{GANG}: reserved {','.join(nodes)} from {clock(start, t0)}, first seen at "
            f"{clock(at, t0)}; {LONG}'s start + its limit: "
            f"{clock((ts(jobs[LONG].status.start_time) or 0) + LONG_LIMIT, t0)}"
        )
    return "\n".join(lines)


async def test_big_gang_starts_at_its_reservation_while_short_jobs_fill_the_gap(
    cluster: Cluster,
) -> None:
    cluster.start_server((EXAMPLES / "config-reservation.yaml").read_text())
    cluster.start_agent("rack-r", (EXAMPLES / "inventory-reservation.yaml").read_text())
    seen = Seen()
    async with MusterClient(cluster.address, timeout=10) as client:
        await client.wait_until_serving(timeout=30)

        async def four_nodes() -> bool:
            return len(await client.list_nodes()) == len(NODES)

        await until(four_nodes, "the agent's four nodes")
        done = await cli(cluster.address, "submit", str(EXAMPLES / "jobs-reservation.yaml"))
        assert done.returncode == 0, done.stderr

        async def gang_reserved() -> bool:
            await poll(client, seen)
            return bool(seen.reserved)

        await until(gang_reserved, "big-gang's reservation", timeout=15, interval=0.05)
        # What a user sees meanwhile (docs/cli.md): `muster jobs --start`, `muster job`.
        listing = await cli(cluster.address, "jobs", "--start")
        shown = await cli(cluster.address, "job", GANG)

        async def all_ended() -> dict[str, pb.Job] | None:
            jobs = await poll(client, seen)
            return jobs if all(jobs[j].status.phase in ENDED for j in JOBS) else None

        jobs = await until(all_ended, "every job of the example ended", DEADLINE, 0.1)
    started = agent_times(cluster, "task started")
    ended = agent_times(cluster, "task ended")
    t0 = min(ts(j.status.submit_time) or math.inf for j in jobs.values())
    print(f"\nseconds from the submission ({time.strftime('%H:%M:%S', time.localtime(t0))}):")
    print(timeline(jobs, seen, t0))

    def start_of(jid: str) -> float:
        at = ts(jobs[jid].status.start_time)
        assert at is not None, (jid, jobs[jid].status)
        return at

    def end_of(jid: str) -> float:
        at = ts(jobs[jid].status.finish_time)
        assert at is not None, (jid, jobs[jid].status)
        return at

    phases = {j: pb.JobPhase.Name(jobs[j].status.phase) for j in JOBS}
    assert phases == {
        **dict.fromkeys(JOBS, "JOB_PHASE_COMPLETED"),
        LONG: "JOB_PHASE_FAILED",
    }, phases
    [ended_by] = [c for c in jobs[LONG].status.conditions if c.type == "Ended"]
    assert ended_by.reason == "TimeLimit", ended_by  # long-train held r-0 to its limit

    # While the gang waited: reserved, on all four nodes, from long-train's start + its limit
    # rounded up to the resolution. Every look until then saw that, or -- a first look, while
    # long-train's bind was in flight, counted from that cycle -- at most a step later: the
    # reservation never slipped.
    long_end = start_of(LONG) + LONG_LIMIT
    first_seen = seen.reserved[0][0]
    settled = [(r, n) for at, r, n in seen.reserved if at < long_end - RESOLUTION]
    assert settled, seen.reserved
    reserved_at, reserved_nodes = settled[-1]
    assert long_end <= reserved_at <= long_end + RESOLUTION + 1e-3, (long_end, reserved_at)
    for r, n in settled:
        assert sorted(n) == NODES, settled
        assert reserved_at <= r <= reserved_at + RESOLUTION + 1e-3, settled
    starts = [r for r, _ in settled]
    assert starts == sorted(starts, reverse=True), settled  # never later than a look before
    hhmm = {time.strftime("%H:%M", time.localtime(r)) for r, _ in settled}
    assert f"{GANG} " in listing.stdout, listing.stdout
    row = next(line for line in listing.stdout.splitlines() if line.startswith(f"{GANG} "))
    assert "reserved" in row, listing.stdout
    assert "r-0..r-3" in row, listing.stdout
    assert any(f"Start: reserved: 4 nodes from {t} (r-0..r-3)" in shown.stdout for t in hhmm), (
        shown.stdout
    )

    # The gang: at its reserved time (no earlier than long-train's end, which freed r-0; at most
    # LATE_BY after the reservation), all four tasks placed together on the reserved nodes.
    gang_start = start_of(GANG)
    assert long_end <= gang_start <= reserved_at + LATE_BY, (long_end, reserved_at, gang_start)
    assert seen.gang_first_placed is not None
    first = seen.gang_first_placed
    assert all(t.status in PLACED or t.status == pb.TASK_STATUS_SUCCEEDED for t in first), first
    gang_tasks = jobs[GANG].tasks
    assert sorted(t.node for t in gang_tasks) == NODES, gang_tasks
    gang_ran = [started[t.id] for t in gang_tasks]
    assert max(gang_ran) - min(gang_ran) <= 1.0, gang_ran  # one bind, four processes

    # The fills: on the idle, reserved nodes, started before the gang and ended before it
    # started (the gap filled); the second wave started after the reservation was visible.
    for jid in FILLS:
        [task] = jobs[jid].tasks
        assert task.node in NODES[1:], (jid, task.node)
        assert start_of(jid) < gang_start, (jid, start_of(jid), gang_start)
        assert end_of(jid) <= gang_start, (jid, end_of(jid), gang_start)
        assert ended[task.id] <= started[gang_tasks[0].id], jid
    for jid in FILLS[3:]:
        assert start_of(jid) > first_seen, (jid, start_of(jid), first_seen)

    # late-eval would have overrun the reservation: it did not start before the gang, though
    # nodes were idle, and was told why.
    assert start_of(LATE) >= gang_start, (start_of(LATE), gang_start)
    [late_task] = jobs[LATE].tasks
    assert started[late_task.id] >= min(gang_ran), (started[late_task.id], gang_ran)
    delays = [f"would delay reservation of job {GANG} on nodes r-0..r-3 from {t}" for t in hhmm]
    assert any(d in reason for d in delays for reason in seen.late_reasons), seen.late_reasons
    late_estimate = seen.first_estimate.get(LATE)
    if late_estimate is not None:
        assert not late_estimate.reserved, late_estimate
        assert (ts(late_estimate.estimated_start) or 0) >= reserved_at, late_estimate
