"""Typed errors from the API's status codes and rich details (google.rpc ErrorInfo, BadRequest,
RetryInfo, QuotaFailure), decoded from the call's trailers."""

from __future__ import annotations

from datetime import datetime, timedelta

import grpc
from google.rpc import error_details_pb2, status_pb2

_DETAILS_KEY = "grpc-status-details-bin"


class ProvisionerError(Exception):
    """Any error of the API. `code` is the gRPC status code, `reason` the server's ErrorInfo
    reason (e.g. NO_CAPACITY), `retry_after` the server's advice (RetryInfo), when given."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None, reason: str = "",
                 fields: tuple[tuple[str, str], ...] = (), retry_after: timedelta | None = None,
                 metadata: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.reason = reason
        self.fields = fields  # (field, description) of each BadRequest violation
        self.retry_after = retry_after
        self.metadata = metadata or {}

    @property
    def field(self) -> str | None:
        """The first offending request field, e.g. `spec.accelerator`."""
        return self.fields[0][0] if self.fields else self.metadata.get("field")

    def __str__(self) -> str:
        extra = [f"field {f}: {d}" if d and d not in self.message else f"field {f}" for f, d in self.fields]
        if self.retry_after is not None:
            extra.append(f"retry in {_short(self.retry_after)}")
        line = f"{self.code.name}: {self.message}"
        return f"{line} ({'; '.join(extra)})" if extra else line


class InvalidArgument(ProvisionerError):
    """The request is wrong and stays wrong: fix `field`, do not retry."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ProvisionerError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(ProvisionerError):
    """Valid, but not now (e.g. a drained cluster)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDenied(ProvisionerError):
    """The caller is known, but its roles do not allow this."""

    code = grpc.StatusCode.PERMISSION_DENIED


class UserBlocked(PermissionDenied):
    """The user is blocked from new GPU sessions (by an operator, or by abuse detection) until an
    operator lifts the block: a retry cannot help."""


class Unauthenticated(ProvisionerError):
    """No token, or one the front does not accept (expired, wrong issuer or audience)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class ResourceExhausted(ProvisionerError):
    """No capacity now (retry after `retry_after`), or a request over a size limit."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class QuotaExceeded(ResourceExhausted):
    """The user is over a quota; `reset_time` says when it resets, if the server said."""

    @property
    def reset_time(self) -> datetime | None:
        text = self.metadata.get("reset_time")
        if text:
            try:
                return datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                return None
        return None


class Unavailable(ProvisionerError):
    """The front or a cluster could not be reached or is restarting; `retry_after` advises when
    to try again. `unreachable` is true when no connection to the front could be made at all."""

    code = grpc.StatusCode.UNAVAILABLE

    @property
    def unreachable(self) -> bool:
        return not self.reason and "failed to connect" in self.message.lower()


class DeadlineExceeded(ProvisionerError):
    """The call's time ran out. A create may still have happened: retry with the same request id."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Aborted(ProvisionerError):
    code = grpc.StatusCode.ABORTED


class Internal(ProvisionerError):
    code = grpc.StatusCode.INTERNAL


class NoCredentials(ProvisionerError):
    """No token was given and none could be found (argument, environment, local fleet)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class SessionEnded(ProvisionerError):
    """The session stopped or failed while a caller waited for it to run, or is stopping or over
    when touched; `session` is its last report (state and reason)."""

    code = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, session):
        super().__init__(f"session {session.id} is {session.state}"
                         + (f": {session.reason}" if session.reason else ""))
        self.session = session


class WaitTimeout(ProvisionerError):
    """The session was not running within the time given; `session` is the last report (None if
    none arrived). The session goes on: wait again, or stop it."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED

    def __init__(self, session, timeout_s: float):
        state = f"{session.state}" + (f": {session.reason}" if session.reason else "") if session else "unknown"
        super().__init__(f"not running after {timeout_s:g}s; last state {state}")
        self.session = session


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, FailedPrecondition, PermissionDenied,
                                      Unauthenticated, ResourceExhausted, Unavailable, DeadlineExceeded,
                                      Aborted, Internal)}


def _short(d: timedelta) -> str:
    s = d.total_seconds()
    return f"{s:.1f}s".replace(".0s", "s") if s < 60 else f"{int(s // 60)}m{int(s % 60)}s".replace("m0s", "m")


def _status(err: grpc.RpcError) -> status_pb2.Status | None:
    trailers = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == _DETAILS_KEY:
            status = status_pb2.Status()
            try:
                status.ParseFromString(value)
            except Exception:  # noqa: BLE001 - a garbled detail is no detail
                return None
            return status
    return None


def from_rpc_error(err: grpc.RpcError) -> ProvisionerError:
    """The typed error for a failed call."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = (err.details() if hasattr(err, "details") else None) or str(code.name)
    reason, fields, retry_after, metadata, quota = "", [], None, {}, False
    status = _status(err)
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, metadata = info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields += [(v.field, v.description) for v in bad.field_violations]
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            retry_after = info.retry_delay.ToTimedelta()
        elif detail.Is(error_details_pb2.QuotaFailure.DESCRIPTOR):
            quota = True
    if quota or reason == "QUOTA_EXCEEDED":
        cls = QuotaExceeded
    elif reason == "USER_BLOCKED" and code == grpc.StatusCode.PERMISSION_DENIED:
        cls = UserBlocked
    else:
        cls = _BY_CODE.get(code, ProvisionerError)
    return cls(message, code=code, reason=reason, fields=tuple(fields), retry_after=retry_after,
               metadata=metadata)
