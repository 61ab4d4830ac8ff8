"""The front does not trust a cluster blindly: with a cluster's certificate (leaked, or a cluster
compromised), a fake cluster cannot block other clusters' users, draw creates with capacity beyond
its pools' bounds, hand a caller an endpoint of its choosing, or put lines in the front's log."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from conftest import fleet_config, front_channel
from provisioner.model.abuse_record import Decision
from provisioner.common.clock import RealClock
from provisioner.front.cluster_reports import capacity_problem, endpoint_problem, flag_problem, session_problem
from provisioner.perf.fleet import free_port
from provisioner.security import tls
from provisioner.cli.serve import local_tls, start_front
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import cluster_service_pb2_grpc as cluster_grpc
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb

CLUSTER = "us-central1"


# ---- the rules, pure -----------------------------------------------------------------------

@pytest.mark.parametrize("endpoint, ok", [
    ("", True), ("http://10.128.0.7:8888", True), ("http://[fd00::7]:8888", True),
    ("sim://us-central1/us-central1-gpu-p100-1a2b", True),
    ("sim://europe-west4/europe-west4-gpu-p100-1a2b", False),
    ("https://evil.example.com/login", False), ("http://evil.example.com:8888", False),
    ("http://10.0.0.1:8888/x?token=1", False), ("http://user:pw@10.0.0.1:8888", False), ("http://10.0.0.1", False),
])
def test_an_endpoint_is_an_address_of_the_fleet(endpoint, ok):
    assert (endpoint_problem(CLUSTER, endpoint) is None) == ok


def _flag(**kw) -> Decision:
    base = dict(session_id="us-central1.s-00aa11", user_id="mal", at=1.0, rules=("miner_program",),
                reason="xmrig", evidence="{}", dry_run=False)
    return Decision(**(base | kw))


@pytest.mark.parametrize("flag, owner", [
    (_flag(session_id="europe-west4.s-00aa11"), "mal"),  # another cluster's session
    (_flag(user_id="bob\nERROR forged line"), None),
    (_flag(user_id="alice"), "mal"),  # the session is mal's, the flag names alice
    (_flag(rules=("anything",)), "mal"),
    (_flag(reason="\x1b[2J"), "mal"),
])
def test_a_flag_must_be_about_the_clusters_own_session_of_that_user(flag, owner):
    assert flag_problem(CLUSTER, flag, owner) is not None
    assert flag_problem(CLUSTER, _flag(), "mal") is None


def test_a_session_must_be_the_clusters_own_and_printable():
    good = pb.Session(id="us-central1.s-00aa11", cluster=CLUSTER, spec=pb.SessionSpec(user_id="alice"),
                      endpoint="http://10.0.0.2:8888", reason="running")
    assert session_problem(CLUSTER, good) is None
    for bad in (pb.Session(id="europe-west4.s-00aa11", cluster="europe-west4"),
                pb.Session(id="us-central1.s-00aa11", reason="ok\u2028forged"),
                pb.Session(id="us-central1.s-00aa11", spec=pb.SessionSpec(user_id="a\x1bb")),
                pb.Session(id="us-central1.s-00aa11", endpoint="https://evil.example.com/")):
        assert session_problem(CLUSTER, bad) is not None


def test_capacity_stays_within_the_pools_configured_ceilings():
    ceilings = {"gpu-p100": 40}
    ok = pb.ClusterCapacity(cluster=CLUSTER, pools=[pb.PoolCapacity(
        pool="gpu-p100", warm=3, warm_by_image=[pb.ImageCount(image="gpu:v154", count=2)], max_vms=40)])
    assert capacity_problem(CLUSTER, ok, ceilings) is None
    for pool in (pb.PoolCapacity(pool="gpu-h100", warm=1), pb.PoolCapacity(pool="gpu-p100", warm=10_000),
                 pb.PoolCapacity(pool="gpu-p100", warm=1, warm_by_image=[pb.ImageCount(image="gpu:v1", count=5)]),
                 pb.PoolCapacity(pool="gpu-p100", cold_start_s=float("nan"))):
        assert capacity_problem(CLUSTER, pb.ClusterCapacity(pools=[pool]), ceilings) is not None


# ---- a fake cluster with a real cluster's certificate, against a real front ------------------

class FakeCluster(cluster_grpc.ClusterServiceServicer):
    """Says what a compromised us-central1 might: the capacity and flags it is given, and for
    every Allocate or Get a running session with `endpoint`."""

    def __init__(self, capacity: pb.ClusterCapacity, flags: list[cluster_pb.AbuseFlag], endpoint: str):
        self.capacity, self.flags, self.endpoint = capacity, flags, endpoint

    async def WatchCapacity(self, request, context):
        yield cluster_pb.WatchCapacityResponse(capacity=self.capacity, abuse_flags=self.flags)
        await asyncio.Event().wait()  # the stream stays open, as a cluster's does

    def _session(self, spec: pb.SessionSpec) -> pb.Session:
        return pb.Session(id="us-central1.s-00c0ffee", cluster=CLUSTER, pool="gpu-p100", image="gpu:v154",
                          state=pb.SESSION_STATE_RUNNING, spec=spec, endpoint=self.endpoint, revision=1)

    async def Allocate(self, request, context):
        return cluster_pb.AllocateResponse(session=self._session(request.spec))

    async def Get(self, request, context):
        return cluster_pb.GetResponse(session=self._session(pb.SessionSpec(user_id=request.user_id or "alice")))

    async def SetBlockedUsers(self, request, context):
        return cluster_pb.SetBlockedUsersResponse()


def _capacity(warm: int) -> pb.ClusterCapacity:
    return pb.ClusterCapacity(cluster=CLUSTER, region=CLUSTER, healthy=True, pools=[pb.PoolCapacity(
        pool="gpu-p100", accelerator="nvidia-tesla-p100", warm=warm, max_vms=warm,
        warm_by_image=[pb.ImageCount(image="gpu:v154", count=warm)], cold_start_s=600)])


def _abuse_flag(session_id: str, user_id: str) -> cluster_pb.AbuseFlag:
    return cluster_pb.AbuseFlag(session_id=session_id, user_id=user_id, rules=["miner_program"], reason="xmrig")


async def _front_with_fake(tmp_path, fake: FakeCluster):
    config = fleet_config(tmp_path)
    data = tmp_path / "data"
    server = grpc.aio.server()
    cluster_grpc.add_ClusterServiceServicer_to_server(fake, server)
    address = f"127.0.0.1:{free_port()}"
    server.add_secure_port(address, tls.server_credentials(local_tls(config, data, CLUSTER), require_client_cert=True))
    await server.start()
    others = {c.name: f"127.0.0.1:{free_port()}" for c in config.clusters if c.name != CLUSTER}  # nothing there
    front = await start_front(config, RealClock(), data, address=f"127.0.0.1:{free_port()}",
                              cluster_addresses={CLUSTER: address, **others})
    return server, front, data


async def _blocked(ch, user: str) -> bool:
    resp = await admin_grpc.AdminServiceStub(ch).GetUserBlock(admin_pb.GetUserBlockRequest(user_id=user), timeout=5)
    return resp.HasField("block")


async def test_flags_and_capacity_beyond_the_clusters_own_are_not_acted_on(tmp_path, caplog):
    flags = [_abuse_flag("europe-west4.s-00aa11", "alice"),  # another cluster's session
             _abuse_flag("us-central1.s-00bb22", "bob\nERROR forged line"),
             _abuse_flag("us-central1.s-00cc33", "carol")]  # a session no front made
    fake = FakeCluster(_capacity(warm=1_000_000), flags, endpoint="")
    server, front, data = await _front_with_fake(tmp_path, fake)
    try:
        with caplog.at_level(logging.WARNING):
            async with front_channel(data, front.address) as ch:
                await asyncio.sleep(1.0)  # the stream's first push, flags first, then refused
                assert not await _blocked(ch, "alice")
                assert not await _blocked(ch, "carol")
                clusters = (await admin_grpc.AdminServiceStub(ch).ListClusters(admin_pb.ListClustersRequest(),
                                                                               timeout=5)).clusters
                assert not {c.name: c.healthy for c in clusters}[CLUSTER]
        assert "capacity push refused" in caplog.text
        assert not any(line.startswith("ERROR forged") for line in caplog.text.splitlines())
    finally:
        await front.stop(grace_s=0.1)
        await server.stop(0)


async def test_a_session_with_an_endpoint_outside_the_fleet_is_not_passed_on(tmp_path):
    fake = FakeCluster(_capacity(warm=5), [], endpoint="https://evil.example.com/login")
    server, front, data = await _front_with_fake(tmp_path, fake)
    try:
        # The fake's first report (the other clusters have nothing there: waiting for all of them
        # would end at the timeout, with the fake not yet heard from on a loaded machine).
        await asyncio.wait_for(front.fleet.clients[CLUSTER].updated.wait(), timeout=60)
        async with front_channel(data, front.address) as ch:
            sessions = s_grpc.SessionServiceStub(ch)
            spec = pb.SessionSpec(user_id="alice", accelerator="gpu-p100", image="gpu:v154", region_hint=CLUSTER,
                                  request_id="r1")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await sessions.CreateSession(s_pb.CreateSessionRequest(spec=spec), timeout=10)
            assert info.value.code() is grpc.StatusCode.INTERNAL and "evil" not in (info.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await sessions.GetSession(s_pb.GetSessionRequest(session_id="us-central1.s-00c0ffee"), timeout=5)
            assert info.value.code() is grpc.StatusCode.INTERNAL
    finally:
        await front.stop(grace_s=0.1)
        await server.stop(0)
