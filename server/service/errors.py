"""Domain errors: a rejected request, with a code and a message that names the offending field.

State, ingest, commands and queries raise these; only the gRPC service maps them onto status codes
(``server.service.rpc``), so nothing below the service imports grpc. The codes carry gRPC's names
because that is the vocabulary clients see.
"""

from __future__ import annotations

from enum import Enum


class ErrorCode(Enum):
    INVALID_ARGUMENT = "invalid argument"
    NOT_FOUND = "not found"
    ALREADY_EXISTS = "already exists"
    FAILED_PRECONDITION = "failed precondition"
    PERMISSION_DENIED = "permission denied"
    UNAUTHENTICATED = "unauthenticated"
    # Not this server, not now: a follower asked to write, or the state store unreachable.
    # Clients retry (on the leader the error names, when it names one).
    UNAVAILABLE = "unavailable"


class DomainError(Exception):
    """A request the server refuses; nothing was changed."""

    def __init__(self, code: ErrorCode, message: str, *, leader: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.leader = leader  # UNAVAILABLE from a follower: the leader's address, when known


def invalid(message: str) -> DomainError:
    return DomainError(ErrorCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> DomainError:
    return DomainError(ErrorCode.NOT_FOUND, message)


def already_exists(message: str) -> DomainError:
    return DomainError(ErrorCode.ALREADY_EXISTS, message)


def precondition(message: str) -> DomainError:
    return DomainError(ErrorCode.FAILED_PRECONDITION, message)


def denied(message: str) -> DomainError:
    return DomainError(ErrorCode.PERMISSION_DENIED, message)


def unauthenticated(message: str) -> DomainError:
    return DomainError(ErrorCode.UNAUTHENTICATED, message)


def unavailable(message: str, *, leader: str = "") -> DomainError:
    return DomainError(ErrorCode.UNAVAILABLE, message, leader=leader)
