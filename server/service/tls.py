"""TLS for the gRPC port: server certificate and key, optionally a client CA (mutual TLS), reloaded
from disk without a restart.

grpc asks ``fetch`` before each new TLS handshake; it returns a new certificate configuration
when any of the files changed (by modification time), so rotating a certificate is: write the
new files (key first, then certificate), and new connections use them. Connections already open
keep the certificate they were made with.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

import grpc
import structlog

log = structlog.get_logger("muster.tls")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: str  # PEM certificate chain the server presents
    key: str  # its PEM private key
    client_ca: str | None = (
        None  # PEM CA bundle: when set, clients must present a certificate it signed
    )


def is_loopback(listen: str) -> bool:
    """Whether ``HOST:PORT`` listens on loopback only (``localhost``, 127.0.0.0/8, ::1)."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name or "" / "0.0.0.0": reachable from elsewhere


class ReloadingCredentials:
    """Server credentials whose files are re-read when they change."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._stamp = self._mtimes()
        self.credentials = grpc.dynamic_ssl_server_credentials(
            self._configuration(),
            # types-grpcio wants a fetcher that always returns a configuration; grpc documents None
            # as "keep the current certificates", which is what _fetch returns when nothing changed.
            self._fetch,  # type: ignore[arg-type]
            require_client_authentication=files.client_ca is not None,
        )

    def _paths(self) -> list[str]:
        return [p for p in (self.files.cert, self.files.key, self.files.client_ca) if p]

    def _mtimes(self) -> tuple[float, ...]:
        return tuple(os.stat(p).st_mtime_ns for p in self._paths())

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        with open(self.files.key, "rb") as f:
            key = f.read()
        with open(self.files.cert, "rb") as f:
            cert = f.read()
        client_ca = None
        if self.files.client_ca:
            with open(self.files.client_ca, "rb") as f:
                client_ca = f.read()
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=client_ca)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            stamp = self._mtimes()
            if stamp == self._stamp:
                return None  # unchanged: grpc keeps the current configuration
            config = self._configuration()
        except OSError as exc:  # mid-rotation or removed: keep serving with what we have
            log.warning("tls.reload_failed", error=str(exc))
            return None
        self._stamp = stamp
        log.info("tls.reloaded", cert=self.files.cert)
        return config
