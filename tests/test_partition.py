"""A network partition between the front and one cluster, made with a network namespace: the
cluster runs inside it, the front and the other clusters outside, and the link between them is
cut. A user's sessions on the cut-off cluster still count toward their cap on active sessions
(the front's last known count of them, not zero), so no create admits them past it; after the
link is mended, no request has two sessions and the user holds no more than the cap."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from conftest import front_channel
from netns import make_netns
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb
from test_processes import Fleet

CUT_OFF = "europe-west4"
ELSEWHERE = "us-central1"
CAP = 4  # the shipped fleet's max_active_sessions_per_user
STARTUP_S = 40.0


@pytest.fixture
def netns():
    ns = make_netns()
    try:
        yield ns
    finally:
        ns.remove()


def inside(fleet: Fleet, ns) -> None:
    """Moves the cluster CUT_OFF into the namespace, at its address there, and points the front at it."""
    service = fleet.clusters[CUT_OFF]
    port = service.address.rsplit(":", 1)[1]
    address = f"{ns.inner_ip}:{port}"
    service.argv = [*ns.prefix, *[address if a == service.address else a for a in service.argv]]
    fleet.front.argv = [f"{CUT_OFF}={address}" if a == f"{CUT_OFF}={service.address}" else a
                        for a in fleet.front.argv]
    service.address = address


async def healthy_at_front(admin, name: str) -> bool:
    clusters = (await admin.ListClusters(admin_pb.ListClustersRequest(), timeout=5)).clusters
    return next(c for c in clusters if c.name == name).healthy


@pytest.mark.timeout(180)
async def test_a_partitioned_cluster_still_counts_toward_the_cap(tmp_path, netns):
    fleet = Fleet(tmp_path)
    inside(fleet, netns)
    try:
        await fleet.start()
        async with front_channel(fleet.data_dir, fleet.front.address) as channel:
            stub, admin = s_grpc.SessionServiceStub(channel), admin_grpc.AdminServiceStub(channel)

            async def create(rid: str, region: str) -> pb.Session:
                spec = pb.SessionSpec(request_id=rid, user_id="ada", accelerator="gpu-p100", image="gpu:latest",
                                      region_hint=region, region_required=True)
                return (await stub.CreateSession(s_pb.CreateSessionRequest(spec=spec), timeout=15)).session

            made = {rid: (await create(rid, CUT_OFF)).id for rid in ("there-1", "there-2")}
            assert all(sid.startswith(CUT_OFF + ".") for sid in made.values())

            netns.cut()
            cut_at = time.monotonic()
            while await healthy_at_front(admin, CUT_OFF):
                assert time.monotonic() - cut_at < 15, "the front never noticed the partition"
                await asyncio.sleep(0.1)

            # Two more elsewhere reach the cap with the two cut off; a fifth is refused.
            for rid in ("here-1", "here-2"):
                made[rid] = (await create(rid, ELSEWHERE)).id
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await create("here-3", ELSEWHERE)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
            assert "active" in refused.value.details()
            assert "did not list" in fleet.front.log.read_text()  # the front says why

            netns.mend()
            await fleet.wait_routable(timeout=20)
            # Every request answers with its one session, and the user holds the cap, no more.
            for rid, sid in made.items():
                assert (await create(rid, CUT_OFF if rid.startswith("there") else ELSEWHERE)).id == sid
            listed = (await stub.ListSessions(s_pb.ListSessionsRequest(user_id="ada"), timeout=10)).sessions
            live = [s for s in listed if s.state not in (pb.SESSION_STATE_STOPPED, pb.SESSION_STATE_FAILED)]
            assert sorted(s.id for s in live) == sorted(made.values())
            assert len(live) == CAP
    finally:
        for s in fleet.services:
            await s.kill()
