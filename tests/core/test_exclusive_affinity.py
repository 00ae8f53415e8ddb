"""``sbatch --exclusive`` through the server: the Slurm adapter's JobSpec (a required pod
anti-affinity on kubernetes.io/hostname with an empty selector, namespaces ["default", ""]) goes
through the server's own validation and conversion, foreign tasks are made by the server's own
ingest, and one scheduling cycle under the default configuration must keep the exclusive job off
every node where anything runs (Muster's tasks and foreign ones) and everything else off its nodes.

These pin down what the adapter relies on in the predicates plugin: an empty label selector
matches every task, an existing task's anti-affinity is checked against an incoming task, and
foreign tasks (namespace "") count when the term names that namespace.
"""

from __future__ import annotations

from types import SimpleNamespace

from core_helpers import cycle, node, snapshot

from adapters.slurm.parse import SlurmJob
from adapters.slurm.translate import HOSTNAME, foreign_task_id, job_to_spec
from muster.quantity import format_resources
from muster.v1 import muster_pb2 as pb
from server import model
from server.config import DEFAULT_CONFIG_YAML
from server.model import PodGroupPhase, TaskStatus
from server.service import convert, validate
from server.service.ingest import _put_foreign

GIB = 1024**3
OVERSUBSCRIBE = {"": "OK", "node": "NO", "user": "USER"}


def slurm_job(
    job_id: int,
    *,
    user: str = "alice",
    exclusive: str = "",
    nodes: int = 1,
    running_on: list[str] | None = None,
) -> model.JobSpec:
    """A Slurm job as the adapter submits it, as the server stores it (optionally running)."""
    sj = SlurmJob(
        job_id=job_id,
        state="PENDING",
        partition="staging",
        num_nodes=nodes,
        cpus=nodes,
        memory_bytes=nodes * GIB,
        user=user,
        oversubscribe=OVERSUBSCRIBE[exclusive],
    )
    valid = validate.normalize_job(job_to_spec(sj, muster_id=f"slurm-{job_id}", queue="default"))
    job = convert.valid_job_to_model(valid, job_id)
    if running_on:
        job.phase = PodGroupPhase.RUNNING
        for task, where in zip(job.tasks, running_on, strict=True):
            task.status, task.node = TaskStatus.RUNNING, where
    return job


def foreign(job_id: int, where: str) -> model.TaskSpec:
    """A foreign task as the server's ingest records it (a Slurm job Muster did not place)."""
    state = SimpleNamespace(foreign={})
    task = pb.BackendTask(
        task_id=foreign_task_id(job_id, where),
        node=where,
        foreign_task=True,
        status=pb.TASK_STATUS_RUNNING,
        request=pb.ResourceList(quantities=format_resources({"cpu": 1000.0})),
    )
    _put_foreign(state, "slurm", task, {"cpu": 1000.0})  # type: ignore[arg-type]
    (record,) = state.foreign.values()
    return record.spec


def nodes(*names: str) -> list[model.NodeSpec]:
    return [node(n, cpu="32", memory="256Gi", labels={HOSTNAME: n}, pods=110) for n in names]


def binds(
    node_names: list[str],
    jobs: list[model.JobSpec],
    foreign_tasks: list[model.TaskSpec] | None = None,
) -> dict[str, str]:
    snap = snapshot(nodes(*node_names), jobs, foreign_tasks=foreign_tasks or [])
    return cycle(snap, DEFAULT_CONFIG_YAML).binds


def test_exclusive_job_avoids_a_node_with_a_foreign_task() -> None:
    assert binds(["a"], [slurm_job(1, exclusive="node")], [foreign(99, "a")]) == {}
    assert binds(["a", "b"], [slurm_job(1, exclusive="node")], [foreign(99, "a")]) == {
        "slurm-1/node-0": "b"
    }


def test_exclusive_job_avoids_a_node_with_a_muster_task() -> None:
    other = slurm_job(2, user="bob", running_on=["a"])
    assert binds(["a"], [other, slurm_job(1, exclusive="node")]) == {}
    assert binds(["a", "b"], [other, slurm_job(1, exclusive="node")]) == {"slurm-1/node-0": "b"}
    mine = slurm_job(3, user="alice", running_on=["a"])  # --exclusive: even the same user's job
    assert binds(["a"], [mine, slurm_job(1, exclusive="node")]) == {}


def test_nothing_joins_a_running_exclusive_job() -> None:
    running = slurm_job(1, exclusive="node", running_on=["a"])
    assert binds(["a"], [running, slurm_job(2, user="alice")]) == {}
    assert binds(["a", "b"], [running, slurm_job(2, user="alice")]) == {"slurm-2/node-0": "b"}


def test_two_exclusive_jobs_never_share_and_a_gang_takes_distinct_nodes() -> None:
    out = binds(["a", "b"], [slurm_job(1, exclusive="node"), slurm_job(2, exclusive="node")])
    assert sorted(out.values()) == ["a", "b"]
    assert sorted(binds(["a", "b"], [slurm_job(3, exclusive="node", nodes=2)]).values()) == [
        "a",
        "b",
    ]
    assert binds(["a"], [slurm_job(3, exclusive="node", nodes=2)]) == {}


def test_exclusive_user_shares_only_with_the_same_user() -> None:
    running = slurm_job(1, user="alice", exclusive="user", running_on=["a"])
    assert binds(["a"], [running, slurm_job(2, user="alice")]) == {"slurm-2/node-0": "a"}
    assert binds(["a"], [running, slurm_job(3, user="bob")]) == {}
    pending = slurm_job(4, user="alice", exclusive="user")
    assert binds(["a"], [slurm_job(5, user="alice", running_on=["a"]), pending]) == {
        "slurm-4/node-0": "a"
    }
    assert binds(["a"], [slurm_job(6, user="bob", running_on=["a"]), pending]) == {}
    assert (
        binds(["a"], [pending], [foreign(99, "a")]) == {}
    )  # foreign work: another user, for all we know


def test_plain_jobs_still_pack() -> None:
    out = binds(["a"], [slurm_job(1), slurm_job(2, user="bob")], [foreign(99, "a")])
    assert out == {"slurm-1/node-0": "a", "slurm-2/node-0": "a"}
