"""Calls whose client is gone end quietly.

A server stream whose client goes away while it waits on a write is closed in the call's own
task (telemetry._streams_close_in_their_call), so context variables it set can be reset; and the
guard's stream, which the tracing wrapper above it leaves to asyncio's finalizer, closes cleanly
from another task. Likewise a call past its deadline ends without sending a status. Each of these
logged a traceback under the fuzzer (test_fuzz_api.py)."""

from __future__ import annotations

import asyncio
import contextvars

import grpc
import pytest

from provisioner.api import status
from provisioner.api.guard import Guard
from provisioner.model.errors import InvalidArgument
from provisioner.security.auth import CLUSTER_SERVICE, FRONT, Caller, with_cluster_service
from provisioner.observability.telemetry import server_wrappers
from provisioner.v1 import cluster_service_pb2 as cluster_pb

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_stream_var", default="")


class StuckWriter:
    """A servicer context whose client stopped reading: every write waits forever."""

    def __init__(self):
        self.writes = 0

    async def write(self, item) -> None:
        self.writes += 1
        await asyncio.Event().wait()


async def test_a_stream_cancelled_on_a_write_is_closed_in_its_own_task():
    closed: list[str] = []

    async def watch(request, context):
        token = VAR.set("caller")
        try:
            yield "first"
            yield "second"
        finally:
            VAR.reset(token)  # raises ValueError if run in another task's context
            closed.append("closed")

    handler = grpc.unary_stream_rpc_method_handler(watch)

    wrapped = server_wrappers()[0]("/test.Test/Watch", handler)
    context = StuckWriter()
    call = asyncio.create_task(wrapped.unary_stream(b"", context))
    while not context.writes:
        await asyncio.sleep(0)
    call.cancel()
    await asyncio.wait([call])
    assert call.cancelled()
    assert closed == ["closed"]


async def test_other_handlers_are_left_alone():
    async def unary(request, context):
        return b""

    handler = grpc.unary_unary_rpc_method_handler(unary)

    assert server_wrappers()[0]("/test.Test/Unary", handler) is handler


async def test_a_guarded_stream_may_be_closed_from_another_task():
    """As asyncio's finalizer does when a wrapper above drops the guard's stream unclosed."""

    async def identify(context):
        return Caller("front", frozenset({FRONT}), "certificate")

    guard = Guard(with_cluster_service({}, ["Watch"]), identify)

    async def watch(request, context):
        yield "first"
        yield "second"

    handler = grpc.unary_stream_rpc_method_handler(watch, request_deserializer=cluster_pb.WatchRequest.FromString)

    wrapped = guard.wrap(CLUSTER_SERVICE + "Watch", handler)
    stream = wrapped.unary_stream(b"", None)
    assert await asyncio.create_task(stream.__anext__()) == "first"
    await asyncio.create_task(stream.aclose())
    assert guard._streams == {}  # the open-stream count came back down


class LateContext:
    """A servicer context whose deadline has passed: grpc's core has already ended the call."""

    def __init__(self, left: float | None):
        self.left = left
        self.aborted = []

    def time_remaining(self) -> float | None:
        return self.left

    async def abort(self, code, details, trailing_metadata=()):
        self.aborted.append(code)
        raise RuntimeError("aborted")


async def test_a_call_past_its_deadline_ends_as_cancelled_without_sending_a_status():
    """Sending a status (error or answer) for a call grpc has already ended fails in its core,
    which logs an error with a traceback."""

    class Servicer:
        @status.unary
        async def Refuse(self, request, context):
            raise InvalidArgument("bad", field="x")

        @status.unary
        async def Answer(self, request, context):
            return "answer"

    late = LateContext(0.0)
    for method in (Servicer().Refuse, Servicer().Answer):
        with pytest.raises(asyncio.CancelledError):
            await method(None, late)
    assert late.aborted == []

    in_time = LateContext(5.0)
    assert await Servicer().Answer(None, in_time) == "answer"
    with pytest.raises(RuntimeError):
        await Servicer().Refuse(None, in_time)
    assert in_time.aborted == [grpc.StatusCode.INVALID_ARGUMENT]
    assert await Servicer().Answer(None, LateContext(None)) == "answer"  # no deadline at all
