"""The fleet as separate OS processes (`provisioner serve ...`): the CLI against them, a graceful
SIGTERM that lets in-flight calls finish, and a restart that finds its sessions in SQLite."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import cluster_channel, front_channel
from provisioner.config import default_clusters_dir
from provisioner.perf.fleet import free_port
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import cluster_service_pb2_grpc as cluster_grpc
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb

PROVISIONER = Path(sys.executable).with_name("provisioner")
CLUSTERS = ("us-central1", "europe-west4", "asia-east1")
STARTUP_S = 40.0  # a cluster on PostgreSQL waits out the lease's grace (9 s) before it serves
HEALTH = health_pb2.HealthCheckResponse


def sim_cloud_vms(data_dir: Path, cluster: str) -> set[str]:
    """The VMs a cluster's simulated cloud holds (its inventory file under the data dir)."""
    db = sqlite3.connect(data_dir / f"sim-cloud-{cluster}.db")
    try:
        return {vm_id for (vm_id,) in db.execute("SELECT id FROM vms")}
    finally:
        db.close()


@dataclass
class Service:
    argv: list[str]
    address: str
    log: Path
    proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdout=asyncio.subprocess.PIPE, stderr=log)
        line = await asyncio.wait_for(self.proc.stdout.readline(), STARTUP_S)
        assert b"listening on" in line, f"{self.argv[4:6]} did not start:\n{self.log.read_text()}"

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await asyncio.wait_for(self.proc.wait(), 10)


def cluster_process(name: str, clusters_dir: Path, data_dir: Path, log: Path, time_scale: float = 300) -> Service:
    """One cluster as its own process (`provisioner serve cluster`) on a port of its own."""
    address = f"127.0.0.1:{free_port()}"
    return Service([str(PROVISIONER), "serve", "cluster", "--name", name, "--address", address, "--traces", "none",
                    "--clusters", str(clusters_dir), "--data-dir", str(data_dir), "--time-scale", str(int(time_scale))],
                   address, log)


class Fleet:
    def __init__(self, tmp_path: Path):
        common = ["--clusters", str(default_clusters_dir()), "--data-dir", str(tmp_path / "data"),
                  "--time-scale", "300"]
        self.clusters: dict[str, Service] = {}
        for name in CLUSTERS:
            address = f"127.0.0.1:{free_port()}"
            self.clusters[name] = Service(
                [str(PROVISIONER), "serve", "cluster", "--traces", "none", "--name", name, "--address", address,
                 *common], address, tmp_path / f"{name}.log")
        routes = [arg for name, c in self.clusters.items() for arg in ("--cluster", f"{name}={c.address}")]
        address = f"127.0.0.1:{free_port()}"
        self.front = Service([str(PROVISIONER), "serve", "front", "--traces", "none", "--address", address,
                              *routes, *common], address, tmp_path / "front.log")
        self.data_dir = tmp_path / "data"  # shared: the local CA and token key are made there once

    @property
    def services(self) -> list[Service]:
        return [*self.clusters.values(), self.front]

    async def start(self) -> None:
        await asyncio.gather(*(s.start() for s in self.services))
        await self.wait_routable()

    async def wait_routable(self, front: Service | None = None, timeout: float = 10.0) -> None:
        """Until the front has every cluster's capacity, so it can route to any of them."""
        async with front_channel(self.data_dir, (front or self.front).address) as ch:
            admin = admin_grpc.AdminServiceStub(ch)
            deadline = time.monotonic() + timeout
            while True:
                clusters = (await admin.ListClusters(admin_pb.ListClustersRequest(), timeout=5)).clusters
                if all(c.healthy for c in clusters):
                    return
                assert time.monotonic() < deadline, f"clusters not healthy at the front: {clusters}"
                await asyncio.sleep(0.05)


@pytest.fixture
async def fleet(tmp_path):
    fleet = Fleet(tmp_path)
    try:
        await fleet.start()
        yield fleet
    finally:
        for s in fleet.services:
            await s.kill()


async def cli(*args: str, timeout: float = 30.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(PROVISIONER), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode, out.decode(), err.decode()


def _spec(request_id: str, **kw) -> pb.SessionSpec:
    return pb.SessionSpec(request_id=request_id, user_id="u", accelerator="gpu-p100", image="gpu:latest", **kw)


async def test_cli_creates_and_stops_a_session_on_separate_processes(fleet):
    front = ["--front", fleet.front.address, "--data-dir", str(fleet.data_dir), "--json"]
    code, out, err = await cli("session", "create", "--user", "u", "--accelerator", "gpu-p100",
                               "--image", "gpu:latest", "--wait", *front)
    assert code == 0, err
    s = json.loads(out)
    assert s["state"] == "running"
    assert s["cluster"] in CLUSTERS and s["id"].startswith(s["cluster"] + ".")
    assert s["image"].startswith("gpu:v") and s["start"] in ("warm", "partial", "cold")

    code, out, err = await cli("session", "stop", s["id"], *front)
    assert code == 0, err
    assert json.loads(out)["state"] in ("stopping", "stopped")
    deadline = time.monotonic() + 15
    while True:
        code, out, err = await cli("session", "get", s["id"], *front)
        assert code == 0, err
        if json.loads(out)["state"] == "stopped":
            break
        assert time.monotonic() < deadline, out
        await asyncio.sleep(0.1)


async def test_sigterm_drains_and_a_restart_keeps_the_sessions(fleet):
    victim = fleet.clusters["us-central1"]
    async with front_channel(fleet.data_dir, fleet.front.address) as front_ch:
        sessions = s_grpc.SessionServiceStub(front_ch)
        spec = _spec("before-sigterm", region_hint="us-central1", region_required=True)
        first = (await sessions.CreateSession(s_pb.CreateSessionRequest(spec=spec), timeout=10)).session
        assert first.cluster == "us-central1"

        async with cluster_channel(fleet.data_dir, None, victim.address, "us-central1") as ch:
            await asyncio.wait_for(ch.channel_ready(), 5)
            health = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest())
            assert (await asyncio.wait_for(health.read(), 5)).status == HEALTH.SERVING
            # Freeze the process so the call is surely in flight (sent, unanswered) when the
            # signal arrives; it is handled when the process resumes.
            victim.proc.send_signal(signal.SIGSTOP)
            try:
                allocate = asyncio.ensure_future(cluster_grpc.ClusterServiceStub(ch).Allocate(
                    cluster_pb.AllocateRequest(spec=_spec("during-sigterm")), timeout=10))
                await asyncio.sleep(0.2)
                assert not allocate.done()
                victim.proc.send_signal(signal.SIGTERM)
            finally:
                victim.proc.send_signal(signal.SIGCONT)
            second = (await allocate).session
            assert second.id.startswith("us-central1.") and second.spec.request_id == "during-sigterm"
            # An open stream sees the drain start, and is not cut off by it.
            assert (await asyncio.wait_for(health.read(), 5)).status == HEALTH.NOT_SERVING
            health.cancel()

        assert await asyncio.wait_for(victim.proc.wait(), 8) == 0
        log = victim.log.read_text()
        assert "draining" in log and "stopped" in log, log
        async with cluster_channel(fleet.data_dir, None, victim.address, "us-central1") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as gone:
                await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
            assert gone.value.code() == grpc.StatusCode.UNAVAILABLE

        # Same port, same data dir: the sessions come back from the cluster's SQLite store.
        await victim.start()
        await fleet.wait_routable()
        for want in (first, second):
            got = (await sessions.GetSession(s_pb.GetSessionRequest(session_id=want.id), timeout=5)).session
            assert got.id == want.id and got.spec.request_id == want.spec.request_id
            assert got.cluster == "us-central1" and got.create_time == want.create_time


async def test_sigterm_ends_open_streams_instead_of_waiting_out_the_grace(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    cluster = Service([str(PROVISIONER), "serve", "cluster", "--traces", "none", "--name", "us-central1",
                       "--address", address, "--data-dir", str(tmp_path / "data"), "--time-scale", "300"],
                      address, tmp_path / "cluster.log")
    try:
        await cluster.start()
        async with cluster_channel(tmp_path / "data", None, address, "us-central1") as ch:
            # What a front holds open on every cluster.
            capacity = cluster_grpc.ClusterServiceStub(ch).WatchCapacity(cluster_pb.WatchCapacityRequest())
            await asyncio.wait_for(capacity.read(), 5)
            cluster.proc.send_signal(signal.SIGTERM)
            # The drain ends the stream cleanly (OK) instead of holding shutdown until the grace
            # period runs out and the server cuts it off (UNAVAILABLE "Cancelling all calls").
            while await asyncio.wait_for(capacity.read(), 10) is not grpc.aio.EOF:
                pass
            assert await capacity.code() == grpc.StatusCode.OK
            assert await asyncio.wait_for(cluster.proc.wait(), 10) == 0
    finally:
        await cluster.kill()
