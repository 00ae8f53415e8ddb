"""Child processes waited for from an event loop (adapters/children.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import anyio
import pytest

from adapters.children import ChildProcess, has_pidfd


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polling"])
async def test_wait_gives_the_exit_status_or_the_signal(pidfd: bool) -> None:
    if pidfd and not has_pidfd():
        pytest.skip("this host has no pidfd")
    ok = ChildProcess(subprocess.Popen(["sh", "-c", "sleep 0.2; exit 3"]), pidfd=pidfd)
    killed = ChildProcess(subprocess.Popen(["sleep", "30"]), pidfd=pidfd)
    os.kill(killed.pid, signal.SIGTERM)
    with anyio.fail_after(10):
        assert await ok.wait() == 3
        assert await killed.wait() == -signal.SIGTERM
        assert await ok.wait() == 3  # asked again: the same answer


def test_a_child_outlives_its_loop_and_object() -> None:
    # The agent's detached tasks must survive the agent: an asyncio child process would be killed
    # once its transport is collected after the loop closes.
    script = (
        "import anyio, gc, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from adapters.children import ChildProcess\n"
        "async def main():\n"
        "    p = ChildProcess.start(['sleep', '30'], start_new_session=True, stdout=-3, stderr=-3)\n"
        "    print(p.pid, flush=True)\n"
        "    async with anyio.create_task_group() as tg:\n"  # a waiter cancelled, as at the agent's stop
        "        tg.start_soon(p.wait)\n"
        "        await anyio.sleep(0.1)\n"
        "        tg.cancel_scope.cancel()\n"
        "anyio.run(main)\n"
        "gc.collect()\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        [sys.executable, "-c", script, root], capture_output=True, text=True, timeout=60, check=True
    )
    pid = int(out.stdout.split()[0])
    try:
        time.sleep(0.2)
        os.kill(pid, 0)  # raises if the child is gone
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
