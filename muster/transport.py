"""How clients and adapters reach the Muster server: plaintext on loopback, TLS (and mutual TLS
with a client certificate) when the server asks for it. One place, so the CLI, the client library
and every adapter take the same options and environment variables:

    --tls-ca FILE     MUSTER_TLS_CA     CA bundle that signed the server's certificate (turns TLS on)
    --tls-cert FILE   MUSTER_TLS_CERT   client certificate (mutual TLS; a backend's identity)
    --tls-key FILE    MUSTER_TLS_KEY    its private key
    --tls-server-name MUSTER_TLS_SERVER_NAME   name to verify when it differs from the address's host
    --token TOKEN / --token-file FILE   MUSTER_TOKEN / MUSTER_TOKEN_FILE   bearer token (server auth policy)
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

import grpc

# The largest message, both ways: the server's default --max-message-bytes, and what every channel
# made here reads. A decision or a Job carries its task groups' annotations and commands, so a job
# the server accepted can make a reply past gRPC's default 4 MiB receive limit, which a client with
# that default could never read (a backend would reconnect and get the same decision again).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# Replicated servers (docs/ha.md): a follower refuses writes and backend calls with UNAVAILABLE and
# names the leader's address in this trailing metadata key (absent while no leader is known).
LEADER_METADATA = "muster-leader"


@dataclass(frozen=True, slots=True)
class ClientTls:
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.ca or self.cert)

    @classmethod
    def from_env(cls) -> ClientTls:
        env = os.environ
        return cls(
            env.get("MUSTER_TLS_CA") or None,
            env.get("MUSTER_TLS_CERT") or None,
            env.get("MUSTER_TLS_KEY") or None,
            env.get("MUSTER_TLS_SERVER_NAME") or None,
        )


def add_tls_args(parser: argparse.ArgumentParser) -> None:
    """The TLS options every command line that talks to the server takes."""
    env = ClientTls.from_env()
    group = parser.add_argument_group("TLS (see docs/security.md)")
    group.add_argument(
        "--tls-ca", default=env.ca, help="CA bundle of the server's certificate (env MUSTER_TLS_CA)"
    )
    group.add_argument(
        "--tls-cert",
        default=env.cert,
        help="client certificate for mutual TLS (env MUSTER_TLS_CERT)",
    )
    group.add_argument("--tls-key", default=env.key, help="its private key (env MUSTER_TLS_KEY)")
    group.add_argument(
        "--tls-server-name",
        default=env.server_name,
        help="name to verify in the server's certificate (env MUSTER_TLS_SERVER_NAME)",
    )


def tls_from_args(args: argparse.Namespace) -> ClientTls:
    tls = ClientTls(args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)
    if bool(tls.cert) != bool(tls.key):
        raise ValueError("--tls-cert and --tls-key go together")
    return tls


def add_token_args(parser: argparse.ArgumentParser) -> None:
    """The bearer-token options of command lines that act for a user."""
    group = parser.add_argument_group("authentication (see docs/security.md)")
    group.add_argument(
        "--token", default=os.environ.get("MUSTER_TOKEN"), help="bearer token (env MUSTER_TOKEN)"
    )
    group.add_argument(
        "--token-file",
        default=os.environ.get("MUSTER_TOKEN_FILE"),
        help="file holding the bearer token (env MUSTER_TOKEN_FILE)",
    )


def token_from_args(args: argparse.Namespace) -> str | None:
    if args.token:
        return str(args.token)
    if args.token_file:
        with open(args.token_file) as f:
            return f.read().strip() or None
    return None


class _Headers:
    """Adds fixed metadata to every call: ``authorization: Bearer <token>`` (works on plaintext
    loopback too, unlike grpc's access-token call credentials) and the caller's user claim."""

    def __init__(self, headers: list[tuple[str, str]]) -> None:
        self.headers = headers

    def details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self.headers)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


# grpc.aio files an interceptor under the first call kind it implements only, so each kind gets an
# object of its own (one class for both sent no token on streaming calls).
class _UnaryHeaders(_Headers, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self.details(details), request)


class _StreamHeaders(_Headers, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self.details(details), request)


class _BidiHeaders(_Headers, grpc.aio.StreamStreamClientInterceptor):  # reflection
    async def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return await continuation(self.details(details), requests)


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def channel(
    address: str,
    tls: ClientTls | None = None,
    options: list[tuple[str, object]] | None = None,
    *,
    token: str | None = None,
    user: str | None = None,
) -> grpc.aio.Channel:
    """An asyncio channel to ``address``: TLS when ``tls`` asks for it, else plaintext; with
    ``token``, every call carries it as a bearer token; with ``user``, the ``x-muster-user`` claim
    a server without authentication records as the owner of submitted jobs (ignored otherwise).
    Messages up to ``MAX_MESSAGE_BYTES`` are read unless ``options`` say otherwise."""
    opts = list(options or [])
    if not any(name == "grpc.max_receive_message_length" for name, _ in opts):
        opts.append(("grpc.max_receive_message_length", MAX_MESSAGE_BYTES))
    headers = [("authorization", f"Bearer {token}")] if token else []
    if user:
        headers.append(("x-muster-user", user))
    interceptors: list[Any] | None = (
        [kind(headers) for kind in (_UnaryHeaders, _StreamHeaders, _BidiHeaders)]
        if headers
        else None
    )
    if tls is None or not tls.enabled:
        return grpc.aio.insecure_channel(address, options=opts, interceptors=interceptors)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca),
        private_key=_read(tls.key),
        certificate_chain=_read(tls.cert),
    )
    if tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.aio.secure_channel(address, credentials, options=opts, interceptors=interceptors)
