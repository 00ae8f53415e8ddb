"""The Slurm backend's enforcement path against the real local Slurm, without a Muster server:
decisions are built by hand, so each primitive (gang bind, verification, rejection with Slurm's
message, evict by requeuehold and re-placement) is checked on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from adapters.slurm.backend import Settings, SlurmBackend
from adapters.slurm.cli import SlurmCLI, SlurmError
from muster.v1 import muster_pb2 as pb
from tests.slurm.conftest import job_info, run, sbatch, wait_until

pytestmark = pytest.mark.slurm

_next_id = iter(range(1, 1_000_000))


def bind(job: str, index: int, node: str, cycle: int = 1) -> pb.Decision:
    return pb.Decision(
        id=next(_next_id),
        cycle_id=cycle,
        bind=pb.BindDecision(task_id=f"{job}/node-{index}", job_id=job, node=node),
    )


def evict(job: str, index: int, node: str, reason: str = "preempt") -> pb.Decision:
    return pb.Decision(
        id=next(_next_id),
        cycle_id=2,
        evict=pb.EvictDecision(task_id=f"{job}/node-{index}", job_id=job, node=node, reason=reason),
    )


@pytest.fixture
async def backend(clean_slurm: list[str]) -> SlurmBackend:
    b = SlurmBackend(SlurmCLI(), Settings(poll_interval=0.2), name="slurm-test")
    await b.poll_once()
    return b


async def test_gang_bind_places_exactly_and_rejects_bad_decisions(backend: SlurmBackend) -> None:
    slurm_id = sbatch("-N3", "--ntasks-per-node=1", "-c", "2", "--mem=1G")
    await backend.poll_once()
    job = f"slurm-{slurm_id}"
    assert backend.jobs[slurm_id].size == 3

    # A partial gang cannot be honoured by Slurm: rejected, nothing changes in Slurm.
    partial = await backend.apply_batch([bind(job, 0, "n5"), bind(job, 1, "n6")])
    assert [o.applied for o in partial] == [False, False]
    assert "gang incomplete" in partial[0].reason
    assert job_info(slurm_id)["Partition"] == "staging"

    # An unknown node: Slurm's own message is the reason.
    bad = await backend.apply_batch([bind(job, 0, "n5"), bind(job, 1, "n6"), bind(job, 2, "n999")])
    assert not bad[0].applied
    assert "Invalid node name" in bad[0].reason
    assert job_info(slurm_id)["Partition"] == "staging"

    # The whole gang: one update, verified.
    good = await backend.apply_batch([bind(job, 0, "n9"), bind(job, 1, "n3"), bind(job, 2, "n6")])
    assert all(o.applied for o in good), good
    wait_until("the gang to run", lambda: job_info(slurm_id)["JobState"] == "RUNNING")
    assert job_info(slurm_id)["_nodes"] == "n3,n6,n9"

    # A repeated bind naming the same placement is idempotent; a different one is refused.
    again = await backend.apply_batch([bind(job, 1, "n3")])
    assert again[0].applied
    moved = await backend.apply_batch([bind(job, 1, "n4")])
    assert not moved[0].applied
    assert "already placed" in moved[0].reason

    # Binds for a job the adapter does not manage.
    stranger = await backend.apply_batch([bind("slurm-999999", 0, "n1")])
    assert not stranger[0].applied


async def test_placement_slurm_cannot_start_becomes_a_new_attempt(backend: SlurmBackend) -> None:
    # A GPU job placed on a node without GPUs: Slurm accepts the update, then keeps the job
    # PENDING (BadConstraints) at its next pass. The poll notices, reports the attempt failed and
    # puts the job back in staging as a new Muster job.
    slurm_id = sbatch("-N1", "--gres=gpu:1", "-c", "1", "--mem=1G")
    await backend.poll_once()
    outcome = await backend.apply_batch([bind(f"slurm-{slurm_id}", 0, "n12")])
    if outcome[0].applied:  # Slurm had not evaluated the node list yet when we verified

        async def retried() -> bool:
            await backend.poll_once()
            return backend.jobs[slurm_id].muster_id == f"slurm-{slurm_id}.a1"

        for _ in range(40):
            if await retried():
                break
            await anyio.sleep(0.25)
    else:
        assert "BadConstraints" in outcome[0].reason
    info = job_info(slurm_id)
    assert info["Partition"] == "staging"
    assert info["_req"] == ""
    if outcome[0].applied:
        assert backend.jobs[slurm_id].muster_id == f"slurm-{slurm_id}.a1"


async def test_evict_requeueholds_back_to_staging_then_replaces(backend: SlurmBackend) -> None:
    slurm_id = sbatch("-N2", "--ntasks-per-node=1", "-c", "1", "--mem=1G")
    await backend.poll_once()
    job = f"slurm-{slurm_id}"
    assert all(
        o.applied for o in await backend.apply_batch([bind(job, 0, "n1"), bind(job, 1, "n2")])
    )
    wait_until("the job to run", lambda: job_info(slurm_id)["JobState"] == "RUNNING")
    await backend.poll_once()

    out = await backend.apply_batch([evict(job, 0, "n1"), evict(job, 1, "n2")])
    assert all(o.applied for o in out), out
    info = job_info(slurm_id)
    # COMPLETING while the old processes are being killed; the job is already back in staging.
    assert (info["JobState"], info["Partition"], info["_req"]) in (
        ("PENDING", "staging", ""),
        ("COMPLETING", "staging", ""),
    )
    wait_until("the old run to end", lambda: job_info(slurm_id)["JobState"] == "PENDING")
    info = job_info(slurm_id)
    assert info["Restarts"] == "1"
    assert info["Reason"] != "job_requeued_in_held_state"
    await backend.poll_once()
    assert backend.jobs[slurm_id].placed is None  # not mistaken for a Slurm-initiated requeue

    # Re-placed elsewhere: runs at once, although requeue left EligibleTime ~2 min ahead.
    assert all(
        o.applied for o in await backend.apply_batch([bind(job, 0, "n7", 3), bind(job, 1, "n8", 3)])
    )
    wait_until(
        "the job to run again", lambda: job_info(slurm_id)["JobState"] == "RUNNING", timeout=30
    )
    assert job_info(slurm_id)["_nodes"] == "n7,n8"


async def test_evict_for_cancel_cancels_the_slurm_job(backend: SlurmBackend) -> None:
    slurm_id = sbatch("-N1", "-c", "1", "--mem=1G")
    await backend.poll_once()
    job = f"slurm-{slurm_id}"
    assert (await backend.apply_batch([bind(job, 0, "n4")]))[0].applied
    assert (await backend.apply_batch([evict(job, 0, "n4", reason="cancel")]))[0].applied
    wait_until("the job to be cancelled", lambda: job_info(slurm_id)["JobState"] == "CANCELLED")


async def test_poll_reports_nodes_and_foreign_jobs(backend: SlurmBackend) -> None:
    # A job root sends straight to the run partition is Slurm's own: a foreign task for Muster.
    own = sbatch("-p", "batch", "-N2", "-c", "4", "--mem=1G")
    wait_until("Slurm to start it", lambda: job_info(own)["JobState"] == "RUNNING")
    await backend.poll_once()
    nodes = {n.name: n for n in await backend.list_nodes()}
    assert len(nodes) == 16
    assert dict(nodes["n1"].allocatable.quantities)["nvidia.com/gpu"] == "4"
    tasks = await backend.list_tasks()
    foreign = [t for t in tasks if t.foreign_task]
    assert sorted(t.node for t in foreign) == job_info(own)["_nodes"].split(",")
    assert all(dict(t.request.quantities)["cpu"] == "4" for t in foreign)
    assert own not in backend.jobs


def native_bind(job: str, index: int, node: str, *, min_member: int, cycle: int = 1) -> pb.Decision:
    return pb.Decision(
        id=next(_next_id),
        cycle_id=cycle,
        bind=pb.BindDecision(
            task_id=f"{job}/worker-{index}",
            job_id=job,
            node=node,
            min_member=min_member,
            command=["sleep", "120"],
            request=pb.ResourceList(quantities={"cpu": "2", "memory": "1Gi"}),
        ),
    )


def slurm_ids_named(name: str) -> list[int]:
    out = run("squeue", "-h", "-a", "-n", name, "-o", "%i")
    return sorted(int(line) for line in out.split())


async def test_native_job_is_submitted_pinned_at_bind_evicted_replaced_and_adopted(
    clean_slurm: list[str],
) -> None:
    settings = Settings(
        poll_interval=0.2, native_user="nobody", native_group="nogroup", native_workdir="/tmp"
    )
    backend = SlurmBackend(SlurmCLI(), settings, name="slurm-test")
    await backend.poll_once()

    # A partial gang is refused before anything reaches Slurm.
    partial = await backend.apply_batch([native_bind("mpi", 0, "n2", min_member=2)])
    assert not partial[0].applied
    assert "gang incomplete: 1 of 2" in partial[0].reason
    assert slurm_ids_named("mpi") == []

    out = await backend.apply_batch(
        [native_bind("mpi", 0, "n2", min_member=2), native_bind("mpi", 1, "n5", min_member=2)]
    )
    assert all(o.applied for o in out), out
    [first] = slurm_ids_named("mpi")
    info = job_info(first)
    # One Slurm job, as the native user, on exactly the bound nodes, with the per-node request.
    assert info["_req"] == "n2,n5"
    assert info["Partition"] == "batch"
    assert info["UserId"].startswith("nobody(")
    assert info["NumNodes"] in ("2", "2-2")
    assert info["MinMemoryNode"] == "1G"
    assert info["NumCPUs"] == "4"
    wait_until("the job to run", lambda: job_info(first)["JobState"] == "RUNNING")
    await backend.poll_once()
    assert backend.jobs[first].ran
    assert backend.jobs[first].tasks == ["mpi/worker-0", "mpi/worker-1"]
    tasks = {
        t.task_id: (t.node, t.status) for t in await backend.list_tasks() if not t.foreign_task
    }
    assert tasks == {
        "mpi/worker-0": ("n2", pb.TASK_STATUS_RUNNING),
        "mpi/worker-1": ("n5", pb.TASK_STATUS_RUNNING),
    }

    # A repeated bind of the same placement is idempotent: no second Slurm job.
    assert (await backend.apply_batch([native_bind("mpi", 1, "n5", min_member=2)]))[0].applied
    assert slurm_ids_named("mpi") == [first]

    # Evicted: the Slurm job is cancelled; binds after it make a new Slurm job elsewhere.
    out = await backend.apply_batch(
        [
            pb.Decision(
                id=next(_next_id),
                cycle_id=2,
                evict=pb.EvictDecision(
                    task_id=f"mpi/worker-{i}", job_id="mpi", node=n, reason="preempt"
                ),
            )
            for i, n in ((0, "n2"), (1, "n5"))
        ]
    )
    assert all(o.applied for o in out), out
    wait_until(
        "the first job to end", lambda: job_info(first)["JobState"] in ("CANCELLED", "COMPLETED")
    )
    out = await backend.apply_batch(
        [
            native_bind("mpi", 0, "n9", min_member=2, cycle=3),
            native_bind("mpi", 1, "n10", min_member=2, cycle=3),
        ]
    )
    assert all(o.applied for o in out), out
    [second] = slurm_ids_named("mpi")
    assert second != first
    assert job_info(second)["_req"] == "n9,n10"
    wait_until("the new job to run", lambda: job_info(second)["JobState"] == "RUNNING")

    # A restarted adapter recognises the job it submitted (not a foreign job).
    restarted = SlurmBackend(SlurmCLI(), settings, name="slurm-test")
    await restarted.poll_once()
    assert restarted.jobs[second].native
    assert restarted.jobs[second].placed == ["n9", "n10"]
    assert not [t for t in await restarted.list_tasks() if t.foreign_task]

    # Off by default: such binds are refused, nothing is submitted.
    plain = SlurmBackend(SlurmCLI(), Settings(poll_interval=0.2), name="slurm-test")
    await plain.poll_once()
    refused = await plain.apply_batch([native_bind("other", 0, "n3", min_member=1)])
    assert not refused[0].applied
    assert "not a Slurm job this adapter manages" in refused[0].reason
    assert slurm_ids_named("other") == []


class _SbatchFailsAfter(SlurmCLI):
    """An sbatch that reports failure (as on a timeout) after Slurm took the job, or before."""

    def __init__(self, *, accepted: bool) -> None:
        super().__init__()
        self.accepted = accepted

    async def submit(self, argv: Sequence[str]) -> int:
        if self.accepted:
            await super().submit(argv)
        raise SlurmError(argv, -1, "sbatch timed out after 30 s")


@pytest.mark.parametrize("accepted", [True, False], ids=["slurm-took-it", "slurm-did-not"])
async def test_failed_native_sbatch_is_looked_for_before_the_binds_are_rejected(
    clean_slurm: list[str], accepted: bool
) -> None:
    # Rejecting the binds of a job Slurm did take would have Muster place it again: twice running.
    settings = Settings(
        poll_interval=0.2, native_user="nobody", native_group="nogroup", native_workdir="/tmp"
    )
    backend = SlurmBackend(_SbatchFailsAfter(accepted=accepted), settings, name="slurm-test")
    await backend.poll_once()
    name = f"lost-{'a' if accepted else 'b'}"
    out = await backend.apply_batch(
        [native_bind(name, 0, "n3", min_member=2), native_bind(name, 1, "n4", min_member=2)]
    )
    ids = slurm_ids_named(name)
    if accepted:
        assert all(o.applied for o in out), out
        assert len(ids) == 1
        assert backend.jobs[ids[0]].placed == ["n3", "n4"]
        await backend.poll_once()
        assert not [t for t in await backend.list_tasks() if t.foreign_task]
    else:
        assert not out[0].applied
        assert "sbatch refused: sbatch timed out" in out[0].reason
        assert ids == []
