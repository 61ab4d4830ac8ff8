"""A span for each traced gRPC call, on both sides, without grpc's interceptor machinery on the client.

Any client interceptor puts every call of a grpc.aio channel on grpc's slower intercepted path,
and OpenTelemetry's server interceptor rebuilds the handler and wraps the context of every call:
together they cost the front about a third of its GetSession throughput (docs/performance.md).
Here a channel's multicallables are wrapped instead (one span, the trace context added to the
call's metadata), and each method's handler is wrapped once, as its service is registered. Spans
are named and described as OpenTelemetry's gRPC instrumentation does: the full method as the
name, kind CLIENT or SERVER, `rpc.system`, `rpc.service`, `rpc.method` and
`rpc.grpc.status_code`.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Callable

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

ATTR_STATUS = "rpc.grpc.status_code"


def _attributes(method: str) -> dict[str, str]:
    service, _, rpc = method.lstrip("/").rpartition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc}


def _finish(span: trace.Span, code: grpc.StatusCode, details: str | None, hung_up: bool = False) -> None:
    """Ends the span with the call's status. A call cancelled because its caller hung up (`hung_up`:
    a watch no longer needed, the normal end of `session create --wait`, and the front's call to
    the cluster that it then cancels) is recorded as CANCELLED but not as an error."""
    span.set_attribute(ATTR_STATUS, code.value[0])
    if code != grpc.StatusCode.OK and not (hung_up and code == grpc.StatusCode.CANCELLED):
        span.set_status(Status(StatusCode.ERROR, f"{code.name}: {details or ''}"))
    span.end()


# ---- client ----------------------------------------------------------------------------------

class TracedChannel:
    """`channel` for generated stubs, with a client span per call of a traced method; closing it
    closes `channel`."""

    def __init__(self, channel: grpc.aio.Channel, tracer: trace.Tracer, traced: Callable[[str], bool]):
        self._channel, self._tracer, self._traced = channel, tracer, traced

    async def __aenter__(self) -> TracedChannel:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self, grace: float | None = None) -> None:
        await self._channel.close(grace)

    def _wrap(self, kind: str, method: str, *args, **kwargs):
        inner = getattr(self._channel, kind)(method, *args, **kwargs)
        if not self._traced(method):
            return inner
        return (_UnaryCall if kind == "unary_unary" else _StreamingCall)(inner, method, self._tracer)

    def unary_unary(self, method, *args, **kwargs):
        return self._wrap("unary_unary", method, *args, **kwargs)

    def unary_stream(self, method, *args, **kwargs):
        return self._wrap("unary_stream", method, *args, **kwargs)

    def stream_unary(self, method, *args, **kwargs):
        return self._wrap("stream_unary", method, *args, **kwargs)

    def stream_stream(self, method, *args, **kwargs):
        return self._wrap("stream_stream", method, *args, **kwargs)


class _Traced:
    def __init__(self, inner, method: str, tracer: trace.Tracer):
        self._inner, self._method, self._tracer = inner, method, tracer
        self._attributes = _attributes(method)

    def _start(self, metadata) -> tuple[trace.Span, tuple]:
        span = self._tracer.start_span(self._method, kind=SpanKind.CLIENT, attributes=self._attributes)
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        return span, (*(metadata or ()), *carrier.items())


class _UnaryCall(_Traced):
    """Awaited like grpc's call: the span ends with the answer or the error."""

    async def __call__(self, request, *, metadata=None, **kwargs):
        span, metadata = self._start(metadata)
        try:
            response = await self._inner(request, metadata=metadata, **kwargs)
        except grpc.aio.AioRpcError as err:
            _finish(span, err.code(), err.details())
            raise
        except BaseException:  # cancelled: the call is abandoned, not answered
            _finish(span, grpc.StatusCode.CANCELLED, "cancelled by the caller")
            raise
        _finish(span, grpc.StatusCode.OK, None)
        return response


class _StreamingCall(_Traced):
    """Returns grpc's own call object (iterated, cancelled, written to as usual); the span ends
    when the call does."""

    def __call__(self, *args, metadata=None, **kwargs):
        span, metadata = self._start(metadata)
        call = self._inner(*args, metadata=metadata, **kwargs)
        call.add_done_callback(lambda done: asyncio.ensure_future(_end_streaming(span, done)))
        return call


async def _end_streaming(span: trace.Span, call) -> None:
    try:
        code, details = await call.code(), await call.details()
    except BaseException:  # noqa: BLE001 - the span must end whatever the call says
        code, details = grpc.StatusCode.UNKNOWN, None
    _finish(span, code, details, hung_up=call.cancelled())  # cancelled here: its reader went away


# ---- server ----------------------------------------------------------------------------------

class ServerTracing:
    """A server span per call of a traced method, child of the caller's context in the metadata,
    current while the handler runs. Wraps each method's handler (`wrap`, see api/wrapping.py)."""

    def __init__(self, tracer: trace.Tracer, traced: Callable[[str], bool]):
        self._tracer, self._traced = tracer, traced

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if not self._traced(method):
            return handler
        tracer, attributes = self._tracer, _attributes(method)

        def start(context) -> tuple[trace.Span, object]:
            """The call's span, made current."""
            parent = propagate.extract(dict(context.invocation_metadata() or ()))
            span = tracer.start_span(method, context=parent, kind=SpanKind.SERVER, attributes=attributes)
            return span, otel_context.attach(trace.set_span_in_context(span))

        def end(span: trace.Span, token, context, failed: bool, cancelled: bool = False) -> None:
            """Ended with the status the handler left."""
            otel_context.detach(token)
            code = context.code()
            if code is None and cancelled:  # the caller went away (or the server is stopping)
                code = grpc.StatusCode.CANCELLED
            elif code is None:  # not set by the handler: OK, or UNKNOWN for an escaping error
                code = grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK
            elif not isinstance(code, grpc.StatusCode):
                code = next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
            _finish(span, code, context.details() if code != grpc.StatusCode.OK else None, hung_up=cancelled)

        serde = {"request_deserializer": handler.request_deserializer,
                 "response_serializer": handler.response_serializer}
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request, context):
                span, token = start(context)
                failed = False
                try:
                    return await inner(request, context)
                except BaseException:
                    failed = True
                    raise
                finally:
                    end(span, token, context, failed)

            return grpc.unary_unary_rpc_method_handler(unary, **serde)
        if handler.unary_stream is not None and inspect.isasyncgenfunction(handler.unary_stream):
            inner_stream = handler.unary_stream

            async def stream(request, context):
                span, token = start(context)
                failed = cancelled = False
                try:
                    async for item in inner_stream(request, context):
                        yield item
                except (asyncio.CancelledError, GeneratorExit):
                    cancelled = True
                    raise
                except BaseException:
                    failed = True
                    raise
                finally:
                    end(span, token, context, failed, cancelled)

            return grpc.unary_stream_rpc_method_handler(stream, **serde)
        return handler  # shapes the services here do not serve stay untraced
