"""Exceptions raised by the fusor package."""

from __future__ import annotations

from typing import Optional

import grpc


class FusorError(Exception):
    """Base class of every error fusor raises."""


class RpcError(FusorError):
    """A call to the scheduler failed.

    Attributes:
        code: the gRPC status code (``grpc.StatusCode``).
        details: the scheduler's message.
        retry_after: seconds the scheduler asked to wait before retrying
            (its ``retry-after-ms`` hint, sent with RESOURCE_EXHAUSTED), or None.
    """

    def __init__(self, code: grpc.StatusCode, details: str, retry_after: Optional[float] = None):
        self.code = code
        self.details = details
        self.retry_after = retry_after
        hint = f" (retry in {retry_after:.1f} s)" if retry_after is not None else ""
        super().__init__(f"{code.name}: {details}{hint}")


class NotFoundError(RpcError):
    """NOT_FOUND: a cache miss with ``cache_only``, an unknown task or sweep."""


class InvalidArgumentError(RpcError):
    """INVALID_ARGUMENT: the chain or request is malformed (the message says where)."""


class ResourceExhaustedError(RpcError):
    """RESOURCE_EXHAUSTED: a quota of the scheduler; ``retry_after`` says when to try again."""


class UnavailableError(RpcError):
    """UNAVAILABLE: the scheduler cannot be reached."""


class AuthError(RpcError):
    """UNAUTHENTICATED or PERMISSION_DENIED: a missing, revoked or wrong-role token."""


class ChainError(FusorError, ValueError):
    """A chain given to the client cannot be read (before it reaches the scheduler)."""


class KernelArgumentError(FusorError, ValueError):
    """A kernel was called with arrays of the wrong count, shape, dtype, device or layout."""


class BuildError(FusorError):
    """A tuned kernel could not be built or loaded on this machine."""


class EmbeddedError(FusorError):
    """The embedded scheduler or worker could not be started or stopped."""


_BY_CODE = {
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: AuthError,
    grpc.StatusCode.PERMISSION_DENIED: AuthError,
}


def from_grpc(error: grpc.RpcError) -> RpcError:
    """The fusor exception for a failed call, with its retry hint."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else None) or str(error)
    retry_after = None
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == "retry-after-ms":
            try:
                retry_after = int(value) / 1000.0
            except ValueError:
                pass
    return _BY_CODE.get(code, RpcError)(code, details, retry_after)
