"""Abusive sessions injected into the simulated cloud and into the agent's fakes, seen by the
detector through what each reports."""

from __future__ import annotations

import asyncio

from provisioner.rules.abuse import Sample, judge
from provisioner.agent.simulated import MINERS, mine, miner
from provisioner.agent.fakes import FakeHost, FakeNvml
from provisioner.agent.gpu import Gpus
from provisioner.agent.host import Process
from provisioner.common.clock import ManualClock
from provisioner.cloud.base import LABEL_CLUSTER, LABEL_POOL, LaunchSpec
from provisioner.cloud.sim import Inventory, SimCloud
from provisioner.config import SimCloudConfig
from provisioner.config.policy import AbuseConfig

CFG = AbuseConfig()
ZONE = "us-central1-a"


async def _ready_vm(cloud: SimCloud, clock: ManualClock, vm_id: str) -> None:
    spec = LaunchSpec(vm_id, "us-central1", "gpu-p100", ZONE, "n1-standard-8", "nvidia-tesla-p100", 1,
                      {LABEL_CLUSTER: "us-central1", LABEL_POOL: "gpu-p100"})
    task = asyncio.create_task(cloud.create(spec))
    await asyncio.sleep(0)
    await clock.advance(10)
    await task
    task = asyncio.create_task(cloud.wait_ready(vm_id, ZONE))
    await asyncio.sleep(0)
    await clock.advance(200)
    await task


def test_miners_are_picked_by_seed():
    assert miner(7) == miner(7)
    picked = {miner(seed) for seed in range(40)}
    assert {m.name for m in picked} == set(MINERS) and len({m.pool for m in picked}) == 40
    assert all(m.pool.is_public for m in picked)


async def test_a_miner_marked_in_the_simulated_cloud_is_reported_flagged_and_cleared_by_a_wipe(tmp_path):
    clock = ManualClock()
    inventory = Inventory(tmp_path / "cloud.db")
    cloud = SimCloud(SimCloudConfig(), clock, inventory=inventory, tracer=None)
    await _ready_vm(cloud, clock, "vm-1")
    await _ready_vm(cloud, clock, "vm-2")
    assert (await cloud.health("vm-1", ZONE)).usage is None  # nothing reported: nothing to judge

    usage = cloud.mark_miner("vm-1", seed=3)
    assert usage == miner(3).usage()
    samples = []
    for _ in range(3):  # the cluster's health pass, once a minute
        report = await cloud.health("vm-1", ZONE)
        assert report.healthy and report.usage == usage
        samples.append(Sample(clock.now(), report.usage))
        await clock.advance(60)
    verdict = judge(samples, [], "interactive", CFG)
    assert [f.rule for f in verdict.findings] == ["miner_program", "pool_connection"]
    assert verdict.findings[0].process == miner(3).name and verdict.findings[1].connection == miner(3).pool
    assert (await cloud.health("vm-2", ZONE)).usage is None  # the other VM's session is not marked

    # Another process over the same cloud (a restarted cluster) sees the mark.
    again = SimCloud(SimCloudConfig(), clock, inventory=Inventory(tmp_path / "cloud.db"), tracer=None)
    assert (await again.health("vm-1", ZONE)).usage == usage
    await again.close()

    task = asyncio.create_task(cloud.wipe("vm-1", ZONE))
    await asyncio.sleep(0)
    await clock.advance(60)
    assert await task is None
    assert (await cloud.health("vm-1", ZONE)).usage is None  # the next session is clean
    await cloud.close()


def test_a_miner_started_in_the_agent_fakes_is_what_the_agent_reports():
    host = FakeHost()
    nvml = FakeNvml(host, count=2)
    host.start_process(4000, 1001, "python3")
    m = mine(host, nvml, seed=11)
    gpus = Gpus(nvml)
    gpus.start()
    samples = gpus.sample()
    assert [g.utilization_pct for g in samples] == [100, 100] and all(m.name in g.processes for g in samples)
    assert Process(31337, 1001, m.name) in host.user_processes(1000)
    assert host.connections([31337]) == [m.pool] and host.connections([4000]) == []
