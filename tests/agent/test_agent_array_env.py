"""The fake agent hands a bind's environment (an array element's MUSTER_ARRAY_JOB_ID and
MUSTER_ARRAY_INDEX) to the task's process, beneath Muster's own variables."""

from __future__ import annotations

import anyio
from muster_fake_server import bind, eventually, evict
from test_agent_backend import INVENTORY, StatusLog

from adapters.agent.agent import FakeAgent
from adapters.agent.inventory import parse_inventory


async def test_an_array_elements_index_reaches_its_process(tmp_path) -> None:
    agent = FakeAgent("rack", parse_inventory(INVENTORY))
    agent.runtime = StatusLog()  # type: ignore[assignment]
    out = tmp_path / "env"
    async with anyio.create_task_group() as tg:
        agent._tg = tg
        decision = bind(1, "sweep_7/w-0", job="sweep_7")
        decision.bind.env.update(
            {"MUSTER_ARRAY_JOB_ID": "sweep", "MUSTER_ARRAY_INDEX": "7", "MUSTER_JOB_ID": "spoof"}
        )
        decision.bind.command.extend(
            [
                "sh",
                "-c",
                f'echo "$MUSTER_ARRAY_JOB_ID $MUSTER_ARRAY_INDEX $MUSTER_JOB_ID" > {out}; sleep 30',
            ]
        )
        await agent.apply_bind(decision)
        await eventually(lambda: out.exists() and out.read_text().strip() != "")
        assert out.read_text().split() == ["sweep", "7", "sweep_7"]  # Muster's own win
        await agent.apply_evict(evict(2, "sweep_7/w-0", job="sweep_7"))
        tg.cancel_scope.cancel()
