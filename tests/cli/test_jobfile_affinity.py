"""Job files: a key of an affinity that is no field (a typo, or Kubernetes' long name) is refused
with its path and the fields that exist, at any depth."""

from __future__ import annotations

import pytest

from clients.jobfile import JobFileError, parse_jobs


def _job(affinity: str) -> str:
    return (
        f"id: j\ntasks:\n- role: w\n  replicas: 1\n  request: {{cpu: 1}}\n  affinity: {affinity}\n"
    )


@pytest.mark.parametrize(
    ("affinity", "problem"),
    [
        (
            "{node_affinity: {requird: [{match_expressions: [{key: a, operator: In, values: [b]}]}]}}",
            "jobs[0].tasks[0].affinity.node_affinity.requird: unknown field "
            "(known: required, preferred)",
        ),
        (
            "{nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: []}}}",
            "jobs[0].tasks[0].affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution: "
            "unknown field (known: required, preferred); Kubernetes' "
            "requiredDuringSchedulingIgnoredDuringExecution is written required here",
        ),
        (
            "{node_affinity: {required: [{match_expressions: [{key: a, operator: In, valuez: [b]}]}]}}",
            "jobs[0].tasks[0].affinity.node_affinity.required[0].match_expressions[0].valuez: "
            "unknown field (known: key, operator, values)",
        ),
        (
            "{pod_anti_affinity: {preferred: [{weight: 5, podAffinityTerm: {topology_key: x}}]}}",
            "jobs[0].tasks[0].affinity.pod_anti_affinity.preferred[0].podAffinityTerm: unknown "
            "field (known: weight, term); Kubernetes' podAffinityTerm is written term here",
        ),
    ],
    ids=["typo", "kubernetes name", "deep typo", "kubernetes term"],
)
def test_unknown_affinity_field_is_named(affinity: str, problem: str) -> None:
    with pytest.raises(JobFileError) as err:
        parse_jobs(_job(affinity))
    assert err.value.problems == [problem]


def test_known_fields_in_either_spelling_still_parse() -> None:
    [job] = parse_jobs(
        _job(
            "{podAntiAffinity: {preferred: [{weight: 5, term: {topologyKey: x, "
            "label_selector: {matchLabels: {a: b}}}}]}}"
        )
    )
    term = job.task_groups[0].affinity.pod_anti_affinity.preferred[0].term
    assert (term.topology_key, dict(term.label_selector.match_labels)) == ("x", {"a": "b"})
