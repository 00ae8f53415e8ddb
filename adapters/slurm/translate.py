"""Slurm records -> Muster API messages (pure functions).

* A node of the run partition -> ``pb.Node``: CPUs, RealMemory and GRES as allocatable
  (``gpu`` -> ``nvidia.com/gpu``), features as labels, DOWN / DRAIN / ... -> unschedulable,
  not responding -> not_ready.
* A job waiting in the staging partition -> ``pb.JobSpec``: ``--nodes K`` is a gang of K tasks
  (role ``node``, one per node, ``min_member = K``), each requesting the job's per-node share of
  CPUs and memory plus its per-node GRES. Queue from the account (or QOS, partition, comment).
  Priority is ``-nice`` (``sbatch --nice=-100`` runs before ``--nice=100``, as in Slurm).
  ``--constraint`` -> required node affinity on the feature labels (``a&b``: one term with both;
  ``a|b``: one term each, ORed; Slurm reads ``&`` and ``|`` left to right, without precedence, and
  so does :func:`parse_constraint`). What Muster cannot express exactly (``a*2`` counts, a
  matching OR ``[a|b]`` over several nodes, ``,``) makes the job *untranslatable*: it is not
  submitted, and the backend leaves it pending with the reason (:func:`untranslatable`).
  ``--exclusive`` -> a required pod anti-affinity per node (``kubernetes.io/hostname``) against
  every task, Muster's and foreign ones (``--exclusive=user``: every task of another user).
* A job Muster did not place that runs on run-partition nodes -> foreign ``pb.BackendTask`` per
  node (it only consumes capacity; an ``--exclusive`` one the whole node, as in Slurm).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from adapters.slurm.parse import SlurmJob, SlurmNode
from muster.quantity import format_resources
from muster.v1 import muster_pb2 as pb

ROLE = "node"
GPU_RESOURCE = "nvidia.com/gpu"
FEATURE_LABEL = "feature.slurm.schedmd.com/"
PARTITION_LABEL = "partition.slurm.schedmd.com/"
ANNOTATION = "slurm.schedmd.com/"
USER_LABEL = (
    "slurm.schedmd.com/user"  # on every task (``--exclusive=user`` tells users apart by it)
)
QUEUE_SOURCES = ("account", "qos", "partition", "comment")
HOSTNAME = "kubernetes.io/hostname"
# Namespaces an exclusive job's anti-affinity covers: the adapter's jobs (JobSpec.namespace is left
# empty, which the server makes "default") and foreign tasks, which the server keeps under "".
JOB_NAMESPACE = "default"
FOREIGN_NAMESPACE = ""
MAX_CONSTRAINT_TERMS = 64  # alternatives a constraint may expand to (``(a|b)&(c|d)`` is 4)

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.:-]+")
_LABEL_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def gres_resource(name: str) -> str:
    """Slurm GRES name -> Muster resource name."""
    return (
        GPU_RESOURCE
        if name == "gpu"
        else f"slurm.schedmd.com/{_LABEL_NAME_BAD.sub('-', name).strip('-.')}"
    )


def sanitize_name(text: str, default: str = "default") -> str:
    """Anything -> a valid Muster name (letters, digits, '-', '_', '.', ':')."""
    name = _NAME_BAD.sub("-", text.strip()).strip("-_.:")[:253]
    return name or default


def _prefixed_label(prefix: str, name: str) -> str:
    """``prefix`` + ``name`` made a label name ('' if nothing of the name is left)."""
    key = _LABEL_NAME_BAD.sub("-", name).strip("-.")
    return prefix + key[:63] if key else ""


def feature_label(feature: str) -> str:
    """Slurm node feature -> the node label that carries it ('' if nothing of the name is left)."""
    return _prefixed_label(FEATURE_LABEL, feature)


def label_value(text: str, default: str = "unknown") -> str:
    return _LABEL_NAME_BAD.sub("-", text).strip("-._")[:63] or default


def node_to_pb(node: SlurmNode) -> pb.Node:
    allocatable = {
        "cpu": float(node.cpus * 1000),
        "memory": float(node.real_memory_mb * 1024 * 1024),
    }
    for name, count in node.gres.items():
        allocatable[gres_resource(name)] = float(count * 1000)
    labels = {HOSTNAME: node.name}
    keys = [feature_label(f) for f in node.features]
    keys += [_prefixed_label(PARTITION_LABEL, p) for p in node.partitions]
    labels.update((key, "true") for key in keys if key)
    return pb.Node(
        name=node.name,
        allocatable=pb.ResourceList(quantities=format_resources(allocatable)),
        labels=labels,
        unschedulable=not node.schedulable,
        not_ready=node.not_responding,
    )


def per_node_request(job: SlurmJob) -> dict[str, str]:
    """What each of the job's nodes must provide, as quantity strings.

    CPUs: the job's CPUs over its nodes, rounded up (``-n3 -N2``: Slurm puts 2 tasks on one of
    the nodes). Memory: the tres total over the nodes (``--mem`` is per node; ``--mem-per-cpu``
    and ``--mem=0``, all of a node's memory, arrive already multiplied out in the tres).
    """
    nodes = max(1, job.num_nodes)
    request: dict[str, float] = {"cpu": float(max(1, -(-job.cpus // nodes)) * 1000)}
    if job.memory_bytes:
        request["memory"] = float(job.memory_bytes // nodes)
    for name, count in job.per_node_gres().items():
        if count > 0:
            request[gres_resource(name)] = float(count * 1000)
    return format_resources(request)


def queue_of(job: SlurmJob, source: str, default: str = "default") -> str:
    value = {
        "account": job.account,
        "qos": job.qos,
        "partition": job.partition,
        "comment": job.comment,
    }[source]
    name = sanitize_name(value, default)
    return default if name == "root" else name


# ---------------------------------------------------------------------------------------------
# --constraint
# ---------------------------------------------------------------------------------------------


class Untranslatable(ValueError):
    """A job Muster cannot place exactly as Slurm would; ``str()`` says why (shown to the user)."""


_CONSTRAINT_TOKEN = re.compile(r"\s*(?:([&|()\[\]!,])|\*([0-9]+)|([^&|()\[\]!,*\s]+))")

# A constraint in disjunctive normal form: alternatives (ORed), each a set of (feature, wanted)
# literals (ANDed); wanted=False is ``!feature``.
Dnf = list[frozenset[tuple[str, bool]]]


def parse_constraint(text: str, nodes: int = 1) -> Dnf:
    """A ``--constraint`` expression -> DNF; raises :class:`Untranslatable`.

    Slurm 22.05 evaluates ``&`` and ``|`` strictly left to right (``cpu|gpu&gpu`` is
    ``(cpu|gpu)&gpu``; checked against ``sbatch --test-only``), parentheses group. A matching OR
    ``[a|b]`` (all nodes share one alternative) is exact only for a single-node job, counts
    (``a*2``) never are.
    """

    def fail(why: str) -> Untranslatable:
        return Untranslatable(f"--constraint {text!r}: {why}")

    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _CONSTRAINT_TOKEN.match(text, pos)
        if not m:
            if text[pos:].strip():
                raise fail(f"cannot read it at {text[pos:]!r}")
            break
        op, count, name = m.groups()
        tokens.append(("op", op) if op else ("count", count) if count else ("name", name))
        pos = m.end()
    where = 0

    def peek() -> tuple[str, str]:
        return tokens[where] if where < len(tokens) else ("end", "")

    def take() -> tuple[str, str]:
        nonlocal where
        token = peek()
        where += 1
        return token

    def item() -> Dnf:
        kind, value = take()
        if kind == "name":
            out: Dnf = [frozenset({(value, True)})]
        elif (kind, value) == ("op", "!"):
            kind, value = take()
            if kind != "name":
                raise fail("Muster can only negate a single feature (!name)")
            out = [frozenset({(value, False)})]
        elif (kind, value) == ("op", "("):
            out = expression()
            if take() != ("op", ")"):
                raise fail("unbalanced parentheses")
        elif (kind, value) == ("op", "["):
            out = expression()
            if take() != ("op", "]"):
                raise fail("unbalanced brackets")
            if nodes > 1 and len(out) > 1:
                raise fail(
                    "a matching OR [a|b] needs all nodes of the job to share one feature, "
                    "which Muster cannot express for a multi-node job"
                )
        else:
            raise fail(f"unexpected {value or 'end'!r}")
        if peek()[0] == "count":
            raise fail("feature counts (name*N) cannot be expressed in Muster")
        return out

    def expression() -> Dnf:
        out = item()
        while peek() in (("op", "&"), ("op", "|"), ("op", ",")):
            _, op = take()
            if op == ",":
                raise fail("',' in a constraint is not supported (use & or |)")
            right = item()
            out = [a | b for a in out for b in right] if op == "&" else out + right
            if len(out) > MAX_CONSTRAINT_TERMS:
                raise fail(f"expands to more than {MAX_CONSTRAINT_TERMS} alternatives")
        return out

    dnf = expression()
    if where != len(tokens):
        raise fail(f"unexpected {tokens[where][1]!r}")
    # Drop contradictory alternatives (a&!a) and duplicates, keep the order.
    seen: list[frozenset[tuple[str, bool]]] = []
    for term in dnf:
        if not any((name, not wanted) in term for name, wanted in term) and term not in seen:
            seen.append(term)
    if not seen:
        raise fail("no node can ever satisfy it")
    return seen


def constraint_terms(job: SlurmJob) -> list[pb.NodeSelectorTerm]:
    """The job's ``--constraint`` as required node affinity terms (ORed); [] for none."""
    if not job.features:
        return []
    terms = []
    for alternative in parse_constraint(job.features, max(1, job.num_nodes)):
        requirements = []
        for name, wanted in sorted(alternative):
            key = feature_label(name)
            if not key:
                raise Untranslatable(
                    f"--constraint {job.features!r}: feature {name!r} has no label name"
                )
            requirements.append(
                pb.LabelSelectorRequirement(
                    key=key, operator="Exists" if wanted else "DoesNotExist"
                )
            )
        terms.append(pb.NodeSelectorTerm(match_expressions=requirements))
    return terms


def untranslatable(job: SlurmJob) -> str:
    """Why Muster cannot place ``job`` as Slurm would ('' when it can)."""
    try:
        constraint_terms(job)
    except Untranslatable as exc:
        return str(exc)
    return ""


# ---------------------------------------------------------------------------------------------
# --exclusive
# ---------------------------------------------------------------------------------------------


def exclusive_terms(job: SlurmJob) -> list[pb.PodAffinityTerm]:
    """``--exclusive``: one required anti-affinity term per node (kubernetes.io/hostname) whose
    empty selector matches every task, in the jobs' namespace and the foreign tasks' one: no
    other task may share a node with the job, and (the server checks an existing task's
    anti-affinity against an incoming task too) no task may join it later. ``--exclusive=user``
    matches only tasks not labelled with the job's user (foreign tasks carry no labels, so they
    count as another user's). ``--exclusive=mcs`` is handled as ``--exclusive`` (stricter)."""
    mode = job.exclusive
    if not mode:
        return []
    selector = pb.LabelSelector()
    if mode == "user":
        selector.match_expressions.append(
            pb.LabelSelectorRequirement(
                key=USER_LABEL, operator="NotIn", values=[label_value(job.user)]
            )
        )
    return [
        pb.PodAffinityTerm(
            label_selector=selector,
            namespaces=[JOB_NAMESPACE, FOREIGN_NAMESPACE],
            topology_key=HOSTNAME,
        )
    ]


def job_to_spec(job: SlurmJob, *, muster_id: str, queue: str, cluster: str = "") -> pb.JobSpec:
    """Raises :class:`Untranslatable` for a job :func:`untranslatable` refuses."""
    k = max(1, job.num_nodes)
    annotations = {
        ANNOTATION + "job-id": str(job.job_id),
        ANNOTATION + "user": job.user,
        ANNOTATION + "account": job.account,
        ANNOTATION + "constraint": job.features,
        ANNOTATION + "exclusive": job.exclusive,
    }
    if cluster:
        annotations[ANNOTATION + "cluster"] = cluster
    if job.name:
        annotations[ANNOTATION + "job-name"] = job.name
    group = pb.TaskGroup(
        role=ROLE,
        replicas=k,
        request=pb.ResourceList(quantities=per_node_request(job)),
        labels={USER_LABEL: label_value(job.user)},
    )
    if terms := constraint_terms(job):
        group.affinity.node_affinity.required.extend(terms)
    if anti := exclusive_terms(job):
        group.affinity.pod_anti_affinity.required.extend(anti)
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


def foreign_tasks(job: SlurmJob, nodes: Mapping[str, pb.Node]) -> list[pb.BackendTask]:
    """A job Muster does not manage, as one foreign task per node it occupies. An exclusive one
    holds the whole node (Slurm gives it every CPU and GRES there), when the node is in ``nodes``."""
    request = pb.ResourceList(quantities=per_node_request(job))
    return [
        pb.BackendTask(
            task_id=foreign_task_id(job.job_id, node),
            node=node,
            request=nodes[node].allocatable if job.exclusive and node in nodes else request,
            status=pb.TASK_STATUS_RUNNING,
            foreign_task=True,
        )
        for node in job.nodes
    ]


def foreign_task_id(job_id: int, node: str) -> str:
    return f"slurm-foreign-{job_id}-{node}"
