"""An in-process OTLP/gRPC trace receiver, so tests can check what the real exporter sends.

Import from test modules as `from otlp_receiver import OtlpReceiver, otlp_receiver`: pytest puts
this directory on sys.path because tests/ is not a package. Importing the fixture name into a
test module makes it available there.

The OTLP exporter is synchronous. When the receiver is served by the test's event loop, flush
the provider from another thread (`await asyncio.to_thread(provider.force_flush)`), or the
export blocks the very loop that would answer it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest_asyncio
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def _value(v: AnyValue):
    field = v.WhichOneof("value")
    if field == "array_value":
        return [_value(x) for x in v.array_value.values]
    if field == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, field) if field else None


@dataclass(frozen=True)
class ReceivedSpan:
    service: str | None
    scope: str
    span: Span

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_span_id(self) -> str | None:
        return self.span.parent_span_id.hex() or None

    @property
    def kind(self) -> str:
        # SPAN_KIND_SERVER -> "SERVER", matching the file exporter's spelling
        return Span.SpanKind.Name(self.span.kind).removeprefix("SPAN_KIND_")

    @property
    def attributes(self) -> dict:
        return {kv.key: _value(kv.value) for kv in self.span.attributes}


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver):
        self._receiver = receiver

    async def Export(self, request, context):
        for rs in request.resource_spans:
            service = next(
                (kv.value.string_value for kv in rs.resource.attributes if kv.key == "service.name"), None
            )
            for ss in rs.scope_spans:
                for span in ss.spans:
                    self._receiver.spans.append(ReceivedSpan(service, ss.scope.name, span))
        self._receiver._changed.set()
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.spans: list[ReceivedSpan] = []
        self._host, self._port = host, port
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Event()

    @property
    def address(self) -> str:
        """host:port, for OTLPSpanExporter(endpoint=..., insecure=True)."""
        return f"{self._host}:{self._port}"

    @property
    def endpoint(self) -> str:
        """http://host:port, for OTEL_EXPORTER_OTLP_ENDPOINT or setup_tracing(endpoint=...)."""
        return f"http://{self.address}"

    async def start(self) -> OtlpReceiver:
        self._server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Collector(self), self._server)
        self._port = self._server.add_insecure_port(f"{self._host}:{self._port}")
        await self._server.start()
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    async def __aenter__(self) -> OtlpReceiver:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 10.0
    ) -> list[ReceivedSpan]:
        """Wait until predicate(spans) holds; TimeoutError lists what did arrive."""
        async def poll():
            while not predicate(self.spans):
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(poll(), timeout)
        except TimeoutError:
            names = [s.name for s in self.spans]
            raise TimeoutError(f"condition not met in {timeout}s; received {len(names)} spans: {names}") from None
        return self.spans


@pytest_asyncio.fixture
async def otlp_receiver():
    async with OtlpReceiver() as receiver:
        yield receiver
