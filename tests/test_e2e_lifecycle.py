"""End to end over real gRPC on loopback: the front, three clusters, the simulated cloud."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from conftest import fleet_config, quick_warm_up, start_fleet
from provisioner.client.errors import from_rpc_error
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import types_pb2 as pb

S = pb.SessionState


async def test_warm_create_starts_its_notebook_at_once_and_stop_recycles_the_vm(local_fleet):
    created = await local_fleet.create(image="gpu:latest", region_hint="us-central1")
    assert created.state == pb.SESSION_STATE_STARTING  # a warm VM holds the image: no launch, no pull
    session = await local_fleet.running(created)
    assert session.start == pb.START_KIND_WARM
    assert session.cluster == "us-central1" and session.id.startswith("us-central1.")
    assert session.image == "gpu:v160" and session.spec.image == "gpu:latest"
    assert session.endpoint

    stopped = await local_fleet.sessions.StopSession(s_pb.StopSessionRequest(session_id=session.id))
    assert stopped.session.state in (pb.SESSION_STATE_STOPPING, pb.SESSION_STATE_STOPPED)
    updates = await local_fleet.watch_until(session.id, pb.SESSION_STATE_STOPPED)
    assert updates[-1].state == pb.SESSION_STATE_STOPPED
    # The pool recycles: the same VM is wiped and warm again, its image cache kept.
    vms = await local_fleet.admin.ListVms(admin_pb.ListVmsRequest(cluster="us-central1", pool="gpu-p100"))
    vm = next(v for v in vms.vms if v.id == session.vm_id)
    assert vm.state == pb.VM_STATE_WARM and not vm.session_id
    assert "gpu:v160" in vm.images
    assert [h.state for h in vm.history][-3:] == ["assigned", "recycling", "warm"]
    ended = (await local_fleet.sessions.GetSession(s_pb.GetSessionRequest(session_id=session.id))).session
    assert [h.state for h in ended.history] == ["starting", "running", "stopping", "stopped"]


async def test_stop_is_idempotent(local_fleet):
    session = await local_fleet.create()
    first = await local_fleet.sessions.StopSession(s_pb.StopSessionRequest(session_id=session.id))
    second = await local_fleet.sessions.StopSession(s_pb.StopSessionRequest(session_id=session.id))
    assert second.session.revision >= first.session.revision
    assert second.session.state in (pb.SESSION_STATE_STOPPING, pb.SESSION_STATE_STOPPED)


async def test_cold_image_shows_provisioning_and_pulling_before_running(tmp_path):
    # No warm pool at all, and the pool deletes VMs after use: every session starts cold.
    def cold(cluster: dict) -> None:
        for pool in cluster["pools"]:
            pool.update(min_vms=0, headroom_fraction=0.0, recycle=False)

    fleet = await start_fleet(fleet_config(tmp_path, cold), tmp_path / "data")
    try:
        session = await fleet.create(image="gpu:v120", accelerator="gpu-t4x2", region_hint="europe-west4",
                                     region_required=True)
        assert session.state == pb.SESSION_STATE_PROVISIONING
        assert session.start == pb.START_KIND_COLD
        assert session.HasField("estimated_ready_time")
        updates = await fleet.watch_until(session.id, pb.SESSION_STATE_RUNNING, pb.SESSION_STATE_FAILED)
        states = [u.state for u in updates]
        assert states[0] == pb.SESSION_STATE_PROVISIONING
        assert pb.SESSION_STATE_PULLING_IMAGE in states and pb.SESSION_STATE_STARTING in states
        assert states[-1] == pb.SESSION_STATE_RUNNING
        pulls = [u.pull.bytes_done for u in updates if u.state == pb.SESSION_STATE_PULLING_IMAGE]
        assert pulls == sorted(pulls) and len(pulls) > 2  # progress is visible and only grows
        history = [h.state for h in updates[-1].history]
        assert history == ["provisioning", "pulling_image", "starting", "running"]

        await fleet.sessions.StopSession(s_pb.StopSessionRequest(session_id=session.id))
        await fleet.watch_until(session.id, pb.SESSION_STATE_STOPPED)
        # recycle: false, so the VM is deleted rather than returned to the pool.
        core = fleet.cluster("europe-west4").runtime.core
        assert session.vm_id not in core.vms
        vms = await fleet.admin.ListVms(admin_pb.ListVmsRequest(cluster="europe-west4"))
        assert session.vm_id not in [v.id for v in vms.vms]
    finally:
        await fleet.channel.close()
        await fleet.fleet.stop(0.5)


async def test_get_list_touch_and_watch_resume(local_fleet):
    a = await local_fleet.create(user_id="carol", image="gpu:latest")
    b = await local_fleet.create(user_id="carol", image="gpu:latest", accelerator="gpu-t4x2")
    await local_fleet.create(user_id="dave")
    got = await local_fleet.sessions.GetSession(s_pb.GetSessionRequest(session_id=a.id))
    assert got.session.id == a.id and got.session.spec.user_id == "carol"

    listed = await local_fleet.sessions.ListSessions(s_pb.ListSessionsRequest(user_id="carol", page_size=1))
    assert len(listed.sessions) == 1 and listed.next_page_token
    rest = await local_fleet.sessions.ListSessions(
        s_pb.ListSessionsRequest(user_id="carol", page_size=1, page_token=listed.next_page_token))
    assert {listed.sessions[0].id, rest.sessions[0].id} == {a.id, b.id} and not rest.next_page_token
    running = await local_fleet.sessions.ListSessions(
        s_pb.ListSessionsRequest(user_id="carol", states=[pb.SESSION_STATE_STOPPED]))
    assert list(running.sessions) == []

    touched = await local_fleet.sessions.TouchSession(s_pb.TouchSessionRequest(session_id=a.id))
    assert touched.session.last_activity_time.ToNanoseconds() >= a.last_activity_time.ToNanoseconds()

    # A watcher that reconnects with the revision it last saw gets only what is newer.
    stream = local_fleet.sessions.WatchSession(
        s_pb.WatchSessionRequest(session_id=a.id, after_revision=touched.session.revision))
    await local_fleet.sessions.StopSession(s_pb.StopSessionRequest(session_id=a.id))
    first = await asyncio.wait_for(stream.read(), 5)
    assert first.session.revision > touched.session.revision
    stream.cancel()

    quota = await local_fleet.sessions.GetQuota(s_pb.GetQuotaRequest(user_id="carol"))
    assert quota.quota.gpu_hours_limit == 30 and quota.quota.active_sessions >= 1


async def test_create_is_idempotent_by_request_id(local_fleet):
    first = await local_fleet.create(request_id="same-key")
    again = await local_fleet.create(request_id="same-key")
    assert again.id == first.id
    core = local_fleet.cluster(first.cluster).runtime.core
    assert sum(1 for s in core.sessions.values() if s.spec.request_id == "same-key") == 1


@pytest.mark.parametrize("spec, field", [
    ({"accelerator": "gpu-h100"}, "spec.accelerator"),
    ({"image": "gpu:v999"}, "spec.image"),
    ({"image": "cuda:v150"}, "spec.image"),
    ({"image": ""}, "spec.image"),
    ({"user_id": ""}, "spec.user_id"),
    ({"max_runtime": {"seconds": -60}}, "spec.max_runtime"),
])
async def test_bad_input_is_invalid_argument_naming_the_field_and_creates_nothing(local_fleet, spec, field):
    before = {c.config.name: len(c.runtime.core.sessions) for c in local_fleet.fleet.clusters}
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await local_fleet.create(**spec)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert from_rpc_error(info.value).field == field
    assert field.split(".")[-1] in info.value.details() or field == "spec.image"
    after = {c.config.name: len(c.runtime.core.sessions) for c in local_fleet.fleet.clusters}
    assert after == before


async def test_unknown_session_is_not_found_and_a_malformed_id_is_invalid(local_fleet):
    for sid, code in (("us-central1.s-00000000ff", grpc.StatusCode.NOT_FOUND),
                      ("mars-1.s-00000000ff", grpc.StatusCode.NOT_FOUND),
                      ("garbage", grpc.StatusCode.INVALID_ARGUMENT)):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await local_fleet.sessions.GetSession(s_pb.GetSessionRequest(session_id=sid))
        assert info.value.code() == code, sid


async def test_deadline_is_honoured(local_fleet):
    # A watch with a short deadline ends with DEADLINE_EXCEEDED rather than hanging.
    session = await local_fleet.create()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in local_fleet.sessions.WatchSession(s_pb.WatchSessionRequest(session_id=session.id),
                                                         timeout=0.3):
            pass
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_drain_keeps_new_sessions_out_and_running_ones_alive(local_fleet):
    running = await local_fleet.running(await local_fleet.create(region_hint="europe-west4"))
    assert running.cluster == "europe-west4"
    await local_fleet.admin.DrainCluster(admin_pb.DrainClusterRequest(cluster="europe-west4"))
    moved = await local_fleet.create(region_hint="europe-west4")
    assert moved.cluster != "europe-west4"
    with pytest.raises(grpc.aio.AioRpcError) as info:  # residency demanded: nowhere to go
        await local_fleet.create(region_hint="europe-west4", region_required=True)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    still = await local_fleet.sessions.GetSession(s_pb.GetSessionRequest(session_id=running.id))
    assert still.session.state == pb.SESSION_STATE_RUNNING
    await local_fleet.admin.UndrainCluster(admin_pb.UndrainClusterRequest(cluster="europe-west4"))
    back = await local_fleet.create(region_hint="europe-west4", region_required=True)
    assert back.cluster == "europe-west4"


async def test_unknown_state_filter_is_invalid_argument(local_fleet):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await local_fleet.sessions.ListSessions(s_pb.ListSessionsRequest(user_id="alice", states=[42]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_the_capacity_stream_sends_the_whole_then_the_pools_that_changed(local_fleet):
    from provisioner.v1 import cluster_service_pb2 as cluster_pb
    from provisioner.v1 import cluster_service_pb2_grpc as cluster_grpc

    async with local_fleet.cluster_channel("us-central1") as ch:
        stub = cluster_grpc.ClusterServiceStub(ch)
        pushes: asyncio.Queue = asyncio.Queue()

        async def follow():
            async for push in stub.WatchCapacity(cluster_pb.WatchCapacityRequest()):
                await pushes.put(push)

        following = asyncio.create_task(follow())
        first = await asyncio.wait_for(pushes.get(), 5)
        assert not first.changes_only
        pools = {p.pool: p for p in first.capacity.pools}
        assert len(pools) > 1 and "gpu-p100" in pools

        def take(push) -> None:  # pushes that follow name only the pools that changed
            assert push.changes_only and all(p != pools[p.pool] for p in push.capacity.pools)
            pools.update((p.pool, p) for p in push.capacity.pools)

        await local_fleet.create(region_hint="us-central1", region_required=True)
        while pools["gpu-p100"].assigned != 1:
            take(await asyncio.wait_for(pushes.get(), 5))
        # What the changes add up to is what a new stream is told whole (once the fleet is still).
        for _ in range(50):
            fresh = stub.WatchCapacity(cluster_pb.WatchCapacityRequest())
            whole = {p.pool: p for p in (await asyncio.wait_for(fresh.read(), 5)).capacity.pools}
            fresh.cancel()
            await asyncio.sleep(0.2)
            while not pushes.empty():
                take(pushes.get_nowait())
            if whole == pools:
                break
        assert whole == pools
        following.cancel()


async def test_a_watch_through_the_front_sees_its_session_move_up_the_queue(tmp_path):
    # One VM in us-central1's pool and no more: the second session on, each waits in the queue.
    def one_vm(cluster: dict) -> None:
        for pool in cluster["pools"]:
            pool.update(min_vms=1, max_vms=1, headroom_fraction=0.0)

    fleet = await start_fleet(fleet_config(tmp_path, lambda c: (quick_warm_up(c), one_vm(c))), tmp_path / "data")
    try:
        await fleet.wait_warm()

        async def create(user: str) -> pb.Session:
            return await fleet.create(user_id=user, region_hint="us-central1", region_required=True)

        await create("holder")
        ahead = [await create("ada"), await create("bob")]
        me = await create("cy")
        assert me.state == pb.SESSION_STATE_QUEUED and me.queue_position == 3
        seen: list[tuple[int, int]] = []

        async def follow():
            async for resp in fleet.sessions.WatchSession(s_pb.WatchSessionRequest(session_id=me.id)):
                seen.append((resp.session.revision, resp.session.queue_position))
                if resp.session.queue_position == 1:
                    return

        watching = asyncio.create_task(follow())
        for s in ahead:
            while len(seen) < 1 + ahead.index(s):  # the report of where it stands, or of the last move
                await asyncio.sleep(0.02)
            await fleet.sessions.StopSession(s_pb.StopSessionRequest(session_id=s.id), timeout=10)
        await asyncio.wait_for(watching, 10)  # the second move comes after the watch's interval (2 s)
        assert seen == [(me.revision, 3), (me.revision, 2), (me.revision, 1)]
    finally:
        await fleet.channel.close()
        await fleet.fleet.stop(0.5)
