"""The gce backend when Compute answers badly and when VMs stop and start: 429 and 5xx bursts on
reads are never taken for bad news (a healthy VM stays healthy, a booting one is not lost, agent
commands carry on, guest attributes are read within Google's rate), and the standby tier's stop and
start keep a VM's instance and disk through 429s, 503s, lost answers and slow operations.
"""

from __future__ import annotations

import asyncio

from gce_fixtures import CLUSTER, PROJECT, TIME_SCALE, backend, gce_fleet, ready_vm, spec, until
from gce_fixtures import fake, loopback_only  # noqa: F401 (fixtures)
from live_records import follow
from provisioner.common.clock import RealClock
from provisioner.cloud.base import CloudFailure, CloudVm
from provisioner.cloud.gce import GUEST_IDLE_MAX_S, GceBackend


# ---- unknown is never bad news (429 and 5xx bursts on reads) --------------------------------------

async def test_a_burst_of_429s_on_reads_leaves_a_healthy_vm_healthy(tmp_path, fake, loopback_only):
    b = backend(tmp_path, fake, retry_attempts=2)
    await ready_vm(b, "vm-h")
    for op, status in (("get", 429), ("get", 503), ("getGuestAttributes", 429)):
        fake.failing.clear()
        await b.clock.sleep(GUEST_IDLE_MAX_S + 1)  # the last guest-attribute read is too old to reuse
        fake.fail_next(op, status, 20)  # more than every try (the client library retries some 503s itself)
        before = len(fake.calls(op))
        report = await b.health("vm-h", "us-central1-f")
        answered = {c.status for c in fake.calls(op)[before:]}
        assert answered == {status}, answered  # every read of the burst failed
        assert report.healthy, (op, status, report)
        assert report.detail.startswith("unknown: ") if op == "get" else report.detail == ""
    fake.failing.clear()
    # What is known stays bad news: a VM that is gone is unhealthy.
    del fake.instances[(PROJECT, "vm-h")]
    assert not (await b.health("vm-h", "us-central1-f")).healthy
    await b.close()


async def test_a_booting_vm_is_not_lost_to_429s_on_reads(tmp_path, fake, loopback_only):
    b = backend(tmp_path, fake, retry_attempts=2)
    fake.fail_next("get", 429, 5)  # right after the insert: the create must not report it never made
    vm = await b.create(spec("vm-b"))
    assert isinstance(vm, CloudVm) and vm.vm_id == "vm-b"
    fake.fail_next("get", 429, 5)  # the ready wait reads through the burst
    fake.fail_next("getGuestAttributes", 503, 3)
    ready = await b.wait_ready("vm-b", "us-central1-f")
    assert isinstance(ready, CloudVm) and ready.status == "running"
    await b.close()


async def test_agent_commands_carry_on_through_429s(tmp_path, fake, loopback_only):
    from provisioner.model.images import Layer

    b = backend(tmp_path, fake, retry_attempts=2)
    await ready_vm(b, "vm-c")
    fake.fail_next("get", 429, 3)  # reading the metadata to set the command
    fake.fail_next("setMetadata", 429, 3)
    fake.fail_next("getGuestAttributes", 429, 5)
    assert await b.pull("vm-c", "us-central1-f", [Layer("a", 10)]) is None
    fake.fail_next("getGuestAttributes", 503, 5)
    assert await b.wipe("vm-c", "us-central1-f") is None
    await b.close()


async def test_a_running_vm_has_an_endpoint(tmp_path, fake, loopback_only):
    b = backend(tmp_path, fake)
    vm = await ready_vm(b, "vm-e")
    ip = fake.instances[(PROJECT, "vm-e")].body["networkInterfaces"][0]["networkIP"]
    assert vm.endpoint == f"http://{ip}:8888"
    assert [v.endpoint for v in await b.list_vms(CLUSTER)] == [vm.endpoint]
    await b.close()


async def test_guest_attributes_are_read_within_googles_rate(tmp_path, fake, loopback_only):
    """About 10 reads a minute per VM are allowed: boot, a 3-minute pull and a wipe stay within
    that in every minute, and a quiet agent is read less often."""
    from provisioner.model.images import Layer

    b = backend(tmp_path, fake)  # poll_s 1: operations and boot are followed every model second
    fake.command_s = 0.6  # 180 model seconds
    await ready_vm(b, "vm-r")
    assert await b.pull("vm-r", "us-central1-f", [Layer("a", 600), Layer("b", 400)]) is None
    fake.command_s = 0.3
    assert await b.wipe("vm-r", "us-central1-f") is None
    reads = [c.at * TIME_SCALE for c in fake.calls("getGuestAttributes") if c.instance == "vm-r"]
    assert len(reads) >= 10
    worst = max(sum(1 for t in reads if start <= t < start + 60.0) for start in reads)
    assert worst <= 10, f"{worst} guest-attribute reads in one minute"
    assert all(c.query.get("queryPath") == "provisioner/" for c in fake.calls("getGuestAttributes"))
    await b.close()


async def test_a_health_check_reuses_a_recent_read_instead_of_queueing(tmp_path, fake, loopback_only):
    from provisioner.model.images import Layer

    b = backend(tmp_path, fake)
    await ready_vm(b, "vm-q")
    assert await b.pull("vm-q", "us-central1-f", [Layer("a", 10)]) is None
    reads = len(fake.calls("getGuestAttributes"))
    assert (await b.health("vm-q", "us-central1-f")).healthy
    assert len(fake.calls("getGuestAttributes")) == reads  # the pull's last read answered
    fake.instances[(PROJECT, "vm-q")].guest.update({"healthy": "0", "health-detail": "GPU 0 at 90 C"})
    await asyncio.sleep(31 / TIME_SCALE)  # older than that now: read again
    report = await b.health("vm-q", "us-central1-f")
    assert not report.healthy and report.detail == "GPU 0 at 90 C"
    await b.close()


async def test_a_burst_of_429s_fails_no_session_and_deletes_no_vm(tmp_path, fake, loopback_only):
    """The cluster's health pass during a burst of 429s on every read: the running session keeps
    running and no healthy VM is deleted."""
    from provisioner.decide.core import ClusterCore
    from provisioner.decide.ids import IdSource
    from provisioner.cluster.runtime import ClusterRuntime
    from provisioner.model.records import SessionSpec

    config = gce_fleet(tmp_path, fake, retry_attempts=2)
    cfg = config.cluster(CLUSTER)
    clock = RealClock(TIME_SCALE)
    runtime = ClusterRuntime(ClusterCore(cfg, config.catalog, config.settings.sessions, IdSource(CLUSTER)),
                             GceBackend(cfg, clock), clock)
    await runtime.start()
    try:
        core = runtime.core
        await until(lambda: sum(vm.state.value == "warm" for vm in core.vms.values()) >= 4, what="warm pools")
        s = follow(runtime)(runtime.allocate(SessionSpec("burst-1", "ada", "gpu-p100", "gpu:latest")))
        await until(lambda: s.state.value == "running", what="running session")
        live = {vid for vid, vm in core.vms.items() if vm.state.value in ("warm", "assigned")}
        for op in ("get", "getGuestAttributes"):
            fake.fail_next(op, 429, 200)
        await runtime._check(runtime._checkable())
        assert {c.status for c in fake.calls("get")[-4:]} == {429}  # the pass did read into the burst
        fake.failing.clear()
        assert s.state.value == "running"
        assert all(core.vms[vid].healthy and core.vms[vid].state.value != "deleting" for vid in live)
        assert live <= fake.names(PROJECT)
    finally:
        await runtime.close()


# ---- stop and start: the standby tier ---------------------------------------------------------

async def test_a_stopped_vm_keeps_its_instance_and_disk_and_starts_again(tmp_path, fake, loopback_only):
    b = backend(tmp_path, fake)
    vm = await ready_vm(b, "vm-s")
    disks = fake.instances[(PROJECT, "vm-s")].body["disks"]
    fake.stop_s = 0.1  # 30 model seconds: the stop operation is waited for
    assert await b.stop("vm-s", "us-central1-f") is None
    assert fake.status(PROJECT, "vm-s") == "TERMINATED"
    assert fake.instances[(PROJECT, "vm-s")].body["disks"] == disks  # the boot disk (the image cache) stays
    assert [v.status for v in await b.list_vms(CLUSTER)] == ["terminated"]
    assert (await b.health("vm-s", "us-central1-f")).detail == "the VM is terminated"
    assert await b.stop("vm-s", "us-central1-f") is None  # stopped already

    started = await b.start("vm-s", "us-central1-f")
    assert isinstance(started, CloudVm) and started.vm_id == "vm-s"
    again = await b.wait_ready("vm-s", "us-central1-f")  # the agent reports ready after this boot
    assert isinstance(again, CloudVm) and again.status == "running" and again.endpoint == vm.endpoint
    assert isinstance(await b.start("vm-s", "us-central1-f"), CloudVm)  # running already
    for c in fake.calls("stop") + fake.calls("start"):
        assert c.method == "POST" and c.project == PROJECT and c.query["requestId"]
    assert (await b.stop("nope", "us-central1-f")).code == "not_found"
    assert (await b.start("nope", "us-central1-f")).code == "not_found"
    await b.close()


async def test_a_start_in_a_stocked_out_or_over_quota_zone_fails_as_a_create_does(tmp_path, fake, loopback_only):
    b = backend(tmp_path, fake)
    await ready_vm(b, "vm-z")
    assert await b.stop("vm-z", "us-central1-f") is None
    fake.stocked_out.add("us-central1-f")
    out = await b.start("vm-z", "us-central1-f")  # the operation fails, as on GCE
    assert isinstance(out, CloudFailure) and out.code == "stockout" and out.zone_exhausted and out.zone == "us-central1-f"
    fake.sync_zone_errors = True  # or the call itself answers 503 ZONE_RESOURCE_POOL_EXHAUSTED: not retried
    starts = len(fake.calls("start"))
    out = await b.start("vm-z", "us-central1-f")
    assert isinstance(out, CloudFailure) and out.code == "stockout" and len(fake.calls("start")) == starts + 1
    fake.stocked_out.clear()
    fake.exceed_quota("GPUS_ALL_REGIONS")
    out = await b.start("vm-z", "us-central1-f")
    assert isinstance(out, CloudFailure) and out.code == "quota" and out.scope == "project"
    assert fake.status(PROJECT, "vm-z") == "TERMINATED"
    fake.quotas_exceeded.clear()
    assert isinstance(await b.start("vm-z", "us-central1-f"), CloudVm)
    await b.close()


async def test_stop_and_start_through_429s_503s_lost_answers_and_slow_operations(tmp_path, fake, loopback_only):
    b = backend(tmp_path, fake, retry_attempts=3)
    await ready_vm(b, "vm-r")
    fake.fail_next("stop", 429, 2)
    assert await b.stop("vm-r", "us-central1-f") is None
    stops = fake.calls("stop")
    assert [c.status for c in stops] == [429, 429, 200] and len({c.query["requestId"] for c in stops}) == 1

    fake.fail_next("start", 503, 3)
    out = await b.start("vm-r", "us-central1-f")
    assert isinstance(out, CloudFailure) and out.code == "unavailable" and out.retryable
    assert fake.status(PROJECT, "vm-r") == "TERMINATED"

    fake.answers_lost["start"] = 1  # carried out, answered 503: the retry with its request id finds its operation
    fake.op_s = 0.3  # and that operation is slow: followed until done
    polls = len(fake.calls("operations.get"))
    assert isinstance(await b.start("vm-r", "us-central1-f"), CloudVm)
    assert len(fake.calls("operations.get")) > polls + 1
    last = fake.calls("start")[-2:]
    assert [c.status for c in last] == [503, 200] and last[0].query["requestId"] == last[1].query["requestId"]
    assert isinstance(await b.wait_ready("vm-r", "us-central1-f"), CloudVm)

    fake.op_s, fake.stop_s = 0.02, 5.0  # a start while the stop is still under way: unavailable, retried
    stopping = asyncio.create_task(b.stop("vm-r", "us-central1-f"))
    await until(lambda: fake.status(PROJECT, "vm-r") == "STOPPING", what="stopping")
    out = await b.start("vm-r", "us-central1-f")
    assert isinstance(out, CloudFailure) and out.code == "unavailable" and "not ready" in out.message
    stopping.cancel()
    await b.close()


async def test_health_carries_the_agents_usage_report(tmp_path, fake, loopback_only):
    from provisioner.agent.simulated import miner

    b = backend(tmp_path, fake)
    await ready_vm(b, "vm-u")
    assert (await b.health("vm-u", "us-central1-f")).usage is None  # no report yet
    usage = miner(5).usage()
    fake.instances[(PROJECT, "vm-u")].guest.update({"usage": usage.to_json(), "healthy": "0", "health-detail": "hot"})
    await asyncio.sleep(31 / TIME_SCALE)  # past the reuse of the last read
    report = await b.health("vm-u", "us-central1-f")
    assert not report.healthy and report.usage == usage
    fake.instances[(PROJECT, "vm-u")].guest.update({"usage": "{not json", "healthy": "1"})
    await asyncio.sleep(31 / TIME_SCALE)
    report = await b.health("vm-u", "us-central1-f")
    assert report.healthy and report.usage is None  # a malformed report is no report
    await b.close()
