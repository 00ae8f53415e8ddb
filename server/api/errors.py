"""The one exception the service maps onto a gRPC status."""

from __future__ import annotations

import grpc


class ApiError(Exception):
    """A rejected request: a gRPC status code and a message that names the offending field."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> ApiError:
    return ApiError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ApiError:
    return ApiError(grpc.StatusCode.NOT_FOUND, message)


def already_exists(message: str) -> ApiError:
    return ApiError(grpc.StatusCode.ALREADY_EXISTS, message)


def precondition(message: str) -> ApiError:
    return ApiError(grpc.StatusCode.FAILED_PRECONDITION, message)
