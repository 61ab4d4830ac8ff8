"""One trace across every hop of the real fleet, sent by the real OTLP exporter: client, front,
cluster and the simulated cloud; and the CLI's trace joined by the fleet's."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from otlp_receiver import OtlpReceiver, ReceivedSpan, otlp_receiver  # noqa: F401  (fixture)

from conftest import fleet_config, start_fleet
from provisioner.observability import telemetry
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb

CREATE = "/provisioner.v1.SessionService/CreateSession"
ALLOCATE = "/provisioner.v1.ClusterService/Allocate"
PROVISIONER = Path(sys.executable).with_name("provisioner")


def _cold(cluster: dict) -> None:
    # No warm VMs, so a new session has to launch one and the cloud work joins its trace.
    for pool in cluster["pools"]:
        pool.update(min_vms=0, headroom_fraction=0.0)


def _otlp_provider(receiver: OtlpReceiver) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "fleet"}))
    # Exports from its own thread (the receiver is served by this loop), soon after each span ends.
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=receiver.address, insecure=True), schedule_delay_millis=50))
    return provider


def _one(spans: list[ReceivedSpan], name: str, kind: str | None = None) -> ReceivedSpan:
    found = [s for s in spans if s.name == name and (kind is None or s.kind == kind)]
    assert len(found) == 1, f"want one {name} {kind or ''} span, got {len(found)}: {[s.name for s in spans]}"
    return found[0]


def _orphans(trace: list[ReceivedSpan]) -> list[str]:
    """Spans of the trace (root aside) whose parent did not arrive."""
    ids = {s.span_id for s in trace}
    return [f"{s.name} ({s.kind}) -> missing parent {s.parent_span_id}"
            for s in trace if s.parent_span_id is not None and s.parent_span_id not in ids]


@pytest.fixture
async def traced(tmp_path, otlp_receiver):  # noqa: F811
    provider = _otlp_provider(otlp_receiver)
    fleet = await start_fleet(fleet_config(tmp_path, _cold), tmp_path / "data", tracer_provider=provider)
    try:
        yield fleet, provider, otlp_receiver
    finally:
        await fleet.channel.close()
        await fleet.fleet.stop(0.5)
        # Blocks on exports answered by this loop: shut down from another thread.
        await asyncio.to_thread(provider.shutdown)


async def test_one_trace_from_client_to_cloud(traced):
    fleet, provider, receiver = traced
    tracer = provider.get_tracer("test")
    async with telemetry.traced_channel(fleet.front_channel(), provider) as ch:
        sessions = s_grpc.SessionServiceStub(ch)
        spec = pb.SessionSpec(request_id="trace-e2e", user_id="alice", accelerator="gpu-p100",
                              image="gpu:latest", region_hint="us-central1")
        with tracer.start_as_current_span("client") as root:
            created = (await sessions.CreateSession(s_pb.CreateSessionRequest(spec=spec), timeout=10)).session
    assert created.start == pb.START_KIND_COLD
    # Running means the launch and the pull happened.
    updates = await fleet.watch_until(created.id, pb.SESSION_STATE_RUNNING, pb.SESSION_STATE_FAILED)
    assert updates[-1].state == pb.SESSION_STATE_RUNNING

    trace_id = format(root.get_span_context().trace_id, "032x")

    def in_trace(spans):
        return [s for s in spans if s.trace_id == trace_id]

    def complete(spans):
        # The pull's span ends just after the update that said running: wait for it too.
        names = {s.name for s in in_trace(spans)}
        return {"client", ALLOCATE, "cluster.launch", "sim.create", "cluster.pull"} <= names \
            and not _orphans(in_trace(spans))

    assert await asyncio.to_thread(provider.force_flush)
    try:
        await receiver.wait_for(complete, timeout=5)
    except TimeoutError:
        pass  # the assertions below say what is missing
    trace = in_trace(receiver.spans)

    root_span = _one(trace, "client", "INTERNAL")
    assert root_span.parent_span_id is None
    client_rpc = _one(trace, CREATE, "CLIENT")
    front = _one(trace, CREATE, "SERVER")
    to_cluster = _one(trace, ALLOCATE, "CLIENT")
    allocate = _one(trace, ALLOCATE, "SERVER")
    launch = _one(trace, "cluster.launch")
    create = _one(trace, "sim.create")
    assert not _orphans(trace), _orphans(trace)

    # From the cloud call up to the client's root: every hop, in order, nothing lost between.
    by_id = {s.span_id: s for s in trace}
    chain, span = [], create
    while span is not None:
        chain.append(span)
        span = by_id.get(span.parent_span_id)
    hops = [root_span, client_rpc, front, to_cluster, allocate, launch, create]
    assert [(s.name, s.kind) for s in chain[::-1]] == [(s.name, s.kind) for s in hops]
    assert [s.span_id for s in chain[::-1]] == [s.span_id for s in hops]
    assert {"sim.wait_ready", "cluster.pull", "sim.pull"} <= {s.name for s in trace}

    attrs = allocate.attributes
    assert attrs[telemetry.ATTR_SESSION_ID] == created.id
    assert attrs[telemetry.ATTR_CLUSTER] == created.cluster == "us-central1"
    assert attrs[telemetry.ATTR_POOL] == "gpu-p100"
    assert attrs[telemetry.ATTR_IMAGE] == created.image
    assert attrs[telemetry.ATTR_START] == "cold"
    assert launch.attributes[telemetry.ATTR_SESSION_ID] == created.id
    assert create.attributes["provisioner.vm_id"] == created.vm_id


async def test_cli_trace_is_joined_by_the_fleet(traced):
    fleet, provider, receiver = traced
    env = {**os.environ, telemetry.ENV_OTLP_ENDPOINT: receiver.endpoint, "PROVISIONER_DATA_DIR": str(fleet.data_dir)}
    proc = await asyncio.create_subprocess_exec(
        str(PROVISIONER), "--traces", "otlp", "session", "create", "--front", fleet.front_address,
        "--user", "bob", "--accelerator", "gpu-p100", "--image", "gpu:latest", "--json",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    # The CLI names its trace on stderr so an operator can find it.
    trace_id = next(ln.split()[-1] for ln in err.decode().splitlines() if ln.startswith("trace: "))

    def services(spans):
        return {s.service for s in spans if s.trace_id == trace_id}

    assert await asyncio.to_thread(provider.force_flush)
    spans = await receiver.wait_for(lambda got: {"provisioner-cli", "fleet"} <= services(got), timeout=5)
    trace = [s for s in spans if s.trace_id == trace_id]
    cli_root = _one(trace, "cli session create", "INTERNAL")
    assert cli_root.parent_span_id is None and cli_root.service == "provisioner-cli"
    cli_rpc = _one(trace, CREATE, "CLIENT")
    front = _one(trace, CREATE, "SERVER")
    to_cluster = _one(trace, ALLOCATE, "CLIENT")
    allocate = _one(trace, ALLOCATE, "SERVER")
    assert cli_rpc.service == "provisioner-cli" and front.service == allocate.service == "fleet"
    # Only the request's hops: the cloud work it started may still be running (spans not ended).
    hops = [cli_root, cli_rpc, front, to_cluster, allocate]
    assert [s.parent_span_id for s in hops[1:]] == [s.span_id for s in hops[:-1]]
    assert allocate.attributes[telemetry.ATTR_SESSION_ID] in out.decode()
