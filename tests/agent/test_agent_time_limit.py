"""The agent ends a task at its time limit (the bind's time_limit_seconds, counted from the task's
start): its process group is killed and it is reported Failed with the TimeLimit reason."""

from __future__ import annotations

import os
import time

import anyio
from muster_fake_server import bind, eventually
from test_agent_backend import make_agent

from adapters.agent.process import alive
from muster.v1 import muster_pb2 as pb

TIME_LIMIT_1S = "TimeLimit: time limit 1s reached"


def timed_bind(decision_id: int, task: str, argv: list[str], limit: int = 1) -> pb.Decision:
    d = bind(decision_id, task, node="n1")
    d.bind.command.extend(argv)
    d.bind.time_limit_seconds = limit
    return d


async def test_sleep_30_ends_at_a_1s_limit_with_the_time_limit_reason(tmp_path):
    agent, log = make_agent()
    pidfile = tmp_path / "pid"
    async with anyio.create_task_group() as tg:
        agent._tg = tg
        # The shell's child (sleep) is in the task's process group: it must go too.
        await agent.apply_bind(
            timed_bind(1, "j/slow-0", ["sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"])
        )
        await agent.apply_bind(timed_bind(2, "j/quick-0", ["true"], limit=60))
        started = agent.live["j/slow-0"].started_at
        await eventually(lambda: "j/slow-0" not in agent.live)
        tg.cancel_scope.cancel()
    assert time.time() - started >= 1.0  # not before its limit
    assert log.statuses("j/slow-0") == [pb.TASK_STATUS_RUNNING, pb.TASK_STATUS_FAILED]
    [(_, _, message, code)] = [u for u in log.updates if u[0] == "j/slow-0" and u[1] == 9]
    assert message == TIME_LIMIT_1S
    assert code == -15
    assert not alive(int(pidfile.read_text()), 0)  # the whole group, the sleep included
    # A task that ends before its limit is not touched.
    assert log.statuses("j/quick-0") == [pb.TASK_STATUS_RUNNING, pb.TASK_STATUS_SUCCEEDED]
    assert agent.free("n1")["cpu"] == 4000


async def test_a_task_ignoring_sigterm_is_killed_and_still_reported_time_limit(tmp_path):
    agent, log = make_agent(kill_grace=0.3)
    async with anyio.create_task_group() as tg:
        agent._tg = tg
        await agent.apply_bind(
            timed_bind(
                1, "j/stubborn-0", ["sh", "-c", "trap '' TERM; while true; do sleep 0.05; done"]
            )
        )
        await eventually(lambda: "j/stubborn-0" not in agent.live)
        tg.cancel_scope.cancel()
    [(_, _, message, code)] = [u for u in log.updates if u[1] == pb.TASK_STATUS_FAILED]
    assert message == TIME_LIMIT_1S
    assert code == -9


async def test_the_limit_counts_from_the_first_start_across_an_agent_restart(tmp_path):
    state = tmp_path / "state"
    agent, _ = make_agent(state)
    async with anyio.create_task_group() as tg:
        agent._tg = tg
        await agent.apply_bind(timed_bind(1, "j/long-0", ["sleep", "30"], limit=2))
        tg.cancel_scope.cancel()  # the agent "dies"; the task runs on (state dir)
    first = agent.live["j/long-0"]
    pid, started = first.pid, first.started_at
    again, log = make_agent(state)
    running, _ = again._adopt()
    try:
        [task] = running
        assert (task.time_limit, task.started_at) == (2, started)  # recorded in tasks.json
        async with anyio.create_task_group() as tg:
            again._tg = tg
            tg.start_soon(again._watch_adopted, task)
            tg.start_soon(again._enforce_time_limit, task)
            await eventually(lambda: "j/long-0" not in again.live)
            tg.cancel_scope.cancel()
        assert time.time() - started >= 2.0
        assert log.updates[-1][:3] == (
            "j/long-0",
            pb.TASK_STATUS_FAILED,
            "TimeLimit: time limit 2s reached",
        )
        assert not alive(pid, 0)
    finally:
        if alive(pid, 0):
            os.killpg(pid, 9)
