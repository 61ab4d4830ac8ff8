"""A data dir is its owner's alone: the audit log, every session, the spans and the keys are in it,
and anyone else on the host must read none of it, whatever the umask the process started with."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from conftest import cluster_channel
from provisioner.config import default_clusters_dir
from provisioner.store import SqliteStore
from provisioner.observability.telemetry import JsonLinesSpanExporter
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import cluster_service_pb2_grpc as cluster_grpc
from provisioner.v1 import types_pb2 as pb
from test_processes import PROVISIONER, Service
from provisioner.perf.fleet import free_port


@pytest.fixture
def open_umask():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def others_can_read(path: Path) -> bool:
    return bool(stat.S_IMODE(path.stat().st_mode) & 0o077)


def test_a_store_file_and_its_journal_are_private(tmp_path, open_umask):
    SqliteStore(tmp_path / "cluster.db")  # its migrations write, so the journal exists too
    files = sorted(tmp_path.glob("cluster.db*"))
    assert files and [f.name for f in files if others_can_read(f)] == []


def test_the_span_file_is_private(tmp_path, open_umask):
    path = tmp_path / "traces.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    with provider.get_tracer("t").start_as_current_span("one"):
        pass
    assert path.exists() and not others_can_read(path)
    assert not others_can_read(path.with_name(path.name + ".lock"))


async def test_a_server_closes_its_data_dir_and_writes_nothing_others_can_read(tmp_path, open_umask):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)  # as a shared parent or an earlier version left it
    address = f"127.0.0.1:{free_port()}"
    cluster = Service([str(PROVISIONER), "serve", "cluster", "--name", "us-central1", "--address", address,
                       "--traces", "file", "--clusters", str(default_clusters_dir()), "--data-dir", str(data),
                       "--time-scale", "300"], address, tmp_path / "cluster.log")
    try:
        await cluster.start()
        async with cluster_channel(data, None, address, "us-central1") as ch:
            stub = cluster_grpc.ClusterServiceStub(ch)
            spec = pb.SessionSpec(request_id="r1", user_id="u", accelerator="gpu-p100", image="gpu:latest")
            await stub.Allocate(cluster_pb.AllocateRequest(spec=spec), timeout=10)
        for _ in range(100):  # spans are exported in batches, off the request's path
            if (data / "traces.jsonl").exists():
                break
            await asyncio.sleep(0.1)
    finally:
        await cluster.kill()
    written = [p for p in data.rglob("*")]
    assert {"traces.jsonl", "cluster-us-central1.db"} <= {p.name for p in written}, sorted(p.name for p in written)
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert sorted(str(p.relative_to(data)) for p in written if others_can_read(p)) == []
