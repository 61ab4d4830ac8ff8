"""`provisioner trace` shows a session's spans from the file the services write, no extra tools."""

from __future__ import annotations

import asyncio

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from conftest import fleet_config, start_fleet
from provisioner.cli import main
from provisioner.observability.telemetry import ATTR_SESSION_ID, JsonLinesSpanExporter
from provisioner.v1 import types_pb2 as pb


async def test_trace_command_renders_the_session_tree(tmp_path, capsys):
    spans_file = tmp_path / "traces.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(spans_file)))

    def cold(cluster: dict) -> None:
        for pool in cluster["pools"]:
            pool.update(min_vms=0, headroom_fraction=0.0)

    fleet = await start_fleet(fleet_config(tmp_path, cold), tmp_path / "data", tracer_provider=provider)
    try:
        session = await fleet.create(image="gpu:v158", region_hint="asia-east1", region_required=True)
        await fleet.watch_until(session.id, pb.SESSION_STATE_RUNNING)
    finally:
        await fleet.channel.close()
        await fleet.fleet.stop(0.5)
    await asyncio.to_thread(provider.shutdown)

    assert main(["trace", session.id, "--file", str(spans_file)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    # Front, then cluster, then the cloud work, each nested under the one before.
    order = ["SessionService/CreateSession", "ClusterService/Allocate", "cluster.launch", "sim.create"]
    positions = [next(i for i, line in enumerate(lines) if name in line) for name in order]
    assert positions == sorted(positions)
    indents = [len(lines[i]) - len(lines[i].lstrip()) for i in positions]
    assert indents == sorted(indents) and indents[0] < indents[-1]
    assert f"session={session.id}" in out and "start=cold" in out and "cluster=asia-east1" in out


def test_trace_command_explains_a_missing_file(tmp_path, capsys):
    assert main(["trace", "us-central1.s-x", "--file", str(tmp_path / "none.jsonl")]) == 1
    assert "no span file" in capsys.readouterr().err


def test_trace_command_finds_a_session_across_rotated_files(tmp_path, capsys):
    """A session whose first spans went to a file since rotated, and whose last are in the current one."""
    spans_file = tmp_path / "traces.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(spans_file, max_bytes=3000, backups=3)))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("CreateSession", attributes={ATTR_SESSION_ID: "s-1"}):
        with tracer.start_as_current_span("Allocate"):
            pass
    for i in range(10):  # other sessions' spans push those into a rotated file
        with tracer.start_as_current_span("GetSession", attributes={ATTR_SESSION_ID: f"other-{i}"}):
            pass
    with tracer.start_as_current_span("StopSession", attributes={ATTR_SESSION_ID: "s-1"}):
        pass
    provider.shutdown()
    assert "CreateSession" not in spans_file.read_text() and "StopSession" in spans_file.read_text()

    assert main(["trace", "s-1", "--file", str(spans_file)]) == 0
    out = capsys.readouterr().out
    assert out.count("trace ") == 2 and "CreateSession" in out and "Allocate" in out and "StopSession" in out
    assert out.index("CreateSession") < out.index("StopSession")
