"""Maps the error taxonomy to gRPC status with rich details, at the servicer edge only.

Clients get google.rpc.ErrorInfo (reason, domain, field), BadRequest for invalid fields,
RetryInfo when waiting can help, and QuotaFailure for quota errors.
"""

from __future__ import annotations

import asyncio
import functools
import logging

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from provisioner.model.errors import ProvisionerError

DOMAIN = "provisioner.v1"
log = logging.getLogger(__name__)


class RemoteError(ProvisionerError):
    """A status another service of ours returned, passed on to our caller unchanged."""

    def __init__(self, err: grpc.aio.AioRpcError):
        super().__init__(err.details() or "")
        self.code = err.code()
        self.status = rpc_status.from_call(err)
        self.grpc_code = self.code.name
        self.retryable = self.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                       grpc.StatusCode.DEADLINE_EXCEEDED)


def to_status(err: ProvisionerError) -> status_pb2.Status:
    if isinstance(err, RemoteError) and err.status is not None:
        return err.status
    code = grpc.StatusCode[err.grpc_code]
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=err.message)
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=DOMAIN)
    if err.field:
        info.metadata["field"] = err.field
    if getattr(err, "reset_time", None) is not None:  # a quota's: provisioner.client reads it
        reset = Timestamp()
        reset.FromNanoseconds(int(err.reset_time * 1e9))
        info.metadata["reset_time"] = reset.ToJsonString()
    status.details.add().Pack(info)
    if err.field and code is grpc.StatusCode.INVALID_ARGUMENT:
        bad = error_details_pb2.BadRequest()
        bad.field_violations.add(field=err.field, description=err.message)
        status.details.add().Pack(bad)
    if err.reason == "QUOTA_EXCEEDED":
        quota = error_details_pb2.QuotaFailure()
        quota.violations.add(subject=err.field or "user", description=err.message)
        status.details.add().Pack(quota)
    if err.retryable:
        delay = Duration()
        delay.FromMilliseconds(int((err.retry_after_s or 1.0) * 1000))
        status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    return status


def _expired(context: grpc.aio.ServicerContext) -> bool:
    left = context.time_remaining()
    return left is not None and left <= 0


async def abort(context: grpc.aio.ServicerContext, err: ProvisionerError) -> None:
    if _expired(context):
        # The call has already ended DEADLINE_EXCEEDED: a status sent now fails in grpc's core,
        # which logs that as an error with a traceback. End the handler as a cancelled call.
        raise asyncio.CancelledError
    status = rpc_status.to_status(to_status(err))
    await context.abort(status.code, status.details, trailing_metadata=status.trailing_metadata)


def unary(fn):
    """Wraps a unary servicer method: ProvisionerError becomes a rich gRPC status."""

    @functools.wraps(fn)
    async def wrapper(self, request, context):
        try:
            response = await fn(self, request, context)
        except ProvisionerError as err:
            await abort(context, err)
        if _expired(context):  # as in abort: too late to answer
            raise asyncio.CancelledError
        return response

    return wrapper


def stream(fn):
    """The same for a server-streaming method (an async generator)."""

    @functools.wraps(fn)
    async def wrapper(self, request, context):
        try:
            async for item in fn(self, request, context):
                yield item
        except ProvisionerError as err:
            await abort(context, err)

    return wrapper
