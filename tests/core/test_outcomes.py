"""Job outcomes (server/session/outcomes.py): what a cycle finds about each job -- verdicts that say
why it waits, fit errors found only to explain it, conditions -- and how the report reads them."""

from __future__ import annotations

import pytest
from core_helpers import cycle, job, node, queue, session, snapshot

from server.actions import ACTIONS
from server.model import CycleResult, PodGroupPhase, TaskStatus
from server.session.extension_points import ALLOWED, refuse
from server.session.info import FitErrors
from server.session.outcomes import Outcomes, explain

GANG = """
actions: "enqueue, allocate"
tiers:
- plugins: [{name: gang}]
"""
PROPORTION = """
actions: "enqueue, allocate"
tiers:
- plugins: [{name: gang}, {name: proportion}]
"""


def test_a_condition_set_again_goes_last_and_wins() -> None:
    ssn = session(snapshot([node("n1")], [job("j")]), GANG)
    j = ssn.jobs["ns/j"]
    ssn.outcomes.set_condition(j, "Unschedulable", "A", "first")
    ssn.outcomes.set_condition(j, "Other", "B", "")
    ssn.outcomes.set_condition(j, "Unschedulable", "C", "again")
    assert list(ssn.outcomes.found(j).conditions.items()) == [
        ("Other", ("B", "")),
        ("Unschedulable", ("C", "again")),
    ]


def test_an_admission_forgets_the_enqueue_refusal_and_records_nothing_new() -> None:
    ssn = session(snapshot([node("n1")], [job("j"), job("k", index=1)]), GANG)
    j, k = ssn.jobs["ns/j"], ssn.jobs["ns/k"]
    outcomes = ssn.outcomes
    outcomes.enqueue_answered(j, refuse("p", "queue full"))
    assert outcomes.found(j).enqueue.reason == "queue full"
    outcomes.enqueue_answered(j, ALLOWED)
    assert outcomes.found(j).enqueue.ok
    assert not outcomes.found(j).enqueue.reason
    outcomes.enqueue_answered(k, ALLOWED)  # nothing was found about k: nothing to keep
    assert outcomes.found(k) is Outcomes().found(k)


def test_fit_errors_found_to_explain_keep_the_first_when_asked_and_reach_the_fit_error() -> None:
    ssn = session(snapshot([node("n1")], [job("j")]), GANG)
    j, t = ssn.jobs["ns/j"], ssn.tasks["ns/j-0"]
    ssn.outcomes.fit_errors_found(j, t, FitErrors(message="first"))
    ssn.outcomes.fit_errors_found(j, t, FitErrors(message="second"), keep_first=True)
    assert ssn.outcomes.found(j).fit_errors[t.uid].message == "first"
    ssn.outcomes.fit_errors_found(j, t, FitErrors(message="third"))
    assert ssn.outcomes.fit_error(j).endswith("Origin reason is j-0: third")
    assert "Origin reason" not in j.fit_error()  # the job's own fit errors hold none


def test_the_enqueue_refusal_explains_a_pending_job() -> None:
    snap = snapshot(
        [node("n1", cpu="4")],
        [
            job(
                "big",
                1,
                cpu="1",
                queue="q",
                min_resources={"cpu": "8"},
                phase=PodGroupPhase.PENDING,
            )
        ],
        [queue("q", capability={"cpu": "2"})],
    )
    result = cycle(snap, PROPORTION)
    explanation = result.jobs["ns/big"].explanation
    assert explanation is not None
    assert explanation.gate == "enqueue"
    assert explanation.summary == "queue resource quota insufficient: insufficient cpu"


def test_the_queue_refusal_explains_a_job_that_would_fit_a_node() -> None:
    # q1 deserves half of the 4 cpus: 2 run, a third would go over its share; the node has room.
    snap = snapshot(
        [node("n1", cpu="4")],
        [
            job("run", 2, cpu="1", queue="q1", status=TaskStatus.RUNNING, nodes="n1"),
            job("more", 1, cpu="1", queue="q1", index=1),
            job("other", 1, cpu="3", queue="q2", index=2),
        ],
        [queue("q1"), queue("q2")],
    )
    ssn = session(snap, PROPORTION)
    for action in ssn.config.actions:
        ACTIONS[action](None).execute(ssn)
    more = ssn.jobs["ns/more"]
    verdict = ssn.outcomes.found(more).queue
    assert not verdict
    assert verdict.plugin == "proportion"
    assert explain(ssn, more, more.phase).summary == (
        "queue q1: placing more-0 would exceed the queue's deserved or capability share"
    )


def test_release_leaves_the_result_whole() -> None:
    ssn = session(snapshot([node("n1")], [job("j")]), GANG)
    result = ssn.close()
    ssn.release()
    # What holds the plugins goes (tests/core/test_cycle_memory.py: no garbage left); the
    # session's data stays, its points can no longer be asked.
    assert ssn.plugins == []
    assert ssn.event_handlers == []
    assert not hasattr(ssn, "evaluator")
    with pytest.raises(AttributeError, match="outside its session's chains"):
        ssn.job_ready(ssn.jobs["ns/j"])
    assert result.jobs["ns/j"].explanation is not None


# -- Unsatisfiable: what a job can never have as the cluster and its queues stand -----------------
CAPACITY = """
actions: "enqueue, allocate"
tiers:
- plugins: [{name: gang}, {name: capacity, enableHierarchy: true}]
"""
PREDICATES = """
actions: "enqueue, allocate"
tiers:
- plugins: [{name: gang}, {name: predicates}]
"""
KAI = """
profile: kai
actions: "allocate"
tiers:
- plugins: [{name: proportion}]
"""


def _never(result: CycleResult, uid: str) -> tuple[str, str]:
    """(reason, message) of the job's true Unsatisfiable condition, ("", "") without one; its
    message is the explanation's, whose gate says so."""
    out = result.jobs[uid]
    for c in out.conditions:
        if c.type == "Unsatisfiable" and c.status == "True":
            assert out.explanation is not None
            assert out.explanation.gate == "unsatisfiable"
            assert c.message == out.explanation.summary
            return c.reason, c.message
    return "", ""


def test_the_least_a_gang_holds_at_once_counts_its_minimums_and_what_succeeded() -> None:
    sizes = [
        job("j", 4, cpu="4", min_member=2, roles=["ps", "w", "w", "w"]),
        job(
            "done",
            3,
            cpu="2",
            min_member=2,
            status=[TaskStatus.SUCCEEDED] + [TaskStatus.PENDING] * 2,
        ),
    ]
    sizes[0].tasks[0].request["cpu"] = 8000.0  # the ps asks for more than a worker
    ssn = session(snapshot([node("n1")], sizes), GANG)
    j, done = ssn.jobs["ns/j"], ssn.jobs["ns/done"]
    cpu = ssn.space.index["cpu"]
    need = j.least_at_once(lambda t: t.resreq)
    assert need is not None
    assert need[cpu] == 8000.0
    j.task_min_available = {"ps": 1}
    need = j.least_at_once(lambda t: t.resreq)
    assert need is not None
    assert need[cpu] == 12000.0
    need = done.least_at_once(lambda t: t.resreq)
    assert need is not None
    assert need[cpu] == 2000.0
    done.min_available = 1
    assert done.least_at_once(lambda t: t.resreq) is None  # the succeeded task is enough


def test_a_gang_larger_than_its_queue_capability_is_unsatisfiable_an_elastic_one_is_not() -> None:
    snap = snapshot(
        [node("n1", cpu="8"), node("n2", cpu="8")],
        [
            job("gang", 2, cpu="3", queue="ml"),
            job("elastic", 2, cpu="3", queue="ml", min_member=1, index=1),
        ],
        [queue("ml", capability={"cpu": "4"})],
    )
    result = cycle(snap, PROPORTION)
    assert _never(result, "ns/gang") == (
        "ExceedsQueueCapability",
        "job gang requests cpu 6 for the 2 tasks it needs at once > queue ml capability cpu 4",
    )
    assert _never(result, "ns/elastic") == ("", "")  # one task fits: it runs, and waits for more
    assert list(result.binds) == ["ns/elastic-0"]


def test_capacity_finds_the_ancestor_whose_capability_is_too_small() -> None:
    snap = snapshot(
        [node("n1", cpu="16")],
        [job("train", 1, cpu="6", queue="team")],
        [
            queue("dept", capability={"cpu": "4"}),
            queue("team", {"cpu": "8"}, {"cpu": "8"}, parent="dept"),
        ],
    )
    assert _never(cycle(snap, CAPACITY), "ns/train") == (
        "ExceedsQueueCapability",
        "job train requests cpu 6 > queue dept (above team) capability cpu 4",
    )


def test_kai_a_limit_and_a_non_preemptible_jobs_quota_are_unsatisfiable() -> None:
    snap = snapshot(
        [node("n1", cpu="16", **{"nvidia.com/gpu": "8"})],
        [
            job("big", 1, cpu="6", queue="q"),
            job("pinned", 1, cpu="1", queue="q", index=1, preemptible=False),
        ],
        [queue("q", capability={"cpu": "4"}, guarantee={"nvidia.com/gpu": "1"})],
    )
    snap.jobs[1].tasks[0].request["nvidia.com/gpu"] = 2000.0  # 2 GPUs: over its 1 deserved
    result = cycle(snap, KAI)
    assert _never(result, "ns/big") == (
        "ExceedsQueueCapability",
        "job big requests cpu 6 > queue q limit cpu 4",
    )
    assert _never(result, "ns/pinned") == (
        "ExceedsQueueCapability",
        "job pinned requests nvidia.com/gpu 2 > queue q deserved quota (a non-preemptible job's "
        "bound) nvidia.com/gpu 1",
    )


def test_a_node_selector_no_node_matches_names_the_label() -> None:
    picky = job("picky", 1)
    picky.tasks[0].node_selector["gpu"] = "a100"
    result = cycle(snapshot([node("n1", labels={"gpu": "t4"})], [picky]), PREDICATES)
    reason, message = _never(result, "ns/picky")
    assert reason == "NoMatchingNode"
    assert message == (
        "task picky-0 can never run on this cluster: no node has label gpu=a100 "
        "(0/1 nodes are unavailable: 1 node(s) didn't match Pod's node affinity/selector)"
    )
