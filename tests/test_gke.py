"""The gke backend: the real google-cloud-container client (gRPC) against a fake ClusterManager,
and the real google-cloud-compute client against the fake Compute server holding the nodes.

The cluster service fills its pools by growing node pools, serves a session on a node, shrinks a
node pool when a VM goes, and after a restart adopts its nodes and deletes those no record claims (labelled or not);
all of it in the fakes' logs, with no request leaving loopback.
"""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from conftest import cluster_channel, fleet_config
from fake_cluster_manager import FakeClusterManager
from fake_compute import FakeCompute
from provisioner.common.clock import RealClock
from provisioner.cloud.base import CloudFailure, CloudVm, LaunchSpec
from provisioner.cloud.gke import GkeBackend
from provisioner.cli.serve import start_cluster
from provisioner.v1 import admin_service_pb2 as a_pb
from provisioner.v1 import admin_service_pb2_grpc as a_grpc
from provisioner.v1 import cluster_service_pb2 as c_pb
from provisioner.v1 import cluster_service_pb2_grpc as c_grpc
from provisioner.v1 import types_pb2 as pb
from gce_fixtures import loopback_only, until, warm_per_pool  # noqa: F401  (fixture)

PROJECT = "test-proj"
CLUSTER = "us-central1"
GKE_CLUSTER = "notebooks"
TIME_SCALE = 300.0


@pytest.fixture
async def fakes():
    compute = FakeCompute(boot_s=0.1, op_s=0.02, command_s=0.05).start()
    gke = FakeClusterManager(compute, PROJECT, CLUSTER, GKE_CLUSTER, op_s=0.02)
    gke.add_pool("p100-pool", "n1-standard-8", "nvidia-tesla-p100", 1, "us-central1-f")
    gke.add_pool("t4-pool", "n1-standard-16", "nvidia-tesla-t4", 2, "us-central1-f")  # node pools share a zone
    gke.add_pool("cpu-pool", "e2-standard-4", "", 0, "us-central1-b")  # not a GPU pool: never ours
    await gke.start()
    yield compute, gke
    await gke.stop()
    compute.stop()


def gke_fleet(tmp_path, compute: FakeCompute, gke: FakeClusterManager):
    def edit(cluster: dict) -> None:
        cluster["backend"] = {"kind": "gke", "project": PROJECT, "endpoint": compute.endpoint,
                              "gke_endpoint": gke.address, "gke_cluster": GKE_CLUSTER, "poll_s": 1.0,
                              "retry_total_s": 10.0}
        for pool in cluster["pools"]:
            pool.update(min_vms=2, max_vms=6, standby=False)  # node pools have no stopped nodes
    return fleet_config(tmp_path, edit)


def node_labels(compute: FakeCompute) -> dict[str, dict]:
    return {name: inst.body.get("labels", {}) for (p, name), inst in compute.instances.items() if p == PROJECT}


async def test_pools_grow_serve_and_shrink_through_node_pool_resizes(tmp_path, fakes, loopback_only):
    compute, gke = fakes
    proc = await start_cluster(gke_fleet(tmp_path, compute, gke), CLUSTER, RealClock(TIME_SCALE),
                               tmp_path / "data", address="127.0.0.1:0")
    try:
        await until(lambda: all(n >= 2 for n in warm_per_pool(proc).values()), what="warm pools")
        assert gke.resizes("p100-pool")[:2] == [1, 2] and gke.resizes("t4-pool")[:2] == [1, 2]
        assert gke.resizes("cpu-pool") == []
        assert {c.name for c in gke.log if c.method == "GetCluster"} == {
            f"projects/{PROJECT}/locations/{CLUSTER}/clusters/{GKE_CLUSTER}"}
        # Each node became one of our VMs: labelled with our id, pool and cluster.
        ours = {labels["provisioner-request"]: name for name, labels in node_labels(compute).items()
                if labels.get("provisioner-cluster") == CLUSTER}
        core = proc.runtime.core
        live = {vid for vid, vm in core.vms.items() if vm.state.value == "warm"}
        assert live <= set(ours)
        assert all(core.vms[vid].pool == node_labels(compute)[ours[vid]]["provisioner-pool"] for vid in live)

        async with cluster_channel(tmp_path / "data", None, proc.address, CLUSTER) as ch:
            stub = c_grpc.ClusterServiceStub(ch)
            spec = pb.SessionSpec(request_id="gke-1", user_id="ada", accelerator="gpu-t4x2", image="gpu:latest")
            s = (await stub.Allocate(c_pb.AllocateRequest(spec=spec), timeout=10)).session
            await until(lambda: core.sessions[s.id].state.value == "running", what="running session")
            node = ours[core.sessions[s.id].vm_id]
            # A running session is reached at its node's address (Get answers with it too).
            got = (await stub.Get(c_pb.GetRequest(session_id=s.id), timeout=10)).session
            assert got.endpoint.startswith("http://10.128.") and got.endpoint == core.sessions[s.id].endpoint
            assert any(c.op == "setMetadata" and c.instance == node for c in compute.log)  # the agent on the node

            # An operator evicts a warm VM: its node goes, and the node pool shrinks.
            victim = next(vid for vid in live if core.vms[vid].pool == "gpu-p100" and vid in ours)
            size = gke.pools["p100-pool"].size
            await a_grpc.AdminServiceStub(ch).EvictVm(a_pb.EvictVmRequest(cluster=CLUSTER, vm_id=victim), timeout=10)
            await until(lambda: ours[victim] not in compute.names(PROJECT), what="the node deleted")
        await until(lambda: size - 1 in gke.resizes("p100-pool")[2:], what="a shrinking resize")
        deletes = [c for c in compute.log if c.op == "deleteInstances"]
        assert [c.body["instances"] for c in deletes] == [[f"zones/us-central1-f/instances/{ours[victim]}"]]
        assert {c.project for c in compute.log} == {PROJECT}
        for c in compute.log:  # every call on a node names the node's zone
            if c.instance and (PROJECT, c.instance) in compute.instances:
                assert c.zone == compute.instances[(PROJECT, c.instance)].zone
        assert all(c.name.startswith(f"projects/{PROJECT}/locations/{CLUSTER}/") for c in gke.log)
    finally:
        await proc.stop(0.5)


async def test_a_restart_adopts_nodes_and_deletes_an_unclaimed_one(tmp_path, fakes, loopback_only):
    compute, gke = fakes
    config = gke_fleet(tmp_path, compute, gke)
    clock = RealClock(TIME_SCALE)
    proc = await start_cluster(config, CLUSTER, clock, tmp_path / "data", address="127.0.0.1:0")
    await until(lambda: all(n >= 2 for n in warm_per_pool(proc).values()), what="warm pools")
    await proc.stop(0.5)
    nodes_before = compute.names(PROJECT)
    grows = len(gke.resizes("t4-pool"))
    # A node labelled as ours that no record claims (its record was lost).
    pool = gke.pools["t4-pool"]
    pool.size += 1
    compute.resize_group(PROJECT, pool.zone, gke.group("t4-pool"), pool.size)
    stray = (compute.names(PROJECT) - nodes_before).pop()
    compute.instances[(PROJECT, stray)].body["labels"] = {
        "provisioner-cluster": CLUSTER, "provisioner-pool": "gpu-t4x2", "provisioner-request": "lost-record"}
    # A node never labelled: a create died between growing the node pool and labelling the node.
    pool.size += 1
    compute.resize_group(PROJECT, pool.zone, gke.group("t4-pool"), pool.size)
    bare = (compute.names(PROJECT) - nodes_before - {stray}).pop()

    proc = await start_cluster(config, CLUSTER, clock, tmp_path / "data", address="127.0.0.1:0")
    try:
        await until(lambda: not {stray, bare} & compute.names(PROJECT), timeout=30, what="the stray nodes deleted")
        assert nodes_before <= compute.names(PROJECT)  # every node it had is kept
        # Two resizes: the shrinks to what is left as each stray went; nothing grew.
        await until(lambda: gke.resizes("t4-pool")[grows:] == [3, 2], what="the node pool shrunk to 2")
        assert all(n >= 2 for n in warm_per_pool(proc).values())
    finally:
        await proc.stop(0.5)


async def test_a_stocked_out_node_pool_zone_is_a_stockout(tmp_path, fakes, loopback_only):
    compute, gke = fakes
    gke.stocked_out.add("us-central1-f")
    b = GkeBackend(gke_fleet(tmp_path, compute, gke).cluster(CLUSTER), RealClock(TIME_SCALE))
    spec = LaunchSpec(vm_id="vm-1", cluster=CLUSTER, pool="gpu-p100", zone="us-central1-c", machine_type="n1-standard-8",
                      accelerator="nvidia-tesla-p100", accelerator_count=1,
                      labels={"provisioner-cluster": CLUSTER, "provisioner-pool": "gpu-p100", "provisioner-request": "vm-1"})
    out = await b.create(spec)
    assert isinstance(out, CloudFailure) and out.code == "stockout" and out.zone == "us-central1-f"
    gke.stocked_out.clear()
    gke.fail_next("SetNodePoolSize", grpc.StatusCode.RESOURCE_EXHAUSTED)  # rate limited: retried
    gke.fail_next("SetNodePoolSize", grpc.StatusCode.UNAVAILABLE)  # retried
    vm = await b.create(spec)
    assert isinstance(vm, CloudVm) and vm.zone == "us-central1-f"  # the node pool's zone
    assert [c.code for c in gke.log if c.method == "SetNodePoolSize"] == ["OK", "RESOURCE_EXHAUSTED", "UNAVAILABLE",
                                                                          "OK"]
    again = await b.create(spec)  # repeated: finds the node it labelled, grows nothing
    assert isinstance(again, CloudVm) and gke.resizes("p100-pool") == [1, 1]  # the stocked-out try, then this
    gke.fail_next("SetNodePoolSize", grpc.StatusCode.UNAVAILABLE, count=10)
    before = len(gke.log)
    out = await b.create(dataclasses.replace(spec, vm_id="vm-2", labels={**spec.labels, "provisioner-request": "vm-2"}))
    assert isinstance(out, CloudFailure) and out.code == "unavailable"
    assert [c.code for c in gke.log[before:] if c.method == "SetNodePoolSize"] == ["UNAVAILABLE"] * 5  # the bound
    await b.close()


async def test_a_multi_zone_node_pool_is_refused(tmp_path, fakes, loopback_only):
    compute, gke = fakes
    gke.pools["p100-pool"].other_zones = ("us-central1-c",)  # setSize would add a node per zone
    b = GkeBackend(gke_fleet(tmp_path, compute, gke).cluster(CLUSTER), RealClock(TIME_SCALE))
    out = await b.create(LaunchSpec(vm_id="vm-1", cluster=CLUSTER, pool="gpu-p100", zone="us-central1-f",
                                    machine_type="n1-standard-8", accelerator="nvidia-tesla-p100", accelerator_count=1))
    assert isinstance(out, CloudFailure) and out.code == "invalid" and "zonal" in out.message
    assert not [c for c in gke.log if c.method == "SetNodePoolSize"]
    await b.close()


async def test_the_standby_tier_is_refused_with_a_reason_and_no_call(tmp_path, fakes, loopback_only):
    compute, gke = fakes
    b = GkeBackend(gke_fleet(tmp_path, compute, gke).cluster(CLUSTER), RealClock(TIME_SCALE))
    calls = len(compute.log), len(gke.log)
    for out in (await b.stop("vm-1", "us-central1-f"), await b.start("vm-1", "us-central1-f")):
        assert isinstance(out, CloudFailure) and out.code == "invalid" and not out.retryable
        assert "node pool" in out.message and "use backend gce" in out.message
    assert (len(compute.log), len(gke.log)) == calls  # nothing was stopped under GKE
    await b.close()
