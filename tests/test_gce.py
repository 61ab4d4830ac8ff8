"""The gce backend: the real google-cloud-compute client against a local fake Compute server.

The cluster service runs on it (real gRPC over loopback): it fills its warm pools, serves a
session (pull and wipe through the VM agent's metadata and guest attributes), routes around a
stocked-out zone, and after a restart adopts the VMs it made and deletes one no record claims.
The fake's request log shows every call; no request leaves loopback.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from conftest import cluster_channel, fleet_config
from gce_fixtures import CLUSTER, PROJECT, TIME_SCALE, backend, gce_fleet, spec, until, warm_per_pool
from gce_fixtures import fake, loopback_only  # noqa: F401 (fixtures)
from provisioner.common.clock import RealClock
from provisioner.cloud.base import CloudFailure, CloudVm
from provisioner.cloud.gce import GceBackend, request_id
from provisioner.cli.serve import start_cluster
from provisioner.v1 import cluster_service_pb2 as c_pb
from provisioner.v1 import cluster_service_pb2_grpc as c_grpc
from provisioner.v1 import types_pb2 as pb

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
