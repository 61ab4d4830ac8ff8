"""A server stream whose client goes away while it waits on a write is closed in the call's own
task (telemetry._StreamsCloseInTheirCall), so context variables it set can be reset."""

from __future__ import annotations

import asyncio
import contextvars

import grpc

from provisioner.telemetry import server_interceptors

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

    async def continuation(details):
        return handler

    wrapped = await server_interceptors()[0].intercept_service(continuation, None)
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

    async def continuation(details):
        return handler

    assert await server_interceptors()[0].intercept_service(continuation, None) is handler
