"""Preemption through the real fleet over gRPC: an interactive session within its owner's share
arrives at a pool full of batch sessions over their owner's share; the youngest is warned on its
watch stream, stopped with reason `preempted` after the grace period and queued again as asked,
and the interactive session runs within the grace period plus a wipe."""

from __future__ import annotations

import asyncio

import yaml

from conftest import fleet_config, quick_warm_up, warm_fleet
from provisioner.config import load_fleet
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import types_pb2 as pb

GRACE_S = 120.0
TIME_SCALE = 60.0  # the grace period is 2 s of wall time: enough to see the warning stream by
REGION = {"region_hint": "us-central1", "region_required": True}


def small_pools(tmp_path, grace_s: float = GRACE_S):
    """The shipped fleet with two VMs in every pool, each user guaranteed one GPU, and a grace
    period of `grace_s`."""
    def two_vms(cluster: dict) -> None:
        quick_warm_up(cluster)
        for pool in cluster["pools"]:
            pool.update(min_vms=2, max_vms=2, autoscaler="fixed", standby=False)

    fleet_config(tmp_path, two_vms)
    path = tmp_path / "clusters" / "fleet.yaml"
    data = yaml.safe_load(path.read_text())
    data["priority"].update(share_gpus_per_user=1, grace_period_s=grace_s)
    path.write_text(yaml.safe_dump(data))
    return load_fleet(tmp_path / "clusters")


def seconds(ts) -> float:
    return ts.ToNanoseconds() / 1e9


async def test_an_interactive_session_within_its_share_preempts_an_over_share_batch(tmp_path):
    config = small_pools(tmp_path)
    async with warm_fleet(config, tmp_path / "data", time_scale=TIME_SCALE) as fleet:
        first = await fleet.create(user_id="ben", kind=pb.SESSION_KIND_BATCH, **REGION)
        await asyncio.sleep(0.2)  # a model minute apart, so which is youngest is plain
        young = await fleet.create(user_id="ben", kind=pb.SESSION_KIND_BATCH, requeue_on_preemption=True, **REGION)
        first, young = await fleet.running(first), await fleet.running(young)  # the pool's two VMs, both ben's
        watching = asyncio.create_task(fleet.watch_until(young.id, pb.SESSION_STATE_STOPPED, timeout=30))

        dee = await fleet.create(user_id="dee", **REGION)
        assert dee.state == pb.SESSION_STATE_QUEUED and "preempted" in dee.reason

        seen = await watching
        warned = [s for s in seen if s.state == pb.SESSION_STATE_RUNNING and s.notices]
        assert warned, "the watch stream never showed the warning while the session ran"
        notice = warned[0].notices[-1]
        assert notice.kind == "preemption" and "dee" not in notice.message
        assert abs(seconds(notice.action_time) - seconds(notice.time) - GRACE_S) < 1
        assert warned[0].HasField("preemption_time")
        end = seen[-1]
        assert end.reason.startswith("preempted: ") and end.requeued_as
        stopping = next(h for h in end.history if h.state == "stopping")
        assert seconds(stopping.time) >= seconds(notice.action_time)  # the whole grace period

        tick_s, wipe_s = fleet.cluster("us-central1").config.tick_s, fleet.cluster("us-central1").config.sim.wipe_s
        ran = (await fleet.watch_until(dee.id, pb.SESSION_STATE_RUNNING, timeout=30))[-1]
        waited = seconds(ran.ready_time) - seconds(ran.create_time)
        # Its start on a VM coming free is the victim's wipe; slack for the ticks and the wall.
        assert waited <= GRACE_S + wipe_s + 2 * tick_s + 30, waited
        assert ran.vm_id == end.vm_id

        again = (await fleet.sessions.GetSession(s_pb.GetSessionRequest(session_id=end.requeued_as))).session
        assert again.requeued_from == young.id and again.spec.kind == pb.SESSION_KIND_BATCH
        assert again.state == pb.SESSION_STATE_QUEUED  # the pool is full again: it waits its turn

        # ben's batch within his share still runs; dee's interactive session is never taken, not
        # even for another user's interactive session within their share.
        eve = await fleet.create(user_id="eve", **REGION)
        assert eve.state == pb.SESSION_STATE_QUEUED
        await asyncio.sleep((GRACE_S + wipe_s + 4 * tick_s) / TIME_SCALE)
        dee_now = (await fleet.sessions.GetSession(s_pb.GetSessionRequest(session_id=dee.id))).session
        assert dee_now.state == pb.SESSION_STATE_RUNNING and not dee_now.notices
        first_now = (await fleet.sessions.GetSession(s_pb.GetSessionRequest(session_id=first.id))).session
        assert first_now.reason.startswith("preempted: its class batch ranks below interactive")


async def test_a_blocked_users_preempted_session_is_not_requeued(tmp_path):
    """ben's batch sessions fill the pool; an operator blocks ben; dee's session preempts the
    youngest, which asked to be requeued: the cluster, told of the block by the front, stops it
    and queues nothing in its place."""
    from provisioner.v1 import admin_service_pb2 as admin_pb

    config = small_pools(tmp_path)
    async with warm_fleet(config, tmp_path / "data", time_scale=TIME_SCALE) as fleet:
        await fleet.create(user_id="ben", kind=pb.SESSION_KIND_BATCH, **REGION)
        await asyncio.sleep(0.2)
        young = await fleet.create(user_id="ben", kind=pb.SESSION_KIND_BATCH, requeue_on_preemption=True, **REGION)
        await fleet.admin.BlockUser(admin_pb.BlockUserRequest(user_id="ben", reason="mining"))
        dee = await fleet.create(user_id="dee", **REGION)
        assert dee.state == pb.SESSION_STATE_QUEUED and "preempted" in dee.reason
        end = (await fleet.watch_until(young.id, pb.SESSION_STATE_STOPPED, timeout=30))[-1]
        assert end.reason.startswith("preempted: ") and not end.requeued_as
        assert end.notices[-1].message == "not queued again: its user is blocked from GPU sessions"
        listed = (await fleet.sessions.ListSessions(s_pb.ListSessionsRequest(user_id="ben"))).sessions
        assert not [s for s in listed if s.spec.request_id.startswith("requeue-")]
