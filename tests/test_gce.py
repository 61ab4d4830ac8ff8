"""The gce backend: the real google-cloud-compute client against a local fake Compute server.

The cluster service runs on it (real gRPC over loopback): it fills its warm pools, serves a
session (pull and wipe through the VM agent's metadata and guest attributes), routes around a
stocked-out zone, and after a restart adopts the VMs it made and deletes one no record claims.
The fake's request log shows every call; no request leaves loopback.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import time

import pytest

from conftest import cluster_channel, fleet_config
from fake_compute import FakeCompute
from provisioner.common.clock import RealClock
from provisioner.cloud.base import CloudFailure, CloudVm, LaunchSpec
from provisioner.cloud.gce import GUEST_IDLE_MAX_S, GceBackend, request_id
from provisioner.cli.serve import start_cluster
from provisioner.v1 import cluster_service_pb2 as c_pb
from provisioner.v1 import cluster_service_pb2_grpc as c_grpc
from provisioner.v1 import types_pb2 as pb

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


async def test_the_cluster_fills_serves_and_survives_a_stockout(tmp_path, fake, loopback_only):
    with pytest.raises(OSError):  # the network is out of reach here
        socket.create_connection(("compute.googleapis.com", 443), timeout=1)
    fake.stocked_out.add("us-central1-c")  # gpu-p100 has zones c and f
    fake.stocked_out.add("us-central1-a")  # gpu-t4x2 has zones a, b, c and f
    config = gce_fleet(tmp_path, fake)
    proc = await start_cluster(config, CLUSTER, RealClock(TIME_SCALE), tmp_path / "data", address="127.0.0.1:0")
    try:
        await until(lambda: all(n >= 2 for n in warm_per_pool(proc).values()), what="warm pools")
        inserts = fake.calls("insert")
        assert {"us-central1-a", "us-central1-c"} <= {c.zone for c in inserts}, "the failing zones were never tried"
        made = {inst.name: inst.zone for inst in fake.instances.values()}
        core = proc.runtime.core
        for pool, good in (("gpu-p100", {"us-central1-f"}), ("gpu-t4x2", {"us-central1-b", "us-central1-f"})):
            vms = [vid for vid, vm in core.vms.items() if vm.pool == pool and vid in made]
            assert vms and {made[vid] for vid in vms} <= good, pool
        # The zones' failures reached the core's memory of failing zones.
        assert "us-central1-c" in core.pools["gpu-p100"].stocked_out_until
        assert "us-central1-a" in core.pools["gpu-t4x2"].stocked_out_until
        # Every insert: our project and zone, the pool's shape, GPUs that stop for maintenance, our labels.
        for c in inserts:
            b = c.body
            assert c.project == PROJECT and b["machineType"] == f"zones/{c.zone}/machineTypes/" + (
                "n1-standard-8" if b["labels"]["provisioner-pool"] == "gpu-p100" else "n1-standard-16")
            assert b["guestAccelerators"][0]["acceleratorType"].startswith(f"zones/{c.zone}/acceleratorTypes/nvidia-")
            assert b["scheduling"]["onHostMaintenance"] == "TERMINATE"
            assert b["labels"]["provisioner-cluster"] == CLUSTER and b["labels"]["provisioner-request"] == b["name"]
            assert b["disks"][0]["initializeParams"]["diskSizeGb"] == "250"
            assert c.query["requestId"] == request_id(b["name"])
            assert any(i["key"] == "provisioner-images" for i in b["metadata"]["items"])
            assert {"key": "enable-guest-attributes", "value": "TRUE"} in b["metadata"]["items"]
        assert {c.project for c in fake.log} == {PROJECT}
        for c in fake.log:
            if c.instance and c.op != "insert" and (PROJECT, c.instance) in fake.instances:
                assert c.zone == fake.instances[(PROJECT, c.instance)].zone

        # A session: a warm VM pulls what it lacks through the agent, then runs; a stop wipes it.
        async with cluster_channel(tmp_path / "data", None, proc.address, CLUSTER) as ch:
            stub = c_grpc.ClusterServiceStub(ch)
            spec = pb.SessionSpec(request_id="gce-1", user_id="ada", accelerator="gpu-p100", image="gpu:latest")
            s = (await stub.Allocate(c_pb.AllocateRequest(spec=spec), timeout=10)).session
            await until(lambda: proc.runtime.core.sessions[s.id].state.value == "running", what="running session")
            vm_id = proc.runtime.core.sessions[s.id].vm_id
            # Reached at the VM's internal address (Get answers with it too).
            ip = fake.instances[(PROJECT, vm_id)].body["networkInterfaces"][0]["networkIP"]
            got = (await stub.Get(c_pb.GetRequest(session_id=s.id), timeout=10)).session
            assert got.endpoint == f"http://{ip}:8888" == proc.runtime.core.sessions[s.id].endpoint
            await stub.Stop(c_pb.StopRequest(session_id=s.id, reason="done"), timeout=10)
            await until(lambda: proc.runtime.core.sessions[s.id].state.value == "stopped", what="stopped")
        commands = [c for c in fake.calls("setMetadata") if c.instance == vm_id]
        ops = [next(i["value"] for i in c.body["items"] if i["key"] == "provisioner-command") for c in commands]
        assert any('"op": "wipe"' in o for o in ops)
        assert proc.runtime.core.vms[vm_id].state.value == "warm"
    finally:
        await proc.stop(0.5)


async def test_a_restart_adopts_its_vms_and_deletes_unclaimed_ones(tmp_path, fake, loopback_only):
    config = gce_fleet(tmp_path, fake)
    clock = RealClock(TIME_SCALE)
    proc = await start_cluster(config, CLUSTER, clock, tmp_path / "data", address="127.0.0.1:0")
    await until(lambda: all(n >= 2 for n in warm_per_pool(proc).values()), what="warm pools")
    await proc.stop(0.5)
    mine = fake.names(PROJECT)
    fake.plant(PROJECT, "us-central1-a", "stray-vm", {"provisioner-cluster": CLUSTER, "provisioner-pool": "gpu-t4x2"})
    fake.plant(PROJECT, "us-central1-a", "someone-else", {"team": "other"})
    before = len(fake.log)

    proc = await start_cluster(config, CLUSTER, clock, tmp_path / "data", address="127.0.0.1:0")
    try:
        await until(lambda: "stray-vm" not in fake.names(PROJECT), timeout=30, what="the stray deleted")
        after = fake.log[before:]
        assert any(c.op == "list" and "provisioner-cluster" in c.query.get("filter", "") for c in after)
        assert [c.instance for c in after if c.op == "delete"] == ["stray-vm"]
        assert not any(c.op == "insert" and c.body["name"] in mine for c in after)  # adopted, not remade
        assert mine <= fake.names(PROJECT) and "someone-else" in fake.names(PROJECT)
        assert {vid for vid, vm in proc.runtime.core.vms.items() if vm.state.value == "warm"} >= mine
    finally:
        await proc.stop(0.5)


def spec(vm_id: str, zone: str = "us-central1-f") -> LaunchSpec:
    return LaunchSpec(vm_id=vm_id, cluster=CLUSTER, pool="gpu-p100", zone=zone, machine_type="n1-standard-8",
                      accelerator="nvidia-tesla-p100", accelerator_count=1,
                      labels={"provisioner-cluster": CLUSTER, "provisioner-pool": "gpu-p100",
                              "provisioner-request": vm_id}, images=("gpu:v160",))


def backend(tmp_path, fake, **changes) -> GceBackend:
    return GceBackend(gce_fleet(tmp_path, fake, **changes).cluster(CLUSTER), RealClock(TIME_SCALE))


async def test_without_an_endpoint_it_uses_application_default_credentials(tmp_path, monkeypatch, loopback_only):
    adc = tmp_path / "adc.json"  # what `gcloud auth application-default login` leaves
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "id", "client_secret": "s",
                               "refresh_token": "r"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))

    def edit(cluster: dict) -> None:
        cluster["backend"] = {"kind": "gce", "project": PROJECT, "retry_attempts": 1, "agent_package": "preinstalled"}
    b = GceBackend(fleet_config(tmp_path, edit).cluster(CLUSTER), RealClock(TIME_SCALE))
    out = await b.create(spec("vm-1"))  # first the token for those credentials, from Google
    assert isinstance(out, CloudFailure) and out.code == "unavailable" and "oauth2.googleapis.com" in out.message
    await b.close()


async def test_rate_limits_and_server_errors_are_retried_within_the_bound(tmp_path, fake, loopback_only):
    b = backend(tmp_path, fake, retry_attempts=4)
    fake.fail_next("insert", 429, 2)
    fake.fail_next("get", 503, 1)
    vm = await b.create(spec("vm-retried"))
    assert isinstance(vm, CloudVm) and vm.vm_id == "vm-retried"
    assert [c.status for c in fake.calls("insert")] == [429, 429, 200]

    fake.fail_next("insert", 403, 1, "rateLimitExceeded")  # the older way Compute says 429
    assert isinstance(await b.create(spec("vm-403")), CloudVm)
    assert [c.status for c in fake.calls("insert") if c.body["name"] == "vm-403"] == [403, 200]

    fake.fail_next("insert", 503, 10)
    failure = await b.create(spec("vm-never"))
    assert isinstance(failure, CloudFailure) and failure.code == "unavailable"
    assert len([c for c in fake.calls("insert") if c.body["name"] == "vm-never"]) == 4  # retry_attempts
    assert "vm-never" not in fake.names(PROJECT)
    await b.close()


async def test_an_insert_answered_with_an_error_after_its_commit_makes_one_vm(tmp_path, fake, loopback_only):
    b = backend(tmp_path, fake)
    fake.commit_then_fail = 1
    vm = await b.create(spec("vm-once"))
    assert isinstance(vm, CloudVm)
    inserts = [c for c in fake.calls("insert") if c.body["name"] == "vm-once"]
    assert [c.status for c in inserts] == [503, 200]  # the retry carried the same request id
    assert inserts[0].query["requestId"] == inserts[1].query["requestId"]
    assert sum(1 for name in fake.names(PROJECT) if name == "vm-once") == 1
    again = await b.create(spec("vm-once"))  # a create repeated much later finds it too
    assert isinstance(again, CloudVm)
    await b.close()


async def test_an_insert_that_times_out_after_its_commit_makes_one_vm(tmp_path, fake, loopback_only):
    b = backend(tmp_path, fake, call_timeout_s=0.3)
    fake.commit_then_stall, fake.stall_s = 1, 1.0
    vm = await b.create(spec("vm-slow-answer"))
    assert isinstance(vm, CloudVm)
    inserts = [c for c in fake.calls("insert") if c.body["name"] == "vm-slow-answer"]
    assert len(inserts) == 2 and len({c.query["requestId"] for c in inserts}) == 1
    assert len([name for name in fake.names(PROJECT) if name == "vm-slow-answer"]) == 1
    await b.close()


async def test_stockout_and_quota_answered_at_once_are_not_retried(tmp_path, fake, loopback_only):
    b = backend(tmp_path, fake)
    fake.sync_zone_errors = True
    fake.stocked_out.add("us-central1-c")
    fake.exceed_quota("NVIDIA_P100_GPUS", "us-central1")
    out = await b.create(spec("vm-c", "us-central1-c"))
    assert isinstance(out, CloudFailure) and out.code == "stockout" and out.zone == "us-central1-c"
    out = await b.create(spec("vm-b", "us-central1-b"))
    assert isinstance(out, CloudFailure) and out.code == "quota" and out.zone == "us-central1-b"
    assert out.scope == "region" and out.shared_by == "nvidia-tesla-p100"
    assert [(c.zone, c.status) for c in fake.calls("insert")] == [("us-central1-c", 503), ("us-central1-b", 403)]
    await b.close()


async def test_calls_in_flight_are_bounded(tmp_path, fake, loopback_only):
    b = backend(tmp_path, fake, max_concurrent_calls=2)
    fake.latency_s = 0.05
    made = await asyncio.gather(*(b.create(spec(f"vm-{i}")) for i in range(6)))
    assert all(isinstance(vm, CloudVm) for vm in made)
    assert fake.max_in_flight == 2
    await b.close()


async def test_stockout_quota_failed_operations_and_deletes(tmp_path, fake, loopback_only):
    b = backend(tmp_path, fake)
    fake.stocked_out.add("us-central1-c")
    fake.exceed_quota("NVIDIA_P100_GPUS", "us-central1")
    out = await b.create(spec("vm-c", "us-central1-c"))
    assert isinstance(out, CloudFailure) and out.code == "stockout" and out.zone_exhausted
    out = await b.create(spec("vm-b", "us-central1-b"))
    assert isinstance(out, CloudFailure) and out.code == "quota" and out.zone == "us-central1-b"
    fake.quotas_exceeded.clear()
    fake.fail_operations = 1
    out = await b.create(spec("vm-f"))
    assert isinstance(out, CloudFailure) and out.code == "internal"
    fake.op_s = 0.3  # a slow operation is waited for
    polls = len(fake.calls("operations.get"))
    vm = await b.create(spec("vm-slow"))
    assert isinstance(vm, CloudVm) and len(fake.calls("operations.get")) > polls + 1
    assert await b.delete("vm-slow", "us-central1-f") is None
    assert await b.delete("vm-slow", "us-central1-f") is None  # 404: already gone
    assert "vm-slow" not in fake.names(PROJECT)
    assert [c.status for c in fake.calls("delete")] == [200, 404]
    await b.close()

    impatient = backend(tmp_path / "impatient", fake, operation_timeout_s=30.0)  # 0.1 s of wall time
    fake.op_s = 0.02
    assert isinstance(await impatient.create(spec("vm-stuck")), CloudVm)
    fake.op_s = 2.0
    out = await impatient.delete("vm-stuck", "us-central1-f")
    assert isinstance(out, CloudFailure) and out.code == "unavailable" and "not done" in out.message
    await impatient.close()


async def test_pull_reports_progress_and_wipe_completes(tmp_path, fake, loopback_only):
    from provisioner.model.images import Layer

    b = backend(tmp_path, fake)
    assert isinstance(await b.create(spec("vm-p")), CloudVm)
    assert isinstance(await b.wait_ready("vm-p", "us-central1-f"), CloudVm)
    fake.command_s = 0.3
    seen: list[int] = []
    assert await b.pull("vm-p", "us-central1-f", [Layer("a", 600), Layer("b", 400)], seen.append) is None
    assert seen and seen[-1] == 1000 and seen == sorted(seen)
    assert await b.wipe("vm-p", "us-central1-f") is None
    assert (await b.health("vm-p", "us-central1-f")).healthy
    listed = await b.list_vms(CLUSTER)
    assert [v.vm_id for v in listed] == ["vm-p"] and listed[0].zone == "us-central1-f"
    failure = await b.pull("nope", "us-central1-f", [Layer("a", 1)])
    assert isinstance(failure, CloudFailure) and failure.code == "not_found"
    await b.close()


# ---- unknown is never bad news (429 and 5xx bursts on reads) --------------------------------------

async def ready_vm(b: GceBackend, vm_id: str) -> CloudVm:
    assert isinstance(await b.create(spec(vm_id)), CloudVm)
    vm = await b.wait_ready(vm_id, "us-central1-f")
    assert isinstance(vm, CloudVm)
    return vm


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
        s = runtime.allocate(SessionSpec("burst-1", "ada", "gpu-p100", "gpu:latest"))
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
