"""YAML job files -> ``muster.v1.JobSpec`` (the format is documented in docs/jobs.md).

A file holds one job, several YAML documents (``---``), a ``jobs:`` list, or a top-level list.
Field names follow the proto in either spelling (``min_member`` or ``minMember``); a few
friendly forms are reshaped before ``json_format.ParseDict``:

* ResourceLists are plain mappings: ``request: {cpu: 2, memory: 4Gi}`` (numbers allowed);
* ``tasks`` is an alias of ``task_groups``; ``duration`` of ``duration_seconds``;
* ``command`` may be a string (run through ``sh -c``) or a list;
* ``time_limit`` (``timeLimit``) is a time limit as ``muster.timelimit`` reads it (``2h``, ``90m``,
  Slurm's ``HH:MM:SS`` ...; a bare number is minutes, as Slurm's ``--time``): it becomes
  ``time_limit_seconds``. ``1:30`` is read as that text, not as YAML 1.1's base-60 number 90;
* a TYJob's fields may sit on the job itself, as in scenarios (``leaderRole``, ``minWorkersNum``,
  ``restartLimit``, ``cleanPodPolicy``, ``schedulerPolicy``): they move into ``tyjob``;
* ``depends_on`` may be Slurm's spelling, ``afterok:a:b,afterany:c`` (or a list of such strings),
  and ``array`` a number (one index).

Every quantity is checked with ``muster.quantity`` so a typo fails here, naming the field:
``jobs[0].tasks[1].request.cpu: '2x' is not a quantity``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from muster.jobcontrol import (
    DEPENDENCY_TYPES,
    ArraySpecError,
    parse_array,
    parse_dependencies,
)
from muster.quantity import QuantityError, parse_resources
from muster.timelimit import TimeLimitError, parse_time_limit
from muster.v1 import muster_pb2 as pb
from muster.yamldoc import DocumentError, load_all

# Proto field names and their JSON (camelCase) spellings, per message, for friendly renames.
_JOB_ALIASES = {"tasks": "task_groups", "taskGroups": "task_groups"}
_GROUP_ALIASES = {"duration": "duration_seconds", "durationSeconds": "duration_seconds"}
_JOB_RESOURCES = ("min_resources", "minResources")
_TIME_LIMIT = ("time_limit", "timeLimit")  # friendly form of time_limit_seconds
_TY_FIELDS = {
    "leaderRole": "leader_role",
    "leader_role": "leader_role",
    "minWorkersNum": "min_workers_num",
    "min_workers_num": "min_workers_num",
    "restartLimit": "restart_limit",
    "restart_limit": "restart_limit",
    "cleanPodPolicy": "clean_pod_policy",
    "clean_pod_policy": "clean_pod_policy",
    "schedulerPolicy": "scheduler_policy",
    "scheduler_policy": "scheduler_policy",
}
_GROUP_RESOURCES = ("request",)


class JobFileError(ValueError):
    """A job file that cannot be turned into JobSpecs; ``problems`` lists one line per error."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def load_job_file(path: str | Path) -> list[pb.JobSpec]:
    """The jobs of a YAML file; a JobFileError's problems each start with ``PATH: ``."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise JobFileError([f"{path}: {exc.strerror or exc}"]) from None
    try:
        return parse_jobs(text)
    except JobFileError as exc:
        raise JobFileError([f"{path}: {problem}" for problem in exc.problems]) from None


def parse_jobs(text: str) -> list[pb.JobSpec]:
    """Parse every job of a YAML text; raises JobFileError listing all problems found."""
    try:
        # Base 60 off: a Slurm-style ``time_limit: 1:30:00`` stays text.
        documents = [d for d in load_all(text, base60=False) if d is not None]
    except DocumentError as exc:
        raise JobFileError([str(exc)]) from None
    entries: list[Any] = []
    for doc in documents:
        if isinstance(doc, dict) and "jobs" in doc and len(doc) == 1:
            if not isinstance(doc["jobs"], list):
                raise JobFileError(["jobs: expected a list of jobs"])
            entries.extend(doc["jobs"])
        elif isinstance(doc, list):
            entries.extend(doc)
        else:
            entries.append(doc)
    if not entries:
        raise JobFileError(["the file holds no job"])
    jobs: list[pb.JobSpec] = []
    problems: list[str] = []
    for i, entry in enumerate(entries):
        where = f"jobs[{i}]"
        try:
            jobs.append(job_from_dict(entry, where))
        except JobFileError as exc:
            problems.extend(exc.problems)
    ids = [j.id for j in jobs]
    problems.extend(
        f"jobs: duplicate id {i!r}" for i in sorted({i for i in ids if ids.count(i) > 1})
    )
    if problems:
        raise JobFileError(problems)
    return jobs


def job_from_dict(entry: Any, where: str = "job") -> pb.JobSpec:
    """One job mapping (friendly form) -> JobSpec."""
    if not isinstance(entry, dict):
        raise JobFileError([f"{where}: expected a mapping, got {type(entry).__name__}"])
    problems: list[str] = []
    data = _rename(dict(entry), _JOB_ALIASES)
    ty_fields = {_TY_FIELDS[k]: data.pop(k) for k in list(data) if k in _TY_FIELDS}
    if ty_fields:
        if "tyjob" in data:
            problems.append(
                f"{where}.tyjob: give the TYJob fields either in tyjob or on the job, not both"
            )
        else:
            data["tyjob"] = ty_fields
    _time_limit(data, where, problems)
    _check_fields(data, pb.JobSpec.DESCRIPTOR, where, problems)
    if not data.get("id"):
        problems.append(f"{where}.id: required (a client-chosen unique id)")
    for key in _JOB_RESOURCES:
        if key in data:
            data[key] = _resource_list(data[key], f"{where}.{key}", problems)
    _job_control(data, where, problems)
    groups = data.get("task_groups")
    if not isinstance(groups, list) or not groups:
        problems.append(f"{where}.tasks: required, a non-empty list of task groups")
    else:
        data["task_groups"] = [
            _task_group(g, f"{where}.tasks[{k}]", problems) for k, g in enumerate(groups)
        ]
    if problems:
        raise JobFileError(problems)
    spec = pb.JobSpec()
    try:
        json_format.ParseDict(data, spec)
    except json_format.ParseError as exc:
        raise JobFileError([f"{where}: {_clean_parse_error(exc)}"]) from None
    return spec


def _time_limit(data: dict[str, Any], where: str, problems: list[str]) -> None:
    """``time_limit: 2h`` (or ``timeLimit``) -> ``time_limit_seconds: 7200``."""
    given = [k for k in _TIME_LIMIT if k in data]
    if not given:
        return
    key = given[0]
    value = data.pop(key)
    for other in given[1:]:
        data.pop(other)
    if len(given) > 1 or "time_limit_seconds" in data or "timeLimitSeconds" in data:
        problems.append(
            f"{where}.{key}: give the time limit once (time_limit or time_limit_seconds)"
        )
        return
    try:
        data["time_limit_seconds"] = parse_time_limit(value)
    except TimeLimitError as exc:
        problems.append(f"{where}.{key}: {exc}")


def _job_control(data: dict[str, Any], where: str, problems: list[str]) -> None:
    """``array`` (a spec, or one index as a number) and ``depends_on`` in Slurm's spelling
    (``afterok:a:b,afterany:c``, or a list of such strings or of ``{job, type}`` mappings)."""
    if isinstance(data.get("array"), int) and not isinstance(data["array"], bool):
        data["array"] = str(data["array"])
    if isinstance(data.get("array"), str):
        try:
            parse_array(data["array"])
        except ArraySpecError as exc:
            problems.append(f"{where}.array: {data['array']!r}: {exc}")
    for key in ("depends_on", "dependsOn"):
        if key in data:
            data[key] = _dependencies(data[key], f"{where}.{key}", problems)


def _dependencies(value: Any, where: str, problems: list[str]) -> Any:
    items = value if isinstance(value, list) else [value]
    out: list[Any] = []
    for k, item in enumerate(items):
        at = f"{where}[{k}]" if isinstance(value, list) else where
        if isinstance(item, str):
            try:
                out.extend({"job": job, "type": kind} for kind, job in parse_dependencies(item))
            except ArraySpecError as exc:
                problems.append(f"{at}: {item!r}: {exc}")
        elif isinstance(item, dict):
            kind = item.get("type", "")
            if kind and kind not in DEPENDENCY_TYPES:
                problems.append(f"{at}.type: {kind!r} is not one of {', '.join(DEPENDENCY_TYPES)}")
            out.append(item)
        else:
            problems.append(
                f"{at}: expected 'afterok:JOB', or a mapping {{job: JOB, type: afterok}}"
            )
    return out


def _task_group(group: Any, where: str, problems: list[str]) -> Any:
    if not isinstance(group, dict):
        problems.append(f"{where}: expected a mapping")
        return group
    data = _rename(dict(group), _GROUP_ALIASES)
    _check_fields(data, pb.TaskGroup.DESCRIPTOR, where, problems)
    if "affinity" in data:
        _check_message(data["affinity"], pb.Affinity.DESCRIPTOR, f"{where}.affinity", problems)
    for key in _GROUP_RESOURCES:
        if key in data:
            data[key] = _resource_list(data[key], f"{where}.{key}", problems)
    command = data.get("command")
    if isinstance(command, str):
        data["command"] = ["sh", "-c", command]
    elif command is not None and not (
        isinstance(command, list) and all(isinstance(c, str | int | float) for c in command)
    ):
        problems.append(f"{where}.command: expected a string or a list of strings")
    elif command is not None:
        data["command"] = [str(c) for c in command]
    return data


def _resource_list(value: Any, where: str, problems: list[str]) -> dict[str, Any]:
    if isinstance(value, dict) and set(value) == {"quantities"}:
        value = value["quantities"]  # already in proto form
    if not isinstance(value, dict):
        problems.append(f"{where}: expected a mapping of resource name to quantity")
        return {}
    quantities = {str(k): _quantity_text(v) for k, v in value.items()}
    try:
        parse_resources(quantities)
    except QuantityError as exc:
        problems.append(f"{where}.{exc}")
    return {"quantities": quantities}


def _quantity_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _rename(data: dict[str, Any], aliases: dict[str, str]) -> dict[str, Any]:
    for alias, name in aliases.items():
        if alias in data:
            data[name] = data.pop(alias)
    return data


def _check_fields(data: dict[str, Any], descriptor: Any, where: str, problems: list[str]) -> None:
    known = {f.name for f in descriptor.fields} | {f.json_name for f in descriptor.fields}
    for key in data:
        if key not in known:
            problems.append(f"{where}.{key}: unknown field")


# Kubernetes' names of the affinity fields a job file writes shorter (the proto's names).
_KUBERNETES_NAMES = {
    "requiredDuringSchedulingIgnoredDuringExecution": "required",
    "preferredDuringSchedulingIgnoredDuringExecution": "preferred",
    "nodeSelectorTerms": "required (a list of terms)",
    "podAffinityTerm": "term",
}


def _check_message(value: Any, descriptor: Any, where: str, problems: list[str]) -> None:
    """Every key of a nested message (an affinity) is one of its fields, at any depth: a typo
    such as ``node_affinity.requird`` is named with its path and the fields that exist, instead
    of ParseDict's one-line summary (or, for a key ParseDict would skip, of nothing)."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_message(item, descriptor, f"{where}[{i}]", problems)
        return
    if not isinstance(value, dict):
        return  # a wrong type: ParseDict names it
    fields = {f.name: f for f in descriptor.fields} | {f.json_name: f for f in descriptor.fields}
    for key, item in value.items():
        field = fields.get(key)
        if field is None:
            hint = _KUBERNETES_NAMES.get(str(key))
            known = ", ".join(f.name for f in descriptor.fields)
            problems.append(
                f"{where}.{key}: unknown field (known: {known})"
                + (f"; Kubernetes' {key} is written {hint} here" if hint else "")
            )
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            _check_message(item, field.message_type, f"{where}.{key}", problems)


def _clean_parse_error(exc: Exception) -> str:
    # ParseDict says 'Failed to parse x field: ... at "JobSpec.taskGroups[0]"' over several lines.
    return str(exc).splitlines()[0].replace("muster.v1.", "")


def job_to_dict(spec: pb.JobSpec) -> dict[str, Any]:
    """JobSpec -> the friendly mapping (inverse of job_from_dict, for `--output yaml` and docs)."""
    data = json_format.MessageToDict(spec, preserving_proto_field_name=True)
    for key in _JOB_RESOURCES:
        if key in data:
            data[key] = data[key].get("quantities", {})
    groups: Iterable[dict[str, Any]] = data.pop("task_groups", [])
    tasks = []
    for group in groups:
        if "request" in group:
            group["request"] = group["request"].get("quantities", {})
        tasks.append(group)
    data["tasks"] = tasks
    return data
