"""A preemption survives a SIGKILL of its cluster: killed in the middle of a grace period and
restarted from its store, the cluster stops the preempted batch when the grace period ends and
gives its VM to the interactive session that waited for it."""

from __future__ import annotations

import pytest

from conftest import cluster_channel
from provisioner.v1 import cluster_service_pb2 as c_pb
from provisioner.v1 import cluster_service_pb2_grpc as c_grpc
from provisioner.v1 import types_pb2 as pb
from test_preemption_fleet import seconds, small_pools
from test_processes import cluster_process

CLUSTER = "us-central1"
# The grace period is 10 s of wall time at 60x: the kill and the restart fall inside it, and the
# 30 model seconds allowed past its end are half a second of wall time (at 300x they were 0.1 s,
# which a loaded machine's late tick could miss).
TIME_SCALE, GRACE_S = 60.0, 600.0


@pytest.mark.timeout(120)
async def test_a_cluster_killed_in_a_grace_period_carries_the_preemption_out_once_restarted(tmp_path):
    config = small_pools(tmp_path, GRACE_S)
    data_dir = tmp_path / "data"
    cluster = cluster_process(CLUSTER, tmp_path / "clusters", data_dir, tmp_path / "cluster.log", TIME_SCALE)
    address = cluster.address

    async def until_state(stub, session_id: str, state: int) -> pb.Session:
        async for resp in stub.Watch(c_pb.WatchRequest(session_id=session_id), timeout=30):
            if resp.session.state == state:
                return resp.session
        raise AssertionError(f"{session_id} never reached {state}")

    await cluster.start()
    try:
        async with cluster_channel(data_dir, config.settings.security, address, CLUSTER) as channel:
            stub = c_grpc.ClusterServiceStub(channel)

            async def allocate(rid: str, user: str, kind: int) -> pb.Session:
                spec = pb.SessionSpec(request_id=rid, user_id=user, accelerator="gpu-p100", image="gpu:latest",
                                      kind=kind)
                return (await stub.Allocate(c_pb.AllocateRequest(spec=spec), timeout=10)).session

            batches = [await until_state(stub, (await allocate(f"b{i}", "ben", pb.SESSION_KIND_BATCH)).id,
                                         pb.SESSION_STATE_RUNNING) for i in range(2)]
            dee = await allocate("i1", "dee", pb.SESSION_KIND_INTERACTIVE)
            assert dee.state == pb.SESSION_STATE_QUEUED
            victim = (await stub.Get(c_pb.GetRequest(session_id=batches[1].id), timeout=5)).session
            assert victim.HasField("preemption_time") and victim.notices[-1].kind == "preemption"
        await cluster.kill()  # in the grace period: the preemption is only on the records now

        await cluster.start()
        async with cluster_channel(data_dir, config.settings.security, address, CLUSTER) as channel:
            stub = c_grpc.ClusterServiceStub(channel)
            ran = await until_state(stub, dee.id, pb.SESSION_STATE_RUNNING)
            ended = (await stub.Get(c_pb.GetRequest(session_id=victim.id), timeout=5)).session
            assert ended.reason.startswith("preempted: ") and ran.vm_id == victim.vm_id
            stopping = next(h for h in ended.history if h.state == "stopping")
            # Stopped when the grace period ended, not at the restart nor at a new one's end.
            end = seconds(victim.preemption_time)
            assert end <= seconds(stopping.time) <= end + 30
            first = (await stub.Get(c_pb.GetRequest(session_id=batches[0].id), timeout=5)).session
            assert first.state == pb.SESSION_STATE_RUNNING and not first.notices
    finally:
        await cluster.kill()
