"""The error taxonomy. Core code raises these; only the gRPC edge maps them to status codes.

Each error says whether a retry can help (`retryable`) and which gRPC code it becomes (by name,
so that this module does not import grpc).
"""

from __future__ import annotations

QUOTE_CHARS = 64


def quote(value: object, limit: int = QUOTE_CHARS) -> str:
    """`value` as an error message may echo it: its repr (so control characters and lone
    surrogates show escaped), cut to `limit` characters with the total length after the cut."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


class ProvisionerError(Exception):
    grpc_code = "INTERNAL"
    retryable = False
    reason = "INTERNAL"

    def __init__(self, message: str, *, field: str | None = None, retry_after_s: float | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s


class InvalidArgument(ProvisionerError):
    """The request is wrong and will stay wrong; `field` names the culprit."""

    grpc_code = "INVALID_ARGUMENT"
    reason = "INVALID_ARGUMENT"


class NotFound(ProvisionerError):
    grpc_code = "NOT_FOUND"
    reason = "NOT_FOUND"


class FailedPrecondition(ProvisionerError):
    """Valid request, wrong moment (e.g. the cluster is draining)."""

    grpc_code = "FAILED_PRECONDITION"
    reason = "FAILED_PRECONDITION"


class Unauthenticated(ProvisionerError):
    """No credentials, or credentials that do not check out."""

    grpc_code = "UNAUTHENTICATED"
    reason = "UNAUTHENTICATED"


class PermissionDenied(ProvisionerError):
    """A known caller asked for something its roles do not allow."""

    grpc_code = "PERMISSION_DENIED"
    reason = "PERMISSION_DENIED"


class UserBlocked(PermissionDenied):
    """The user may not start GPU sessions until an operator unblocks them."""

    reason = "USER_BLOCKED"


class Aborted(ProvisionerError):
    """Nothing was done and nothing will be: the request came too late. Safe to place elsewhere."""

    grpc_code = "ABORTED"
    reason = "ABORTED"


class QuotaExceeded(ProvisionerError):
    """`reset_time` (epoch seconds), when the quota resets, reaches the client in the ErrorInfo."""

    grpc_code = "RESOURCE_EXHAUSTED"
    reason = "QUOTA_EXCEEDED"

    def __init__(self, message: str, *, reset_time: float | None = None, **kwargs):
        super().__init__(message, **kwargs)
        self.reset_time = reset_time


class RateLimited(ProvisionerError):
    """Too many calls in too little time; `retry_after_s` says when one more will be taken."""

    grpc_code = "RESOURCE_EXHAUSTED"
    reason = "RATE_LIMITED"
    retryable = True


class NoCapacity(ProvisionerError):
    """The cluster cannot take the session now; another cluster, or later, may."""

    grpc_code = "RESOURCE_EXHAUSTED"
    reason = "NO_CAPACITY"
    retryable = True


class Unavailable(ProvisionerError):
    grpc_code = "UNAVAILABLE"
    reason = "UNAVAILABLE"
    retryable = True


class IllegalTransition(ProvisionerError):
    """A state machine was asked for an edge its table does not allow: a bug, never user input."""

    grpc_code = "INTERNAL"
    reason = "ILLEGAL_TRANSITION"
