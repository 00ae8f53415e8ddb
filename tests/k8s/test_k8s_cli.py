"""The console script end to end: a subprocess adapter binds a pod and stops cleanly on SIGTERM,
releasing its leader lease; of two adapters only one runs, and SIGTERM hands over at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys

from .conftest import eventually
from .fake_apiserver import FakeApiServer, make_node, make_pod
from .mini_muster import MiniMusterHandle


async def test_cli_adapter_binds_and_exits_cleanly_on_sigterm() -> None:
    kube = FakeApiServer()
    await kube.start()
    muster = MiniMusterHandle()
    await muster.start()
    kube.put_object(make_node("n0", cpu="2"))
    kube.put_object(make_pod("p", cpu="1"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "adapters.k8s.main",
        "--api-server",
        kube.url,
        "--server",
        muster.address,
        "--log-format",
        "json",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await eventually(
            lambda: (
                (kube.get_object("v1", "Pod", "p", "default") or {}).get("spec", {}).get("nodeName")
                == "n0"
            ),
            timeout=30,
        )
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 0, stderr.decode()[-2000:]
        assert b'"stopping"' in stderr
        assert b'"leader election: acquired"' in stderr
        assert b'"leader election: released"' in stderr
        # Leader election is on by default: outside a pod the Lease is in muster-system (the
        # deployed adapters'), and a clean stop leaves it without a holder.
        lease = kube.get_object(
            "coordination.k8s.io/v1", "Lease", "muster-k8s-adapter-kubernetes", "muster-system"
        )
        assert lease is not None
        assert "holderIdentity" not in lease["spec"]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await muster.stop()
        await kube.stop()


class Adapter:
    """A subprocess adapter whose JSON log lines are collected as they come."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.events: list[str] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for line in self.proc.stderr:
            with contextlib.suppress(ValueError, KeyError):
                self.events.append(json.loads(line)["event"])


async def start_adapter(kube: FakeApiServer, muster: MiniMusterHandle, name: str) -> Adapter:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "adapters.k8s.main",
        "--api-server",
        kube.url,
        "--server",
        muster.address,
        "--log-format",
        "json",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "POD_NAME": name},
    )
    return Adapter(proc)


async def test_two_cli_adapters_one_runs_and_sigterm_hands_over_at_once() -> None:
    kube = FakeApiServer()
    await kube.start()
    muster = MiniMusterHandle()
    await muster.start()
    kube.put_object(make_node("n0", cpu="2"))
    kube.put_object(make_pod("p", cpu="1"))
    adapters: list[Adapter] = []

    def holder() -> str:
        lease = kube.get_object(
            "coordination.k8s.io/v1", "Lease", "muster-k8s-adapter-kubernetes", "muster-system"
        )
        return str((lease or {}).get("spec", {}).get("holderIdentity") or "")

    try:
        adapters.append(await start_adapter(kube, muster, "adapter-a"))
        await eventually(lambda: holder().startswith("adapter-a_"), timeout=30)
        adapters.append(await start_adapter(kube, muster, "adapter-b"))
        a, b = adapters
        await eventually(
            lambda: (
                (kube.get_object("v1", "Pod", "p", "default") or {}).get("spec", {}).get("nodeName")
                == "n0"
            ),
            timeout=30,
        )
        await eventually(lambda: "leader election: campaigning" in b.events, timeout=30)
        await asyncio.sleep(1.0)
        assert "starting" in a.events
        assert "starting" not in b.events
        a.proc.send_signal(signal.SIGTERM)
        stopped = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(a.proc.wait(), 20) == 0
        # The default lease lasts 15 s; a released one is taken at b's next try (2 s apart).
        await eventually(lambda: holder().startswith("adapter-b_"), timeout=10)
        assert asyncio.get_running_loop().time() - stopped < 6.0
        await eventually(lambda: "starting" in b.events, timeout=10)
    finally:
        for adapter in adapters:
            if adapter.proc.returncode is None:
                adapter.proc.kill()
                await adapter.proc.wait()
            adapter.reader.cancel()
        await muster.stop()
        await kube.stop()
