"""Shared fixtures: the real local fleet (front + three clusters) over gRPC on loopback.

The fleet runs on the simulated cloud with a clock 300x faster than the wall, so a 90 s boot
takes 0.3 s and a full image pull 2 s.
"""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable

import grpc
import pytest
import yaml

import provisioner
from provisioner.common.clock import RealClock
from provisioner.config import FleetConfig, SecurityConfig, default_clusters_dir, load_fleet
from provisioner.client.credentials import front_credentials, local_ca
from provisioner.security.client import dev_token
from provisioner.security.pki import local_files
from provisioner.cli.serve import LocalFleet, start_local_fleet
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb

TIME_SCALE = 300.0

# The files that take longest, longest first: pyproject runs the suite on two workers that take whole
# files (`--dist loadfile --no-loadscope-reorder`), in the order the collection has them, and the
# suite ends when the slower worker does. Started first, a long file runs beside many short ones;
# started last (xdist's own order puts one-test files last), it would run alone for minutes.
LONGEST_FIRST = ("test_crash.py", "test_placement_protocol.py", "test_simulate.py", "test_placement_protocol_long.py",
                 "test_floods_bench.py", "test_client.py", "test_failover.py", "test_database_blip.py",
                 "test_quota_fronts.py", "test_fuzz_api.py", "test_replicas.py", "test_sim_quotas.py",
                 "test_processes.py", "test_serving_bench.py", "test_exactly_once.py", "test_e2e_lifecycle.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def pytest_sessionstart(session: pytest.Session) -> None:
    """Writes the package's bytecode once, before any test starts a `provisioner` process: with
    PYTHONDONTWRITEBYTECODE set (as some CI shells do), every child process would otherwise compile
    the package's modules again (about 0.5 s of CPU each, for a hundred or more children)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        compileall.compile_dir(Path(provisioner.__file__).parent, quiet=1)


def fleet_config(tmp_path: Path, edit_cluster: Callable[[dict], None] | None = None) -> FleetConfig:
    """The shipped fleet, copied to tmp_path; `edit_cluster` may change each cluster's YAML dict."""
    target = tmp_path / "clusters"
    shutil.copytree(default_clusters_dir(), target)
    if edit_cluster is not None:
        for path in target.glob("*.yaml"):
            if path.name in ("fleet.yaml", "images.yaml"):
                continue
            data = yaml.safe_load(path.read_text())
            edit_cluster(data)
            path.write_text(yaml.safe_dump(data))
    return load_fleet(target)


@dataclass
class FleetHandle:
    """A running fleet and a channel to its front as the local operator (service and admin)."""

    fleet: LocalFleet
    channel: grpc.aio.Channel
    sessions: s_grpc.SessionServiceStub
    admin: admin_grpc.AdminServiceStub
    data_dir: Path
    security: SecurityConfig

    @property
    def front_address(self) -> str:
        return self.fleet.front.address

    def cluster(self, name: str):
        return next(c for c in self.fleet.clusters if c.config.name == name)

    def cluster_channel(self, name: str, as_process: str = "front") -> grpc.aio.Channel:
        """A new channel to one cluster's own port with the certificate of `as_process` ("front",
        as the front reaches it, or e.g. "cluster-asia-east1"); the caller closes it."""
        return cluster_channel(self.data_dir, self.security, self.cluster(name).address, name, as_process)

    def front_channel(self, token: str | None = None, **kwargs) -> grpc.aio.Channel:
        """A new channel to the front with `token` (default: the local operator's)."""
        return front_channel(self.data_dir, self.front_address, token, **kwargs)

    def token(self, subject: str) -> str:
        return dev_token(self.data_dir, subject)

    async def create(self, **spec) -> pb.Session:
        spec.setdefault("request_id", f"req-{time.monotonic_ns()}")
        spec.setdefault("user_id", "alice")
        spec.setdefault("accelerator", "gpu-p100")
        spec.setdefault("image", "gpu:latest")
        resp = await self.sessions.CreateSession(s_pb.CreateSessionRequest(spec=pb.SessionSpec(**spec)), timeout=10)
        return resp.session

    async def running(self, session: pb.Session, timeout: float = 20.0) -> pb.Session:
        """The session once its notebook has started (it was starting, or already running)."""
        seen = await self.watch_until(session.id, pb.SESSION_STATE_RUNNING, pb.SESSION_STATE_FAILED,
                                      pb.SESSION_STATE_STOPPED, timeout=timeout)
        assert seen[-1].state == pb.SESSION_STATE_RUNNING, seen[-1]
        return seen[-1]

    async def watch_until(self, session_id: str, *states: int, timeout: float = 20.0) -> list[pb.Session]:
        """Every update WatchSession sends until the session reaches one of `states`."""
        seen: list[pb.Session] = []

        async def follow():
            async for resp in self.sessions.WatchSession(s_pb.WatchSessionRequest(session_id=session_id)):
                seen.append(resp.session)
                if resp.session.state in states:
                    return

        await asyncio.wait_for(follow(), timeout)
        return seen

    async def wait_warm(self, timeout: float = 20.0) -> None:
        """Until every pool holds its minimum of warm VMs with the latest image."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(_pool_warm(c) for c in self.fleet.clusters) and self._front_sees_warm():
                return
            await asyncio.sleep(0.05)
        raise TimeoutError("pools did not warm up")

    def _front_sees_warm(self) -> bool:
        """The front's capacity view (pushed on a wall-time throttle) has caught up with the pools:
        warm VMs holding the latest image, as routing counts them."""
        for proc in self.fleet.clusters:
            view = self.fleet.front.fleet.clients[proc.config.name].view()
            latest = proc.runtime.core.catalog.latest
            if not view.healthy or any(view.pools.get(name) is None
                                       or view.pools[name].warm_by_image.get(latest, 0) < p.policy.min_vms
                                       for name, p in proc.runtime.core.pools.items()):
                return False
        return True


def _pool_warm(proc) -> bool:
    core = proc.runtime.core
    for pool in core.pools.values():
        warm = sum(1 for vid in pool.vms if core.vms[vid].state.value == "warm"
                   and core.vms[vid].cache.has_image(core.catalog.latest, core.catalog))
        if warm < pool.policy.min_vms:
            return False
    return True


async def start_fleet(config: FleetConfig, data_dir: Path, tracer_provider=None,
                      time_scale: float = TIME_SCALE, **options) -> FleetHandle:
    """`options` go to start_local_fleet (e.g. metrics)."""
    fleet = await start_local_fleet(config, RealClock(time_scale), data_dir, front_address="127.0.0.1:0",
                                    cluster_port_base=0, tracer_provider=tracer_provider, **options)
    channel = front_channel(data_dir, fleet.front.address)
    return FleetHandle(fleet, channel, s_grpc.SessionServiceStub(channel), admin_grpc.AdminServiceStub(channel),
                       data_dir, config.settings.security)


def front_channel(data_dir: Path, address: str, token: str | None = None, **kwargs) -> grpc.aio.Channel:
    """A channel to a front of the fleet whose local CA and token key are under `data_dir`."""
    creds = front_credentials(local_ca(data_dir).read_bytes(), token or dev_token(data_dir))
    return grpc.aio.secure_channel(address, creds, **kwargs)


def cluster_channel(data_dir: Path, security: SecurityConfig | None, address: str, cluster: str,
                    as_process: str = "front") -> grpc.aio.Channel:
    """A channel to a cluster of the fleet whose local CA is under `data_dir`, with the
    certificate of `as_process` (the front's: the only one a cluster answers)."""
    security = security or SecurityConfig()
    files = local_files(Path(data_dir) / "tls", as_process)
    ca, chain, key = files.read()
    return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(ca, key, chain),
                                   options=[("grpc.ssl_target_name_override", security.cluster_name(cluster))])


@contextlib.asynccontextmanager
async def warm_fleet(config: FleetConfig, data_dir: Path, **options) -> AsyncIterator[FleetHandle]:
    """A fleet whose pools hold their minimum of warm VMs, stopped on the way out."""
    handle = await start_fleet(config, data_dir, **options)
    try:
        await handle.wait_warm()
        yield handle
    finally:
        await handle.channel.close()
        await handle.fleet.stop(0.5)


def quick_warm_up(cluster: dict) -> None:
    """Boots and pulls ten times as fast, so a fleet warms in a fraction of a second of wall time;
    cold starts still take several model minutes, longer than any warm one."""
    cluster["sim"].update(boot_s=9, boot_jitter_s=1, pull_bytes_per_s=cluster["sim"]["pull_bytes_per_s"] * 10)


@pytest.fixture
async def local_fleet(tmp_path):
    async with warm_fleet(fleet_config(tmp_path, quick_warm_up), tmp_path / "data") as handle:
        yield handle


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server for the whole run (see tests/pg.py); skipped loudly if none can start."""
    from pg import serving

    yield from serving()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """A database URL for each backend the store supports, empty."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("postgres").new_database()
