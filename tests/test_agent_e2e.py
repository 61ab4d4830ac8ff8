"""The whole loop with real agent processes: a cluster on the gce backend (the real
google-cloud-compute client) against the fake Compute Engine, and one `provisioner agent`
process per booted fake VM, talking to that VM's fake metadata server over loopback HTTP.

Each agent runs with `--simulate DIR`: its GPU (NVML), container runtime and host are the
agent's fakes, with their state in DIR's JSON files, which this test reads and edits (a user's
processes and files, a hot GPU, a read-only disk). No network other than loopback.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
import yaml

from conftest import fleet_config
from fake_compute import FakeCompute
from fake_metadata import FakeMetadataServer
from live_records import follow
from provisioner.agent.fakes import FakeHost, FakeRuntime, State
from provisioner.common.clock import RealClock
from provisioner.cloud.gce import GceBackend
from provisioner.decide.core import ClusterCore
from provisioner.decide.ids import IdSource
from provisioner.cluster.runtime import ClusterRuntime
from provisioner.model.records import SessionSpec
from gce_fixtures import loopback_only  # noqa: F401 (a fixture)

PROJECT, CLUSTER, POOL = "test-proj", "us-central1", "gpu-p100"
WORKSPACES, SCRATCH = "/var/lib/provisioner-agent/workspaces", "/scratch"
TIME_SCALE = 60.0  # the cluster's clock: a 6 s guest-attribute read interval is 0.1 s of wall time
# The agents run on the wall clock while the cluster runs 60 times faster: their write rate too.
WRITES_PER_MINUTE = 600


class Agents:
    """Starts an agent process (and a metadata server) for every booted instance; stops both
    when the instance is gone. By default each agent runs on its fakes (`--simulate DIR`);
    `settings` and `flags(dir)` run it otherwise (e.g. on a real container engine)."""

    def __init__(self, fake: FakeCompute, root: Path, settings: dict | None = None,
                 flags: Callable[[Path], list[str]] | None = None):
        self.fake, self.root = fake, root
        self.settings, self.flags = settings, flags
        self.procs: dict[str, tuple[subprocess.Popen, FakeMetadataServer]] = {}
        self.started: list[str] = []

    def dir(self, name: str) -> Path:
        return self.root / name

    def sync(self) -> None:
        for name in self.fake.running(PROJECT):
            if name not in self.procs:
                self._start(name)
        for name in set(self.procs) - self.fake.names(PROJECT):
            self._stop(name)

    def _simulated(self, d: Path) -> list[str]:
        host = FakeHost(State({}, d / "host.json"))
        host.d["dirs"].update({WORKSPACES: [], SCRATCH: []})
        host.d["disks"].update({"/": {"free_fraction": 0.5}, SCRATCH: {"free_fraction": 0.9}})
        host.state.save()
        return ["--simulate", str(d), "--simulate-bytes-per-s", "5e10"]

    def _start(self, name: str) -> None:
        d = self.dir(name)
        d.mkdir(parents=True)
        flags = self.flags(d) if self.flags else self._simulated(d)
        (d / "agent.yaml").write_text(yaml.safe_dump({
            "state_dir": str(d / "state"), "workspace_root": WORKSPACES, "disk_paths": ["/", SCRATCH],
            "health_s": 0.2, "progress_s": 0.1, "kill_grace_s": 0.5, "watch_timeout_s": 5,
            "guest_writes_per_minute": WRITES_PER_MINUTE, **(self.settings or {})}))
        server = FakeMetadataServer(self.fake, PROJECT, name, writes_per_minute=WRITES_PER_MINUTE).start()
        log = open(d / "agent.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "provisioner.agent", "--config", str(d / "agent.yaml"),
                                 "--metadata-url", server.url, *flags], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs[name] = (proc, server)
        self.started.append(name)

    def _stop(self, name: str) -> None:
        proc, server = self.procs.pop(name)
        proc.kill()
        proc.wait()
        server.stop()

    async def run(self) -> None:
        while True:
            self.sync()
            await asyncio.sleep(0.05)

    def close(self) -> None:
        for name in list(self.procs):
            self._stop(name)


async def until(check, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        await asyncio.sleep(0.05)


@pytest.fixture
async def loop_parts(tmp_path, loopback_only):  # noqa: F811
    fake = FakeCompute(boot_s=0.1, op_s=0.02, agents="external").start()

    def edit(cluster: dict) -> None:
        cluster["backend"] = {"kind": "gce", "project": PROJECT, "endpoint": fake.endpoint, "poll_s": 1.0,
                              "agent_package": "preinstalled",
                              "retry_total_s": 10.0}
        for pool in cluster["pools"]:
            if pool["name"] == POOL:  # one warm VM above demand, a disk for about one image
                pool.update(min_vms=1, max_vms=3, autoscaler="fixed", warm_vms=1, disk_cache_gb=30)
            else:
                pool.update(min_vms=0, max_vms=0)
    config = fleet_config(tmp_path, edit)
    cfg = config.cluster(CLUSTER)
    clock = RealClock(TIME_SCALE)
    runtime = ClusterRuntime(ClusterCore(cfg, config.catalog, config.settings.sessions, IdSource(CLUSTER)),
                             GceBackend(cfg, clock), clock)
    agents = Agents(fake, tmp_path / "vms")
    watcher = asyncio.create_task(agents.run())
    await runtime.start()
    try:
        yield fake, runtime, agents
    finally:
        await runtime.close()
        watcher.cancel()
        agents.close()
        fake.stop()


def idle_warm(runtime: ClusterRuntime) -> list:
    return [vm for vm in runtime.core.vms.values() if vm.pool == POOL and vm.state.value == "warm"
            and not vm.pulling and not vm.session_id]


async def test_sessions_run_on_real_agents_and_faults_replace_the_vm(loop_parts):
    fake, runtime, agents = loop_parts
    core = runtime.core
    catalog = core.catalog
    await until(lambda: idle_warm(runtime), what="a warm VM with its agent ready")

    # Create, pull (a version the VM lacks: a partial pull through the agent), run with an endpoint.
    live = follow(runtime)
    s = live(runtime.allocate(SessionSpec("e2e-1", "ada", POOL, "gpu:v150")))
    await until(lambda: s.state.value == "running", what="the first session running")
    vm_id = s.vm_id
    ip = fake.instances[(PROJECT, vm_id)].body["networkInterfaces"][0]["networkIP"]
    assert s.endpoint == f"http://{ip}:8888" and s.start.value in ("partial", "cold")
    host = FakeHost(State({}, agents.dir(vm_id) / "host.json"))
    runtime_of_vm = FakeRuntime(RealClock(), host, State({}, agents.dir(vm_id) / "containers.json"))
    layers = runtime_of_vm.state.data["layers"]
    assert catalog.layer_ids("gpu:v150") <= set(layers)  # pulled by the agent, layer by layer
    assert any(k.startswith("progress-") for k in fake.instances[(PROJECT, vm_id)].guest)

    # The user leaves things behind: a container, its processes (one on the GPU), files.
    runtime_of_vm.run("nb-1", s.id, pid=2001)
    host.start_process(2001, 1000, "jupyter-lab", ns=2001)
    host.start_process(2002, 1000, "python3", gpu=True, ns=2001)
    host.start_process(3001, 1001, "backup-daemon")  # the VM's own: the wipe leaves it
    host.d["dirs"].update({WORKSPACES: [s.id], f"{WORKSPACES}/{s.id}": ["model.ckpt"]})
    host.state.save()

    # Stop: the agent wipes and verifies, the VM is warm again with its image cache.
    runtime.stop(s.id, "done")
    await until(lambda: s.state.value == "stopped", what="the session stopped")
    vm = live(core.vms[vm_id])
    await until(lambda: vm.state.value == "warm", what="the VM warm again")
    assert [p.name for p in host.user_processes(1000)] == ["backup-daemon"] and host.entries(WORKSPACES) == []
    assert host.d["gpu_resets"] >= 1
    after = runtime_of_vm.state.data
    assert after["containers"] == {} and catalog.layer_ids("gpu:v150") <= set(after["layers"])
    done = json.loads((agents.dir(vm_id) / "state" / "done.json").read_text())
    assert "ok" in done.values()
    assert vm.cache.has_image("gpu:v150", catalog)

    # A GPU at 90 C: the session on it fails with the agent's detail, and the VM is replaced.
    s2 = live(runtime.allocate(SessionSpec("e2e-2", "bob", POOL, "gpu:v150")))
    await until(lambda: s2.state.value == "running", what="the second session running")
    hot = s2.vm_id
    gpu = State({}, agents.dir(hot) / "gpu.json")
    gpu.data["gpus"][0].update(temperature_c=90, throttle=0x40)
    gpu.save()
    await until(lambda: s2.state.value == "failed", what="the session on the hot GPU failed")
    assert "GPU 0 at 90 C (limit 85 C); throttling: hw_thermal_slowdown" in s2.reason
    await until(lambda: hot not in fake.names(PROJECT), what="the hot VM deleted")
    await until(lambda: any(vm.id != hot for vm in idle_warm(runtime)), what="a replacement warm")

    # A read-only disk does the same.
    s3 = live(runtime.allocate(SessionSpec("e2e-3", "cy", POOL, "gpu:latest")))
    await until(lambda: s3.state.value == "running", what="the third session running")
    ro = FakeHost(State({}, agents.dir(s3.vm_id) / "host.json"))
    ro.d["disks"]["/"]["read_only"] = True
    ro.state.save()
    await until(lambda: s3.state.value == "failed", what="the session on the read-only disk failed")
    assert "the file system of / is read-only" in s3.reason
    await until(lambda: s3.vm_id not in fake.names(PROJECT), what="the read-only VM deleted")
    # The VMs replacing the two deleted boot agents of their own (not necessarily by now: the
    # replacement seen warm above may have been the pool's other VM).
    await until(lambda: len(agents.started) >= 3, what="a replacement VM's agent started")
