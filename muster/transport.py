"""How clients and adapters reach the Muster server: plaintext on loopback, TLS (and mutual TLS
with a client certificate) when the server asks for it. One place, so the CLI, the client library
and every adapter take the same options and environment variables:

    --tls-ca FILE     MUSTER_TLS_CA     CA bundle that signed the server's certificate (turns TLS on)
    --tls-cert FILE   MUSTER_TLS_CERT   client certificate (mutual TLS; a backend's identity)
    --tls-key FILE    MUSTER_TLS_KEY    its private key
    --tls-server-name MUSTER_TLS_SERVER_NAME   name to verify when it differs from the address's host
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import grpc


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
        return cls(env.get("MUSTER_TLS_CA") or None, env.get("MUSTER_TLS_CERT") or None,
                   env.get("MUSTER_TLS_KEY") or None, env.get("MUSTER_TLS_SERVER_NAME") or None)


def add_tls_args(parser: argparse.ArgumentParser) -> None:
    """The TLS options every command line that talks to the server takes."""
    env = ClientTls.from_env()
    group = parser.add_argument_group("TLS (see docs/security.md)")
    group.add_argument("--tls-ca", default=env.ca, help="CA bundle of the server's certificate (env MUSTER_TLS_CA)")
    group.add_argument("--tls-cert", default=env.cert, help="client certificate for mutual TLS (env MUSTER_TLS_CERT)")
    group.add_argument("--tls-key", default=env.key, help="its private key (env MUSTER_TLS_KEY)")
    group.add_argument("--tls-server-name", default=env.server_name,
                       help="name to verify in the server's certificate (env MUSTER_TLS_SERVER_NAME)")


def tls_from_args(args: argparse.Namespace) -> ClientTls:
    tls = ClientTls(args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)
    if bool(tls.cert) != bool(tls.key):
        raise ValueError("--tls-cert and --tls-key go together")
    return tls


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def channel(address: str, tls: ClientTls | None = None,
            options: list[tuple[str, object]] | None = None) -> grpc.aio.Channel:
    """An asyncio channel to ``address``: TLS when ``tls`` asks for it, else plaintext."""
    opts = list(options or [])
    if tls is None or not tls.enabled:
        return grpc.aio.insecure_channel(address, options=opts)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca), private_key=_read(tls.key), certificate_chain=_read(tls.cert)
    )
    if tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.aio.secure_channel(address, credentials, options=opts)
