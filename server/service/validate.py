"""Stateless validation of API messages.

Each function checks one message completely and raises ``DomainError`` (INVALID_ARGUMENT) whose
message starts with the field path, e.g. ``job.task_groups[1].request.cpu: '2x' is not a
quantity``. Checks that need server state (does the queue exist, who owns the node) live in
``server.service.ingest`` and ``server.service.commands``, which run them before applying anything.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from muster.devices import NVIDIA_GPU, device_count_problem
from muster.jobcontrol import (
    DEFAULT_DEPENDENCY_TYPE,
    DEPENDENCY_TYPES,
    ArraySpecError,
    element_id,
    parse_array,
)
from muster.quantity import QuantityError, parse_resources
from muster.timelimit import MAX_TIME_LIMIT, format_time_limit
from muster.v1 import muster_pb2 as pb
from server.model import TY_BASIC_POLICIES, TY_CLEAN_POD_POLICIES, TY_JOB_QUEUE_POLICIES
from server.service.errors import invalid

# Ids, names, roles: DNS-label-like, plus '.' and '_' (no '/', which separates job id and role).
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.:]{0,251}[A-Za-z0-9])?$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
MAX_TASKS_PER_JOB = 100_000
# Bounds on every request, whatever its RPC (``check_bounds``): within the 64 MiB message limit a
# client could still send a million-entry map or a 60 MB string; these refuse it by field.
MAX_STRING = 65_536  # characters in any string field (names are held to 253 by check_name)
MAX_LIST = 100_000  # entries in any repeated field (nodes of a snapshot, deltas, acks ...)
MAX_MAP = 10_000  # entries in any map field (labels, annotations, quantities ...)
# Documents with their own, larger bound (muster/yamldoc.py checks them when they are parsed).
LONG_STRINGS = frozenset(
    {"muster.v1.UpdateConfigRequest.yaml", "muster.v1.SimulateRequest.scenario"}
)
MAX_RESTART_LIMIT = 1000
# Decision ids are SQLite INTEGERs (signed 64-bit): anything above was never issued.
MAX_DECISION_ID = 2**63 - 1
REPORTABLE_TASK_STATUSES = frozenset(
    {pb.TASK_STATUS_BOUND, pb.TASK_STATUS_RUNNING, pb.TASK_STATUS_SUCCEEDED, pb.TASK_STATUS_FAILED}
)


def check_bounds(message: Message, path: str = "") -> None:
    """Every string, list and map of ``message`` (recursively) within MAX_STRING / MAX_LIST / MAX_MAP;
    INVALID_ARGUMENT naming the first field over its bound."""
    # Runs on the event loop for every request (a SubmitJobs of 100 jobs, a SendDeltas of 1,000
    # deltas): the field path is only spelled out for the field that fails.
    _bounds(message, ((path, None),) if path else ())


# How check_bounds walks a field, per field descriptor (asking a descriptor costs more than the check).
(
    _MAP_OF_MESSAGES,
    _MAP_OF_SCALARS,
    _LIST_OF_MESSAGES,
    _LIST_OF_STRINGS,
    _LIST_OTHER,
    _MESSAGE,
    _STRING,
    _OTHER,
) = range(8)
_FIELD_KINDS: dict[FieldDescriptor, int] = {}


def _field_kind(field: FieldDescriptor) -> int:
    kind = _FIELD_KINDS.get(field)
    if kind is None:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            kind = _MAP_OF_MESSAGES if value_field.message_type is not None else _MAP_OF_SCALARS
        elif field.is_repeated:
            if field.message_type is not None:
                kind = _LIST_OF_MESSAGES
            elif field.type == FieldDescriptor.TYPE_STRING:
                kind = _LIST_OF_STRINGS
            else:
                kind = _LIST_OTHER
        elif field.message_type is not None:
            kind = _MESSAGE
        elif field.type == FieldDescriptor.TYPE_STRING and field.full_name not in LONG_STRINGS:
            kind = _STRING
        else:
            kind = _OTHER
        _FIELD_KINDS[field] = kind
    return kind


# A field path as check_bounds walks it: (field name, marker) steps, the marker None for a plain
# field, an int for a list index, a 1-tuple for a map key. Spelled out only for a field that fails.
_Path = tuple[tuple[str, object], ...]


def _where(path: _Path, name: str, marker: object = None) -> str:
    return ".".join(step + _bracket(at) for step, at in (*path, (name, marker)))


def _bracket(marker: object) -> str:
    if isinstance(marker, tuple):
        return f"[{str(marker[0])[:40]!r}]"
    return "" if marker is None else f"[{marker}]"


# A message this small (serialized) holds nothing over a bound: a string over MAX_STRING characters
# takes more bytes than that, and so do more than MAX_MAP map entries (2 bytes each at least) or
# MAX_LIST list entries (1 byte each at least).
_SURELY_BOUNDED = min(MAX_STRING, 2 * MAX_MAP, MAX_LIST)


def _bounds(message: Message, path: _Path) -> None:
    if message.ByteSize() <= _SURELY_BOUNDED:  # (a C call: most messages end the walk here)
        return
    for field, value in message.ListFields():
        kind = _field_kind(field)
        if kind == _OTHER:
            continue
        if kind == _STRING:
            _check_string(value, path, field.name)
        elif kind == _MESSAGE:
            _bounds(value, (*path, (field.name, None)))
        elif kind in (_MAP_OF_MESSAGES, _MAP_OF_SCALARS):
            if len(value) > MAX_MAP:
                raise invalid(
                    f"{_where(path, field.name)}: {len(value)} entries exceed the limit of {MAX_MAP}"
                )
            for key in value:
                item = value[key]
                _check_string(key, path, field.name, (key,))
                if kind == _MAP_OF_MESSAGES:
                    _bounds(item, (*path, (field.name, (key,))))
                else:
                    _check_string(item, path, field.name, (key,))
        else:
            if len(value) > MAX_LIST:
                raise invalid(
                    f"{_where(path, field.name)}: {len(value)} entries exceed the limit of {MAX_LIST}"
                )
            if kind == _LIST_OF_MESSAGES:
                for i, item in enumerate(value):
                    _bounds(item, (*path, (field.name, i)))
            elif kind == _LIST_OF_STRINGS:
                for i, item in enumerate(value):
                    _check_string(item, path, field.name, i)


def _check_string(value: object, path: _Path, name: str, marker: object = None) -> None:
    """A string over MAX_STRING characters is INVALID_ARGUMENT, naming its field (the path is
    spelled out only then)."""
    if isinstance(value, str) and len(value) > MAX_STRING:
        raise invalid(
            f"{_where(path, name, marker)}: {len(value):,} characters exceed the limit of {MAX_STRING:,}"
        )


def check_decision_id(path: str, value: int, *, zero_ok: bool = False) -> None:
    if value == 0 and not zero_ok:
        raise invalid(f"{path}: must not be 0")
    if value > MAX_DECISION_ID:
        raise invalid(f"{path}: {value} is beyond the largest decision id ({MAX_DECISION_ID})")


def check_name(path: str, value: str, what: str = "name") -> None:
    if not value:
        raise invalid(f"{path}: must not be empty")
    if not _NAME.match(value):
        raise invalid(
            f"{path}: {value!r} is not a valid {what} (letters, digits, '-', '_', '.', ':'; "
            "starts and ends with a letter or digit; at most 253 characters)"
        )


def check_labels(path: str, labels: Mapping[str, str]) -> None:
    for key in labels:
        if not _LABEL_KEY.match(key):
            raise invalid(f"{path}[{key!r}]: not a valid label key")


def resources(
    path: str,
    rl: pb.ResourceList,
    *,
    allow_unlimited: bool = False,
    require_nonzero: bool = False,
) -> dict[str, float]:
    """Parse a ResourceList into canonical units; QuantityError -> INVALID_ARGUMENT on the field."""
    try:
        parsed = parse_resources(dict(rl.quantities), allow_unlimited=allow_unlimited)
    except QuantityError as exc:
        raise invalid(f"{path}.{exc}") from None
    if require_nonzero and not any(v > 0 for v in parsed.values()):
        raise invalid(f"{path}: must request a positive amount of at least one resource")
    return parsed


def _check_requirements(path: str, reqs: Iterable[pb.LabelSelectorRequirement]) -> None:
    for i, req in enumerate(reqs):
        p = f"{path}[{i}]"
        if not req.key:
            raise invalid(f"{p}.key: must not be empty")
        if req.operator not in SELECTOR_OPERATORS:
            raise invalid(
                f"{p}.operator: {req.operator!r} is not one of {', '.join(SELECTOR_OPERATORS)}"
            )
        if req.operator in ("In", "NotIn") and not req.values:
            raise invalid(f"{p}.values: operator {req.operator} needs at least one value")
        if req.operator in ("Exists", "DoesNotExist") and req.values:
            raise invalid(f"{p}.values: operator {req.operator} takes no values")
        if req.operator in ("Gt", "Lt"):
            if len(req.values) != 1:
                raise invalid(
                    f"{p}.values: operator {req.operator} takes exactly one integer value"
                )
            try:
                int(req.values[0])
            except ValueError:
                raise invalid(f"{p}.values[0]: {req.values[0]!r} is not an integer") from None


def _check_pod_affinity(path: str, pa: pb.PodAffinity) -> None:
    for i, term in enumerate(pa.required):
        _check_pod_affinity_term(f"{path}.required[{i}]", term)
    for i, wterm in enumerate(pa.preferred):
        if not 1 <= wterm.weight <= 100:
            raise invalid(f"{path}.preferred[{i}].weight: {wterm.weight} is not in 1..100")
        _check_pod_affinity_term(f"{path}.preferred[{i}].term", wterm.term)


def _check_pod_affinity_term(path: str, term: pb.PodAffinityTerm) -> None:
    if not term.topology_key:
        raise invalid(f"{path}.topology_key: must not be empty")
    check_labels(f"{path}.label_selector.match_labels", term.label_selector.match_labels)
    _check_requirements(
        f"{path}.label_selector.match_expressions", term.label_selector.match_expressions
    )


def check_known_fields(path: str, message: Message) -> None:
    """INVALID_ARGUMENT when ``message`` (at any depth) carries a field this server's muster.proto
    does not have: a client built from a newer proto, or a message built by hand. Ignored, such a
    field would drop what it says (an affinity rule) without a word."""
    fields = UnknownFieldSet(message)
    unknown = sorted({fields[i].field_number for i in range(len(fields))})
    if unknown:
        numbers = ", ".join(str(n) for n in unknown)
        raise invalid(
            f"{path}: unknown field number {numbers} of {message.DESCRIPTOR.name} "
            f"(known: {', '.join(f.name for f in message.DESCRIPTOR.fields)})"
        )
    for field, value in message.ListFields():
        if field.message_type is None or field.message_type.GetOptions().map_entry:
            continue
        if field.is_repeated:
            for i, item in enumerate(value):
                check_known_fields(f"{path}.{field.name}[{i}]", item)
        else:
            check_known_fields(f"{path}.{field.name}", value)


def check_affinity(path: str, aff: pb.Affinity) -> None:
    check_known_fields(path, aff)
    na = aff.node_affinity
    for i, term in enumerate(na.required):
        if not term.match_expressions and not term.match_fields:
            raise invalid(
                f"{path}.node_affinity.required[{i}]: a term needs at least one requirement"
            )
        _check_requirements(
            f"{path}.node_affinity.required[{i}].match_expressions", term.match_expressions
        )
        _check_requirements(f"{path}.node_affinity.required[{i}].match_fields", term.match_fields)
    for i, pref in enumerate(na.preferred):
        if not 1 <= pref.weight <= 100:
            raise invalid(
                f"{path}.node_affinity.preferred[{i}].weight: {pref.weight} is not in 1..100"
            )
        p = f"{path}.node_affinity.preferred[{i}].preference"
        _check_requirements(f"{p}.match_expressions", pref.preference.match_expressions)
        _check_requirements(f"{p}.match_fields", pref.preference.match_fields)
    _check_pod_affinity(f"{path}.pod_affinity", aff.pod_affinity)
    _check_pod_affinity(f"{path}.pod_anti_affinity", aff.pod_anti_affinity)


def check_tolerations(path: str, tolerations: Iterable[pb.Toleration]) -> None:
    for i, tol in enumerate(tolerations):
        p = f"{path}[{i}]"
        if tol.operator not in ("", "Equal", "Exists"):
            raise invalid(f"{p}.operator: {tol.operator!r} is not Equal or Exists")
        if tol.operator == "Exists" and tol.value:
            raise invalid(f"{p}.value: must be empty when operator is Exists")
        if not tol.key and tol.operator != "Exists":
            raise invalid(f"{p}.key: an empty key needs operator Exists")
        if tol.effect and tol.effect not in TAINT_EFFECTS:
            raise invalid(f"{p}.effect: {tol.effect!r} is not one of {', '.join(TAINT_EFFECTS)}")


@dataclass(frozen=True, slots=True)
class ValidJob:
    """A submitted job that passed validation: its spec normalized (defaults filled in: what is
    stored and compared for idempotent resubmission) and its quantities in canonical units, parsed
    here once for ``convert.valid_job_to_model``."""

    spec: pb.JobSpec
    requests: tuple[dict[str, float], ...]  # per task group, in the spec's order
    min_resources: dict[str, float]


@dataclass(frozen=True, slots=True)
class ValidQueue:
    """A queue that passed validation: normalized, and its quantities in canonical units (``-1``:
    unlimited, +inf), parsed here once for ``convert.valid_queue_to_model``."""

    spec: pb.Queue
    guarantee: dict[str, float]
    deserved: dict[str, float]
    capability: dict[str, float]


def normalize_job(spec: pb.JobSpec) -> ValidJob:
    """Validate a submitted JobSpec: a normalized copy (defaults filled in) and its parsed
    quantities."""
    job = pb.JobSpec()
    job.CopyFrom(spec)
    check_name("job.id", job.id, "job id")
    if not job.namespace:
        job.namespace = "default"
    check_name("job.namespace", job.namespace, "namespace")
    if not job.name:
        job.name = job.id
    check_name("job.name", job.name)
    if not job.queue:
        job.queue = "default"
    check_name("job.queue", job.queue, "queue name")
    if job.queue == "root":
        raise invalid(
            "job.queue: the root queue cannot hold jobs; use a leaf queue such as 'default'"
        )
    if not job.task_groups:
        raise invalid("job.task_groups: a job needs at least one task group")
    sub_groups: set[str] = set()
    for i, sg in enumerate(job.sub_groups):
        check_name(f"job.sub_groups[{i}].name", sg.name, "sub-group name")
        if sg.name in sub_groups:
            raise invalid(f"job.sub_groups[{i}].name: duplicate sub-group {sg.name!r}")
        if sg.min_member < 0:
            raise invalid(f"job.sub_groups[{i}].min_member: {sg.min_member} is negative")
        sub_groups.add(sg.name)
    replicas: dict[str, int] = {}
    requests: list[dict[str, float]] = []
    total = 0
    for i, tg in enumerate(job.task_groups):
        p = f"job.task_groups[{i}]"
        check_name(f"{p}.role", tg.role, "role")
        if tg.role in replicas:
            raise invalid(f"{p}.role: duplicate role {tg.role!r}")
        if tg.replicas <= 0:
            raise invalid(f"{p}.replicas: {tg.replicas} must be at least 1")
        replicas[tg.role] = tg.replicas
        total += tg.replicas
        requests.append(resources(f"{p}.request", tg.request, require_nonzero=True))
        check_labels(f"{p}.node_selector", tg.node_selector)
        check_labels(f"{p}.labels", tg.labels)
        check_tolerations(f"{p}.tolerations", tg.tolerations)
        check_affinity(f"{p}.affinity", tg.affinity)
        if not math.isfinite(tg.duration_seconds) or tg.duration_seconds < 0:
            raise invalid(
                f"{p}.duration_seconds: {tg.duration_seconds} must be a finite number >= 0"
            )
        if tg.sub_group and tg.sub_group not in sub_groups:
            raise invalid(f"{p}.sub_group: no sub-group named {tg.sub_group!r} in job.sub_groups")
        if tg.gpu_fraction:
            if not math.isfinite(tg.gpu_fraction) or not 0 < tg.gpu_fraction < 1:
                raise invalid(
                    f"{p}.gpu_fraction: {tg.gpu_fraction} is not a share of one GPU (above 0, below 1)"
                )
            if tg.request.quantities.get(NVIDIA_GPU, "0") not in ("", "0"):
                raise invalid(
                    f"{p}.gpu_fraction: a task sharing a GPU asks no whole {NVIDIA_GPU} (it asks "
                    f"{tg.request.quantities[NVIDIA_GPU]})"
                )
    if total > MAX_TASKS_PER_JOB:
        raise invalid(
            f"job.task_groups: {total} tasks exceed the limit of {MAX_TASKS_PER_JOB} per job"
        )
    if job.min_member < 0:
        raise invalid(f"job.min_member: {job.min_member} is negative")
    if job.min_member > total:
        raise invalid(f"job.min_member: {job.min_member} is more than the job's {total} tasks")
    for role, count in job.min_task_member.items():
        if role not in replicas:
            raise invalid(f"job.min_task_member[{role!r}]: no task group has role {role!r}")
        if count < 0:
            raise invalid(f"job.min_task_member[{role!r}]: {count} is negative")
        if count > replicas[role]:
            raise invalid(
                f"job.min_task_member[{role!r}]: {count} is more than the role's {replicas[role]} replicas"
            )
    min_resources = resources("job.min_resources", job.min_resources)
    if job.HasField("tyjob"):
        _normalize_tyjob(job, replicas)
    if job.network_topology.mode not in ("", "hard", "soft"):
        raise invalid(
            f"job.network_topology.mode: {job.network_topology.mode!r} is not hard or soft"
        )
    if job.network_topology.highest_tier_allowed < 0:
        raise invalid("job.network_topology.highest_tier_allowed: must be >= 0")
    check_time_limit("job.time_limit_seconds", job.time_limit_seconds)
    _check_job_control(job, total)
    return ValidJob(job, tuple(requests), min_resources)


# An array's elements together have at most this many tasks (each element is a job of the
# spec's tasks).
MAX_ARRAY_TASKS = 1_000_000


def _check_job_control(job: pb.JobSpec, tasks: int) -> None:
    """An array spec and dependencies (their types defaulted in), and the fields only the server
    sets (an array element's)."""
    if job.array_job_id or job.array_index:
        field = "array_job_id" if job.array_job_id else "array_index"
        raise invalid(
            f"job.{field}: set by the server on an array's elements; submit the array "
            "(job.array) instead"
        )
    if job.array:
        try:
            array = parse_array(job.array)
        except ArraySpecError as exc:
            raise invalid(f"job.array: {job.array!r}: {exc}") from None
        check_name("job.array", element_id(job.id, array.indexes[-1]), "element job id")
        if len(array) * tasks > MAX_ARRAY_TASKS:
            raise invalid(
                f"job.array: {len(array)} elements of {tasks} tasks exceed the limit of "
                f"{MAX_ARRAY_TASKS} tasks per array"
            )
    for i, dep in enumerate(job.depends_on):
        where = f"job.depends_on[{i}]"
        check_name(f"{where}.job", dep.job, "job id")
        if dep.job == job.id:
            raise invalid(f"{where}.job: a job cannot depend on itself")
        if not dep.type:
            dep.type = DEFAULT_DEPENDENCY_TYPE
        if dep.type not in DEPENDENCY_TYPES:
            raise invalid(f"{where}.type: {dep.type!r} is not one of {', '.join(DEPENDENCY_TYPES)}")


def _normalize_tyjob(job: pb.JobSpec, replicas: Mapping[str, int]) -> None:
    """TY-Arranger's rules for a TYJob, with its defaults written in (so resubmission compares
    equal): one Leader replica, enough workers, priority 1..10 (default 5)."""
    ty = job.tyjob
    if not ty.leader_role:
        ty.leader_role = "leader"
    if replicas.get(ty.leader_role) != 1:
        found = replicas.get(ty.leader_role, 0)
        raise invalid(
            f"job.tyjob.leader_role: a TYJob has one Leader: the task group with role "
            f"{ty.leader_role!r} must have 1 replica (it has {found})"
        )
    if not ty.HasField("min_workers_num"):
        ty.min_workers_num = 1
    workers = sum(replicas.values()) - 1
    if not 0 <= ty.min_workers_num <= workers:
        raise invalid(
            f"job.tyjob.min_workers_num: {ty.min_workers_num} must be between 0 and the job's {workers} workers"
        )
    if not ty.HasField("restart_limit"):
        ty.restart_limit = 3
    if not 0 <= ty.restart_limit <= MAX_RESTART_LIMIT:
        raise invalid(
            f"job.tyjob.restart_limit: {ty.restart_limit} must be between 0 and {MAX_RESTART_LIMIT}"
        )
    ty.clean_pod_policy = ty.clean_pod_policy or "All"
    if ty.clean_pod_policy not in TY_CLEAN_POD_POLICIES:
        raise invalid(
            f"job.tyjob.clean_pod_policy: {ty.clean_pod_policy!r} is not one of {', '.join(TY_CLEAN_POD_POLICIES)}"
        )
    policy = ty.scheduler_policy
    policy.job_queue_policy = policy.job_queue_policy or "Priority"
    if policy.job_queue_policy not in TY_JOB_QUEUE_POLICIES:
        raise invalid(
            f"job.tyjob.scheduler_policy.job_queue_policy: {policy.job_queue_policy!r} is not one of "
            f"{', '.join(TY_JOB_QUEUE_POLICIES)}"
        )
    policy.basic_policy = policy.basic_policy or "Gang"
    if policy.basic_policy not in TY_BASIC_POLICIES:
        raise invalid(
            f"job.tyjob.scheduler_policy.basic_policy: {policy.basic_policy!r} is not one of "
            f"{', '.join(TY_BASIC_POLICIES)}"
        )
    if job.priority == 0 and not job.priority_class:
        job.priority = 5
    if not 1 <= job.priority <= 10 and not job.priority_class:
        raise invalid(f"job.priority: {job.priority} is not a TYJob priority (1 to 10)")
    if job.min_member == 0:
        job.min_member = 1 + ty.min_workers_num
    if not job.min_task_member:
        job.min_task_member[ty.leader_role] = 1


def check_node(path: str, node: pb.Node) -> dict[str, float]:
    """Validate a Node; returns its allocatable in canonical units."""
    check_name(f"{path}.name", node.name, "node name")
    allocatable = resources(f"{path}.allocatable", node.allocatable)
    check_labels(f"{path}.labels", node.labels)
    for i, taint in enumerate(node.taints):
        if not taint.key:
            raise invalid(f"{path}.taints[{i}].key: must not be empty")
        if taint.effect not in TAINT_EFFECTS:
            raise invalid(
                f"{path}.taints[{i}].effect: {taint.effect!r} is not one of {', '.join(TAINT_EFFECTS)}"
            )
    ids: set[str] = set()
    for i, dev in enumerate(node.devices):
        if not dev.id:
            raise invalid(f"{path}.devices[{i}].id: must not be empty")
        if dev.id in ids:
            raise invalid(f"{path}.devices[{i}].id: duplicate device {dev.id!r}")
        ids.add(dev.id)
    # Device ids are made up per unit for a device resource the node does not list: bounded here.
    too_many = device_count_problem(allocatable, (d.type for d in node.devices))
    if too_many is not None:
        raise invalid(f"{path}.{too_many[0]}: {too_many[1]}")
    return allocatable


# KAI writes -1 for "unlimited" in a queue's quota and limit, not in its over-quota weight (KAI's
# docs/queues: "Special Values"); a -1 weight is refused with this said.
WEIGHT_NOT_UNLIMITED = (
    " (KAI's -1, unlimited, is for a quota (guarantee) or a limit (capability), "
    "not for the over-quota weight)"
)


def normalize_queue(queue: pb.Queue, path: str = "queue") -> ValidQueue:
    """Validate a Queue: a copy with defaults filled in (parent root, weight 1, reclaimable true)
    and its parsed quantities."""
    q = pb.Queue()
    q.CopyFrom(queue)
    check_name(f"{path}.name", q.name, "queue name")
    if q.name == "root":
        q.parent = ""
    elif not q.parent:
        q.parent = "root"
    else:
        check_name(f"{path}.parent", q.parent, "queue name")
        if q.parent == q.name:
            raise invalid(f"{path}.parent: a queue cannot be its own parent")
    if q.weight < 0:
        raise invalid(f"{path}.weight: {q.weight} is negative{WEIGHT_NOT_UNLIMITED}")
    if q.weight == 0:
        q.weight = 1
    if not q.HasField("reclaimable"):
        q.reclaimable = True
    if q.state == pb.QUEUE_STATE_UNSPECIFIED:
        q.state = pb.QUEUE_STATE_OPEN
    if q.state not in (pb.QUEUE_STATE_OPEN, pb.QUEUE_STATE_CLOSING, pb.QUEUE_STATE_CLOSED):
        raise invalid(f"{path}.state: {q.state} is not a known queue state")
    check_time_limit(f"{path}.default_time_limit_seconds", q.default_time_limit_seconds)
    check_time_limit(f"{path}.max_time_limit_seconds", q.max_time_limit_seconds)
    if 0 < q.max_time_limit_seconds < q.default_time_limit_seconds:
        raise invalid(
            f"{path}.default_time_limit_seconds: {q.default_time_limit_seconds} "
            f"({format_time_limit(q.default_time_limit_seconds)}) is more than the queue's maximum, "
            f"max_time_limit_seconds {q.max_time_limit_seconds} "
            f"({format_time_limit(q.max_time_limit_seconds)})"
        )
    return ValidQueue(
        q,
        # "-1": unlimited (KAI's quota -1; docs/plugins/kai.md), as for deserved and capability.
        guarantee=resources(f"{path}.guarantee", q.guarantee, allow_unlimited=True),
        deserved=resources(f"{path}.deserved", q.deserved, allow_unlimited=True),
        capability=resources(f"{path}.capability", q.capability, allow_unlimited=True),
    )


def check_time_limit(path: str, seconds: int) -> None:
    """A time limit in seconds (0: none) within ``muster.timelimit.MAX_TIME_LIMIT``."""
    if seconds > MAX_TIME_LIMIT:
        raise invalid(
            f"{path}: {seconds} is more than the largest time limit, {MAX_TIME_LIMIT} "
            f"({format_time_limit(MAX_TIME_LIMIT)})"
        )


def check_backend_task(path: str, task: pb.BackendTask) -> dict[str, float]:
    if not task.task_id:
        raise invalid(f"{path}.task_id: must not be empty")
    if not task.node:
        raise invalid(f"{path}.node: must not be empty")
    return resources(f"{path}.request", task.request)
