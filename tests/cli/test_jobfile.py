"""Job files: friendly YAML -> JobSpec; every error names its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.jobfile import JobFileError, job_to_dict, load_job_file, parse_jobs
from muster.v1 import muster_pb2 as pb

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_friendly_form_maps_onto_jobspec():
    [job] = parse_jobs(
        """
id: train
namespace: ml
queue: gpu
priorityClass: high
minMember: 3
min_task_member: {leader: 1}
min_resources: {cpu: 8}
tasks:
  - role: leader
    replicas: 1
    request: {cpu: 2, memory: 4Gi, nvidia.com/gpu: 1}
    command: "echo hi"
  - role: worker
    replicas: 2
    request: {cpu: 0.5}
    duration: 2.5
    node_selector: {zone: a}
    tolerations: [{key: gpu, operator: Exists}]
    affinity:
      node_affinity:
        required: [{match_expressions: [{key: rack, operator: In, values: [a, b]}]}]
"""
    )
    assert job.id == "train"
    assert job.namespace == "ml"
    assert job.queue == "gpu"
    assert job.priority_class == "high"
    assert job.min_member == 3
    assert dict(job.min_task_member) == {"leader": 1}
    assert dict(job.min_resources.quantities) == {"cpu": "8"}
    leader, worker = job.task_groups
    assert dict(leader.request.quantities) == {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}
    assert list(leader.command) == ["sh", "-c", "echo hi"]
    assert worker.request.quantities["cpu"] == "0.5"
    assert worker.duration_seconds == 2.5
    assert worker.tolerations[0].operator == "Exists"
    term = worker.affinity.node_affinity.required[0].match_expressions[0]
    assert (term.key, term.operator, list(term.values)) == ("rack", "In", ["a", "b"])


def test_many_jobs_per_file_documents_and_list():
    text = """
id: a
tasks: [{role: w, replicas: 1, request: {cpu: 1}}]
---
jobs:
  - {id: b, tasks: [{role: w, replicas: 2, request: {cpu: 1}}]}
  - {id: c, tasks: [{role: w, replicas: 3, request: {cpu: 1}}]}
"""
    assert [j.id for j in parse_jobs(text)] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "id: a\ntasks: [{role: w, replicas: 1, request: {cpu: 2x}}]",
            "jobs[0].tasks[0].request.cpu: '2x' is not a quantity",
        ),
        (
            "id: a\ntasks: [{role: w, replicas: 1, request: {cpu: -1}}]",
            "jobs[0].tasks[0].request.cpu",
        ),
        (
            "id: a\nmin_resources: {memory: lots}\ntasks: [{role: w, request: {cpu: 1}}]",
            "jobs[0].min_resources.memory",
        ),
        ("tasks: [{role: w, request: {cpu: 1}}]", "jobs[0].id: required"),
        ("id: a", "jobs[0].tasks: required"),
        ("id: a\ncolour: red\ntasks: [{role: w}]", "jobs[0].colour: unknown field"),
        ("id: a\ntasks: [{role: w, replica: 2}]", "jobs[0].tasks[0].replica: unknown field"),
        ("id: a\ntasks: [{role: w, command: {run: x}}]", "jobs[0].tasks[0].command"),
        ("id: a\ntasks: [{role: w, replicas: many}]", "jobs[0]"),
        ("- {id: a, tasks: [{role: w}]}\n- {id: a, tasks: [{role: w}]}", "duplicate id 'a'"),
        ("id: [unclosed", "not valid YAML"),
        ("", "no job"),
    ],
)
def test_errors_name_the_field(text, expected):
    with pytest.raises(JobFileError) as err:
        parse_jobs(text)
    assert any(expected in p for p in err.value.problems), err.value.problems


def test_all_problems_are_reported_not_just_the_first():
    with pytest.raises(JobFileError) as err:
        parse_jobs("- {tasks: [{role: w}]}\n- {id: b, tasks: [{role: w, request: {cpu: x}}]}")
    assert len(err.value.problems) == 2
    assert err.value.problems[0].startswith("jobs[0].id")
    assert err.value.problems[1].startswith("jobs[1].tasks[0]")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("job*.yaml")), ids=lambda p: p.name)
def test_examples_parse_and_respect_gang_bounds(path):
    jobs = load_job_file(path)
    assert jobs
    for job in jobs:
        replicas = {g.role: g.replicas for g in job.task_groups}
        assert all(g.replicas > 0 for g in job.task_groups)
        assert job.min_member <= sum(replicas.values())
        for role, minimum in job.min_task_member.items():
            assert role in replicas, (job.id, role)
            assert minimum <= replicas[role], (job.id, role)


def test_round_trip_through_friendly_dict():
    [job] = load_job_file(EXAMPLES / "job-leader-workerset.yaml")
    again = pb.JobSpec()
    from clients.jobfile import job_from_dict

    again.CopyFrom(job_from_dict(job_to_dict(job)))
    assert again == job
