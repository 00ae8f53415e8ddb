"""Fixtures: a fake API server, a small Muster server and the real adapter between them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from adapters.k8s.adapter import K8sBackend
from adapters.k8s.kube import make_api_client
from server.service.app import ServerOptions, start_server

from .fake_apiserver import FakeApiServer
from .mini_muster import MiniMusterHandle

FAST_RUNTIME = {
    "backoff_initial": 0.05,
    "backoff_max": 0.3,
    "batch_linger": 0.02,
    "flush_interval": 0.01,
}


async def eventually(
    predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.02
) -> None:
    """Poll until true; the timeout is a bound against hangs, never the verdict of a test."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


@dataclass
class Env:
    kube: FakeApiServer
    muster: MiniMusterHandle
    adapters: list[tuple[K8sBackend, asyncio.Task[None]]] = field(default_factory=list)

    async def start_adapter(self, **kwargs) -> K8sBackend:
        api = await make_api_client(host=self.kube.url)
        backend = K8sBackend(
            api,
            server=self.muster.address,
            runtime_options=FAST_RUNTIME,
            evict_backoff=0.01,
            watch_timeout=30,
            **kwargs,
        )
        task = asyncio.create_task(backend.run())
        backend._api = api  # type: ignore[attr-defined]
        self.adapters.append((backend, task))
        await eventually(lambda: backend.ready.is_set() and backend.runtime.connected)
        return backend

    async def stop_adapter(self, backend: K8sBackend) -> None:
        for i, (b, task) in enumerate(self.adapters):
            if b is backend:
                b.stop()
                await asyncio.wait_for(task, 10)
                await b._api.close()  # type: ignore[attr-defined]
                del self.adapters[i]
                return

    def bind_posts(self, pod: str | None = None) -> int:
        return sum(
            1
            for m, p in self.kube.requests
            if m == "POST" and p.endswith("/binding") and (pod is None or f"/pods/{pod}/" in p)
        )

    def pod(self, name: str, namespace: str = "default") -> dict:
        obj = self.kube.get_object("v1", "Pod", name, namespace)
        assert obj is not None, f"pod {name} missing"
        return obj

    def events(self, reason: str, pod: str | None = None) -> list[dict]:
        return [
            e
            for e in self.kube.list_objects("v1", "Event")
            if e.get("reason") == reason and (pod is None or e["involvedObject"]["name"] == pod)
        ]


class RealMusterHandle:
    """The real Muster server (``server.service.app``), looking like MiniMusterHandle to the Env helpers."""

    def __init__(self, state: str, config_path: str | None = None) -> None:
        self.state = state
        self.config_path = config_path
        self.handle = None
        self.port = 0

    async def start(self) -> None:
        listen = f"127.0.0.1:{self.port}"
        self.handle = await start_server(
            ServerOptions(
                listen=listen, state=self.state, cycle_period=0.1, config_path=self.config_path
            )
        )
        self.port = self.handle.port

    async def stop(self) -> None:
        if self.handle is not None:
            await self.handle.stop()
            self.handle = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@asynccontextmanager
async def open_env(muster: MiniMusterHandle) -> AsyncIterator[Env]:
    """A fake API server and ``muster`` (started here); on exit the adapters stop, then Muster,
    then the API server."""
    kube = FakeApiServer(bookmark_interval=0.2)
    await kube.start()
    await muster.start()
    env = Env(kube, muster)
    try:
        yield env
    finally:
        for backend, task in list(env.adapters):
            backend.stop()
            try:
                await asyncio.wait_for(task, 10)
            except Exception:  # noqa: BLE001 - teardown
                task.cancel()
            await backend._api.close()  # type: ignore[attr-defined]
        await env.muster.stop()
        await env.kube.stop()


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with open_env(MiniMusterHandle()) as e:
        yield e
