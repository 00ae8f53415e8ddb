"""Request validation and proto <-> model conversion for the gRPC service.

Everything here is pure: it never touches the cache, the store or the network, so the service can
validate a whole request before it changes any state.
"""

from server.api.errors import ApiError

__all__ = ["ApiError"]
