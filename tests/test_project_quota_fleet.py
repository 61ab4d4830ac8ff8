"""Two clusters of one Google Cloud project, against the fake Compute API, behind the front: once
one cluster's insert is refused for the project-wide GPU quota (GPUS_ALL_REGIONS, as Compute
answers it: QUOTA_EXCEEDED with the metric and limit in the error's details), the other inserts
no GPU VM either; creates queue where VMs will come free and are refused, saying why, where none
will; a front started afterwards (another replica, or one restarted) knows it from the clusters'
reports."""

from __future__ import annotations

import grpc
import pytest

from conftest import fleet_config, front_channel, start_fleet
from fake_compute import FakeCompute
from provisioner.common.clock import RealClock
from provisioner.config import load_fleet
from provisioner.front import project_quota
from provisioner.cli.serve import start_front
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb
from gce_fixtures import PROJECT, until
from gce_fixtures import fake, loopback_only  # noqa: F401 (fixtures)

FIRST, SECOND = "us-central1", "europe-west4"

# The quota is remembered for 15 model minutes: at 60x that is 15 s of wall time, which outlasts a
# second front's start on a loaded machine (at 300x it was 3 s, and a slow start let it lapse).
TIME_SCALE = 60.0


def two_clusters(tmp_path, fake: FakeCompute):
    """us-central1 and europe-west4 on the gce backend, one project: one warm P100 VM each, no T4."""
    def edit(cluster: dict) -> None:
        cluster["backend"] = {"kind": "gce", "project": PROJECT, "endpoint": fake.endpoint, "poll_s": 1.0,
                              "retry_total_s": 10.0, "agent_package": "preinstalled"}
        for pool in cluster["pools"]:
            pool.update(autoscaler="fixed", warm_vms=0, min_vms=1 if pool["name"] == "gpu-p100" else 0, max_vms=4,
                        standby=False)
    fleet_config(tmp_path, edit)
    (tmp_path / "clusters" / "asia-east1.yaml").unlink()
    return load_fleet(tmp_path / "clusters")


def inserts(fake: FakeCompute, cluster: str) -> int:
    return sum(1 for c in fake.calls("insert") if c.body.get("labels", {}).get("provisioner-cluster") == cluster)


async def create(stub, request_id: str, region: str, pool: str = "gpu-p100") -> pb.Session:
    spec = pb.SessionSpec(request_id=request_id, user_id="ada", accelerator=pool, image="gpu:latest",
                          region_hint=region, region_required=True)
    return (await stub.CreateSession(s_pb.CreateSessionRequest(spec=spec), timeout=10)).session


async def test_the_second_cluster_inserts_nothing_after_the_first_meets_the_project_quota(tmp_path, fake,
                                                                                            loopback_only):
    handle = await start_fleet(two_clusters(tmp_path, fake), tmp_path / "data", time_scale=TIME_SCALE)
    first, second = handle.cluster(FIRST).runtime, handle.cluster(SECOND).runtime
    try:
        await handle.wait_warm(timeout=60)
        fake.exceed_quota("GPUS_ALL_REGIONS")
        first.set_policy("gpu-p100", {"min_vms": 2})  # one more VM: its insert is refused
        await until(lambda: first.core.project_quota is not None, what="the first cluster meets the quota")
        assert first.core.project_quota.metric == "GPUS_ALL_REGIONS"
        await until(lambda: second.core.project_quota is not None, what="the second cluster is told")
        assert second.core.project_quota.cluster == FIRST
        before = inserts(fake, SECOND)
        second.set_policy("gpu-p100", {"min_vms": 2})  # it wants a VM too...
        await second.clock.sleep(300)  # five minutes of fleet time
        assert inserts(fake, SECOND) == before  # ...and asks for none: the project has no GPU left

        # The front routes knowing it: a session queues where a VM will come free...
        running = await handle.running(await create(handle.sessions, "takes-the-warm-vm", SECOND), timeout=30)
        queued = await create(handle.sessions, "waits-for-it", SECOND)
        assert queued.state == pb.SESSION_STATE_QUEUED and queued.cluster == SECOND
        # ...and where none will (no T4 VM anywhere), the create is refused, saying why.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await create(handle.sessions, "t4", SECOND, "gpu-t4x2")
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "GPUS_ALL_REGIONS quota is exhausted" in refused.value.details()
        assert f"an insert of cluster {FIRST} was refused" in refused.value.details()

        # Another front (a replica, or this one restarted) knows it from the clusters' reports alone.
        other = await start_front(handle.fleet.front.sessions.config, RealClock(TIME_SCALE), tmp_path / "data",
                                  address="127.0.0.1:0",
                                  cluster_addresses={p.config.name: p.address for p in handle.fleet.clusters})
        try:
            await other.fleet.wait_until_ready(timeout_s=10.0)
            quota = project_quota.current(other.fleet.clients.values(), other.sessions.clock.now())
            assert quota is not None and quota.cluster == FIRST
            async with front_channel(tmp_path / "data", other.address) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as again:
                    await create(s_grpc.SessionServiceStub(ch), "t4-again", FIRST, "gpu-t4x2")
            assert again.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            await other.stop(0.5)
        assert running.cluster == SECOND and inserts(fake, SECOND) == before
    finally:
        await handle.channel.close()
        await handle.fleet.stop(0.5)
