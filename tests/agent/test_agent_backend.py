"""FakeAgent as a Backend: inventory parsing, resource accounting, rejects, real processes, evict."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from muster_fake_server import bind, eventually, evict

from adapters.agent.agent import FakeAgent
from adapters.agent.inventory import InventoryError, parse_inventory
from adapters.agent.process import alive as _alive
from adapters.agent.process import read_exit_file as _read_exit_file
from adapters.runtime import Rejected
from muster.v1 import muster_pb2 as pb

INVENTORY = """
nodes:
  - name: n1
    cpu: 4
    memory: 8Gi
    gpus: 2
    labels: {zone: a}
    taints: [{key: dedicated, value: ml, effect: NoSchedule}]
  - name: small
    count: 2
    cpu: 500m
"""


class StatusLog:
    def __init__(self) -> None:
        self.updates: list[tuple[str, int, str, int]] = []

    def report_task_status(self, task_id, status, *, node="", message="", exit_code=0):
        self.updates.append((task_id, status, message, exit_code))

    def statuses(self, task_id):
        return [s for t, s, _, _ in self.updates if t == task_id]


def make_agent(tmp_path=None, **kw) -> tuple[FakeAgent, StatusLog]:
    agent = FakeAgent(
        "rack", parse_inventory(INVENTORY), state_dir=str(tmp_path) if tmp_path else None, **kw
    )
    log = StatusLog()
    agent.runtime = log  # type: ignore[assignment]  # only report_task_status is used
    return agent, log


def test_inventory_parses_nodes_gpus_taints_and_count():
    nodes = {n.name: n for n in parse_inventory(INVENTORY)}
    assert set(nodes) == {"n1", "small-0", "small-1"}
    n1 = nodes["n1"].to_proto("rack")
    assert dict(n1.allocatable.quantities) == {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"}
    assert [d.id for d in n1.devices] == ["0", "1"]
    assert n1.taints[0].effect == "NoSchedule"
    assert nodes["small-1"].allocatable == {"cpu": 500.0}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("nodes: [{name: a, cpu: 4x}]", "nodes[0].cpu"),
        ("nodes: [{name: a}, {cpu: 1}]", "nodes[1].name"),
        ("nodes: [{name: a, gpus: -1}]", "nodes[0].gpus"),
        ("nodes: [{name: a, resources: {pods: lots}}]", "nodes[0].resources.pods"),
        ("nodes: [{name: a, taints: [{key: k, effect: Sometimes}]}]", "nodes[0].taints[0].effect"),
        ("nodes: [{name: a, colour: red}]", "nodes[0].colour"),
        ("nodes: [{name: a}, {name: a}]", "duplicate node name"),
        ("nodes: 3", "nodes"),
    ],
)
def test_inventory_errors_name_the_field(text, field):
    with pytest.raises(InventoryError) as err:
        parse_inventory(text)
    assert field in str(err.value)


async def test_rejects_unknown_node_overcommit_and_duplicate():
    agent, _ = make_agent()
    async with anyio.create_task_group() as tg:
        agent._tg = tg
        with pytest.raises(Rejected, match="unknown node"):
            await agent.apply_bind(bind(1, "j/a-0", node="nowhere"))
        await agent.apply_bind(bind(2, "j/a-0", node="n1", cpu="3", memory="1Gi"))
        with pytest.raises(Rejected, match="already running"):
            await agent.apply_bind(bind(3, "j/a-0", node="n1", cpu="1"))
        # 1 CPU left on n1: a 2-CPU task does not fit whatever the server believes.
        with pytest.raises(Rejected, match=r"insufficient cpu \(requested 2, free 1\)"):
            await agent.apply_bind(bind(4, "j/a-1", node="n1", cpu="2"))
        await agent.apply_bind(bind(5, "j/a-1", node="n1", cpu="1"))
        assert agent.free("n1")["cpu"] == 0
        with pytest.raises(Rejected, match="insufficient"):
            await agent.apply_bind(bind(6, "j/a-2", node="small-0", cpu="1"))
        with pytest.raises(Rejected, match="is not a quantity"):
            await agent.apply_bind(bind(7, "j/a-3", node="n1", cpu="lots"))
        assert set(agent.live) == {"j/a-0", "j/a-1"}
        for task in ("j/a-0", "j/a-1"):
            await agent.apply_evict(evict(10, task, node="n1"))
        assert agent.live == {}
        assert agent.free("n1")["cpu"] == 4000
        tg.cancel_scope.cancel()


async def test_gpu_devices_are_assigned_and_not_shared():
    agent, _ = make_agent()
    async with anyio.create_task_group() as tg:
        agent._tg = tg
        await agent.apply_bind(bind(1, "g/w-0", node="n1", **{"nvidia.com/gpu": "1", "cpu": "1"}))
        await agent.apply_bind(bind(2, "g/w-1", node="n1", **{"nvidia.com/gpu": "1", "cpu": "1"}))
        assert sorted(agent.live["g/w-0"].devices + agent.live["g/w-1"].devices) == ["0", "1"]
        with pytest.raises(Rejected, match="nvidia.com/gpu"):
            await agent.apply_bind(bind(3, "g/w-2", node="n1", **{"nvidia.com/gpu": "1"}))
        tg.cancel_scope.cancel()


async def test_task_runs_as_real_process_and_reports_exit_codes(tmp_path):
    agent, log = make_agent()
    marker = tmp_path / "ran"
    async with anyio.create_task_group() as tg:
        agent._tg = tg
        ok = bind(1, "j/ok-0", node="n1")
        ok.bind.command.extend(["sh", "-c", f'echo "$MUSTER_TASK_ID" > {marker}'])
        bad = bind(2, "j/bad-0", node="n1")
        bad.bind.command.extend(["sh", "-c", "exit 3"])
        await agent.apply_bind(ok)
        await agent.apply_bind(bad)
        await eventually(lambda: not agent.live)
        tg.cancel_scope.cancel()
    assert marker.read_text().strip() == "j/ok-0"
    assert log.statuses("j/ok-0") == [pb.TASK_STATUS_RUNNING, pb.TASK_STATUS_SUCCEEDED]
    assert log.statuses("j/bad-0") == [pb.TASK_STATUS_RUNNING, pb.TASK_STATUS_FAILED]
    assert ("j/bad-0", pb.TASK_STATUS_FAILED, "exit code 3", 3) in log.updates
    # Resources are freed when a task ends.
    assert agent.free("n1")["cpu"] == 4000


async def test_evict_kills_process_group_with_sigkill_fallback(tmp_path):
    agent, log = make_agent(kill_grace=0.3)
    pidfile = tmp_path / "pid"
    async with anyio.create_task_group() as tg:
        agent._tg = tg
        d = bind(1, "j/stubborn-0", node="n1")
        # Ignores SIGTERM: only the SIGKILL fallback ends it.
        d.bind.command.extend(
            ["sh", "-c", f"trap '' TERM; echo $$ > {pidfile}; while true; do sleep 0.05; done"]
        )
        await agent.apply_bind(d)
        await eventually(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
        pid = int(pidfile.read_text())
        outcome = await agent.apply_evict(evict(2, "j/stubborn-0", node="n1"))
        assert outcome.applied
        assert "SIGKILL" in outcome.reason
        assert not _alive(pid, 0)
        tg.cancel_scope.cancel()
    # No Failed report after an eviction: the ack is the report.
    assert log.statuses("j/stubborn-0") == [pb.TASK_STATUS_RUNNING]
    assert "j/stubborn-0" not in agent.live


async def test_evict_of_unknown_task_is_applied_noop():
    agent, _ = make_agent()
    outcome = await agent.apply_evict(evict(1, "nope", node="n1"))
    assert outcome.applied
    assert "not running" in outcome.reason


async def test_state_dir_adopts_running_task_and_reports_ended_one(tmp_path):
    state = tmp_path / "state"
    agent, _ = make_agent(state)
    async with anyio.create_task_group() as tg:
        agent._tg = tg
        long = bind(1, "j/long-0", node="n1", cpu="2")
        long.bind.duration_seconds = 30
        short = bind(2, "j/short-0", node="n1", cpu="1")
        # The short task waits for a gate the test opens only after the agent is gone: its
        # watcher must not see it end first (a fast 'exit 0' raced the cancel on a busy host).
        gate = tmp_path / "gate"
        short.bind.command.extend(
            ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done; exit 0"]
        )
        await agent.apply_bind(long)
        await agent.apply_bind(short)
        # The "agent dies" before it notices the short task ended.
        tg.cancel_scope.cancel()
    assert "j/short-0" in agent.live
    gate.touch()
    long_pid = agent.live["j/long-0"].pid
    await eventually(lambda: not _alive(agent.live["j/short-0"].pid, 0))

    again, log = make_agent(state)
    running, gone = again._adopt()
    try:
        assert [t.task_id for t in running] == ["j/long-0"]
        assert [t.task_id for t in gone] == ["j/short-0"]
        # The adopted task still holds its resources: no over-commit after a restart.
        assert again.free("n1")["cpu"] == 1000
        snapshot = await again.list_tasks()
        assert any(t.task_id == "j/long-0" and t.status == pb.TASK_STATUS_RUNNING for t in snapshot)
        assert _read_exit_file(gone[0].exit_file) == 0
        again._finish(gone[0], 0)
        assert log.statuses("j/short-0") == [pb.TASK_STATUS_SUCCEEDED]
    finally:
        os.killpg(long_pid, 9)
    assert Path(state / "tasks.json").exists()


ASCEND_INVENTORY = """
nodes:
  - name: npu
    cpu: 64
    resources: {huawei.com/Ascend910: 8}
  - name: listed
    cpu: 64
    devices:
      - {id: Ascend910-0, type: huawei.com/Ascend910, group: "0", healthy: false}
      - {id: Ascend910-1, type: huawei.com/Ascend910, group: "0"}
"""


def test_inventory_devices_made_up_or_listed_with_health():
    nodes = {n.name: n.to_proto("rack") for n in parse_inventory(ASCEND_INVENTORY)}
    npu = nodes["npu"]
    assert [(d.id, d.group, d.healthy) for d in npu.devices] == [
        (f"Ascend910-{i}", str(i // 4), True) for i in range(8)
    ]
    listed = nodes["listed"]
    assert (
        dict(listed.allocatable.quantities)["huawei.com/Ascend910"] == "2"
    )  # the list is what the node has
    assert [(d.id, d.healthy) for d in listed.devices] == [
        ("Ascend910-0", False),
        ("Ascend910-1", True),
    ]
    with pytest.raises(InventoryError, match=r"nodes\[0\].devices\[0\].type"):
        parse_inventory("nodes: [{name: a, devices: [{id: x, type: cpu}]}]")


async def test_ascend_chips_reach_the_task_and_a_bind_on_taken_or_broken_chips_is_refused(tmp_path):
    agent = FakeAgent("rack", parse_inventory(ASCEND_INVENTORY))
    agent.runtime = StatusLog()  # type: ignore[assignment]
    out = tmp_path / "env"
    async with anyio.create_task_group() as tg:
        agent._tg = tg
        first = bind(1, "a/w-0", node="npu", **{"huawei.com/Ascend910": "2", "cpu": "1"})
        first.bind.devices.extend(["Ascend910-4", "Ascend910-5"])
        first.bind.command.extend(
            ["sh", "-c", f'echo "$ASCEND_VISIBLE_DEVICES $MUSTER_DEVICES" > {out}; sleep 30']
        )
        await agent.apply_bind(first)
        await eventually(lambda: out.exists() and out.read_text().strip() != "")
        assert out.read_text().split() == ["4,5", "Ascend910-4,Ascend910-5"]
        taken = bind(2, "b/w-0", node="npu", **{"huawei.com/Ascend910": "1", "cpu": "1"})
        taken.bind.devices.append("Ascend910-5")
        with pytest.raises(Rejected, match=r"devices \['Ascend910-5'\] are not free"):
            await agent.apply_bind(taken)
        broken = bind(3, "c/w-0", node="listed", **{"huawei.com/Ascend910": "1", "cpu": "1"})
        broken.bind.devices.append("Ascend910-0")
        with pytest.raises(Rejected, match="not free"):
            await agent.apply_bind(broken)
        # No ids from the server: the lowest free ones of the resource, never a broken one.
        await agent.apply_bind(
            bind(4, "d/w-0", node="listed", **{"huawei.com/Ascend910": "1", "cpu": "1"})
        )
        assert agent.live["d/w-0"].devices == ["Ascend910-1"]
        for task, node in (("a/w-0", "npu"), ("d/w-0", "listed")):
            await agent.apply_evict(evict(10, task, node=node))
        tg.cancel_scope.cancel()


async def test_a_burst_of_binds_starts_without_over_committing(tmp_path):
    """apply_batch checks binds in order (each reserving its share before any process starts),
    starts them, applies an evict in its place in the burst, and saves the state twice: the
    intent before any process starts, the started pids after. (One job per bind here: a job's
    binds in a burst are all or none, tests/agent/test_agent_crash.py.)"""
    agent, _ = make_agent(tmp_path)
    saves = 0
    save = agent._save

    def counting_save() -> None:
        nonlocal saves
        saves += 1
        save()

    def long(decision: pb.Decision) -> pb.Decision:
        decision.bind.duration_seconds = 300
        return decision

    agent._save = counting_save  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        agent._tg = tg
        burst = [
            long(bind(i, f"j/a-{i}", node="n1", job=f"j{i}", cpu="1", **{"nvidia.com/gpu": "1"}))
            for i in range(3)
        ]
        burst += [
            long(
                bind(3, "j/a-0", node="n1", job="dup", cpu="1")
            ),  # the same task twice in one burst
            long(bind(4, "k/b-0", node="n1", job="k0", cpu="1")),
            long(bind(5, "k/b-1", node="n1", job="k1", cpu="2")),
        ]  # n1 has 4 CPUs, 3 are taken by then
        outcomes = await agent.apply_batch(burst)
        assert [o.applied for o in outcomes] == [True, True, False, False, True, False]
        assert "nvidia.com/gpu" in outcomes[2].reason
        assert "already" in outcomes[3].reason
        assert "insufficient cpu" in outcomes[5].reason
        assert sorted(agent.live) == ["j/a-0", "j/a-1", "k/b-0"]
        assert sorted(agent.live["j/a-0"].devices + agent.live["j/a-1"].devices) == ["0", "1"]
        assert agent.free("n1")["cpu"] == 1000
        assert not agent._starting
        assert saves == 2
        # An evict between binds frees its share for the binds after it.
        outcomes = await agent.apply_batch(
            [
                long(bind(6, "k/b-2", node="n1", job="k2", cpu="2")),
                evict(7, "k/b-0", node="n1", job="k0"),
                long(bind(8, "k/b-3", node="n1", job="k3", cpu="2")),
            ]
        )
        assert [o.applied for o in outcomes] == [False, True, True]
        assert sorted(agent.live) == ["j/a-0", "j/a-1", "k/b-3"]
        for task in list(agent.live):
            await agent.apply_evict(evict(20, task, node="n1"))
        tg.cancel_scope.cancel()
