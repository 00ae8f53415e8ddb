"""KAI GPU sharing in the fake agent: a bind's shared GPU (``gpu_group``, or, from a server before
that field, the one entry of ``devices``) is shared up to one GPU, reaches the task and is reported
back as ``gpu_group``; a state dir written before the field is adopted with the shared GPU."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import anyio
import pytest
from muster_fake_server import bind, eventually, evict

from adapters.agent.agent import FakeAgent
from adapters.agent.inventory import parse_inventory
from adapters.children import ChildProcess
from adapters.runtime import Rejected
from muster.v1 import muster_pb2 as pb

INVENTORY = """
nodes:
  - name: n1
    cpu: 8
    memory: 8Gi
    gpus: 2
"""


def share(decision_id: int, task: str, fraction: float, gpu: str = "", *, old: bool = False):
    """A fractional bind naming ``gpu`` as today's server does, or (``old``) as one before."""
    decision = bind(decision_id, task, node="n1", cpu="1")
    decision.bind.duration_seconds = 30  # held until evicted: a share that ended frees its GPU
    decision.bind.gpu_fraction = fraction
    if old:
        decision.bind.devices.append(gpu)
    else:
        decision.bind.gpu_group = gpu
    return decision


def make_agent(state_dir: Path | None = None) -> FakeAgent:
    agent = FakeAgent(
        "rack", parse_inventory(INVENTORY), state_dir=str(state_dir) if state_dir else None
    )

    class Quiet:
        def report_task_status(self, *args: object, **kwargs: object) -> None:
            pass

    agent.runtime = Quiet()  # type: ignore[assignment]  # only report_task_status is used
    return agent


async def test_shares_in_either_encoding_fill_one_gpu_and_reach_the_task(tmp_path: Path) -> None:
    agent = make_agent()
    out = tmp_path / "env"
    async with anyio.create_task_group() as tg:
        agent._tg = tg
        first = share(1, "a/w-0", 0.5, "1")
        first.bind.command.extend(
            ["sh", "-c", f'echo "$CUDA_VISIBLE_DEVICES $MUSTER_DEVICES" > {out}; sleep 30']
        )
        await agent.apply_bind(first)
        await agent.apply_bind(share(2, "b/w-0", 0.5, "1", old=True))
        for task in ("a/w-0", "b/w-0"):
            live = agent.live[task]
            assert (live.gpu_group, live.devices) == ("1", [])
        assert agent.gpu_shares("n1") == {"1": 1.0}
        await eventually(lambda: out.exists() and out.read_text().strip() != "")
        assert out.read_text().split() == ["1", "1"]  # the shared GPU is the task's to see
        reported = {t.task_id: (t.gpu_group, list(t.devices)) for t in await agent.list_tasks()}
        assert reported == {"a/w-0": ("1", []), "b/w-0": ("1", [])}
        with pytest.raises(Rejected, match="GPU 1 on node n1 has 0 left"):
            await agent.apply_bind(share(3, "c/w-0", 0.25, "1"))
        whole = bind(4, "d/w-0", node="n1", **{"nvidia.com/gpu": "1", "cpu": "1"})
        whole.bind.devices.append("1")
        with pytest.raises(Rejected, match=r"devices \['1'\] are not free"):
            await agent.apply_bind(whole)
        # A share without a GPU named (an older server still) goes to a free GPU.
        await agent.apply_bind(share(5, "e/w-0", 0.25))
        assert agent.live["e/w-0"].gpu_group == "0"
        with pytest.raises(Rejected, match="a fractional task shares one GPU"):
            await agent.apply_bind(_two(6))
        for i, task in enumerate(("a/w-0", "b/w-0", "e/w-0")):
            await agent.apply_evict(evict(10 + i, task))
        tg.cancel_scope.cancel()


def _two(decision_id: int) -> pb.Decision:
    """An old-style share naming two GPUs: never one shared GPU."""
    decision = share(decision_id, "f/w-0", 0.25, "0", old=True)
    decision.bind.devices.append("1")
    return decision


async def test_a_state_dir_written_before_gpu_group_is_adopted_sharing_its_gpu(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    (state / "tasks").mkdir(parents=True)
    sleeper = ChildProcess.start(["sleep", "30"], start_new_session=True)
    try:
        ticks = int(Path(f"/proc/{sleeper.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        old_task = {
            "task_id": "j/half-0",
            "job_id": "j",
            "node": "n1",
            "request": {"cpu": 1000.0},
            "devices": ["0"],  # the shared GPU, as agents before gpu_group recorded it
            "decision_id": 1,
            "pid": sleeper.pid,
            "start_ticks": ticks,
            "exit_file": str(state / "tasks" / "j_half-0.exit"),
            "evicted": False,
            "gpu_fraction": 0.5,
            "cycle_id": 1,
            "argv": ["sleep", "30"],
            "log_file": str(state / "tasks" / "j_half-0.log"),
        }
        (state / "tasks.json").write_text(json.dumps({"version": 2, "live": [old_task]}))
        agent = make_agent(state)
        running, gone = agent._adopt()
        assert [t.task_id for t in running] == ["j/half-0"]
        assert gone == []
        assert (running[0].gpu_group, running[0].devices) == ("0", [])
        assert agent.gpu_shares("n1") == {"0": 0.5}
        assert [d.id for d in agent.free_devices("n1")] == ["1"]
        (reported,) = await agent.list_tasks()
        assert (reported.gpu_group, list(reported.devices)) == ("0", [])
    finally:
        os.killpg(sleeper.pid, signal.SIGKILL)
        await sleeper.wait()
