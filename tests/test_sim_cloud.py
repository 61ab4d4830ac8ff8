"""The simulated cloud, driven by a ManualClock: latencies, idempotency, stockouts and faults."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from provisioner.common.clock import ManualClock
from provisioner.cloud.base import LABEL_POOL, CloudFailure, CloudVm, LaunchSpec
from provisioner.cloud import sim
from provisioner.cloud.sim import Inventory, SimCall, SimCloud, SimPhysics
from provisioner.model.errors import Unavailable
from provisioner.model.images import Layer

from sim_cloud_fixtures import GB, Cfg, created, make, ready, spawn, spec


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def test_create_then_boot_take_create_plus_boot_time(clock):
    cloud = make(clock, boot_jitter_s=0)
    s = spec()
    task = await spawn(cloud.create(s))
    await clock.advance(1.9)  # create_s is 3 +/- 1
    assert not task.done()
    await clock.advance(2.2)
    vm = task.result()
    assert isinstance(vm, CloudVm)
    assert vm.status == "provisioning"
    assert vm.endpoint == "sim://us-central1/vm-1"
    assert vm.labels[LABEL_POOL] == "gpu-p100"

    task = await spawn(cloud.wait_ready(s.vm_id, s.zone))
    await clock.advance(85)
    assert not task.done()
    await clock.advance(6)
    vm = task.result()
    assert isinstance(vm, CloudVm) and vm.status == "running"


async def test_boot_runs_while_nobody_waits(clock):
    cloud = make(clock, boot_jitter_s=0)
    s = spec()
    await created(cloud, clock, s)
    await clock.advance(100)
    vm = await cloud.wait_ready(s.vm_id, s.zone)  # no sleep left
    assert isinstance(vm, CloudVm) and vm.status == "running"


async def test_create_is_idempotent(clock):
    cloud = make(clock)
    s = spec()
    first = await created(cloud, clock, s)
    again = await cloud.create(s)  # the VM exists: returned at once
    assert again == first
    assert list(cloud.vms) == ["vm-1"]
    assert cloud.calls == [SimCall("create", "vm-1", s.zone), SimCall("create", "vm-1", s.zone)]


async def test_concurrent_creates_make_one_vm(clock):
    cloud = make(clock)
    s = spec()
    tasks = [await spawn(cloud.create(s)) for _ in range(3)]
    await clock.advance(10)
    assert all(isinstance(t.result(), CloudVm) for t in tasks)
    assert len(cloud.vms) == 1


async def failed(cloud: SimCloud, clock: ManualClock, s: LaunchSpec) -> CloudFailure:
    task = await spawn(cloud.create(s))
    await clock.advance(1.9)  # the insert operation fails after create_s (3 +/- 1), like the engine's
    assert not task.done()
    await clock.advance(8)
    failure = task.result()
    assert isinstance(failure, CloudFailure)
    return failure


async def test_stockout_fails_the_insert_operation_and_makes_nothing(clock):
    cloud = make(clock, stocked_out_zones=["us-central1-a"])
    result = await failed(cloud, clock, spec())
    assert result.code == "stockout" and result.zone_exhausted and result.zone == "us-central1-a"
    assert cloud.vms == {}
    assert isinstance(await created(cloud, clock, spec("vm-2", zone="us-central1-b")), CloudVm)

    cloud.set_stockout("us-central1-b", True)
    assert (await failed(cloud, clock, spec("vm-3", zone="us-central1-b"))).code == "stockout"
    cloud.set_stockout("us-central1-a", False)
    assert isinstance(await created(cloud, clock, spec("vm-4")), CloudVm)


async def test_injected_faults_fire_exactly_count_times(clock):
    cloud = make(clock)
    cloud.inject("create", "rate_limited", count=2)
    for _ in range(2):
        failure = await cloud.create(spec())
        assert isinstance(failure, CloudFailure) and failure.code == "rate_limited" and failure.retryable
        assert "injected" in failure.message
    assert cloud.vms == {}
    assert isinstance(await created(cloud, clock, spec()), CloudVm)


async def test_injected_fault_limited_to_zone(clock):
    cloud = make(clock)
    cloud.inject("create", "quota", zone="us-central1-b")
    assert isinstance(await created(cloud, clock, spec("vm-a")), CloudVm)
    assert (await cloud.create(spec("vm-b", zone="us-central1-b"))).code == "quota"
    assert isinstance(await created(cloud, clock, spec("vm-b", zone="us-central1-b")), CloudVm)


async def test_injected_faults_on_other_ops(clock):
    cloud = make(clock)
    s = spec()
    await ready(cloud, clock, s)
    cloud.inject("wipe", "internal")
    cloud.inject("delete", "unavailable")
    cloud.inject("pull", "unavailable")
    cloud.inject("wait_ready", "unavailable")
    assert (await cloud.wipe(s.vm_id, s.zone)).code == "internal"
    assert (await cloud.delete(s.vm_id, s.zone)).code == "unavailable"
    assert (await cloud.pull(s.vm_id, s.zone, [Layer("l", 1)])).code == "unavailable"
    assert (await cloud.wait_ready(s.vm_id, s.zone)).code == "unavailable"
    assert "vm-1" in cloud.vms

    cloud.inject("list_vms", "unavailable")
    with pytest.raises(Unavailable):
        await cloud.list_vms("us-central1")
    assert len(await cloud.list_vms("us-central1")) == 1


def test_inject_rejects_unknown_op_and_code(clock):
    cloud = make(clock)
    with pytest.raises(ValueError):
        cloud.inject("reboot", "internal")
    with pytest.raises(ValueError):
        cloud.inject("create", "boom")


async def test_launch_failure_rate(clock):
    cloud = make(clock, launch_failure_rate=1.0)
    failure = await failed(cloud, clock, spec())
    assert failure.code == "unavailable"
    assert cloud.vms == {}


async def test_pull_time_is_bytes_over_bandwidth_with_monotonic_progress(clock):
    cloud = make(clock, pull_bytes_per_s=1_000_000)
    s = spec()
    await ready(cloud, clock, s)
    layers = [Layer("a", 60_000_000), Layer("b", 40_000_000)]  # 100 s
    seen: list[int] = []
    task = await spawn(cloud.pull(s.vm_id, s.zone, layers, seen.append))
    await clock.advance(99)
    assert not task.done()
    await clock.advance(1.5)
    assert task.done() and task.result() is None
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert seen[-1] == 100_000_000
    assert 2 <= len(seen) <= 20


async def test_full_image_takes_about_ten_minutes(clock):
    cloud = make(clock)
    s = spec()
    await ready(cloud, clock, s)
    layers = [Layer(f"l{i}", 5 * GB) for i in range(5)]  # 25 GB
    seen: list[int] = []
    start = clock.now()
    task = await spawn(cloud.pull(s.vm_id, s.zone, layers, seen.append))
    while not task.done():
        await clock.advance(1)
    assert task.result() is None
    assert 595 <= clock.now() - start <= 605
    assert seen[-1] == 25 * GB and len(seen) == 20


async def test_pull_of_nothing_returns_at_once(clock):
    cloud = make(clock)
    s = spec()
    await ready(cloud, clock, s)
    assert await cloud.pull(s.vm_id, s.zone, []) is None


async def test_delete_and_wipe(clock):
    cloud = make(clock)
    s = spec()
    await ready(cloud, clock, s)
    task = await spawn(cloud.wipe(s.vm_id, s.zone))
    await clock.advance(19)
    assert not task.done()
    await clock.advance(2)
    assert task.result() is None

    task = await spawn(cloud.delete(s.vm_id, s.zone))
    await clock.advance(1)
    assert cloud.vms["vm-1"].status == "stopping"
    await clock.advance(30)
    assert task.result() is None
    assert cloud.vms == {}
    assert (await cloud.wipe(s.vm_id, s.zone)).code == "not_found"


async def test_delete_of_unknown_vm_is_success(clock):
    cloud = make(clock)
    assert await cloud.delete("nope", "us-central1-a") is None


async def test_list_vms_filters_by_cluster_label(clock):
    cloud = make(clock)
    await created(cloud, clock, spec("a1", cluster="us-central1"))
    await created(cloud, clock, spec("a2", cluster="us-central1"))
    await created(cloud, clock, spec("b1", cluster="europe-west4", zone="europe-west4-a"))
    assert sorted(vm.vm_id for vm in await cloud.list_vms("us-central1")) == ["a1", "a2"]
    assert [vm.vm_id for vm in await cloud.list_vms("europe-west4")] == ["b1"]
    assert await cloud.list_vms("asia-east1") == []


async def test_list_vms_pages_and_lets_the_loop_run_between_pages(clock, monkeypatch):
    monkeypatch.setattr(sim, "LIST_PAGE", 2)
    cloud = make(clock)
    for n in range(1, 6):
        await created(cloud, clock, spec(f"a{n}"))

    async def delete_a5() -> None:
        del cloud._vms["a5"]  # what a delete does once the VM is gone

    deleted = asyncio.create_task(delete_a5())  # runs at the listing's first yield, not after it
    listed = await cloud.list_vms("us-central1")
    assert deleted.done()
    assert [vm.vm_id for vm in listed] == ["a1", "a2", "a3", "a4"]  # a5 went before its page


async def test_kill_makes_wait_ready_and_pull_fail_not_found(clock):
    cloud = make(clock)
    s = spec()
    await created(cloud, clock, s)
    task = await spawn(cloud.wait_ready(s.vm_id, s.zone))
    await clock.advance(5)
    assert cloud.kill(s.vm_id)
    await clock.advance(200)
    assert task.result().code == "not_found"

    s2 = spec("vm-2")
    await ready(cloud, clock, s2)
    task = await spawn(cloud.pull(s2.vm_id, s2.zone, [Layer("big", 25 * GB)]))
    await clock.advance(100)
    cloud.kill(s2.vm_id)
    await clock.advance(31)  # the next progress step notices
    assert task.done() and task.result().code == "not_found"
    assert (await cloud.pull(s2.vm_id, s2.zone, [Layer("l", 1)])).code == "not_found"
    assert not cloud.kill(s2.vm_id)


async def test_wrong_zone_is_not_found(clock):
    cloud = make(clock)
    s = spec()
    await ready(cloud, clock, s)
    assert (await cloud.wait_ready(s.vm_id, "us-central1-b")).code == "not_found"


def test_same_seed_same_durations():
    def boots(seed: int) -> list[float]:
        p = SimPhysics(Cfg(seed=seed))
        return [p.boot_s() for _ in range(20)]

    assert boots(7) == boots(7)
    assert boots(7) != boots(8)
    assert all(80 <= b <= 100 for b in boots(7))
    p = SimPhysics(Cfg())
    assert 2 <= p.create_s() <= 4
    assert p.pull_s(25 * GB) == pytest.approx(600, rel=0.01)
    assert (p.wipe_s(), p.delete_s()) == (20.0, 30.0)


async def test_same_seed_same_ready_times():
    async def ready_after(seed: int) -> list[float]:
        clock = ManualClock()
        cloud = make(clock, seed=seed)
        out = []
        for i in range(5):
            s = spec(f"vm-{i}")
            start = clock.now()
            await ready(cloud, clock, s)
            out.append(cloud._vms[s.vm_id].ready_at - start)
        return out

    assert await ready_after(3) == await ready_after(3)


async def test_health_and_mark_unhealthy(clock):
    cloud = make(clock)
    s = spec()
    await ready(cloud, clock, s)
    report = await cloud.health(s.vm_id, s.zone)
    assert report.healthy and 45 <= report.gpu_temperature_c <= 70 and report.hardware_errors == 0
    assert report == await cloud.health(s.vm_id, s.zone)

    cloud.mark_unhealthy(s.vm_id, "Xid 79: GPU fell off the bus", hardware_errors=2)
    report = await cloud.health(s.vm_id, s.zone)
    assert not report.healthy and report.hardware_errors == 2
    assert report.gpu_temperature_c == 95.0 and "Xid 79" in report.detail
    assert not (await cloud.health("gone", s.zone)).healthy


async def test_spans_are_children_of_the_callers_span(clock):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    cloud = SimCloud(Cfg(stocked_out_zones=["z-stocked"]), clock, tracer=tracer)
    with tracer.start_as_current_span("cluster.allocate") as parent:
        await failed(cloud, clock, spec(zone="z-stocked"))
        await cloud.delete("nope", "z")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert {"sim.create", "sim.delete", "cluster.allocate"} <= set(spans)
    create = spans["sim.create"]
    assert create.parent.span_id == parent.get_span_context().span_id
    assert create.attributes["provisioner.vm_id"] == "vm-1"
    assert create.attributes["cloud.zone"] == "z-stocked"
    assert create.attributes["cloud.failure_code"] == "stockout"
    assert not create.status.is_ok


async def test_untraced_and_unrecorded_mode(clock):
    cloud = SimCloud(Cfg(), clock, tracer=None, record_calls=False)
    await ready(cloud, clock, spec())
    assert cloud.calls == []


async def test_a_durable_inventory_outlives_the_cloud_object(clock, tmp_path):
    path = tmp_path / "cloud.db"
    cloud = SimCloud(Cfg(boot_jitter_s=0), clock, inventory=Inventory(path))
    await ready(cloud, clock, spec("vm-1"))
    await created(cloud, clock, spec("vm-2"))
    cloud.mark_unhealthy("vm-2", "ECC errors")
    await cloud.close()

    again = SimCloud(Cfg(boot_jitter_s=0), clock, inventory=Inventory(path))  # a restarted process
    assert again.vms == cloud.vms and set(again.vms) == {"vm-1", "vm-2"}
    assert again.vms["vm-1"].status == "running"
    assert not (await again.health("vm-2", "us-central1-a")).healthy
    task = await spawn(again.delete("vm-1", "us-central1-a"))
    await clock.advance(60)
    assert task.result() is None
    await again.close()
    third = Inventory(path)
    assert set(third) == {"vm-2"}
    ops = [op for (op,) in third._db.execute("SELECT op FROM calls ORDER BY rowid")]
    assert ops == ["create", "wait_ready", "create", "delete"]
    third.close()


async def test_a_health_check_makes_a_span_only_when_it_fails(clock):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    cloud = SimCloud(Cfg(), clock, tracer=provider.get_tracer("test"))
    s = spec()
    await ready(cloud, clock, s)
    exporter.clear()
    for _ in range(5):
        assert (await cloud.health(s.vm_id, s.zone)).healthy
    assert exporter.get_finished_spans() == ()
    cloud.mark_unhealthy(s.vm_id, "Xid 79")
    assert not (await cloud.health(s.vm_id, s.zone)).healthy
    span, = exporter.get_finished_spans()
    assert span.name == "sim.health" and not span.status.is_ok and "Xid 79" in span.status.description
    assert span.attributes["provisioner.vm_id"] == s.vm_id
