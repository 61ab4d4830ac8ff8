"""What the gce backend's tests share: the fake Compute server, a network that reaches only
loopback, a fleet on the gce backend, a backend alone, and a VM made ready."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time

import pytest

from conftest import fleet_config
from fake_compute import FakeCompute
from provisioner.common.clock import RealClock
from provisioner.cloud.base import CloudVm, LaunchSpec
from provisioner.cloud.gce import GceBackend

PROJECT = "test-proj"
CLUSTER = "us-central1"
TIME_SCALE = 300.0


@pytest.fixture
def loopback_only(monkeypatch):
    """Any connection to a non-loopback address fails, as with the network unplugged (Python's
    sockets: the REST client's; gRPC's own sockets are given only the fakes' loopback addresses)."""
    real_connect = socket.socket.connect

    def connect(self, address):
        host = address[0] if isinstance(address, tuple) else None
        if host is not None:
            try:
                loopback = ipaddress.ip_address(host).is_loopback
            except ValueError:
                loopback = host == "localhost"
            if not loopback:
                raise OSError(f"network unreachable (test): {host}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if host not in ("127.0.0.1", "localhost", "::1", None):
            raise socket.gaierror(f"no DNS in this test: {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def fake():
    f = FakeCompute(boot_s=0.1, op_s=0.02, command_s=0.05).start()
    yield f
    f.stop()


def gce_fleet(tmp_path, fake: FakeCompute, **backend):
    def edit(cluster: dict) -> None:
        cluster["backend"] = {"kind": "gce", "project": PROJECT, "endpoint": fake.endpoint, "poll_s": 1.0,
                              "agent_package": "preinstalled",
                              "retry_total_s": 10.0, **backend}
        for pool in cluster["pools"]:
            pool.update(min_vms=2, max_vms=6)
    return fleet_config(tmp_path, edit)


async def until(check, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        await asyncio.sleep(0.05)


def warm_per_pool(proc) -> dict[str, int]:
    core = proc.runtime.core
    return {name: sum(1 for vid in pool.vms if core.vms[vid].state.value == "warm") for name, pool in core.pools.items()}


def spec(vm_id: str, zone: str = "us-central1-f") -> LaunchSpec:
    return LaunchSpec(vm_id=vm_id, cluster=CLUSTER, pool="gpu-p100", zone=zone, machine_type="n1-standard-8",
                      accelerator="nvidia-tesla-p100", accelerator_count=1,
                      labels={"provisioner-cluster": CLUSTER, "provisioner-pool": "gpu-p100",
                              "provisioner-request": vm_id}, images=("gpu:v160",))


def backend(tmp_path, fake, **changes) -> GceBackend:
    return GceBackend(gce_fleet(tmp_path, fake, **changes).cluster(CLUSTER), RealClock(TIME_SCALE))


async def ready_vm(b: GceBackend, vm_id: str) -> CloudVm:
    assert isinstance(await b.create(spec(vm_id)), CloudVm)
    vm = await b.wait_ready(vm_id, "us-central1-f")
    assert isinstance(vm, CloudVm)
    return vm
