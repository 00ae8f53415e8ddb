"""Slurm records -> Muster API messages (pure functions).

* A node of the run partition -> ``pb.Node``: CPUs, RealMemory and GRES as allocatable
  (``gpu`` -> ``nvidia.com/gpu``), features as labels, DOWN / DRAIN / ... -> unschedulable,
  not responding -> not_ready.
* A job waiting in the staging partition -> ``pb.JobSpec``: ``--nodes K`` is a gang of K tasks
  (role ``node``, one per node, ``min_member = K``), each requesting the job's per-node share of
  CPUs and memory plus its per-node GRES. Queue from the account (or QOS, partition, comment).
  Priority is ``-nice`` (``sbatch --nice=-100`` runs before ``--nice=100``, as in Slurm).
* A job Muster did not place that runs on run-partition nodes -> foreign ``pb.BackendTask`` per
  node (it only consumes capacity).
"""

from __future__ import annotations

import re

from adapters.slurm.parse import SlurmJob, SlurmNode
from muster.quantity import format_resources
from muster.v1 import muster_pb2 as pb

ROLE = "node"
GPU_RESOURCE = "nvidia.com/gpu"
FEATURE_LABEL = "feature.slurm.schedmd.com/"
PARTITION_LABEL = "partition.slurm.schedmd.com/"
ANNOTATION = "slurm.schedmd.com/"
QUEUE_SOURCES = ("account", "qos", "partition", "comment")

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.:-]+")
_LABEL_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def gres_resource(name: str) -> str:
    """Slurm GRES name -> Muster resource name."""
    return GPU_RESOURCE if name == "gpu" else f"slurm.schedmd.com/{_LABEL_NAME_BAD.sub('-', name).strip('-.')}"


def sanitize_name(text: str, default: str = "default") -> str:
    """Anything -> a valid Muster name (letters, digits, '-', '_', '.', ':')."""
    name = _NAME_BAD.sub("-", text.strip()).strip("-_.:")[:253]
    return name or default


def node_to_pb(node: SlurmNode) -> pb.Node:
    allocatable = {"cpu": float(node.cpus * 1000), "memory": float(node.real_memory_mb * 1024 * 1024)}
    for name, count in node.gres.items():
        allocatable[gres_resource(name)] = float(count * 1000)
    labels = {"kubernetes.io/hostname": node.name}
    for feature in node.features:
        key = _LABEL_NAME_BAD.sub("-", feature).strip("-.")
        if key:
            labels[FEATURE_LABEL + key[:63]] = "true"
    for partition in node.partitions:
        key = _LABEL_NAME_BAD.sub("-", partition).strip("-.")
        if key:
            labels[PARTITION_LABEL + key[:63]] = "true"
    return pb.Node(
        name=node.name,
        allocatable=pb.ResourceList(quantities=format_resources(allocatable)),
        labels=labels,
        unschedulable=not node.schedulable,
        not_ready=node.not_responding,
    )


def per_node_request(job: SlurmJob) -> dict[str, str]:
    """What each of the job's nodes must provide, as quantity strings."""
    nodes = max(1, job.num_nodes)
    request: dict[str, float] = {"cpu": float(max(1, job.cpus // nodes) * 1000)}
    if job.memory_bytes:
        request["memory"] = float(job.memory_bytes // nodes)
    for name, count in job.per_node_gres().items():
        if count > 0:
            request[gres_resource(name)] = float(count * 1000)
    return format_resources(request)


def queue_of(job: SlurmJob, source: str, default: str = "default") -> str:
    value = {"account": job.account, "qos": job.qos, "partition": job.partition, "comment": job.comment}[source]
    name = sanitize_name(value, default)
    return default if name == "root" else name


def job_to_spec(job: SlurmJob, *, muster_id: str, queue: str, cluster: str = "") -> pb.JobSpec:
    k = max(1, job.num_nodes)
    annotations = {
        ANNOTATION + "job-id": str(job.job_id),
        ANNOTATION + "user": job.user,
        ANNOTATION + "account": job.account,
    }
    if cluster:
        annotations[ANNOTATION + "cluster"] = cluster
    if job.name:
        annotations[ANNOTATION + "job-name"] = job.name
    group = pb.TaskGroup(role=ROLE, replicas=k, request=pb.ResourceList(quantities=per_node_request(job)))
    return pb.JobSpec(
        id=muster_id,
        name=muster_id,
        queue=queue,
        priority=max(-(2**31) + 1, min(2**31 - 1, -job.nice)),
        min_member=k,
        task_groups=[group],
        annotations={k2: v for k2, v in annotations.items() if v},
    )


def task_ids(muster_id: str, count: int) -> list[str]:
    return [f"{muster_id}/{ROLE}-{i}" for i in range(count)]


def task_index(task_id: str) -> int | None:
    """``slurm-12/node-3`` -> 3; None when it is not one of this adapter's task ids."""
    _, _, tail = task_id.rpartition("/")
    role, _, index = tail.rpartition("-")
    if role != ROLE or not index.isdigit():
        return None
    return int(index)


def foreign_tasks(job: SlurmJob) -> list[pb.BackendTask]:
    """A job Muster does not manage, as one foreign task per node it occupies."""
    request = pb.ResourceList(quantities=per_node_request(job))
    return [
        pb.BackendTask(
            task_id=foreign_task_id(job.job_id, node),
            node=node,
            request=request,
            status=pb.TASK_STATUS_RUNNING,
            foreign_task=True,
        )
        for node in job.nodes
    ]


def foreign_task_id(job_id: int, node: str) -> str:
    return f"slurm-foreign-{job_id}-{node}"
