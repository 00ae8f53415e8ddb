"""Leader election of the Kubernetes adapter (adapters/k8s/lease.py) against the fake API server.

Short timings (a 1 s lease, 0.6 s renew deadline, 0.1 s retry) keep every test within a few
seconds; every wait is bounded. Each test is built to fail on a plausible wrong implementation:
two leaders, a takeover before the lease expired, no release, a lost lease left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from adapters.k8s.adapter import K8sBackend
from adapters.k8s.kube import KubeWriter, NotLeader, make_api_client
from adapters.k8s.lease import LeaderElector, LeaseConfig, default_identity, default_namespace
from adapters.k8s.main import parse_args

from .conftest import FAST_RUNTIME, Env, eventually
from .fake_apiserver import FakeApiServer, make_node, make_pod

NS = "muster-system"
LEASE = "muster-k8s-adapter-kubernetes"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{LEASE}"
FAST = {"lease_duration": 1.0, "renew_deadline": 0.6, "retry_period": 0.1}
# Where a test needs leadership to hold for a while, a 0.6 s stall of a loaded machine must not
# end it.
STEADY = {"lease_duration": 2.0, "renew_deadline": 1.2, "retry_period": 0.1}


def now() -> float:
    return asyncio.get_running_loop().time()


@dataclass
class Candidate:
    """One elector in a task; ``lead()`` runs until cancelled and records its terms."""

    elector: LeaderElector
    api: client.ApiClient
    work: Callable[[], Awaitable[None]] | None = None
    task: asyncio.Task[None] | None = None
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    leader_at_end: list[bool] = field(default_factory=list)

    @property
    def leading(self) -> bool:
        return len(self.starts) > len(self.ends)

    async def lead(self) -> None:
        self.starts.append(now())
        try:
            if self.work is not None:
                await self.work()
            else:
                await asyncio.Event().wait()
        finally:
            self.ends.append(now())
            self.leader_at_end.append(self.elector.is_leader())

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run(self.lead))

    async def kill(self) -> None:
        """Cancel without releasing: a crashed process."""
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@dataclass
class Cluster:
    kube: FakeApiServer
    candidates: list[Candidate] = field(default_factory=list)

    async def candidate(self, identity: str, **timing: float) -> Candidate:
        api = await make_api_client(host=self.kube.url)
        config = LeaseConfig(LEASE, NS, identity, **{**FAST, **timing})
        c = Candidate(LeaderElector(api, config), api)
        self.candidates.append(c)
        return c

    def lease(self) -> dict[str, Any]:
        lease = self.kube.get_object("coordination.k8s.io/v1", "Lease", LEASE, NS)
        assert lease is not None
        return lease

    def holder(self) -> str | None:
        lease = self.kube.get_object("coordination.k8s.io/v1", "Lease", LEASE, NS)
        return None if lease is None else lease["spec"].get("holderIdentity")

    def leaders(self) -> list[Candidate]:
        return [c for c in self.candidates if c.leading]


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    kube = FakeApiServer()
    await kube.start()
    c = Cluster(kube)
    try:
        yield c
    finally:
        kube.request_hook = None
        for cand in c.candidates:
            if cand.task is not None and not cand.task.done():
                cand.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(cand.task, 5)
            await cand.api.close()
        await kube.stop()


async def watch_leaders(cluster: Cluster, seconds: float) -> list[int]:
    """How many candidates lead, sampled every 10 ms for ``seconds``."""
    counts = []
    deadline = now() + seconds
    while now() < deadline:
        counts.append(len(cluster.leaders()))
        counts.append(sum(c.elector.is_leader() for c in cluster.candidates))
        await asyncio.sleep(0.01)
    return counts


async def test_two_electors_exactly_one_leads(cluster: Cluster) -> None:
    a, b = await cluster.candidate("a", **STEADY), await cluster.candidate("b", **STEADY)
    a.start()
    b.start()
    await eventually(lambda: len(cluster.leaders()) == 1, timeout=5)
    counts = await watch_leaders(cluster, 3.0)  # 1.5 lease durations of renewing
    assert max(counts) == 1, counts
    assert min(counts) == 1, counts
    [leader] = cluster.leaders()
    assert len(leader.starts) == 1  # one term, no flapping
    assert cluster.holder() == leader.elector.identity
    other = b if leader is a else a
    assert other.starts == []
    assert other.elector.holder == leader.elector.identity
    assert cluster.lease()["spec"]["leaseDurationSeconds"] == 2


async def test_killed_leader_is_replaced_only_after_the_lease_duration(cluster: Cluster) -> None:
    a = await cluster.candidate("a")
    a.start()
    await eventually(lambda: a.leading, timeout=5)
    b = await cluster.candidate("b")
    b.start()
    assert max(await watch_leaders(cluster, 1.5)) == 1
    assert not b.leading
    await a.kill()
    killed = now()
    assert cluster.holder() == "a"  # cancelled, not released
    await eventually(lambda: b.leading, timeout=5)
    waited = b.starts[0] - killed
    # a renewed at most 0.3 s (renew_deadline / 2) before it died; b waits a full lease
    # duration (1 s) after it saw that renew.
    assert 0.5 <= waited <= 2.5, waited
    assert cluster.holder() == "b"
    assert cluster.lease()["spec"]["leaseTransitions"] == 1


async def test_graceful_release_hands_over_well_under_the_lease_duration(
    cluster: Cluster,
) -> None:
    slow = {"lease_duration": 5.0, "renew_deadline": 3.0, "retry_period": 0.1}
    a = await cluster.candidate("a", **slow)
    a.start()
    await eventually(lambda: a.leading, timeout=5)
    b = await cluster.candidate("b", **slow)
    b.start()
    await eventually(lambda: b.elector.holder == "a", timeout=5)
    a.elector.stop()
    stopped = now()
    assert a.task is not None
    await asyncio.wait_for(a.task, 5)  # run() returns after a stop
    assert a.ends
    assert a.ends[0] - stopped < 0.2
    await eventually(lambda: b.leading, timeout=5)
    assert b.starts[0] - stopped < 1.0  # a 5 s lease, taken over at the next 0.1 s retry
    assert a.ends[0] <= b.starts[0]
    assert cluster.holder() == "b"


async def test_conflicting_updates_never_make_two_leaders(cluster: Cluster) -> None:
    # A released lease: free for everyone at once. The three candidates read it at the same
    # resourceVersion, and their updates are held until all three are in flight.
    cluster.kube.put_object(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": LEASE, "namespace": NS},
            "spec": {"leaseDurationSeconds": 1, "leaseTransitions": 4},
        }
    )
    arrived: list[str] = []
    all_in = asyncio.Event()

    async def hold_first_puts(method: str, path: str) -> None:
        if method == "PUT" and path == LEASE_PATH and len(arrived) < 3:
            arrived.append(path)
            if len(arrived) == 3:
                all_in.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_in.wait(), 3)

    cluster.kube.request_hook = hold_first_puts
    cands = [await cluster.candidate(name) for name in ("a", "b", "c")]
    for c in cands:
        c.start()
    await eventually(lambda: len(cluster.leaders()) == 1, timeout=5)
    assert all_in.is_set()  # the race did happen
    counts = await watch_leaders(cluster, 1.5)
    assert max(counts) == 1, counts
    conflicts = [r for r in cluster.kube.responses if r[0] == "PUT" and r[1] == LEASE_PATH]
    assert [status for _, _, status in conflicts[:3]].count(409) == 2
    [leader] = cluster.leaders()
    assert cluster.holder() == leader.elector.identity
    assert sum(len(c.starts) for c in cands) == 1
    assert cluster.lease()["spec"]["leaseTransitions"] == 5


async def test_lease_taken_by_another_holder_stops_the_work_at_once(cluster: Cluster) -> None:
    a = await cluster.candidate("a")
    a.start()
    await eventually(lambda: a.leading, timeout=5)
    lease = cluster.lease()
    lease["spec"].update(
        holderIdentity="intruder",
        leaseDurationSeconds=2,
        renewTime=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    )
    cluster.kube.put_object(lease)
    taken = now()
    await eventually(lambda: a.elector.holder == "intruder", timeout=3, interval=0.002)
    seen = now()
    await eventually(lambda: not a.leading, timeout=3)
    # Stopped as soon as the next renew (every 0.3 s) saw the intruder, not at the renew deadline.
    assert a.ends[0] - seen < 0.1, a.ends[0] - seen
    assert a.leader_at_end == [False]
    assert not a.elector.is_leader()
    assert a.elector.holder == "intruder"
    # a campaigns again, but leaves the intruder's lease alone until it expired on a's clock.
    await eventually(lambda: len(a.starts) == 2, timeout=6)
    assert a.starts[1] - taken >= 1.8
    assert cluster.holder() == "a"


async def test_renew_deadline_stops_the_work_when_the_api_server_hangs(cluster: Cluster) -> None:
    a = await cluster.candidate("a", **STEADY)
    a.start()
    await eventually(lambda: a.leading, timeout=5)
    await asyncio.sleep(0.8)
    released = asyncio.Event()

    async def hang(method: str, path: str) -> None:
        if "/leases" in path:
            await released.wait()

    cluster.kube.request_hook = hang
    hung = now()
    try:
        await eventually(lambda: not a.leading, timeout=3)
        # The last renew that got through started before the hang: the work ends by its renew
        # deadline (1.2 s), although every renew request since is still waiting for an answer.
        assert a.ends[0] - hung <= 1.2 + 0.4, a.ends[0] - hung
        assert a.leader_at_end == [False]  # the fence was already down when the work stopped
    finally:
        released.set()
        cluster.kube.request_hook = None


async def test_a_stopped_leader_releases_the_lease(cluster: Cluster) -> None:
    a = await cluster.candidate("a")
    a.start()
    await eventually(lambda: a.leading, timeout=5)
    a.elector.stop()
    assert a.task is not None
    await asyncio.wait_for(a.task, 5)
    spec = cluster.lease()["spec"]
    assert "holderIdentity" not in spec
    assert spec["leaseDurationSeconds"] == 1
    # A stopped elector never campaigns again.
    puts = len([r for r in cluster.kube.requests if r[1] == LEASE_PATH])
    await asyncio.sleep(0.3)
    assert len([r for r in cluster.kube.requests if r[1] == LEASE_PATH]) == puts


async def test_work_that_returns_ends_the_election_and_releases(cluster: Cluster) -> None:
    a = await cluster.candidate("a")

    async def short() -> None:
        await asyncio.sleep(0.05)

    a.work = short
    a.start()
    assert a.task is not None
    await asyncio.wait_for(a.task, 5)
    assert len(a.starts) == 1
    assert "holderIdentity" not in cluster.lease()["spec"]


async def test_the_writer_refuses_a_bind_once_the_fence_is_down() -> None:
    kube = FakeApiServer()
    await kube.start()
    api = await make_api_client(host=kube.url)
    try:
        kube.put_object(make_node("n0"))
        kube.put_object(make_pod("p"))
        leader = [True]
        writer = KubeWriter(api, may_write=lambda: leader[0])
        leader[0] = False
        with pytest.raises(NotLeader):
            await writer.bind("default", "p", "n0")
        with pytest.raises(NotLeader):
            await writer.evict("default", "p")
        with pytest.raises(NotLeader):
            await writer.label_pod("default", "p", {"x": "y"})
        assert [r for r in kube.requests if r[0] != "GET"] == []
        leader[0] = True
        assert (await writer.bind("default", "p", "n0")).ok
    finally:
        await api.close()
        await kube.stop()


async def test_the_adapter_stops_binding_while_another_holder_has_the_lease(env: Env) -> None:
    """The real adapter under an elector: binds while leading; once a third party holds the
    lease, nothing is bound until the lease is ours again."""
    env.kube.put_object(make_node("n0", cpu="4"))
    env.kube.put_object(make_pod("p1", cpu="1"))
    api = await make_api_client(host=env.kube.url)
    elector = LeaderElector(api, LeaseConfig(LEASE, NS, "adapter-0", **STEADY))
    backends: list[K8sBackend] = []

    async def lead() -> None:
        backend = K8sBackend(
            api,
            server=env.muster.address,
            runtime_options=FAST_RUNTIME,
            watch_timeout=30,
            may_write=elector.is_leader,
        )
        backends.append(backend)
        await backend.run()

    task = asyncio.create_task(elector.run(lead))
    try:
        await eventually(lambda: env.pod("p1")["spec"].get("nodeName") == "n0", timeout=15)
        lease = env.kube.get_object("coordination.k8s.io/v1", "Lease", LEASE, NS)
        assert lease is not None
        lease["spec"].update(holderIdentity="intruder", leaseDurationSeconds=3)
        env.kube.put_object(lease)
        await eventually(lambda: not elector.is_leader() and elector.holder == "intruder")
        taken = now()
        env.kube.put_object(make_pod("p2", cpu="1"))
        binds = env.bind_posts()
        while now() - taken < 2.0:  # the intruder's 3 s lease has not expired on our clock
            assert env.bind_posts() == binds
            assert not env.pod("p2")["spec"].get("nodeName")
            await asyncio.sleep(0.05)
        # The lease expires; the adapter takes it back and a new term binds the waiting pod.
        await eventually(lambda: env.pod("p2")["spec"].get("nodeName") == "n0", timeout=15)
        assert len(backends) == 2
        assert elector.terms == 2
    finally:
        elector.stop()
        await asyncio.wait_for(task, 10)
        await api.close()


def test_flags_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "muster-k8s-adapter-5d9f-x2")
    monkeypatch.setenv("POD_NAMESPACE", "sched")
    args = parse_args([])
    assert args.leader_elect is True
    lease = args.lease
    assert (lease.name, lease.namespace) == ("muster-k8s-adapter-kubernetes", "sched")
    assert (lease.lease_duration, lease.renew_deadline, lease.retry_period) == (15.0, 10.0, 2.0)
    assert lease.renew_interval == 5.0
    assert lease.identity.startswith("muster-k8s-adapter-5d9f-x2_")
    assert parse_args([]).lease.identity != lease.identity  # a random suffix per process
    args = parse_args(
        [
            "--name",
            "gpu",
            "--lease-namespace",
            "ops",
            "--lease-duration",
            "30",
            "--renew-deadline",
            "20",
        ]
    )
    assert (args.lease.name, args.lease.namespace) == ("muster-k8s-adapter-gpu", "ops")
    assert parse_args(["--lease-name", "mine"]).lease.name == "mine"
    assert parse_args(["--no-leader-elect"]).leader_elect is False
    with pytest.raises(SystemExit):  # a renew deadline past the lease duration is unsafe
        parse_args(["--lease-duration", "5", "--renew-deadline", "10"])
    with pytest.raises(SystemExit):
        parse_args(["--retry-period", "0"])


def test_namespace_and_identity_outside_a_pod(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.delenv("POD_NAME", raising=False)
    # In a pod without the downward API: the service account's namespace.
    sa = tmp_path / "namespace"
    sa.write_text("team-a\n")
    assert default_namespace(str(sa)) == "team-a"
    # Outside a cluster: the deployed adapters' namespace, so both contend for one Lease.
    assert default_namespace(str(tmp_path / "absent")) == "muster-system"
    assert default_identity().startswith(socket.gethostname() + "_")
