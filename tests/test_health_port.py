"""The plaintext health port (--health-address), as Kubernetes' gRPC probes see it: health alone,
mirroring the TLS server's status, NOT_SERVING on a standby replica and while draining, and
"liveness" SERVING whenever the process runs."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import fleet_config
from provisioner.api.server import HealthPort
from provisioner.common.clock import RealClock
from provisioner.config import default_clusters_dir
from provisioner.cli.serve import start_cluster
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import cluster_service_pb2_grpc as cluster_grpc

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


async def status(port: HealthPort | str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(port if isinstance(port, str) else port.address) as channel:
        resp = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                              timeout=5)
        return resp.status


async def test_standby_then_leader_then_draining(tmp_path):
    fleet = fleet_config(tmp_path)
    clock, data = RealClock(300.0), tmp_path / "data"
    first_port, second_port = HealthPort("127.0.0.1:0"), HealthPort("127.0.0.1:0")
    await first_port.start()
    await second_port.start()
    first = await start_cluster(fleet, "asia-east1", clock, data, address="127.0.0.1:0", health_port=first_port)
    second_start = asyncio.create_task(start_cluster(fleet, "asia-east1", clock, data, address="127.0.0.1:0",
                                                     health_port=second_port))
    try:
        assert await status(first_port) == SERVING
        assert await status(first_port, "provisioner.v1.ClusterService") == SERVING
        # The standby waits for the lease: alive, not ready.
        await asyncio.sleep(0.3)
        assert not second_start.done()
        assert await status(second_port) == NOT_SERVING
        assert await status(second_port, HealthPort.LIVENESS) == SERVING

        # Only health answers there: the cluster's API is on its TLS port alone.
        async with grpc.aio.insecure_channel(first_port.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await cluster_grpc.ClusterServiceStub(channel).List(cluster_pb.ListRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED

        # The leader drains: NOT_SERVING from the start of the drain, and the standby takes over.
        await first.stop(0.5)
        assert await status(first_port) == NOT_SERVING
        assert await status(first_port, HealthPort.LIVENESS) == SERVING
        second = await asyncio.wait_for(second_start, 20)
        assert await status(second_port) == SERVING
        await second.stop(0.5)
        assert await status(second_port) == NOT_SERVING
    finally:
        if not second_start.done():
            second_start.cancel()
            await asyncio.gather(second_start, return_exceptions=True)
        await first_port.stop()
        await second_port.stop()


async def test_serve_offers_health_and_metrics_from_the_start(tmp_path):
    """The command as the manifests run it: the health port and /metrics are up while a standby
    waits for the lease (live, not ready, not leading), and it drains on SIGTERM."""
    data = tmp_path / "data"
    leader = await start_cluster(fleet_config(tmp_path), "asia-east1", RealClock(300.0), data, address="127.0.0.1:0")
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("provisioner")), "serve", "cluster", "--name", "asia-east1",
        "--address", "127.0.0.1:0", "--health-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
        "--log-format", "json", "--traces", "none", "--time-scale", "300", "--clusters", str(default_clusters_dir()),
        "--data-dir", str(data), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        found = {}
        while len(found) < 2:
            line = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
            assert line, "the process ended before it said where it serves health and metrics"
            if m := re.match(r"(metrics|health)\s+(?:http://)?([\d.]+:\d+)", line):
                found[m.group(1)] = m.group(2)
        drain = asyncio.create_task(proc.stderr.read())  # the rest of its log, so the pipe never fills
        port = found["health"]
        assert await status(port) == NOT_SERVING  # standing by
        assert await status(port, HealthPort.LIVENESS) == SERVING

        def scrape() -> str:
            with urllib.request.urlopen(f"http://{found['metrics']}/metrics", timeout=10) as resp:
                return resp.read().decode()
        assert 'provisioner_leader{cluster="asia-east1"} 0.0' in await asyncio.to_thread(scrape)

        await leader.stop(0.5)  # the subprocess takes over
        leader = None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert b"listening on" in line
        assert await status(port) == SERVING
        assert 'provisioner_leader{cluster="asia-east1"} 1.0' in await asyncio.to_thread(scrape)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        assert b'"severity": "INFO"' in await drain  # --log-format json
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if leader is not None:
            await leader.stop(0.5)
