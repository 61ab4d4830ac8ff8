"""The simulated cloud's stop and start: the standby tier (provisioner/cloud/sim.py)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from provisioner.cloud.base import CloudVm, LaunchSpec
from provisioner.cloud.sim import SimCloud, SimPhysics
from provisioner.common.clock import ManualClock
from provisioner.model.images import Layer
from sim_cloud_fixtures import GB, Cfg, make, ready, spawn, spec


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def standby_cfg(**overrides) -> dict:
    return {"stop_s": 15.0, "start_median_s": 45.0, "start_sigma": 0.0, **overrides}


async def stopped(cloud: SimCloud, clock: ManualClock, s: LaunchSpec) -> None:
    task = await spawn(cloud.stop(s.vm_id, s.zone))
    await clock.advance(14)
    assert not task.done() and cloud.vms[s.vm_id].status == "stopping"
    await clock.advance(2)
    assert task.result() is None and cloud.vms[s.vm_id].status == "terminated"


async def test_a_stopped_vm_keeps_its_disk_runs_nothing_and_starts_in_the_start_time(clock):
    cloud = make(clock, **standby_cfg())
    s = spec()
    await ready(cloud, clock, s)
    pull = await spawn(cloud.pull(s.vm_id, s.zone, [Layer("a", GB), Layer("b", GB)]))
    await clock.advance(60)
    assert pull.result() is None and cloud.disk(s.vm_id) == ["a", "b"]

    await stopped(cloud, clock, s)
    assert [vm.status for vm in await cloud.list_vms("us-central1")] == ["terminated"]
    for failure in (await cloud.wait_ready(s.vm_id, s.zone), await cloud.wipe(s.vm_id, s.zone),
                    await cloud.pull(s.vm_id, s.zone, [Layer("c", 1)])):
        assert failure.code == "unavailable" and "stopped" in failure.message
    assert await cloud.stop(s.vm_id, s.zone) is None  # stopped already: nothing to wait for

    t0 = clock.now()
    start = await spawn(cloud.start(s.vm_id, s.zone))
    await clock.advance(5)  # the start operation (create_s, 3 +/- 1)
    vm = start.result()
    assert isinstance(vm, CloudVm) and vm.status == "provisioning"
    waiting = await spawn(cloud.wait_ready(s.vm_id, s.zone))
    await clock.advance(t0 + 44.9 - clock.now())
    assert not waiting.done()
    await clock.advance(0.2)
    assert waiting.result().status == "running"
    assert cloud.disk(s.vm_id) == ["a", "b"]  # the image cache came back with it
    assert (await cloud.start(s.vm_id, s.zone)).status == "running"  # started already


async def test_a_start_is_refused_while_the_stop_runs_and_a_stop_interrupts_a_pull(clock):
    cloud = make(clock, **standby_cfg())
    s = spec()
    await ready(cloud, clock, s)
    pull = await spawn(cloud.pull(s.vm_id, s.zone, [Layer("a", 25 * GB)]))
    stop = await spawn(cloud.stop(s.vm_id, s.zone))
    assert (await cloud.start(s.vm_id, s.zone)).code == "unavailable"
    await clock.advance(30)
    assert stop.result() is None
    assert pull.result().code == "unavailable" and cloud.disk(s.vm_id) == []
    assert (await cloud.stop("vm-none", s.zone)).code == "not_found"
    assert (await cloud.start("vm-none", s.zone)).code == "not_found"


async def test_a_start_in_a_stocked_out_zone_fails_like_a_create_and_the_vm_stays_stopped(clock):
    cloud = make(clock, **standby_cfg())
    s = spec()
    await ready(cloud, clock, s)
    await stopped(cloud, clock, s)
    cloud.set_stockout(s.zone)
    task = await spawn(cloud.start(s.vm_id, s.zone))
    await clock.advance(1.9)
    assert not task.done()  # the operation fails, as an insert's does, after create_s
    await clock.advance(3)
    failure = task.result()
    assert failure.code == "stockout" and failure.zone_exhausted and failure.zone == s.zone
    assert cloud.vms[s.vm_id].status == "terminated"
    cloud.set_stockout(s.zone, False)
    task = await spawn(cloud.start(s.vm_id, s.zone))
    await clock.advance(5)
    assert task.result().status == "provisioning"


async def test_stop_and_start_take_injected_faults_and_a_start_whose_answer_is_lost_still_starts(clock):
    cloud = make(clock, **standby_cfg())
    s = spec()
    await ready(cloud, clock, s)
    cloud.inject("stop", "rate_limited")
    assert (await cloud.stop(s.vm_id, s.zone)).code == "rate_limited"
    assert cloud.vms[s.vm_id].status == "running"
    await stopped(cloud, clock, s)
    cloud.inject("start", "unavailable")
    cloud.inject("start", "quota")
    assert (await cloud.start(s.vm_id, s.zone)).code == "unavailable"
    assert (await cloud.start(s.vm_id, s.zone)).zone_exhausted
    assert cloud.vms[s.vm_id].status == "terminated"

    # The caller gives up on the answer; the cloud starts the VM all the same, and a retry finds it.
    task = await spawn(cloud.start(s.vm_id, s.zone))
    task.cancel()
    await asyncio.sleep(0)
    assert cloud.vms[s.vm_id].status == "provisioning"
    ready_at = cloud._vms[s.vm_id].ready_at
    assert (await cloud.start(s.vm_id, s.zone)).status == "provisioning"
    assert cloud._vms[s.vm_id].ready_at == ready_at  # one start, not two
    assert [c.op for c in cloud.calls].count("start") == 4


def test_start_times_are_seeded_lognormal_with_a_long_tail_and_a_median_per_pool():
    cfg = Cfg(**standby_cfg(start_sigma=0.6, pool_start_median_s={"gpu-t4x2": 90.0}), seed=4)
    p = SimPhysics(cfg)
    p100 = sorted(p.start_s("gpu-p100") for _ in range(4000))
    t4 = sorted(p.start_s("gpu-t4x2") for _ in range(4000))
    assert 42 < p100[2000] < 48 and 84 < t4[2000] < 96  # the pool's own median, else the cluster's
    assert 3.0 < p100[3960] / p100[2000] < 5.0  # p99 about 4 times the median
    assert p100[0] > 0 and p.stop_s() == 15.0

    def first(seed: int) -> list[float]:
        fresh = SimPhysics(dataclasses.replace(cfg, seed=seed))
        return [fresh.start_s("gpu-p100") for _ in range(5)]

    assert first(4) == first(4) != first(5)


def test_the_shipped_clusters_configure_stop_start_and_the_disk_price(tmp_path):
    from pathlib import Path

    from provisioner.config import ConfigError, load_cluster

    shipped = Path(__file__).parent.parent / "clusters" / "us-central1.yaml"
    c = load_cluster(shipped)
    assert (c.sim.stop_s, c.sim.start_median_s, c.sim.start_sigma) == (15, 45, 0.6)
    assert all(0 < p.disk_hourly_price_usd < p.hourly_price_usd / 40 for p in c.pools)
    text = shipped.read_text()
    bad = tmp_path / "c.yaml"
    bad.write_text(text.replace("pool_start_median_s: {}", "pool_start_median_s: {gpu-v100: 60}"))
    with pytest.raises(ConfigError) as e:
        load_cluster(bad)
    assert e.value.field == "sim.pool_start_median_s.gpu-v100" and "no pool 'gpu-v100'" in e.value.reason
    bad.write_text(text.replace("disk_hourly_price_usd: 0.03", "disk_hourly_price_usd: 2.5", 1))
    with pytest.raises(ConfigError) as e:
        load_cluster(bad)
    assert e.value.field == "pools[0].disk_hourly_price_usd" and "cannot cost more" in e.value.reason
