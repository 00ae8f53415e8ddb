"""Replays the hostile-tenant audit against a real server: TLS, mutual TLS and an auth policy.

    .venv/bin/python bench/hostile.py            # prints one line per attempt, then the figures

Starts ``muster-server`` in a temporary directory (certificates made with openssl), then makes the
attempts an ordinary user (alice: a client certificate the policy does not map, a token with
submit/read in queue ml) or a backend (rack-a: a mapped backend certificate) would make to get
more than the policy gives, or to stop or exhaust the server. Each line: what was tried, what a
correct server answers, what this one answered. Figures: the server's peak RSS before and after
the memory attacks, the slowest answer, the longest audit line. Exit status 1 when any attempt got
an answer other than the expected one. Loopback only; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from muster import transport  # noqa: E402
from muster.transport import ClientTls  # noqa: E402
from muster.v1 import muster_pb2 as pb  # noqa: E402
from muster.v1 import muster_pb2_grpc as pb_grpc  # noqa: E402

POLICY = """
tokens:
  - {token: alice-token-1, user: alice, groups: [ml]}
  - {token: bob-token-123, user: bob}
  - {token: rack-b-token1, user: rack-b}
  - {token: ops-token-123, user: ops, groups: [admins]}
certificates:
  - {cn: rack-a, backend: rack-a}
rules:
  - {subjects: ["group:ml"], verbs: [read, submit, cancel], queues: [ml]}
  - {subjects: ["user:bob"], verbs: [read, submit], queues: [default]}
  - {subjects: ["user:rack-b"], verbs: [backend]}
  - {subjects: ["group:admins"], verbs: ["*"]}
"""

ALIAS_BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]"
        for i in range(8)
    ]
)


def openssl_pki(directory: Path) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=audit-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    )
    (directory / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, server in (("server", True), ("alice", False), ("rack-a", False)):
        run(
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
        )
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            f"{name}.crt",
            *(["-extfile", "san.ext"] if server else []),
        )


@dataclass
class Attempt:
    what: str
    expected: str
    got: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.got == self.expected


class Audit:
    def __init__(
        self, directory: Path, server: subprocess.Popen[bytes], address: str, metrics: str
    ) -> None:
        self.dir = directory
        self.server = server
        self.address = address
        self.metrics = metrics
        self.attempts: list[Attempt] = []

    def tls(self, name: str) -> ClientTls:
        return ClientTls(
            ca=str(self.dir / "ca.crt"),
            cert=str(self.dir / f"{name}.crt"),
            key=str(self.dir / f"{name}.key"),
        )

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.server.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    async def expect(self, what: str, expected: str, call: Awaitable[Any]) -> None:
        started = time.perf_counter()
        try:
            await asyncio.wait_for(call, 30)
            got = "OK"
        except grpc.aio.AioRpcError as err:
            got = err.code().name
        except TimeoutError:
            got = "TIMEOUT"
        self.attempts.append(Attempt(what, expected, got, time.perf_counter() - started))
        mark = "ok " if got == expected else "BAD"
        print(f"{mark} {what:<78} expected {expected:<19} got {got}", flush=True)


async def first(stream: Any) -> None:
    async for _ in stream:
        return


async def attacks(audit: Audit) -> None:
    alice_cert = audit.tls("alice")  # a user's certificate; the policy does not map it
    async with transport.channel(audit.address, alice_cert) as ch:
        s = pb_grpc.SchedulerStub(ch)
        node = pb.Node(name="fake-0", allocatable=pb.ResourceList(quantities={"cpu": "1000"}))
        await audit.expect(
            "alice's certificate, no token: RegisterBackend{name: alice}",
            "UNAUTHENTICATED",
            s.RegisterBackend(pb.RegisterBackendRequest(name="alice", kind="x"), timeout=10),
        )
        await audit.expect(
            "alice's certificate, no token: SyncSnapshot a 1,000-CPU node",
            "UNAUTHENTICATED",
            s.SyncSnapshot(pb.SyncSnapshotRequest(backend="alice", nodes=[node]), timeout=10),
        )
        await audit.expect(
            "alice's certificate, no token: StreamDecisions(rack-a)",
            "UNAUTHENTICATED",
            first(s.StreamDecisions(pb.StreamDecisionsRequest(backend="rack-a"), timeout=10)),
        )
        await audit.expect(
            "alice's certificate, no token: AckDecisions(rack-a)",
            "UNAUTHENTICATED",
            s.AckDecisions(pb.AckDecisionsRequest(backend="rack-a"), timeout=10),
        )
        await audit.expect(
            "alice's certificate, no token: reflection",
            "UNAUTHENTICATED",
            first(
                reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
                )
            ),
        )
        before = audit.peak_rss_mib()
        big = pb.GetJobRequest(id="x" * (60 * 1024 * 1024))
        started = time.perf_counter()
        results = await asyncio.gather(
            *(s.GetJob(big, timeout=30) for _ in range(8)), return_exceptions=True
        )
        codes = {r.code().name if isinstance(r, grpc.aio.AioRpcError) else "OK" for r in results}
        audit.attempts.append(
            Attempt(
                "8 concurrent 60 MiB GetJob, no token",
                "UNAUTHENTICATED",
                ",".join(sorted(codes)),
                time.perf_counter() - started,
            )
        )
        print(
            f"{'ok ' if codes == {'UNAUTHENTICATED'} else 'BAD'} {'8 concurrent 60 MiB GetJob, no token':<78} "
            f"expected UNAUTHENTICATED     got {','.join(sorted(codes))}  (peak RSS {before:.0f} -> "
            f"{audit.peak_rss_mib():.0f} MiB, {time.perf_counter() - started:.2f} s)",
            flush=True,
        )
        health = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        print(
            f"    health without a token: {health_pb2.HealthCheckResponse.ServingStatus.Name(health.status)}"
        )

    async with transport.channel(audit.address, alice_cert, token="alice-token-1") as ch:
        s = pb_grpc.SchedulerStub(ch)
        await audit.expect(
            "alice's token: RegisterBackend{name: alice}",
            "PERMISSION_DENIED",
            s.RegisterBackend(pb.RegisterBackendRequest(name="alice", kind="x"), timeout=10),
        )
        for value in ("1e308", "1e309", "9" * 400, "nan", "inf", "1e999999999"):
            job = pb.JobSpec(
                id=f"poison-{len(value)}-{value[:4]}",
                queue="ml",
                task_groups=[
                    pb.TaskGroup(
                        role="w", replicas=1, request=pb.ResourceList(quantities={"cpu": value})
                    )
                ],
            )
            await audit.expect(
                f"SubmitJob request cpu {value[:24]!r}",
                "INVALID_ARGUMENT",
                s.SubmitJob(pb.SubmitJobRequest(job=job), timeout=10),
            )
        await audit.expect(
            "GetJob of bob's job in queue default",
            "PERMISSION_DENIED",
            s.GetJob(pb.GetJobRequest(id="bob-1"), timeout=10),
        )
        await audit.expect(
            "GetTaskLogs of bob's job in queue default",
            "PERMISSION_DENIED",
            s.GetTaskLogs(pb.GetTaskLogsRequest(job_id="bob-1"), timeout=10),
        )
        before = audit.peak_rss_mib()
        await audit.expect(
            "Simulate: 9 levels of nested YAML aliases",
            "INVALID_ARGUMENT",
            s.Simulate(pb.SimulateRequest(scenario=ALIAS_BOMB), timeout=30),
        )
        ascend = json.dumps(
            {
                "nodes": [
                    {"name": "n", "allocatable": {"cpu": "8", "huawei.com/Ascend910": "1e30"}}
                ],
                "jobs": [],
            }
        )
        await audit.expect(
            "Simulate: a node with 1e30 Ascend910 and no device list",
            "INVALID_ARGUMENT",
            s.Simulate(pb.SimulateRequest(scenario=ascend), timeout=30),
        )
        for scenario in (
            "jobs: [{id: j, tasks: [{node: []}]}]\nnodes: []",
            "config: {profile: []}\nnodes: []\njobs: []",
        ):
            await audit.expect(
                f"Simulate {scenario.splitlines()[0]!r}",
                "INVALID_ARGUMENT",
                s.Simulate(pb.SimulateRequest(scenario=scenario), timeout=30),
            )
        print(
            f"    peak RSS across the YAML and device attacks: {before:.0f} -> {audit.peak_rss_mib():.0f} MiB"
        )

    async with transport.channel(audit.address, alice_cert, token="ops-token-123") as ch:
        s = pb_grpc.SchedulerStub(ch)
        bombs = {
            "UpdateConfig: aliases in extension_points_not_listed": ALIAS_BOMB.replace(
                "a: &a", "x-a: &a", 1
            )
            + "\nextension_points_not_listed: *i",
            "UpdateConfig profile: []": "profile: []",
            "UpdateConfig profile: {a: 1}": "profile: {a: 1}",
            "UpdateConfig configurations arguments: -1": "configurations: [{name: preempt, arguments: -1}]",
            "UpdateConfig configurations arguments: [x]": "configurations: [{name: preempt, arguments: [x]}]",
        }
        for what, text in bombs.items():
            await audit.expect(
                what,
                "INVALID_ARGUMENT",
                s.UpdateConfig(pb.UpdateConfigRequest(yaml=text), timeout=30),
            )

    async with transport.channel(audit.address, audit.tls("rack-a")) as ch:
        s = pb_grpc.SchedulerStub(ch)
        await audit.expect(
            "rack-a's certificate: RegisterBackend rack-a",
            "OK",
            s.RegisterBackend(pb.RegisterBackendRequest(name="rack-a", kind="x"), timeout=10),
        )
        await audit.expect(
            "rack-a's certificate: RegisterBackend rack-b",
            "PERMISSION_DENIED",
            s.RegisterBackend(pb.RegisterBackendRequest(name="rack-b", kind="x"), timeout=10),
        )
        await audit.expect(
            "rack-a's certificate: ListJobs (a backend is no user)",
            "PERMISSION_DENIED",
            s.ListJobs(pb.ListJobsRequest(), timeout=10),
        )
        gpus = pb.Node(
            name="g-0",
            allocatable=pb.ResourceList(quantities={"cpu": "8", "nvidia.com/gpu": "1000000000000"}),
        )
        before = audit.peak_rss_mib()
        await audit.expect(
            "rack-a: SyncSnapshot a node of 10^12 GPUs",
            "INVALID_ARGUMENT",
            s.SyncSnapshot(pb.SyncSnapshotRequest(backend="rack-a", nodes=[gpus]), timeout=10),
        )
        print(
            f"    peak RSS across the GPU-count attack: {before:.0f} -> {audit.peak_rss_mib():.0f} MiB"
        )

    async with transport.channel(audit.address, audit.tls("alice"), token="rack-b-token1") as ch:
        s = pb_grpc.SchedulerStub(ch)
        await s.RegisterBackend(pb.RegisterBackendRequest(name="rack-b", kind="x"), timeout=10)
        feed = s.StreamDecisions(pb.StreamDecisionsRequest(backend="rack-b"))
        await asyncio.sleep(0.5)
        await audit.expect(
            "rack-b's token: a second live StreamDecisions",
            "FAILED_PRECONDITION",
            first(s.StreamDecisions(pb.StreamDecisionsRequest(backend="rack-b"), timeout=10)),
        )
        feed.cancel()

    context = ssl.create_default_context(cafile=str(audit.dir / "ca.crt"))
    try:
        urllib.request.urlopen(audit.metrics, context=context, timeout=10)  # a loopback URL
        got = "200"
    except urllib.error.HTTPError as err:
        got = str(err.code)
    audit.attempts.append(Attempt("/metrics without a token", "401", got, 0.0))
    print(
        f"{'ok ' if got == '401' else 'BAD'} {'/metrics without a token':<78} expected 401                 got {got}"
    )


async def setup_jobs(audit: Audit) -> None:
    async with transport.channel(audit.address, audit.tls("alice"), token="ops-token-123") as ch:
        s = pb_grpc.SchedulerStub(ch)
        await s.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="ml")), timeout=10)
    async with transport.channel(audit.address, audit.tls("alice"), token="bob-token-123") as ch:
        job = pb.JobSpec(
            id="bob-1",
            queue="default",
            task_groups=[
                pb.TaskGroup(
                    role="w",
                    replicas=1,
                    command=["sh", "-c", "echo OPS-PASSWORD=hunter2"],
                    request=pb.ResourceList(quantities={"cpu": "1"}),
                )
            ],
        )
        await pb_grpc.SchedulerStub(ch).SubmitJob(pb.SubmitJobRequest(job=job), timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def main() -> int:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    with tempfile.TemporaryDirectory(prefix="muster-audit-") as tmp:
        directory = Path(tmp)
        openssl_pki(directory)
        (directory / "policy.yaml").write_text(POLICY)
        port, metrics_port = free_port(), free_port()
        log = (directory / "server.log").open("wb")
        server = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from server.service.main import main; sys.exit(main())",
                "--listen",
                f"127.0.0.1:{port}",
                "--state",
                str(directory / "muster.db"),
                "--tls-cert",
                str(directory / "server.crt"),
                "--tls-key",
                str(directory / "server.key"),
                "--tls-client-ca",
                str(directory / "ca.crt"),
                "--auth-policy",
                str(directory / "policy.yaml"),
                "--metrics-listen",
                f"127.0.0.1:{metrics_port}",
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        audit = Audit(
            directory, server, f"localhost:{port}", f"https://localhost:{metrics_port}/metrics"
        )
        try:
            async with transport.channel(audit.address, audit.tls("alice")) as ch:
                for _ in range(300):
                    try:
                        await health_pb2_grpc.HealthStub(ch).Check(
                            health_pb2.HealthCheckRequest(), timeout=1
                        )
                        break
                    except grpc.aio.AioRpcError:
                        await asyncio.sleep(0.1)
            print(f"server up: peak RSS {audit.peak_rss_mib():.0f} MiB")
            await setup_jobs(audit)
            await attacks(audit)
            alive = server.poll() is None
            peak = audit.peak_rss_mib() if alive else float("nan")
        finally:
            server.terminate()
            server.wait(15)
            log.close()
        lines = (directory / "server.log").read_bytes().splitlines()
        audit_lines = [line for line in lines if b"audit" in line]
        bad = [a for a in audit.attempts if not a.ok]
        print(
            f"\n{len(audit.attempts)} attempts: {len(audit.attempts) - len(bad)} answered as they should, "
            f"{len(bad)} not; server alive at the end: {alive}"
        )
        print(
            f"slowest answer {max(a.seconds for a in audit.attempts):.2f} s; peak RSS {peak:.0f} MiB; "
            f"longest audit line {max((len(line) for line in audit_lines), default=0):,} bytes; "
            f"'hunter2' in the log: {any(b'hunter2' in line for line in lines)}"
        )
        return 0 if not bad and alive else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
