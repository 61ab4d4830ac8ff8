"""The gce backend against a fake Compute API that answers as Google documents: what a VM is
made with (service account, disk type, subnetwork, a template that keeps each pool's shape,
names within 63 characters), and how far a quota or a stockout reaches."""

from __future__ import annotations

import json
import subprocess

from conftest import fleet_config
from compute_answers import NAME
from fake_compute import FakeCompute
from provisioner.common.clock import RealClock
from provisioner.cloud.base import CloudFailure, CloudVm, LaunchSpec
from provisioner.cloud.gce_instance import startup_script
from provisioner.decide.ids import IdSource
from provisioner.cli.serve import start_cluster
from gce_fixtures import CLUSTER, PROJECT, TIME_SCALE, backend, fake, gce_fleet, loopback_only, spec, until  # noqa: F401

VMS_ACCOUNT = "notebook-vms@test-proj.iam.gserviceaccount.com"
SUBNET = "regions/us-central1/subnetworks/notebooks"
CUSTOM_NET = "global/networks/notebooks"


async def test_every_vm_runs_as_the_service_account_on_a_balanced_disk_in_the_subnetwork(tmp_path, fake, loopback_only):
    fake.custom_networks.add(CUSTOM_NET)  # custom mode: an insert without a subnetwork is refused
    b = backend(tmp_path, fake, service_account=VMS_ACCOUNT, network=CUSTOM_NET, subnetwork=SUBNET)
    assert isinstance(await b.create(spec("vm-1")), CloudVm)
    body = fake.instances[(PROJECT, "vm-1")].body
    assert body["serviceAccounts"] == [{"email": VMS_ACCOUNT, "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    assert body["disks"][0]["initializeParams"]["diskType"] == "zones/us-central1-f/diskTypes/pd-balanced"
    assert body["networkInterfaces"][0]["subnetwork"] == SUBNET
    # GPUs stop for host maintenance and stay stopped: the cluster, not Compute, decides what next.
    assert body["scheduling"] == {"onHostMaintenance": "TERMINATE", "automaticRestart": False}
    await b.close()


async def test_a_spot_tier_vm_is_made_spot_in_an_on_demand_pool(tmp_path, fake, loopback_only):
    import dataclasses

    b = backend(tmp_path, fake)  # gpu-p100 is on demand: only the VM asked Spot is Spot
    assert isinstance(await b.create(dataclasses.replace(spec("vm-spot"), spot=True)), CloudVm)
    assert isinstance(await b.create(spec("vm-on-demand")), CloudVm)
    # Compute refuses a Spot VM that restarts; a preempted one is stopped, its disk kept.
    assert fake.instances[(PROJECT, "vm-spot")].body["scheduling"] == {
        "onHostMaintenance": "TERMINATE", "automaticRestart": False, "provisioningModel": "SPOT",
        "instanceTerminationAction": "STOP"}
    assert "provisioningModel" not in fake.instances[(PROJECT, "vm-on-demand")].body["scheduling"]
    assert {vm.vm_id: vm.spot for vm in await b.list_vms(CLUSTER)} == {"vm-spot": True, "vm-on-demand": False}
    await b.close()


async def test_a_pool_chooses_its_disk_type(tmp_path, fake, loopback_only):
    def edit(cluster: dict) -> None:
        cluster["backend"] = {"kind": "gce", "project": PROJECT, "endpoint": fake.endpoint, "poll_s": 1.0,
                              "agent_package": "preinstalled"}
        cluster["pools"][0]["boot_disk_type"] = "pd-ssd"
        for pool in cluster["pools"]:
            del pool["disk_hourly_price_usd"]

    from provisioner.cloud.gce import GceBackend
    cluster = fleet_config(tmp_path, edit).cluster(CLUSTER)
    pool, other = cluster.pools[0], cluster.pools[1]
    assert pool.name == "gpu-p100" and pool.disk_hourly_price_usd == round(0.17 * 250 / 730, 4)
    # A pool that names no disk type gets pd-balanced, priced as pd-balanced (list price per GB-month).
    assert other.boot_disk_type == "pd-balanced"
    assert other.disk_hourly_price_usd == round(0.10 * other.disk_cache_gb / 730, 4)
    b = GceBackend(cluster, RealClock(TIME_SCALE))
    assert isinstance(await b.create(spec("vm-ssd")), CloudVm)
    assert fake.instances[(PROJECT, "vm-ssd")].body["disks"][0]["initializeParams"]["diskType"].endswith("/pd-ssd")
    await b.close()


async def test_an_instance_template_keeps_each_pool_s_shape(tmp_path, fake, loopback_only):
    template = f"projects/{PROJECT}/global/instanceTemplates/notebook-vm"
    fake.templates[template] = {
        "machineType": "e2-small", "tags": {"items": ["notebook"]},
        "disks": [{"boot": True, "initializeParams": {"diskSizeGb": "10", "diskType": "pd-standard"}}],
        "networkInterfaces": [{"network": "global/networks/shared", "subnetwork": SUBNET}]}
    b = backend(tmp_path, fake, instance_template=template)
    assert isinstance(await b.create(spec("vm-t")), CloudVm)
    insert = fake.calls("insert")[-1]
    assert insert.query["sourceInstanceTemplate"] == template
    body = fake.instances[(PROJECT, "vm-t")].body
    assert body["machineType"] == "zones/us-central1-f/machineTypes/n1-standard-8"  # the pool's
    assert body["guestAccelerators"][0]["acceleratorType"].endswith("/nvidia-tesla-p100")
    assert body["disks"][0]["initializeParams"]["diskSizeGb"] == "250"
    assert body["disks"][0]["initializeParams"]["diskType"].endswith("/pd-balanced")
    assert body["tags"] == {"items": ["notebook"]}  # what the pool does not decide: the template's
    assert body["networkInterfaces"][0]["network"] == "global/networks/shared"
    await b.close()


async def test_long_cluster_and_pool_names_never_make_colliding_instance_names(tmp_path, fake, loopback_only):
    ids = IdSource("c" * 40, seed=7)
    names = [ids.vm("p" * 40) for _ in range(2)]
    assert all(len(n) <= 63 and NAME.match(n) for n in names) and names[0] != names[1]
    b = backend(tmp_path, fake)
    for name in names:
        assert isinstance(await b.create(spec(name)), CloudVm)
    assert fake.names(PROJECT) == set(names)
    await b.close()


def test_the_startup_script_is_valid_shell_and_the_one_in_deploy():
    from pathlib import Path
    script = startup_script()
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert Path(__file__).parent.parent.joinpath("deploy/agent/startup-script.sh").read_text() == script
    unit = Path(__file__).parent.parent.joinpath("deploy/agent/provisioner-agent.service").read_text()
    unit_lines = [line for line in unit.splitlines() if line and not line.startswith("#")]
    assert all(line in script.splitlines() for line in unit_lines)


async def test_every_vm_is_given_the_startup_script_and_the_agent_to_install(tmp_path, fake, loopback_only):
    b = backend(tmp_path, fake, agent_package="gs://test-bucket/provisioner-1.0-py3-none-any.whl")
    assert isinstance(await b.create(spec("vm-s")), CloudVm)
    items = {i["key"]: i["value"] for i in fake.instances[(PROJECT, "vm-s")].body["metadata"]["items"]}
    assert items["startup-script"] == startup_script()
    assert items["provisioner-agent-package"] == "gs://test-bucket/provisioner-1.0-py3-none-any.whl"
    assert items["install-nvidia-driver"] == "TRUE"
    await b.close()


async def test_quota_failures_say_how_far_they_reach(tmp_path, fake, loopback_only):
    b = backend(tmp_path, fake)
    fake.exceed_quota("NVIDIA_P100_GPUS", "us-central1")
    out = await b.create(spec("vm-r", "us-central1-c"))
    assert isinstance(out, CloudFailure) and (out.code, out.scope, out.shared_by) == ("quota", "region", "nvidia-tesla-p100")
    assert "NVIDIA_P100_GPUS" in out.message and "us-central1" in out.message
    fake.quotas_exceeded.clear()
    fake.exceed_quota("GPUS_ALL_REGIONS")
    out = await b.create(spec("vm-p", "us-central1-c"))
    assert isinstance(out, CloudFailure) and (out.code, out.scope, out.shared_by) == ("quota", "project", "")
    fake.quotas_exceeded.clear()
    fake.stocked_out.add("us-central1-c")
    fake.zones_available["us-central1-c"] = ["us-central1-f", "us-central1-b"]
    out = await b.create(spec("vm-s", "us-central1-c"))
    assert isinstance(out, CloudFailure) and out.code == "stockout" and out.scope == "zone"
    assert out.zones_available == ("us-central1-f", "us-central1-b")
    await b.close()


def one_vm_fleet(tmp_path, fake: FakeCompute, spot_pool: str = ""):
    """Each pool wants one VM: a second launch comes only after the first one's answer."""
    def edit(cluster: dict) -> None:
        cluster["backend"] = {"kind": "gce", "project": PROJECT, "endpoint": fake.endpoint, "poll_s": 1.0,
                              "retry_total_s": 10.0, "agent_package": "preinstalled"}
        for pool in cluster["pools"]:
            pool.update(min_vms=1, max_vms=6)
            if pool["name"] == spot_pool:
                pool["provisioning_model"] = "spot"
    return fleet_config(tmp_path, edit)


def pool_inserts(fake: FakeCompute, pool: str) -> list:
    return [c for c in fake.calls("insert") if c.body.get("labels", {}).get("provisioner-pool") == pool]


async def test_a_regional_gpu_quota_stops_the_region_s_other_zones_and_a_hint_steers_a_stockout(tmp_path, fake,
                                                                                                loopback_only):
    fake.exceed_quota("NVIDIA_T4_GPUS", "us-central1")  # gpu-t4x2: zones a, b, c and f
    fake.stocked_out.update({"us-central1-c"})  # gpu-p100: zones c and f
    fake.zones_available["us-central1-c"] = ["us-central1-a"]  # none of the P100 pool's zones but c...
    proc = await start_cluster(one_vm_fleet(tmp_path, fake), CLUSTER, RealClock(TIME_SCALE), tmp_path / "data",
                               address="127.0.0.1:0")
    try:
        core = proc.runtime.core
        t4 = core.pools["gpu-t4x2"]
        await until(lambda: all(t4.stocked_out_until.get(z, 0) > 0 for z in t4.config.zones), what="t4 zones skipped")
        tried = len(pool_inserts(fake, "gpu-t4x2"))
        assert tried == 1  # one zone's answer stands for the region's
        p100 = core.pools["gpu-p100"]
        await until(lambda: p100.stocked_out_until.get("us-central1-c", 0) > 0, what="p100 stockout")
        # ...so f, which the hint leaves out, is skipped too instead of being tried next.
        assert p100.stocked_out_until.get("us-central1-f", 0) > 0
        await proc.runtime.clock.sleep(120)  # two model minutes: nothing is tried again
        assert len(pool_inserts(fake, "gpu-t4x2")) == tried
        assert {c.zone for c in pool_inserts(fake, "gpu-p100")} == {"us-central1-c"}
    finally:
        await proc.stop()


async def test_a_project_wide_quota_stops_every_pool(tmp_path, fake, loopback_only):
    fake.exceed_quota("GPUS_ALL_REGIONS")
    proc = await start_cluster(one_vm_fleet(tmp_path, fake), CLUSTER, RealClock(TIME_SCALE), tmp_path / "data",
                               address="127.0.0.1:0")
    try:
        pools = proc.runtime.core.pools.values()
        await until(lambda: all(p.stocked_out_until.get(z, 0) > 0 for p in pools for z in p.config.zones),
                    what="every zone of every pool skipped")
        tried = len(fake.calls("insert"))
        await proc.runtime.clock.sleep(120)
        assert len(fake.calls("insert")) == tried
        assert tried <= len(pools)  # at most the launches under way when the first answer came
    finally:
        await proc.stop()


async def test_a_lost_answer_is_asked_for_again_instead_of_hanging_the_command(tmp_path, fake, loopback_only):
    # An hour-long command timeout would hold the pull; the silence before asking again is minutes.
    b = backend(tmp_path, fake, command_timeout_s=3600.0, command_silence_s=60.0)
    assert isinstance(await b.create(spec("vm-q")), CloudVm)
    assert isinstance(await b.wait_ready("vm-q", "us-central1-f"), CloudVm)
    fake.drop_done = 1  # the agent's done-<id> is dropped (written beyond the VM's rate)
    started = b.clock.now()
    assert await b.pull("vm-q", "us-central1-f", []) is None
    assert b.clock.now() - started < 600  # model seconds: well before the command's timeout
    commands = [c for c in fake.calls("setMetadata") if c.instance == "vm-q"]
    asks = [json.loads(next(i["value"] for i in c.body["items"] if i["key"] == "provisioner-command")) for c in commands]
    assert len({a["id"] for a in asks}) == 1 and [a.get("ask", 0) for a in asks] == [0, 1]
    await b.close()


async def test_a_command_still_at_work_is_not_taken_for_a_lost_answer(tmp_path, fake, loopback_only):
    # A wipe (or a layer being unpacked) reports nothing for longer than the silence; asked again,
    # the agent says `asked-<id>`, and the command goes on to its end instead of failing.
    b = backend(tmp_path, fake, command_timeout_s=3600.0, command_silence_s=60.0)
    assert isinstance(await b.create(spec("vm-w")), CloudVm)
    assert isinstance(await b.wait_ready("vm-w", "us-central1-f"), CloudVm)
    fake.command_s = 4.0  # 1,200 model seconds: many silences long
    started = b.clock.now()
    assert await b.wipe("vm-w", "us-central1-f") is None
    assert b.clock.now() - started >= 1200
    asks = [json.loads(next(i["value"] for i in c.body["items"] if i["key"] == "provisioner-command")).get("ask", 0)
            for c in fake.calls("setMetadata") if c.instance == "vm-w"]
    assert max(asks) > 2  # asked more often than an agent that never answers may be
    await b.close()


async def test_a_running_vm_whose_agent_reports_preemption_or_maintenance_is_taken(tmp_path, fake, loopback_only):
    # The agent's word comes before the instance's status: a VM still RUNNING that reports
    # `preempted` or `maintenance` is reported with that cause.
    b = backend(tmp_path, fake)
    assert isinstance(await b.create(spec("vm-p")), CloudVm)
    assert isinstance(await b.wait_ready("vm-p", "us-central1-f"), CloudVm)
    guest = fake.instances[(PROJECT, "vm-p")].guest
    guest["maintenance"] = "MIGRATE_ON_HOST_MAINTENANCE"
    await b.clock.sleep(60)  # past the health read's reuse of a recent read
    report = await b.health("vm-p", "us-central1-f")
    assert (report.healthy, report.cause, report.detail) == (False, "maintenance",
                                                             "host maintenance (MIGRATE_ON_HOST_MAINTENANCE)")
    guest["preempted"] = "TRUE"
    await b.clock.sleep(60)
    report = await b.health("vm-p", "us-central1-f")
    assert fake.status(PROJECT, "vm-p") == "RUNNING"
    assert (report.healthy, report.cause, report.detail) == (False, "preempted", "preempted (spot)")
    await b.close()


async def running(proc, stub, request_id: str, kind=None) -> str:
    from provisioner.v1 import cluster_service_pb2 as c_pb
    from provisioner.v1 import types_pb2 as pb
    spec_ = pb.SessionSpec(request_id=request_id, user_id="ada", accelerator="gpu-p100", image="gpu:latest",
                           kind=kind or pb.SESSION_KIND_INTERACTIVE)
    s = (await stub.Allocate(c_pb.AllocateRequest(spec=spec_), timeout=10)).session
    await until(lambda: proc.runtime.core.sessions[s.id].state.value == "running", what=f"{request_id} running")
    return s.id


async def test_maintenance_and_spot_preemption_end_sessions_with_their_reason_and_requeue_batch(
        tmp_path, fake, loopback_only):
    from conftest import cluster_channel
    from provisioner.v1 import cluster_service_pb2_grpc as c_grpc
    from provisioner.v1 import types_pb2 as pb
    proc = await start_cluster(one_vm_fleet(tmp_path, fake, spot_pool="gpu-p100"), CLUSTER, RealClock(TIME_SCALE), tmp_path / "data",
                               address="127.0.0.1:0")
    try:
        core = proc.runtime.core
        async with cluster_channel(tmp_path / "data", None, proc.address, CLUSTER) as ch:
            stub = c_grpc.ClusterServiceStub(ch)
            sid = await running(proc, stub, "maint")
            # Spot VMs for the Spot pool, as Compute requires them.
            p100 = [c.body for c in fake.calls("insert") if c.body["labels"]["provisioner-pool"] == "gpu-p100"]
            assert p100 and all(b["scheduling"] == {"onHostMaintenance": "TERMINATE", "automaticRestart": False,
                                                    "provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}
                                for b in p100)
            fake.announce_maintenance(PROJECT, core.sessions[sid].vm_id)
            await until(lambda: core.sessions[sid].state.value == "failed", what="ended by maintenance")
            assert core.sessions[sid].reason == "host maintenance (TERMINATE_ON_HOST_MAINTENANCE)"

            sid = await running(proc, stub, "interactive")
            fake.preempt(PROJECT, core.sessions[sid].vm_id)
            await until(lambda: core.sessions[sid].state.value == "failed", what="interactive preempted")
            assert core.sessions[sid].reason == "preempted (spot)" and not core.sessions[sid].requeued_as

            sid = await running(proc, stub, "batch", pb.SESSION_KIND_BATCH)
            vm_id = core.sessions[sid].vm_id
            fake.preempt(PROJECT, vm_id)
            await until(lambda: core.sessions[sid].state.value == "failed", what="batch preempted")
            again = core.sessions[sid].requeued_as
            assert core.sessions[sid].reason == "preempted (spot)" and again
            await until(lambda: core.sessions[again].state.value == "running", what="the batch run again")
            assert core.sessions[again].vm_id != vm_id
    finally:
        await proc.stop()


def test_a_gce_cluster_names_the_agent_its_vms_install(tmp_path):
    import pytest

    from provisioner.config import ConfigError

    def edit(cluster: dict) -> None:
        cluster["backend"] = {"kind": "gce", "project": PROJECT}
    with pytest.raises(ConfigError, match="agent_package"):
        fleet_config(tmp_path, edit)
