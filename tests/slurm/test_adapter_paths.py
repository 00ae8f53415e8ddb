"""The Slurm adapter's fast paths, against a fake Slurm command line and a fake server (no Slurm,
no root): batched submission and its fallback, the live-jobs poll with ended jobs looked up by id,
bursts acked on scontrol's exit status and checked by the next poll, the runtime's burst shaping
(gang-aware gathering, consecutive cycles merged only when their jobs are disjoint).
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import grpc
import pytest

from adapters.slurm.backend import SlurmBackend
from adapters.slurm.cli import LIVE_STATES, Result, SlurmError
from adapters.slurm.jobs import Settings, TrackedJob
from adapters.slurm.parse import SlurmJob
from adapters.slurm.runtime import SlurmRuntime, merge_runs
from muster.v1 import muster_pb2 as pb

_ids = iter(range(1, 1_000_000))


def bind(job: str, index: int, node: str, cycle: int = 1) -> pb.Decision:
    return pb.Decision(
        id=next(_ids),
        cycle_id=cycle,
        bind=pb.BindDecision(task_id=f"{job}/node-{index}", job_id=job, node=node),
    )


def evict(job: str, index: int, node: str, cycle: int = 1) -> pb.Decision:
    return pb.Decision(
        id=next(_ids),
        cycle_id=cycle,
        evict=pb.EvictDecision(
            task_id=f"{job}/node-{index}", job_id=job, node=node, reason="preempt"
        ),
    )


def staged(job_id: int, nodes: int = 1) -> SlurmJob:
    return SlurmJob(
        job_id=job_id,
        state="PENDING",
        partition="staging",
        num_nodes=nodes,
        cpus=nodes,
        memory_bytes=nodes << 30,
        reason="PartitionDown",
    )


def in_run(job_id: int, state: str, node: str, *, runs_on: str = "", reason: str = "") -> SlurmJob:
    """A one-node job in the run partition, required on ``node`` (running on ``runs_on``)."""
    return SlurmJob(
        job_id=job_id,
        state=state,
        partition="batch",
        num_nodes=1,
        required_nodes=[node],
        nodes=[runs_on] if runs_on else [],
        reason=reason,
    )


class FakeCLI:
    """The SlurmCLI calls the backend and enforcer make, answered from fields the test sets."""

    parallel = 8

    def __init__(self) -> None:
        self.live: list[SlurmJob] = []
        self.by_id: dict[int, SlurmJob] = {}
        self.place_rc = 0
        self.place_error = ""
        self.calls: list[tuple[Any, ...]] = []

    async def nodes(self, partition: str = "") -> list[Any]:
        return []

    async def jobs(self, *, states: str = "all") -> list[SlurmJob]:
        self.calls.append(("jobs", states))
        return list(self.live)

    async def jobs_by_id(self, job_ids: list[int], *, missing_ok: bool = False) -> list[SlurmJob]:
        self.calls.append(("jobs_by_id", tuple(job_ids)))
        return [self.by_id[i] for i in job_ids if i in self.by_id]

    async def jobs_full(self) -> list[SlurmJob]:
        return []

    async def place_many(self, placements: Any, partition: str) -> Result:
        self.calls.append(("place_many", tuple(p[0] for p in placements)))
        return Result(self.place_rc, "", "", 0.0)

    async def place(
        self, job_id: int, partition: str, nodes: Any, marker: str = "", time_limit: int = 0
    ) -> None:
        self.calls.append(("place", job_id))
        if self.place_error:
            raise SlurmError(["scontrol"], 1, self.place_error)

    async def show_job(self, job_id: int) -> SlurmJob:
        return self.by_id[job_id]

    async def unstage(self, job_id: int, staging: str) -> None:
        self.calls.append(("unstage", job_id))

    async def requeuehold(self, job_id: int) -> None:
        self.calls.append(("requeuehold", job_id))

    async def release(self, job_id: int) -> None:
        self.calls.append(("release", job_id))

    async def set_admin_comment(self, job_id: int, text: str) -> None:
        pass


class FakeRuntime:
    """Records what the backend reports."""

    def __init__(self) -> None:
        self.statuses: list[tuple[str, int, str]] = []

    def report_task_status(
        self, task_id: str, status: int, *, node: str = "", message: str = "", exit_code: int = 0
    ) -> None:
        self.statuses.append((task_id, status, message))

    def upsert_node(self, node: pb.Node) -> None: ...
    def remove_node(self, name: str) -> None: ...
    def upsert_foreign_task(self, task: pb.BackendTask) -> None: ...
    def remove_foreign_task(self, task_id: str) -> None: ...


def rpc_error(code: grpc.StatusCode, details: str = "") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class FakeServer:
    """SubmitJobs / SubmitJob / CreateQueue; ``refuse`` names the job ids the server refuses."""

    def __init__(self, refuse: set[str] | None = None) -> None:
        self.refuse = refuse or set()
        self.batches: list[list[str]] = []
        self.singles: list[str] = []

    async def CreateQueue(self, request: pb.QueueRequest) -> pb.Queue:  # the gRPC name
        return request.queue

    async def SubmitJobs(self, request: pb.SubmitJobsRequest) -> pb.SubmitJobsResponse:
        ids = [j.id for j in request.jobs]
        self.batches.append(ids)
        if self.refuse & set(ids):
            raise rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "jobs[1].job: refused")
        return pb.SubmitJobsResponse()

    async def SubmitJob(self, request: pb.SubmitJobRequest) -> pb.SubmitJobResponse:
        self.singles.append(request.job.id)
        if request.job.id in self.refuse:
            raise rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "job: refused")
        return pb.SubmitJobResponse()


def make_backend() -> tuple[SlurmBackend, FakeCLI, FakeRuntime]:
    cli = FakeCLI()
    backend = SlurmBackend(cli, Settings())  # type: ignore[arg-type]
    runtime = FakeRuntime()
    backend.runtime = runtime  # type: ignore[assignment]
    backend._adopted = True
    return backend, cli, runtime


def submitted(backend: SlurmBackend, slurm_id: int, size: int = 1) -> TrackedJob:
    job = backend.table.track(slurm_id, size)
    job.submitted = True
    return job


def placed(
    backend: SlurmBackend, slurm_id: int, nodes: list[str], *, confirmed: bool = True
) -> TrackedJob:
    job = submitted(backend, slurm_id, len(nodes))
    job.placed = nodes
    job.confirmed = confirmed
    return job


# -- submission ---------------------------------------------------------------------------------


async def test_a_polls_new_jobs_go_in_one_submitjobs() -> None:
    backend, cli, _ = make_backend()
    server = FakeServer()
    backend.client = server  # type: ignore[assignment]
    cli.live = [staged(1), staged(2), staged(3, nodes=4)]
    await backend.poll_once()
    assert server.batches == [["slurm-1", "slurm-2", "slurm-3"]]
    assert server.singles == []
    assert all(backend.jobs[i].submitted for i in (1, 2, 3))
    await backend.poll_once()  # nothing new: nothing submitted again
    assert len(server.batches) == 1


async def test_a_refused_batch_is_submitted_one_by_one() -> None:
    backend, cli, _ = make_backend()
    server = FakeServer(refuse={"slurm-2"})
    backend.client = server  # type: ignore[assignment]
    cli.live = [staged(1), staged(2), staged(3)]
    await backend.poll_once()
    assert server.batches == [["slurm-1", "slurm-2", "slurm-3"]]
    assert sorted(server.singles) == ["slurm-1", "slurm-2", "slurm-3"]
    assert [backend.jobs[i].submitted for i in (1, 2, 3)] == [True, False, True]


# -- polling --------------------------------------------------------------------------------------


async def test_poll_reads_live_jobs_and_looks_up_ended_tracked_jobs_by_id() -> None:
    backend, cli, runtime = make_backend()
    done = placed(backend, 5, ["n1"])
    done.ran = True
    gone = placed(backend, 6, ["n2"])
    gone.ran = True
    placed(backend, 7, ["n3"])
    cli.live = [in_run(7, "RUNNING", "n3", runs_on="n3")]
    cli.by_id = {5: in_run(5, "COMPLETED", "n1", runs_on="n1")}
    await backend.poll_once()
    assert ("jobs", LIVE_STATES) in cli.calls
    assert ("jobs", "all") not in cli.calls
    assert ("jobs_by_id", (5, 6)) in cli.calls  # only the tracked jobs missing from the live list
    assert ("slurm-5/node-0", pb.TASK_STATUS_SUCCEEDED, "COMPLETED") in runtime.statuses
    assert ("slurm-6/node-0", pb.TASK_STATUS_FAILED, "job vanished from Slurm") in runtime.statuses
    assert ("slurm-7/node-0", pb.TASK_STATUS_RUNNING, "") in runtime.statuses


# -- enforcement ----------------------------------------------------------------------------------


async def test_a_burst_scontrol_accepted_is_acked_without_reading_back_then_checked_by_the_poll() -> (
    None
):
    backend, cli, runtime = make_backend()
    for sid in (10, 11):
        submitted(backend, sid)
    outcomes = await backend.apply_batch([bind("slurm-10", 0, "n1"), bind("slurm-11", 0, "n2")])
    assert all(o.applied for o in outcomes)
    assert not any(c[0] == "jobs_by_id" for c in cli.calls)  # no read-back on the enforcement path
    assert backend.jobs[10].placed == ["n1"]
    assert not backend.jobs[10].confirmed
    # The next poll: job 10 shows Muster's placement; job 11 does not (its update did not stick).
    cli.live = [
        in_run(10, "PENDING", "n1", reason="None"),
        in_run(11, "PENDING", "n7", reason="None"),
    ]
    await backend.poll_once()
    assert backend.jobs[10].confirmed
    assert backend.jobs[10].attempt == 0
    failed = [s for s in runtime.statuses if s[0] == "slurm-11/node-0"]
    assert failed
    assert failed[0][1] == pb.TASK_STATUS_FAILED
    assert "ReqNodeList=n7" in failed[0][2]
    assert ("unstage", 11) in cli.calls
    assert ("requeuehold", 11) not in cli.calls
    assert backend.jobs[11].attempt == 1
    assert backend.jobs[11].muster_id == "slurm-11.a1"
    assert not any(s[0] == "slurm-10/node-0" for s in runtime.statuses)


async def test_a_mismatched_job_slurm_already_started_is_requeued_back_to_staging() -> None:
    backend, cli, _ = make_backend()
    placed(backend, 12, ["n1"], confirmed=False)
    cli.live = [in_run(12, "RUNNING", "n1", runs_on="n4")]
    await backend.poll_once()
    assert [c for c in cli.calls if c[0] in ("requeuehold", "unstage", "release")] == [
        ("requeuehold", 12),
        ("unstage", 12),
        ("release", 12),
    ]
    assert backend.jobs[12].attempt == 1


async def test_a_chunk_with_a_failed_update_is_read_back_and_its_failures_retried_alone() -> None:
    backend, cli, _ = make_backend()
    for sid in (20, 21):
        submitted(backend, sid)
    cli.place_rc = 1
    cli.place_error = "Invalid node name specified"
    cli.by_id = {20: in_run(20, "PENDING", "n1")}
    ok, bad = await backend.apply_batch([bind("slurm-20", 0, "n1"), bind("slurm-21", 0, "n999")])
    assert ok.applied
    assert backend.jobs[20].confirmed
    assert not bad.applied
    assert "Invalid node name specified" in bad.reason
    assert ("place", 21) in cli.calls
    assert ("place", 20) not in cli.calls


# -- runtime burst shaping ------------------------------------------------------------------------


def test_consecutive_cycles_merge_only_when_their_jobs_are_disjoint() -> None:
    a1, b2, c2 = (
        bind("a", 0, "n1", cycle=1),
        bind("b", 0, "n2", cycle=2),
        bind("c", 0, "n3", cycle=2),
    )
    assert merge_runs([a1, b2, c2]) == [[a1, b2, c2]]
    # Job a bound in cycle 1 and evicted in cycle 2: the eviction must come after the bind.
    ev = evict("a", 0, "n1", cycle=2)
    d3 = bind("d", 0, "n4", cycle=3)
    assert merge_runs([a1, b2, ev, d3]) == [[a1], [b2, ev, d3]]
    # Within one cycle nothing is split.
    g = [bind("g", i, f"n{i}", cycle=4) for i in range(3)]
    assert merge_runs(g) == [g]


async def _gathered(
    first: list[pb.Decision], later: list[pb.Decision], delay: float
) -> tuple[list[pb.Decision], float]:
    backend, _, _ = make_backend()
    submitted(backend, 30, 3)
    runtime = SlurmRuntime(
        backend, server="127.0.0.1:1", name="slurm", batch_linger=0.01, gang_wait=1.0
    )
    send, receive = anyio.create_memory_object_stream[pb.Decision](100)
    for d in first:
        send.send_nowait(d)
    burst = [await receive.receive()]
    started = time.monotonic()
    async with anyio.create_task_group() as tg:

        async def late() -> None:
            await anyio.sleep(delay)
            for d in later:
                await send.send(d)

        tg.start_soon(late)
        await runtime.gather(receive, burst)
        elapsed = time.monotonic() - started
        tg.cancel_scope.cancel()
    return burst, elapsed


async def test_gather_waits_past_the_linger_for_the_rest_of_a_gang() -> None:
    gang = [bind("slurm-30", i, f"n{i}") for i in range(3)]
    burst, elapsed = await _gathered(gang[:2], gang[2:], delay=0.15)
    assert burst == gang  # without the gang wait the partial gang would be rejected
    assert elapsed < 0.9


async def test_gather_does_not_wait_when_every_gang_is_whole() -> None:
    gang = [bind("slurm-30", i, f"n{i}") for i in range(3)]
    burst, elapsed = await _gathered(gang, [bind("other", 0, "n9")], delay=0.5)
    assert burst == gang
    assert elapsed < 0.3


@pytest.mark.parametrize("missing", [False, True])
def test_incomplete_gangs(missing: bool) -> None:
    backend, _, _ = make_backend()
    submitted(backend, 40, 2)
    decisions = [bind("slurm-40", 0, "n1")] + ([] if missing else [bind("slurm-40", 1, "n2")])
    assert backend.incomplete_gangs(decisions) is missing
