"""Muster places jobs on a real, private local Slurm (16 emulated nodes, scripts/slurm-up.sh).

Each test starts a fresh Muster server and the Slurm adapter as processes, submits with
``sbatch`` and checks the outcome both in Slurm (``scontrol``, the job's own output) and in
Muster (GetJob / Explain / ListNodes). Waits are bounded; nothing asserts on timing.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from tests.slurm.conftest import (
    NODES,
    Muster,
    SlurmCluster,
    job_info,
    run,
    sbatch,
    sort_nodes,
    wait_until,
)

pytestmark = pytest.mark.slurm


@pytest.fixture
def stub(muster: Muster) -> Iterator[pb_grpc.SchedulerStub]:
    channel = grpc.insecure_channel(muster.address)
    try:
        yield pb_grpc.SchedulerStub(channel)
    finally:
        channel.close()


def muster_job(stub: pb_grpc.SchedulerStub, job_id: str) -> pb.Job | None:
    try:
        return stub.GetJob(pb.GetJobRequest(id=job_id), timeout=10)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise


def muster_nodes(job: pb.Job) -> list[str]:
    return sort_nodes(t.node for t in job.tasks if t.node)


def slurm_state(job_id: int) -> str:
    return job_info(job_id)["JobState"]


def running(job_id: int) -> bool:
    return slurm_state(job_id) == "RUNNING"


def shared_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="muster-slurm-out-"))
    path.chmod(0o777)  # jobs of user nobody write their output here
    return path


# ---------------------------------------------------------------------------------------------


def test_gang_runs_on_exactly_musters_nodes(muster: Muster, stub: pb_grpc.SchedulerStub) -> None:
    muster.start_adapter()
    out = shared_dir()
    # Submitted by an ordinary user asking for the run partition: job_submit.lua moves it to
    # staging, so only Muster can start it.
    script = 'srun bash -c "echo \\$SLURMD_NODENAME"; sleep 60'
    slurm_id = int(
        run(
            "runuser",
            "-u",
            "nobody",
            "--",
            "sbatch",
            "--parsable",
            "-p",
            "batch",
            "-N4",
            "--ntasks-per-node=1",
            "-c",
            "2",
            "--mem=1G",
            "--chdir=/tmp",
            "-o",
            str(out / "out-%j.txt"),
            "--wrap",
            script,
        ).strip()
    )
    assert job_info(slurm_id)["Partition"] == "staging"

    job = wait_until(
        "Muster to bind the gang",
        lambda: (j := muster_job(stub, f"slurm-{slurm_id}")) and len(muster_nodes(j)) == 4 and j,
    )
    assert job.spec.min_member == 4
    assert len(job.tasks) == 4
    wait_until("the gang to run", lambda: running(slurm_id))
    chosen = muster_nodes(job)
    info = job_info(slurm_id)
    assert info["Partition"] == "batch"
    assert info["_nodes"].split(",") == chosen
    assert info["_req"].split(",") == chosen
    # From inside the job: each srun task was started by the slurmd of a chosen node.
    output = out / f"out-{slurm_id}.txt"
    lines = wait_until(
        "the job's srun output",
        lambda: (
            output.exists() and len(output.read_text().split()) >= 4 and output.read_text().split()
        ),
    )
    assert sort_nodes(lines) == chosen
    wait_until(
        "Muster to see the tasks running",
        lambda: all(
            t.status == pb.TASK_STATUS_RUNNING for t in muster_job(stub, f"slurm-{slurm_id}").tasks
        ),
    )


def test_gang_that_does_not_fit_stays_staged_with_reason(
    muster: Muster, stub: pb_grpc.SchedulerStub
) -> None:
    muster.start_adapter()
    blocker = sbatch("-N1", "-c", "1", "--mem=1G")
    wait_until("the blocker to run", lambda: running(blocker))
    # Every CPU of all 16 nodes: one core is taken, so this gang cannot be placed.
    gang = sbatch(f"-N{NODES}", "--ntasks-per-node=1", "-c", "32", "--mem=1G")
    wait_until(
        "Muster to mark the gang unschedulable",
        lambda: (
            (j := muster_job(stub, f"slurm-{gang}")) is not None
            and any(c.type == "Unschedulable" and c.status == "True" for c in j.status.conditions)
        ),
    )
    explain = stub.Explain(pb.ExplainRequest(job_id=f"slurm-{gang}"), timeout=10)
    assert explain.gate not in ("", "none")
    assert explain.summary
    info = job_info(gang)
    assert (info["JobState"], info["Partition"], info["Reason"]) == (
        "PENDING",
        "staging",
        "PartitionDown",
    )
    shown = muster.cli("explain", f"slurm-{gang}")
    assert shown.returncode == 0, shown.stderr
    assert explain.summary.split(":")[0] in shown.stdout


def test_two_accounts_share_by_weight(muster: Muster, stub: pb_grpc.SchedulerStub) -> None:
    stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="teama", weight=3)), timeout=10)
    stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="teamb", weight=1)), timeout=10)
    muster.start_adapter()
    # Fill the cluster first so that all the contending jobs are known before any can start.
    filler = sbatch(f"-N{NODES}", "--ntasks-per-node=1", "-c", "32", "--mem=1G", "-A", "filler")
    wait_until("the filler to run", lambda: running(filler))
    ids = {"teama": [], "teamb": []}
    for _ in range(NODES):
        for account in ("teama", "teamb"):  # whole-node jobs, interleaved
            ids[account].append(sbatch("-N1", "-c", "32", "--mem=1G", "-A", account))
    wait_until(
        "all jobs to reach Muster",
        lambda: all(
            muster_job(stub, f"slurm-{i}") is not None for acc in ids.values() for i in acc
        ),
    )
    run("scancel", str(filler))

    def counts() -> dict[str, int]:
        states = {i: slurm_state(i) for acc in ids.values() for i in acc}
        return {acc: sum(states[i] == "RUNNING" for i in ids[acc]) for acc in ids}

    wait_until("the cluster to fill again", lambda: sum(counts().values()) == NODES, timeout=90)
    got = counts()
    # Weight 3:1 over 16 whole nodes: 12 and 4 (first come first served would give 8 and 8).
    assert abs(got["teama"] - 12) <= 1, got
    assert got["teama"] + got["teamb"] == NODES


# Volcano's deployed configuration (its Helm chart): gang and drf do not veto victims, so a job
# running exactly its minMember can be preempted by a higher-priority one of the same queue.
PREEMPT_CONFIG = """
actions: "allocate, preempt, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
    enablePreemptable: false
  - name: conformance
- plugins:
  - name: overcommit
  - name: drf
    enablePreemptable: false
  - name: predicates
  - name: proportion
  - name: nodeorder
"""


def enable_preempt(stub: pb_grpc.SchedulerStub) -> None:
    """Switch the server to a configuration with the preempt action."""
    stub.UpdateConfig(pb.UpdateConfigRequest(yaml=PREEMPT_CONFIG), timeout=10)


def test_higher_priority_preempts_and_victim_is_replaced(
    muster: Muster, stub: pb_grpc.SchedulerStub
) -> None:
    enable_preempt(stub)
    muster.start_adapter()
    low = [sbatch("-N1", "-c", "32", "--mem=1G", "-A", "shared") for _ in range(NODES)]
    wait_until("the low-priority jobs to run", lambda: all(running(i) for i in low), timeout=90)
    high = sbatch("-N1", "-c", "32", "--mem=1G", "-A", "shared", "--nice=-100", script="sleep 8")
    wait_until(
        "the high-priority job to run",
        lambda: slurm_state(high) in ("RUNNING", "COMPLETED"),
        timeout=60,
    )
    restarted = [i for i in low if int(job_info(i).get("Restarts", "0")) > 0]
    assert len(restarted) == 1, f"expected exactly one victim, got {restarted}"
    victim = restarted[0]
    # The victim waits in staging, then runs again once the high-priority job ends.
    wait_until("the victim to run again", lambda: running(victim), timeout=90)
    assert job_info(victim)["Partition"] == "batch"
    # Muster learns it from the adapter's next poll.
    wait_until(
        "Muster to see the victim running again",
        lambda: (
            (job := muster_job(stub, f"slurm-{victim}")) is not None
            and all(t.status == pb.TASK_STATUS_RUNNING for t in job.tasks)
        ),
        timeout=30,
    )


def test_killed_slurmd_makes_node_unschedulable(
    muster: Muster, stub: pb_grpc.SchedulerStub, slurm_instance: SlurmCluster
) -> None:
    victim_node = f"n{NODES}"
    # The private cluster's own slurmd (its PID file is in the cluster's directory).
    pid = int(slurm_instance.pid_file(f"slurmd-{victim_node}").read_text())
    os.kill(pid, signal.SIGKILL)
    muster.start_adapter()

    def node_view() -> pb.Node | None:
        for view in stub.ListNodes(pb.ListNodesRequest(), timeout=10).nodes:
            if view.node.name == victim_node:
                return view.node
        return None

    wait_until(
        "Slurm and Muster to see the node down",
        lambda: (n := node_view()) is not None and n.unschedulable and n.not_ready,
        timeout=90,
    )
    jobs = [sbatch("-N1", "-c", "32", "--mem=1G") for _ in range(NODES)]
    wait_until("15 jobs to run", lambda: sum(running(i) for i in jobs) == NODES - 1, timeout=90)
    used = {job_info(i)["_nodes"] for i in jobs if running(i)}
    assert victim_node not in used
    assert len(used) == NODES - 1
    for i in jobs:
        job = muster_job(stub, f"slurm-{i}")
        assert job is not None
        assert all(t.node != victim_node for t in job.tasks)
    leftover = [i for i in jobs if not running(i)]
    assert len(leftover) == 1
    assert job_info(leftover[0])["Partition"] == "staging"


def test_adapter_restart_places_nothing_twice(muster: Muster, stub: pb_grpc.SchedulerStub) -> None:
    muster.start_adapter()
    jobs = [sbatch("-N2", "--ntasks-per-node=1", "-c", "4", "--mem=1G") for _ in range(3)]
    jobs += [sbatch("-N1", "-c", "4", "--mem=1G") for _ in range(4)]
    wait_until("the first jobs to run", lambda: all(running(i) for i in jobs), timeout=60)
    muster.stop_adapter(signal.SIGKILL)
    more = [sbatch("-N2", "--ntasks-per-node=1", "-c", "4", "--mem=1G") for _ in range(2)]
    muster.start_adapter()
    wait_until("every job to run", lambda: all(running(i) for i in jobs + more), timeout=60)
    # Let the new adapter poll and re-sync a few times more, then check nothing moved.
    wait_until(
        "a few adapter polls", lambda: muster.adapter_log().count('"synced"') >= 2, timeout=30
    )
    for i in jobs + more:
        info = job_info(i)
        assert info["Restarts"] == "0", f"job {i} was started more than once"
        job = muster_job(stub, f"slurm-{i}")
        assert job is not None
        assert muster_nodes(job) == info["_nodes"].split(",")
    placed = re.findall(r'"event": "placed"[^\n]*?"slurm_job": (\d+)', muster.adapter_log())
    placed += re.findall(r'"slurm_job": (\d+)[^\n]*?"event": "placed"', muster.adapter_log())
    assert sorted(int(p) for p in placed) == sorted(jobs + more), "each job is placed exactly once"


def test_cancelled_staged_job_is_cancelled_in_muster(
    muster: Muster, stub: pb_grpc.SchedulerStub
) -> None:
    muster.start_adapter()
    blocker = sbatch(f"-N{NODES}", "--ntasks-per-node=1", "-c", "32", "--mem=1G")
    wait_until("the blocker to run", lambda: running(blocker))
    waiting = sbatch("-N1", "-c", "1")
    wait_until("Muster to know the job", lambda: muster_job(stub, f"slurm-{waiting}") is not None)
    subprocess.run(["scancel", str(waiting)], check=True)
    wait_until(
        "Muster to cancel it",
        lambda: muster_job(stub, f"slurm-{waiting}").status.phase == pb.JOB_PHASE_CANCELLED,
    )


def test_exclusive_jobs_get_nodes_of_their_own_and_constraints_are_honoured(
    muster: Muster, stub: pb_grpc.SchedulerStub
) -> None:
    """Four GPU nodes (feature gpu: n1-n4), three of them running a small foreign job: one core
    each, so without --exclusive every job below would fit anywhere. Two --exclusive jobs
    constrained to gpu: the first gets the only empty gpu node, the second gets none (Muster
    says why) until a foreign job ends. A plain gpu job packs next to foreign work but not
    next to the exclusive job; a cpu job lands on a cpu node; a feature count is refused."""
    muster.start_adapter()
    foreign = {
        node: sbatch("-p", "batch", "-w", node, "-c", "1", "--mem=1G")
        for node in ("n2", "n3", "n4")
    }
    wait_until("the foreign jobs to run", lambda: all(running(j) for j in foreign.values()))

    first = sbatch("--exclusive", "--constraint=gpu", "-c", "1", "--mem=1G", user="nobody")
    wait_until("the first exclusive job to run", lambda: running(first))
    assert job_info(first)["_nodes"] == "n1"  # the only gpu node with nothing on it
    second = sbatch("--exclusive", "--constraint=gpu", "-c", "1", "--mem=1G", user="nobody")
    wait_until(
        "Muster to mark the second exclusive job unschedulable",
        lambda: (
            (j := muster_job(stub, f"slurm-{second}")) is not None
            and any(c.type == "Unschedulable" and c.status == "True" for c in j.status.conditions)
        ),
    )
    explain = stub.Explain(pb.ExplainRequest(job_id=f"slurm-{second}"), timeout=10)
    assert any("anti-affinity" in reason for reason in explain.node_reasons), dict(
        explain.node_reasons
    )
    info = job_info(second)
    assert (info["JobState"], info["Partition"]) == ("PENDING", "staging")

    plain = sbatch("--constraint=gpu", "-c", "1", "--mem=1G", user="nobody")
    on_cpu = sbatch("--constraint=cpu", "-c", "1", "--mem=1G", user="nobody")
    refused = sbatch("-N2", "--constraint=gpu*2", "-c", "1", "--mem=1G", user="nobody")
    wait_until("the plain and the cpu job to run", lambda: running(plain) and running(on_cpu))
    assert job_info(plain)["_nodes"] in (
        "n2",
        "n3",
        "n4",
    )  # beside foreign work, never beside n1's job
    assert job_info(on_cpu)["_nodes"] in {f"n{i}" for i in range(5, NODES + 1)}
    wait_until(
        "the refusal to reach Slurm",
        lambda: "muster-refused:" in job_info(refused).get("AdminComment", ""),
    )
    assert "feature counts" in job_info(refused)["AdminComment"]
    assert muster_job(stub, f"slurm-{refused}") is None
    assert job_info(refused)["Partition"] == "staging"

    # n4 frees up (no foreign job; the plain job may sit there: then n2 or n3 frees instead).
    free = next(node for node in ("n4", "n3", "n2") if job_info(plain)["_nodes"] != node)
    subprocess.run(["scancel", str(foreign[free])], check=True)
    wait_until("the second exclusive job to run", lambda: running(second), timeout=90)
    assert job_info(second)["_nodes"] == free
    assert job_info(first)["_nodes"] == "n1"
    assert running(first)


def test_job_submitted_to_muster_runs_as_one_pinned_slurm_job(
    muster: Muster, stub: pb_grpc.SchedulerStub
) -> None:
    # --native-jobs-user: a job submitted to Muster itself (no sbatch) becomes, at bind time, one
    # Slurm job on exactly Muster's nodes, run as that user, and its ending comes back to Muster.
    muster.start_adapter("--native-jobs-user", "nobody")
    out = shared_dir()
    script = f'srun bash -c "echo \\$SLURMD_NODENAME \\$(id -un)" > {out}/native.txt'
    name = f"native-{uuid.uuid4().hex[:8]}"  # Slurm lists ended jobs of earlier runs for a while
    stub.SubmitJob(
        pb.SubmitJobRequest(
            job=pb.JobSpec(
                id=name,
                queue="default",
                task_groups=[
                    pb.TaskGroup(
                        role="w",
                        replicas=3,
                        request=pb.ResourceList(quantities={"cpu": "2", "memory": "1Gi"}),
                        command=["bash", "-c", script],
                    )
                ],
            )
        ),
        timeout=10,
    )
    job = wait_until(
        "the job to succeed in Muster",
        lambda: (
            (j := muster_job(stub, name))
            and all(t.status == pb.TASK_STATUS_SUCCEEDED for t in j.tasks)
            and j
        ),
        timeout=90,
    )
    chosen = muster_nodes(job)
    assert len(chosen) == 3
    [slurm_id] = [
        int(x) for x in run("squeue", "-h", "-a", "-t", "all", "-n", name, "-o", "%i").split()
    ]
    lines = sorted((out / "native.txt").read_text().splitlines())
    assert sorted(line.split()[0] for line in lines) == chosen
    assert {line.split()[1] for line in lines} == {"nobody"}
    info = job_info(slurm_id)
    assert info["_req"].split(",") == chosen
    assert info["Partition"] == "batch"
