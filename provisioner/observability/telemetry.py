"""OpenTelemetry tracing: one trace follows a request from the client through the front, the
cluster and every cloud call.

W3C trace context travels in gRPC metadata, carried by `provisioner.observability.rpc_tracing` on the servers
and the front's channels (a span per call on each side, named and described as OpenTelemetry's
gRPC instrumentation names them) and by that instrumentation in the CLI. The exporter is chosen
per process: none, console, otlp (OTLP over gRPC) or file (JSON lines, readable with `provisioner.observability.traceview`). Spans leave
through a batch processor for every exporter, so exporting never runs on the request path; a
trace is kept or dropped where it starts (a ratio of new traces) and every hop follows that
choice, carried in the trace context.

The local fleet runs the front and every cluster in one OS process with one provider, so
service.name alone does not say which hop a span belongs to: span names (the gRPC method) and
the attributes below (ATTR_CLUSTER above all) do.
"""

from __future__ import annotations

import fcntl
import inspect
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

import grpc
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from provisioner.observability import rpc_tracing
from provisioner.common.private_files import open_private

# Span attribute keys for the domain.
ATTR_SESSION_ID = "session.id"
ATTR_CLUSTER = "provisioner.cluster"
ATTR_POOL = "provisioner.pool"
ATTR_IMAGE = "provisioner.image"
ATTR_START = "provisioner.start_kind"
ATTR_REQUEST_ID = "provisioner.request_id"
ATTR_USER = "enduser.id"
ATTR_VM_ID = "provisioner.vm_id"
# A List: the sessions that matched it, and those on the page answered.
ATTR_MATCHED = "provisioner.sessions_matched"
ATTR_LISTED = "provisioner.sessions_listed"

EXPORTERS = ("none", "console", "otlp", "file")
ENV_EXPORTER = "PROVISIONER_TRACES"
ENV_FILE = "PROVISIONER_TRACES_FILE"
ENV_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
DEFAULT_OTLP_ENDPOINT = "http://127.0.0.1:4317"
DEFAULT_FILE = "provisioner-traces.jsonl"
ENV_FILE_MAX_BYTES = "PROVISIONER_TRACES_MAX_BYTES"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024  # per file; with 3 rotated files at most 256 MiB of spans
DEFAULT_BACKUPS = 3
ENV_SAMPLE = "PROVISIONER_TRACE_SAMPLE"
# Spans encoded per export, unless OTEL_BSP_MAX_EXPORT_BATCH_SIZE says otherwise (the SDK reads
# and checks it). The exporter's thread holds the GIL while it encodes: the SDK's 512 at once held
# every call in flight for about 5 ms (GetSession's p99 at 8 in flight went from 10-12 ms to 8 ms).
ENV_EXPORT_BATCH = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
EXPORT_BATCH = 64

# Calls that are not part of any request: probes, tooling, and the OTLP exporter's own export
# (tracing the export would feed itself).
_UNTRACED_SERVICE_PREFIXES = ("grpc.health.v1.Health", "grpc.reflection", "opentelemetry.proto.collector")


def is_traced(method: str) -> bool:
    """True if calls of `method` ("/package.Service/Method") get spans."""
    return not method.lstrip("/").startswith(_UNTRACED_SERVICE_PREFIXES)


# One encoder for every span: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(default=str)


class JsonLinesSpanExporter(SpanExporter):
    """Appends one JSON object per finished span to a file, rotated by size: when a write would
    take it past `max_bytes`, the file becomes `<name>.1` (`.1` becomes `.2` ..., the oldest beyond
    `backups` is dropped). Several processes may share the file (a fleet started from one data
    dir): appends and rotations are serialized by a lock file beside it."""

    def __init__(self, path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS):
        self.path = Path(path)
        self.max_bytes, self.backups = max_bytes, backups
        # The batch processor exports from its own thread; console/simple from the caller's.
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = "".join(_ENCODER.encode(span_to_dict(s)) + "\n" for s in spans).encode()
        try:
            with self._lock, open_private(self.path.with_name(self.path.name + ".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                size = self.path.stat().st_size if self.path.exists() else 0
                if size and size + len(data) > self.max_bytes:
                    self._rotate()
                with open_private(self.path, "ab") as f:
                    f.write(data)
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _rotate(self) -> None:
        for i in range(self.backups - 1, 0, -1):
            older = rotated(self.path, i)
            if older.exists():
                older.replace(rotated(self.path, i + 1))
        if self.backups:
            self.path.replace(rotated(self.path, 1))
        else:
            self.path.unlink()

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def rotated(path: Path, n: int) -> Path:
    """The n-th rotated span file (1: the newest)."""
    return path.with_name(f"{path.name}.{n}")


def span_to_dict(span: ReadableSpan) -> dict:
    ctx = span.get_span_context()
    return {
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "name": span.name,
        "kind": span.kind.name,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": {"code": span.status.status_code.name, "description": span.status.description},
        "attributes": dict(span.attributes or {}),
        "events": [
            {"name": e.name, "time_ns": e.timestamp, "attributes": dict(e.attributes or {})}
            for e in span.events
        ],
        "service": span.resource.attributes.get(SERVICE_NAME),
    }


def setup_tracing(
    service_name: str,
    exporter: str | None = None,
    endpoint: str | None = None,
    file_path: str | Path | None = None,
    sample_ratio: float | None = None,
) -> TracerProvider:
    """Build a provider for this process and make it the global one if none is set yet.

    `sample_ratio` (default: $PROVISIONER_TRACE_SAMPLE, else 1) is the share of traces started
    here that are recorded; a trace that came with the call's context keeps its caller's choice.
    A later call (several services in one process, tests) gets a working provider that is not
    global; pass it explicitly to `server_wrappers` / `traced_channel`.
    """
    kind = (exporter or os.environ.get(ENV_EXPORTER) or "none").strip().lower()
    if kind not in EXPORTERS:
        raise ValueError(f"unknown trace exporter {kind!r}; allowed: {', '.join(EXPORTERS)}")
    ratio = sample_ratio_from(sample_ratio, os.environ.get(ENV_SAMPLE))
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}),
                              sampler=ParentBased(TraceIdRatioBased(ratio)))
    if kind == "console":
        provider.add_span_processor(_batched(ConsoleSpanExporter()))
    elif kind == "file":
        path = file_path or os.environ.get(ENV_FILE) or DEFAULT_FILE
        max_bytes = int(os.environ.get(ENV_FILE_MAX_BYTES) or DEFAULT_MAX_BYTES)
        provider.add_span_processor(_batched(JsonLinesSpanExporter(path, max_bytes)))
    elif kind == "otlp":
        # Imported here: it pulls in the OTLP protos, which "none" and "file" do not need.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # noqa: PLC0415

        url = endpoint or os.environ.get(ENV_OTLP_ENDPOINT) or DEFAULT_OTLP_ENDPOINT
        insecure = {"http": True, "https": False}.get(urlparse(url).scheme)
        provider.add_span_processor(_batched(OTLPSpanExporter(endpoint=url, insecure=insecure)))
    # The API allows one global provider per process and only warns on a second set.
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    return provider


def _batched(exporter: SpanExporter) -> BatchSpanProcessor:
    """`exporter` behind a batch processor (its own thread), EXPORT_BATCH spans per export."""
    return BatchSpanProcessor(exporter, max_export_batch_size=None if os.environ.get(ENV_EXPORT_BATCH)
                              else EXPORT_BATCH)


def sample_ratio_from(given: float | str | None, env: str | None = None) -> float:
    """The sampling ratio: `given`, else `env`, else 1 (every trace); a share from 0 to 1."""
    value = given if given is not None else env if env not in (None, "") else 1.0
    try:
        ratio = float(value)
    except ValueError:
        raise ValueError(f"trace sample ratio {value!r} is not a number") from None
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"trace sample ratio must be between 0 and 1, got {ratio:g}")
    return ratio


def shutdown_tracing(provider: TracerProvider | None) -> None:
    """Export what is buffered, then stop. Blocks: with an OTLP receiver served by this
    thread's event loop, call it from another thread (asyncio.to_thread)."""
    if provider is None:
        return
    provider.force_flush()
    provider.shutdown()


def _streams_close_in_their_call(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """Serves server streams through the write API instead of handing grpc the generator.

    When a client goes away while a stream waits on a write, grpc drops the generator unclosed
    and asyncio's finalizer closes it later in a task of its own, where resetting the context
    variables the stream set (the span OpenTelemetry attached, the caller) fails with a logged
    traceback. Here the generator is closed in the call's own task."""
    if not inspect.isasyncgenfunction(handler.unary_stream):
        return handler
    inner = handler.unary_stream

    async def behavior(request, context):
        stream = inner(request, context)
        try:
            async for item in stream:
                await context.write(item)
        finally:
            await stream.aclose()

    return grpc.unary_stream_rpc_method_handler(behavior, request_deserializer=handler.request_deserializer,
                                                response_serializer=handler.response_serializer)


def server_wrappers(tracer_provider: TracerProvider | None = None) -> list:
    """Handler wrappers for api/wrapping.py, outermost first: one server span per traced call,
    child of the caller's context from the metadata."""
    return [_streams_close_in_their_call, rpc_tracing.ServerTracing(_tracer(tracer_provider), is_traced).wrap]


def traced_channel(channel: grpc.aio.Channel, tracer_provider: TracerProvider | None = None) -> rpc_tracing.TracedChannel:
    """`channel` for stubs: one client span per traced call, its context sent in the metadata.
    No client interceptor: grpc.aio runs every call of an intercepted channel on a slower path."""
    return rpc_tracing.TracedChannel(channel, _tracer(tracer_provider), is_traced)


def _tracer(provider: TracerProvider | None) -> trace.Tracer:
    return trace.get_tracer("provisioner.rpc", tracer_provider=provider)

