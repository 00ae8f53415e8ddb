"""``python -m adapters.k8s.probe``: a gRPC health check for a Kubernetes exec probe.

The kubelet's own gRPC probe speaks plaintext only, and the server in the chart serves mutual TLS.
This check speaks it: it presents the server pod's own certificate as its client certificate (the
chart's single CA signs both) and verifies the server against the Service name the certificate
carries, since it connects to 127.0.0.1. Exit status 0 when the server answers SERVING, 1
otherwise, with one line on stderr saying why.

    python -m adapters.k8s.probe --server 127.0.0.1:50051 --tls-ca ca.crt \\
        --tls-cert tls.crt --tls-key tls.key --tls-server-name muster-server.muster-system.svc
"""

from __future__ import annotations

import argparse
import sys

import anyio
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from muster.transport import ClientTls, add_tls_args, channel, tls_from_args


async def check(address: str, tls: ClientTls | None, *, timeout: float = 3.0) -> str:
    """ "" when ``address`` answers SERVING, else why not."""
    conn = channel(address, tls)
    try:
        reply = await health_pb2_grpc.HealthStub(conn).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout
        )
    except grpc.aio.AioRpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    finally:
        await conn.close(grace=None)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        return name
    return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m adapters.k8s.probe", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--server", default="127.0.0.1:50051", help="HOST:PORT of the server")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    add_tls_args(p)
    args = p.parse_args(argv)
    problem = anyio.run(lambda: check(args.server, tls_from_args(args), timeout=args.timeout))
    if problem:
        sys.stderr.write(f"{args.server} is not serving: {problem}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
