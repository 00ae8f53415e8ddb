"""Job outcomes (server/session/outcomes.py): what a cycle finds about each job -- verdicts that say
why it waits, fit errors found only to explain it, conditions -- and how the report reads them."""

from __future__ import annotations

from core_helpers import cycle, job, node, queue, session, snapshot

from server.actions import ACTIONS
from server.model import PodGroupPhase, TaskStatus
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
    assert outcomes.found(j).enqueue.ok and not outcomes.found(j).enqueue.reason
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
    assert explanation is not None and explanation.gate == "enqueue"
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
    assert not verdict and verdict.plugin == "proportion"
    assert explain(ssn, more, more.phase).summary == (
        "queue q1: placing more-0 would exceed the queue's deserved or capability share"
    )


def test_release_leaves_the_result_whole() -> None:
    ssn = session(snapshot([node("n1")], [job("j")]), GANG)
    result = ssn.close()
    ssn.release()
    assert not vars(ssn)  # everything goes (tests/core/test_cycle_memory.py: no garbage left)
    assert result.jobs["ns/j"].explanation is not None
