"""The console script end to end: a subprocess adapter binds a pod and stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
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
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await muster.stop()
        await kube.stop()
