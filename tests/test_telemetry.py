"""Tracing: context crosses gRPC hops, probes are not traced, the file exporter and trace view."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_receiver import OtlpReceiver, otlp_receiver  # noqa: F401  (fixture)

from provisioner.observability import telemetry
from provisioner.api.wrapping import WrappingServer
from provisioner.config import ConfigError, default_clusters_dir, load_fleet
from provisioner.observability.telemetry import (
    ATTR_CLUSTER,
    ATTR_IMAGE,
    ATTR_POOL,
    ATTR_SESSION_ID,
    ATTR_START,
    JsonLinesSpanExporter,
    server_wrappers,
    setup_tracing,
)
from provisioner.observability.traceview import find_traces, load_spans, render_tree

FRONT_METHOD = "/test.Front/Create"
CLUSTER_METHOD = "/test.Cluster/Allocate"


def _bytes_method(path: str, behavior) -> grpc.GenericRpcHandler:
    service, method = path.strip("/").split("/")
    return grpc.method_handlers_generic_handler(service, {method: grpc.unary_unary_rpc_method_handler(behavior)})


async def _serve(provider, *handlers: grpc.GenericRpcHandler, extra=None):
    server = grpc.aio.server()
    WrappingServer(server, server_wrappers(provider)).add_generic_rpc_handlers(handlers)
    if extra:
        extra(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def _channel(provider, target: str) -> grpc.aio.Channel:
    return telemetry.traced_channel(grpc.aio.insecure_channel(target), provider)


@pytest.fixture
def memory_provider():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


async def test_one_trace_across_two_hops_via_otlp(otlp_receiver: OtlpReceiver):  # noqa: F811
    provider = TracerProvider(resource=Resource.create({"service.name": "test"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_receiver.address, insecure=True)))
    tracer = provider.get_tracer("test")
    seen_metadata = {}

    async def allocate(request, context):
        seen_metadata.update(context.invocation_metadata())
        with tracer.start_as_current_span("cluster.assign") as span:
            span.set_attribute(ATTR_CLUSTER, "us-central1")
        return b"vm-1:" + request

    cluster, cluster_addr = await _serve(provider, _bytes_method(CLUSTER_METHOD, allocate))
    to_cluster = _channel(provider, cluster_addr)

    async def create(request, context):
        return await to_cluster.unary_unary(CLUSTER_METHOD)(request)

    front, front_addr = await _serve(provider, _bytes_method(FRONT_METHOD, create))
    try:
        async with _channel(provider, front_addr) as ch:
            with tracer.start_as_current_span("client.root"):
                assert await ch.unary_unary(FRONT_METHOD)(b"s1") == b"vm-1:s1"
        # The exporter is synchronous and the receiver runs on this loop: flush elsewhere.
        assert await asyncio.to_thread(provider.force_flush)
        spans = await otlp_receiver.wait_for(lambda got: len(got) >= 6)
    finally:
        await to_cluster.close()
        await front.stop(None)
        await cluster.stop(None)
        provider.shutdown()

    assert "traceparent" in seen_metadata
    assert {s.trace_id for s in spans} == {spans[0].trace_id}
    by_id = {s.span_id: s for s in spans}
    assert len(by_id) == 6
    (root,) = [s for s in spans if s.parent_span_id is None]
    assert root.name == "client.root"
    assert all(s.parent_span_id in by_id for s in spans if s is not root)

    # Walk from the innermost span up to the root: the whole chain, in hop order.
    (inner,) = [s for s in spans if s.name == "cluster.assign"]
    chain, span = [], inner
    while span is not None:
        chain.append((span.name, span.kind))
        span = by_id.get(span.parent_span_id)
    assert chain[::-1] == [
        ("client.root", "INTERNAL"),
        (FRONT_METHOD, "CLIENT"),
        (FRONT_METHOD, "SERVER"),
        (CLUSTER_METHOD, "CLIENT"),
        (CLUSTER_METHOD, "SERVER"),
        ("cluster.assign", "INTERNAL"),
    ]
    assert inner.attributes[ATTR_CLUSTER] == "us-central1"
    assert {s.service for s in spans} == {"test"}


async def test_health_checks_are_not_traced(memory_provider):
    provider, exporter = memory_provider

    async def ping(request, context):
        return request

    def add_health(server):
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)

    server, addr = await _serve(provider, _bytes_method("/test.Echo/Ping", ping), extra=add_health)
    try:
        async with _channel(provider, addr) as ch:
            reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            assert await ch.unary_unary("/test.Echo/Ping")(b"x") == b"x"
    finally:
        await server.stop(None)

    # Only the control call is traced, on both sides.
    assert sorted((s.name, s.kind.name) for s in exporter.get_finished_spans()) == [
        ("/test.Echo/Ping", "CLIENT"),
        ("/test.Echo/Ping", "SERVER"),
    ]


async def test_abort_and_server_streaming_pass_through(memory_provider):
    provider, exporter = memory_provider

    async def get(request, context):
        await context.abort(grpc.StatusCode.NOT_FOUND, "no such session")

    async def watch(request, context):
        for i in range(3):
            yield bytes([i])

    handler = grpc.method_handlers_generic_handler(
        "test.S",
        {"Get": grpc.unary_unary_rpc_method_handler(get), "Watch": grpc.unary_stream_rpc_method_handler(watch)},
    )
    server, addr = await _serve(provider, handler)
    try:
        async with _channel(provider, addr) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ch.unary_unary("/test.S/Get")(b"")
            assert err.value.code() == grpc.StatusCode.NOT_FOUND and err.value.details() == "no such session"
            assert [m async for m in ch.unary_stream("/test.S/Watch")(b"")] == [b"\x00", b"\x01", b"\x02"]
    finally:
        await server.stop(None)

    spans = {(s.name, s.kind.name): s for s in exporter.get_finished_spans()}
    assert len(spans) == 4
    assert spans["/test.S/Get", "CLIENT"].attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert spans["/test.S/Get", "CLIENT"].status.status_code == trace.StatusCode.ERROR
    for name in ("/test.S/Get", "/test.S/Watch"):
        assert spans[name, "SERVER"].parent.span_id == spans[name, "CLIENT"].context.span_id


@pytest.mark.parametrize(
    ("method", "traced"),
    [
        ("/grpc.health.v1.Health/Watch", False),
        ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", False),
        ("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", False),
        ("/opentelemetry.proto.collector.trace.v1.TraceService/Export", False),
        ("/provisioner.v1.SessionService/CreateSession", True),
    ],
)
def test_filter(method, traced):
    assert telemetry.is_traced(method) is traced


def _write_sample_traces(path):
    provider = TracerProvider(resource=Resource.create({"service.name": "front"}))
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    t = provider.get_tracer("test")
    with t.start_as_current_span("CreateSession", attributes={ATTR_SESSION_ID: "s-1"}) as root:
        with t.start_as_current_span("Allocate", kind=trace.SpanKind.CLIENT) as alloc:
            alloc.set_attribute(ATTR_CLUSTER, "us-central1")
            with t.start_as_current_span(
                "assign", attributes={ATTR_POOL: "gpu-p100", ATTR_IMAGE: "gpu:v154", ATTR_START: "warm"}
            ) as assign:
                assign.add_event("vm.assigned", {"vm": "vm-7"})
        with t.start_as_current_span("record"):
            pass
    # A span whose parent lives in a process that did not record it.
    remote = trace.SpanContext(
        root.get_span_context().trace_id, 0xABC, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)
    )
    with t.start_as_current_span("late", context=trace.set_span_in_context(trace.NonRecordingSpan(remote))):
        pass
    with t.start_as_current_span("other", attributes={ATTR_SESSION_ID: "s-2"}):
        pass
    provider.shutdown()
    return f"{root.get_span_context().trace_id:032x}"


def test_file_exporter_and_trace_view(tmp_path):
    path = tmp_path / "spans.jsonl"
    trace_id = _write_sample_traces(path)
    with path.open("a") as f:
        f.write('{"trace_id": "torn')  # a writer killed mid-line

    first = json.loads(path.read_text().splitlines()[0])
    fields = "trace_id span_id parent_span_id name kind start_ns end_ns status attributes events service"
    assert set(first) == set(fields.split())
    assert first["service"] == "front"

    spans = load_spans(path)
    assert len(spans) == 6
    assert find_traces(spans, "s-1") == [trace_id]
    assert len(find_traces(spans, "s-2")) == 1 and find_traces(spans, "s-2") != [trace_id]
    assert find_traces(spans, "nope") == []

    tree = render_tree(spans, trace_id)
    lines = tree.splitlines()
    assert lines[0] == f"trace {trace_id} (durations and offsets in wall-clock ms)"
    body = [ln for ln in lines[1:] if not ln.lstrip().startswith("*")]
    names = [(len(ln) - len(ln.lstrip()), ln.split()[0]) for ln in body]
    assert names == [(2, "CreateSession"), (4, "Allocate"), (6, "assign"), (4, "record"), (2, "late")]
    assert "session=s-1" in body[0] and " ms]" in body[0]
    assert "client" in body[1] and "cluster=us-central1" in body[1]
    assert "pool=gpu-p100 image=gpu:v154 start=warm" in body[2]
    assert body[4].endswith("(parent not recorded)")
    event = lines[lines.index(body[2]) + 1]
    assert event.lstrip().startswith("* vm.assigned") and "vm=vm-7" in event
    assert render_tree(spans, "0" * 32).startswith("no spans")


def test_load_spans_rejects_a_bad_middle_line(tmp_path):
    path = tmp_path / "spans.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(ValueError, match="line 2"):
        load_spans(path)


def test_setup_tracing_rejects_unknown_exporter(monkeypatch):
    with pytest.raises(ValueError, match="none, console, otlp, file"):
        setup_tracing("svc", exporter="jaeger")
    monkeypatch.setenv("PROVISIONER_TRACES", "zipkin")
    with pytest.raises(ValueError, match="zipkin"):
        setup_tracing("svc")


def test_setup_tracing_twice_and_file_from_env(monkeypatch, tmp_path):
    first = setup_tracing("svc", exporter="none")
    assert not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    monkeypatch.setenv("PROVISIONER_TRACES", "file")
    path = tmp_path / "t.jsonl"
    second = setup_tracing("svc2", file_path=path)  # does not replace the global provider
    assert second is not first and trace.get_tracer_provider() is not second
    with second.get_tracer("x").start_as_current_span("hello"):
        pass
    telemetry.shutdown_tracing(second)
    (span,) = load_spans(path)
    assert span["name"] == "hello" and span["service"] == "svc2" and span["parent_span_id"] is None


def _sampled_provider(ratio: float | None) -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = setup_tracing("svc", exporter="none", sample_ratio=ratio)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_sampling_is_decided_where_a_trace_starts(memory_provider):
    """A server recording no new traces (ratio 0) still records a call that arrives in a sampled
    trace; one recording all (ratio 1) records a call that arrives with no trace."""
    caller, caller_spans = memory_provider  # samples every trace it starts
    none_provider, none_spans = _sampled_provider(0.0)
    all_provider, all_spans = _sampled_provider(1.0)

    async def echo(request: bytes, context) -> bytes:
        return request

    servers = []
    try:
        for provider in (none_provider, all_provider):
            servers.append(await _serve(provider, _bytes_method(CLUSTER_METHOD, echo)))
        (none_server, none_addr), (all_server, all_addr) = servers
        for target in (none_addr, all_addr):
            async with _channel(caller, target) as traced, grpc.aio.insecure_channel(target) as untraced:
                assert await traced.unary_unary(CLUSTER_METHOD)(b"x") == b"x"
                assert await untraced.unary_unary(CLUSTER_METHOD)(b"y") == b"y"
    finally:
        for server, _ in servers:
            await server.stop(None)
    traced_ids = {s.context.trace_id for s in caller_spans.get_finished_spans()}
    assert len(traced_ids) == 2
    # Ratio 0: only the call that came in a sampled trace.
    (joined,) = none_spans.get_finished_spans()
    assert joined.context.trace_id in traced_ids
    # Ratio 1: both calls, the untraced one as the root of a trace of its own.
    assert len(all_spans.get_finished_spans()) == 2
    assert {s.parent is None for s in all_spans.get_finished_spans()} == {True, False}


def test_sample_ratio_from_argument_env_or_default(monkeypatch):
    assert telemetry.sample_ratio_from(None) == 1.0
    assert telemetry.sample_ratio_from(None, "0.25") == 0.25
    assert telemetry.sample_ratio_from(0.5, "0.25") == 0.5
    for bad, why in (("2", "between 0 and 1"), ("lots", "not a number")):
        with pytest.raises(ValueError, match=why):
            telemetry.sample_ratio_from(None, bad)
    monkeypatch.setenv(telemetry.ENV_SAMPLE, "0")
    provider, spans = _sampled_provider(None)
    with provider.get_tracer("t").start_as_current_span("dropped"):
        pass
    assert spans.get_finished_spans() == ()


def test_servers_refuse_a_bad_sample_ratio_from_flag_env_or_config(tmp_path):
    clusters = tmp_path / "clusters"
    shutil.copytree(default_clusters_dir(), clusters)
    fleet = yaml.safe_load((clusters / "fleet.yaml").read_text())
    assert load_fleet(clusters).settings.tracing.sample_ratio == 1.0
    for ratio, ok in ((0.25, True), (1.5, False)):
        (clusters / "fleet.yaml").write_text(yaml.safe_dump({**fleet, "tracing": {"sample_ratio": ratio}}))
        if ok:
            assert load_fleet(clusters).settings.tracing.sample_ratio == ratio
        else:
            with pytest.raises(ConfigError, match="sample_ratio"):
                load_fleet(clusters)
    cli = "import sys; from provisioner.cli import main; sys.exit(main())"
    for args, env, why in ((["--trace-sample", "2"], {}, "between 0 and 1"),
                           ([], {telemetry.ENV_SAMPLE: "abc"}, "not a number")):
        out = subprocess.run([sys.executable, "-c", cli, "serve", "front", "--data-dir", str(tmp_path / "data"), *args],
                             env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and why in out.stderr
