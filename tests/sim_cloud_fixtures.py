"""The simulated cloud's configuration and calls, shared by its tests (test_sim_cloud*.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from provisioner.cloud.base import LABEL_CLUSTER, LABEL_POOL, CloudVm, LaunchSpec
from provisioner.cloud.sim import SimCloud
from provisioner.common.clock import ManualClock

GB = 1_000_000_000


@dataclass
class Cfg:
    boot_s: float = 90.0
    boot_jitter_s: float = 10.0
    pull_bytes_per_s: float = 41_666_667
    wipe_s: float = 20.0
    delete_s: float = 30.0
    stop_s: float = 15.0
    start_median_s: float = 45.0
    start_sigma: float = 0.6
    pool_start_median_s: dict[str, float] = field(default_factory=dict)
    stocked_out_zones: list[str] = field(default_factory=list)
    launch_failure_rate: float = 0.0
    seed: int = 0


def spec(vm_id: str = "vm-1", cluster: str = "us-central1", zone: str = "us-central1-a") -> LaunchSpec:
    return LaunchSpec(
        vm_id=vm_id,
        cluster=cluster,
        pool="gpu-p100",
        zone=zone,
        machine_type="n1-standard-8",
        accelerator="nvidia-tesla-p100",
        accelerator_count=1,
        labels={LABEL_CLUSTER: cluster, LABEL_POOL: "gpu-p100"},
    )


async def spawn(coro) -> asyncio.Task:
    """Starts the call and lets it reach its first clock sleep before the test advances time."""
    task = asyncio.create_task(coro)
    await asyncio.sleep(0)
    return task


def make(clock: ManualClock, **overrides) -> SimCloud:
    return SimCloud(Cfg(**overrides), clock)


async def created(cloud: SimCloud, clock: ManualClock, s: LaunchSpec) -> CloudVm:
    task = await spawn(cloud.create(s))
    await clock.advance(10)
    vm = task.result()
    assert isinstance(vm, CloudVm)
    return vm


async def ready(cloud: SimCloud, clock: ManualClock, s: LaunchSpec) -> CloudVm:
    await created(cloud, clock, s)
    task = await spawn(cloud.wait_ready(s.vm_id, s.zone))
    await clock.advance(200)
    vm = task.result()
    assert isinstance(vm, CloudVm) and vm.status == "running"
    return vm
