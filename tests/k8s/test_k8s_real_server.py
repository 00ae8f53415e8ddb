"""The adapter against the real Muster server (server/service/app.py, in-process) and the fake API server."""

from __future__ import annotations

import pytest

from .conftest import Env, RealMusterHandle, eventually, open_env
from .fake_apiserver import make_node, make_pod, make_volcano_podgroup


@pytest.fixture
async def real_env(tmp_path):
    async with open_env(RealMusterHandle(str(tmp_path / "muster.db"))) as env:  # type: ignore[arg-type]
        yield env


def _pg(env: Env, name: str = "pg") -> dict:
    return env.kube.get_object("scheduling.volcano.sh/v1beta1", "PodGroup", name, "default") or {}


async def test_gang_of_four_with_the_real_server(real_env: Env) -> None:
    env = real_env
    for i in range(3):
        env.kube.put_object(make_node(f"n{i}", cpu="4"))
    env.kube.put_object(make_volcano_podgroup("pg", min_member=4))
    for i in range(4):
        env.kube.put_object(make_pod(f"w{i}", cpu="3", group="pg", task_spec="worker"))
    await env.start_adapter()
    await eventually(lambda: all(env.events("FailedScheduling", f"w{i}") for i in range(4)))
    await eventually(
        lambda: (
            (_pg(env).get("status", {}).get("conditions") or [{}])[0].get("type") == "Unschedulable"
        )
    )
    assert env.bind_posts() == 0

    env.kube.put_object(make_node("n3", cpu="4"))
    await eventually(lambda: all(env.pod(f"w{i}")["spec"].get("nodeName") for i in range(4)))
    assert {env.pod(f"w{i}")["spec"]["nodeName"] for i in range(4)} == {"n0", "n1", "n2", "n3"}
    await eventually(lambda: _pg(env)["status"]["phase"] == "Running")
    assert env.bind_posts() == 4


async def test_real_server_restart_adapter_reconnects(real_env: Env) -> None:
    env = real_env
    env.kube.put_object(make_node("n0", cpu="8"))
    env.kube.put_object(make_pod("before", cpu="1"))
    backend = await env.start_adapter()
    await eventually(lambda: env.pod("before")["spec"].get("nodeName") == "n0")
    await env.muster.stop()
    env.kube.put_object(make_pod("during", cpu="1"))
    await eventually(lambda: not backend.runtime.connected)
    await env.muster.start()  # same port, same SQLite state
    await eventually(lambda: backend.runtime.sessions >= 2)
    await eventually(lambda: env.pod("during")["spec"].get("nodeName") == "n0")
    assert env.bind_posts("before") == 1
