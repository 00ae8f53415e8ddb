"""YAML job files -> ``muster.v1.JobSpec`` (the format is documented in docs/jobs.md).

A file holds one job, several YAML documents (``---``), a ``jobs:`` list, or a top-level list.
Field names follow the proto in either spelling (``min_member`` or ``minMember``); a few
friendly forms are reshaped before ``json_format.ParseDict``:

* ResourceLists are plain mappings: ``request: {cpu: 2, memory: 4Gi}`` (numbers allowed);
* ``tasks`` is an alias of ``task_groups``; ``duration`` of ``duration_seconds``;
* ``command`` may be a string (run through ``sh -c``) or a list;
* a TYJob's fields may sit on the job itself, as in scenarios (``leaderRole``, ``minWorkersNum``,
  ``restartLimit``, ``cleanPodPolicy``, ``schedulerPolicy``): they move into ``tyjob``.

Every quantity is checked with ``muster.quantity`` so a typo fails here, naming the field:
``jobs[0].tasks[1].request.cpu: '2x' is not a quantity``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from muster.quantity import QuantityError, parse_resources
from muster.v1 import muster_pb2 as pb
from muster.yamldoc import DocumentError, load_all

# Proto field names and their JSON (camelCase) spellings, per message, for friendly renames.
_JOB_ALIASES = {"tasks": "task_groups", "taskGroups": "task_groups"}
_GROUP_ALIASES = {"duration": "duration_seconds", "durationSeconds": "duration_seconds"}
_JOB_RESOURCES = ("min_resources", "minResources")
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
        documents = [d for d in load_all(text) if d is not None]
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
    _check_fields(data, pb.JobSpec.DESCRIPTOR, where, problems)
    if not data.get("id"):
        problems.append(f"{where}.id: required (a client-chosen unique id)")
    for key in _JOB_RESOURCES:
        if key in data:
            data[key] = _resource_list(data[key], f"{where}.{key}", problems)
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


def _task_group(group: Any, where: str, problems: list[str]) -> Any:
    if not isinstance(group, dict):
        problems.append(f"{where}: expected a mapping")
        return group
    data = _rename(dict(group), _GROUP_ALIASES)
    _check_fields(data, pb.TaskGroup.DESCRIPTOR, where, problems)
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
