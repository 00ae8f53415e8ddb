"""The extension points plugins register for, and how the session combines their answers.

Every combination rule lives here, next to its declaration, and follows Volcano's
``framework/session_plugins.go``. "Enabled" means the plugin's switch for that point is on
(``PluginOption.enabled``); a plugin that registered no function for a point is skipped.

====================  ==========================================================================
point                 combination rule
====================  ==========================================================================
job_order             compare fns: tiers in order, first plugin with a non-zero answer wins; ties
task_order            fall back to creation order, then uid (task order: priority of the
queue_order           creation index). ``victim_queue_order`` falls back to the reverse queue order.
victim_queue_order
sub_job_order
job_ready             every enabled plugin must answer true (no plugin: true).
allocatable           every enabled plugin must answer true.
preemptive            every enabled plugin must answer true.
predicate             every enabled plugin must pass a node (vectorised masks are ANDed).
node_order            scores of every enabled plugin add up (vectorised arrays are summed).
job_valid             the first plugin (any tier) that fails the job decides; no switch.
job_pipelined         votes: any reject (<0) wins at once; a permit (>0) ends the check at the end
job_enqueueable       of its tier; abstentions everywhere: permit.
job_starving          the first tier that has a function decides: all of that tier's functions
                      must answer true; no function anywhere: false.
overused              any enabled plugin answering true makes the queue overused.
preemptable           per tier, the victim lists of the enabled plugins are intersected (a plugin
reclaimable           that returns no victims empties the result); an abstaining plugin is skipped;
                      the first tier that yields a non-empty list decides.
victim                victim task fns: union within a tier; the first tier with victims decides.
hypernode_gradient    the first enabled plugin with a function answers: the hypernodes a job may be
                      placed in, as gradients (lists tried in order; within one, the best wins).
hypernode_order       hypernode scores of every enabled plugin add up.
job_enqueued          notification: every enabled plugin is called.
allocate/deallocate   event handlers: every plugin's handler is called, in registration order, on
                      every Statement operation and its undo, so plugins keep incremental state.
====================  ==========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Rule(StrEnum):
    FIRST_NON_ZERO = "first non-zero answer in tier order wins"
    ALL_MUST_PASS = "every enabled plugin must pass"
    SCORES_ADD = "scores add up"
    FIRST_FAILURE = "first failing plugin decides"
    VOTE = "any reject wins; a permit ends the check at the end of its tier"
    FIRST_TIER_ALL = "first tier with a function decides; all its functions must agree"
    ANY_TRUE = "any enabled plugin answering true wins"
    INTERSECT_FIRST_TIER = "intersect within a tier; first tier with victims decides"
    UNION_FIRST_TIER = "union within a tier; first tier with victims decides"
    CALL_ALL = "every enabled plugin is called"
    FIRST_ANSWER = "the first enabled plugin with a function answers"


@dataclass(frozen=True)
class Point:
    name: str
    switch: str | None  # PluginOption switch that enables it (None: always on)
    rule: Rule


POINTS: dict[str, Point] = {
    p.name: p
    for p in (
        Point("job_order", "job_order", Rule.FIRST_NON_ZERO),
        Point("task_order", "task_order", Rule.FIRST_NON_ZERO),
        Point("queue_order", "queue_order", Rule.FIRST_NON_ZERO),
        Point("victim_queue_order", None, Rule.FIRST_NON_ZERO),
        Point("sub_job_order", "subjob_order", Rule.FIRST_NON_ZERO),
        Point("job_ready", "job_ready", Rule.ALL_MUST_PASS),
        Point("allocatable", "allocatable", Rule.ALL_MUST_PASS),
        Point("preemptive", "preemptive", Rule.ALL_MUST_PASS),
        Point("predicate", "predicate", Rule.ALL_MUST_PASS),
        Point("node_order", "node_order", Rule.SCORES_ADD),
        Point("job_valid", None, Rule.FIRST_FAILURE),
        Point("job_pipelined", "job_pipelined", Rule.VOTE),
        Point("job_enqueueable", "job_enqueued", Rule.VOTE),
        Point("job_starving", "job_starving", Rule.FIRST_TIER_ALL),
        Point("overused", "overused", Rule.ANY_TRUE),
        Point("preemptable", "preemptable", Rule.INTERSECT_FIRST_TIER),
        Point("reclaimable", "reclaimable", Rule.INTERSECT_FIRST_TIER),
        Point("victim", "victim", Rule.UNION_FIRST_TIER),
        Point("hypernode_gradient", "hypernode_gradient", Rule.FIRST_ANSWER),
        Point("hypernode_order", "hypernode_order", Rule.SCORES_ADD),
        Point("job_enqueued", "job_enqueued", Rule.CALL_ALL),
    )
}

PERMIT = 1
ABSTAIN = 0
REJECT = -1
