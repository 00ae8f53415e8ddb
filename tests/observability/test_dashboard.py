"""The web dashboard: off by default, the page and its JSON from a running server (queues with
shares, nodes with utilisation, jobs with reasons, cycles with per-action timings), the API's tokens,
no plain HTTP off loopback, and the page drawn in a real headless browser when chromium is here."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import anyio
import grpc
import pytest

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service.app import ServerHandle, ServerOptions, start_server
from server.service.observability.dashboard import DashboardServer
from server.service.observability.history import CycleHistory

from .conftest import next_cycle

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "var" / "test-artifacts"
POLICY = """
tokens:
  - {token: rack-token-123, user: rack}
  - {token: reader-token-1, user: rita}
  - {token: nobody-token-1, user: nobody}
rules:
  - {subjects: ["user:rack"], verbs: [submit, backend]}
  - {subjects: ["user:rita"], verbs: [read]}
"""


async def start(tmp_path: Path, **overrides: object) -> ServerHandle:
    opts = ServerOptions(
        listen="127.0.0.1:0",
        state=str(tmp_path / "m.db"),
        cycle_period=3600.0,
        dashboard_listen="127.0.0.1:0",
    )
    for key, value in overrides.items():
        setattr(opts, key, value)
    return await start_server(opts)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ServerHandle]:
    handle = await start(tmp_path)
    try:
        yield handle
    finally:
        await handle.stop()


async def populate(handle: ServerHandle, metadata: tuple[tuple[str, str], ...] = ()) -> None:
    async with grpc.aio.insecure_channel(handle.address) as channel:
        stub = pb_grpc.SchedulerStub(channel)
        await stub.RegisterBackend(
            pb.RegisterBackendRequest(name="rack", kind="fake-agent"), metadata=metadata
        )
        nodes = [
            pb.Node(
                name=f"n{i}", allocatable=pb.ResourceList(quantities={"cpu": "4", "memory": "8Gi"})
            )
            for i in range(2)
        ]
        await stub.SyncSnapshot(
            pb.SyncSnapshotRequest(backend="rack", nodes=nodes), metadata=metadata
        )
        for job_id, cpu in (("fits", "2"), ("huge", "64")):
            spec = pb.JobSpec(
                id=job_id,
                task_groups=[
                    pb.TaskGroup(
                        role="w", replicas=1, request=pb.ResourceList(quantities={"cpu": cpu})
                    )
                ],
            )
            await stub.SubmitJob(pb.SubmitJobRequest(job=spec), metadata=metadata)
    await next_cycle(handle)


async def get(url: str, token: str = "") -> tuple[int, object]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as resp:
        body = await resp.json() if resp.content_type == "application/json" else await resp.text()
        return resp.status, body


async def test_overview_reports_queues_nodes_jobs_and_cycles(server: ServerHandle) -> None:
    await populate(server)
    base = f"http://127.0.0.1:{server.dashboard_port}"
    status, data = await get(f"{base}/api/overview")
    assert status == 200
    assert isinstance(data, dict)
    [default] = [q for q in data["queues"] if q["queue"]["name"] == "default"]
    assert default["allocated"]["quantities"]["cpu"] == "2"
    utilisation = {n["name"]: n["utilisation"] for n in data["nodes"]}
    assert sorted(utilisation) == ["n0", "n1"]
    assert sorted(u["cpu"] for u in utilisation.values()) == [0.0, 0.5]
    jobs = {j["id"]: j for j in data["jobs"]}
    assert jobs["fits"]["phase"] == "Running"
    assert jobs["fits"]["running"] == 1
    assert jobs["huge"]["reason"] == "RequestExceedsEveryNode"
    assert "can never run" in jobs["huge"]["message"]
    [cycle] = data["cycles"][-1:]
    assert cycle["binds"] == 1
    assert "allocate" in cycle["actions"]
    assert cycle["cpu_share"]["default"] == 0.25  # 2 of the cluster's 8 CPUs
    status, page = await get(f"{base}/")
    assert status == 200
    assert "<title>Muster</title>" in str(page)
    status, _ = await get(f"{base}/static/vendor/chart.umd.min.js")
    assert status == 200


async def test_dashboard_is_off_by_default_and_refuses_plain_http_off_loopback(
    tmp_path: Path,
) -> None:
    handle = await start(tmp_path, dashboard_listen=None)
    try:
        assert handle.dashboard_port == 0
        assert handle.server.loop is not None
        assert handle.server.loop.history is None
    finally:
        await handle.stop()
    with pytest.raises(OSError, match="refusing plain HTTP off loopback"):
        DashboardServer(handle.server.state, CycleHistory(), "0.0.0.0:8080")  # type: ignore[arg-type]


async def test_dashboard_wants_the_apis_tokens(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    handle = await start(tmp_path, auth_policy=str(policy))
    try:
        await populate(handle, metadata=(("authorization", "Bearer rack-token-123"),))
        url = f"http://127.0.0.1:{handle.dashboard_port}/api/overview"
        assert (await get(url))[0] == 401
        assert (await get(url, "nobody-token-1"))[0] == 403
        status, data = await get(url, "reader-token-1")
        assert status == 200
        assert isinstance(data, dict)
        assert len(data["jobs"]) == 2
    finally:
        await handle.stop()


CHROMIUM = (
    shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
)


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium here (apt-get install chromium to run the browser test)"
)
async def test_the_page_draws_in_a_real_browser(server: ServerHandle) -> None:
    await populate(server)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    shot.unlink(missing_ok=True)
    url = f"http://127.0.0.1:{server.dashboard_port}/"
    common = [
        CHROMIUM,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--virtual-time-budget=4000",
    ]
    # In a thread: the server answering the page runs on this test's event loop.
    dom = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [*common, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=False
        )
    )
    assert 'data-ready="true"' in dom.stdout, dom.stderr[-2000:]  # the script ran and drew the data
    assert "RequestExceedsEveryNode" in dom.stdout
    assert "<canvas" in dom.stdout
    await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [*common, f"--screenshot={shot}", "--window-size=1400,1000", url],
            capture_output=True,
            timeout=120,
            check=True,
        )
    )
    assert shot.stat().st_size > 10_000  # kept as the test's artifact
