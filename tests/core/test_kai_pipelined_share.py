"""KAI: a gang pipelined whole after one task could only be pipelined keeps its queue's share
right. KAI unallocates each task it had allocated and pipelines it again on its node, so the
event handlers (proportion's queue shares) see the task go and come back: it counts once."""

from __future__ import annotations

from pathlib import Path

from core_helpers import job, node, session, snapshot

from server.actions.kai.allocate import KaiAllocateAction
from server.model import TaskStatus
from server.plugins.kai.proportion import KaiProportionPlugin

KAI_CONFIG = (Path(__file__).resolve().parents[2] / "examples" / "config-kai.yaml").read_text()


def test_a_job_pipelined_whole_counts_each_task_once_in_its_queue() -> None:
    # n0: 4 cpu, 2 of them held by a task being released. The gang's first task fits the idle 2,
    # the second only the 2 being released: the whole gang is pipelined.
    leaving = job(
        "leaving", 1, "2", status=TaskStatus.RELEASING, nodes="n0", queue="other", index=0
    )
    gang = job("gang", 2, "2", index=1)
    ssn = session(snapshot([node("n0", cpu="4", memory="64Gi")], [leaving, gang]), KAI_CONFIG)
    (proportion,) = [p for p in ssn.plugins if isinstance(p, KaiProportionPlugin)]
    before = proportion.queues["default"].by_resource["cpu"].allocated
    KaiAllocateAction({}).execute(ssn)
    statuses = sorted(t.status for t in ssn.jobs[gang.uid].tasks.values())
    assert statuses == [TaskStatus.PIPELINED, TaskStatus.PIPELINED]
    # Two tasks of 2 cpu each (in millicores): 4 cpu more, not 6 (the first one counted twice).
    added = proportion.queues["default"].by_resource["cpu"].allocated - before
    assert added == 4000.0
