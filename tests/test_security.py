"""Who may call what, over real TLS on a running fleet: every cell of the roles table, at the
front's port and at a cluster's."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import fleet_config, quick_warm_up, start_fleet, warm_fleet
from provisioner.security.client import dev_token
from provisioner.config import load_fleet
from provisioner.security.tokens import ensure_local_key, mint
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb

C = grpc.StatusCode
SERVICES = {
    "provisioner.v1.SessionService": s_pb.DESCRIPTOR.services_by_name["SessionService"],
    "provisioner.v1.AdminService": admin_pb.DESCRIPTOR.services_by_name["AdminService"],
    "provisioner.v1.ClusterService": cluster_pb.DESCRIPTOR.services_by_name["ClusterService"],
}


def every_rpc(*services: str):
    """(full method name, streams?) of every RPC of the named services."""
    return [(f"/{name}/{m.name}", m.server_streaming) for name in services for m in SERVICES[name].methods]


async def call_raw(channel: grpc.aio.Channel, method: str, streaming: bool, body: bytes = b"",
                   metadata=None) -> grpc.StatusCode:
    """The status of one call with a raw (here empty, so valid) request; OK if it answered."""
    try:
        if streaming:
            stream = channel.unary_stream(method)(body, timeout=5, metadata=metadata)
            await stream.read()
            stream.cancel()
        else:
            await channel.unary_unary(method)(body, timeout=5, metadata=metadata)
    except grpc.aio.AioRpcError as err:
        return err.code()
    return C.OK


def with_roles(tmp_path):
    """The shipped fleet plus a service identity and an admin identity on the local issuer."""
    fleet_config(tmp_path, quick_warm_up)  # copies the shipped config under tmp_path
    path = tmp_path / "clusters" / "fleet.yaml"
    data = yaml.safe_load(path.read_text())
    data["security"]["issuers"][0]["roles"].update({"notebook-backend": ["service"], "ops": ["admin"]})
    path.write_text(yaml.safe_dump(data))
    return load_fleet(tmp_path / "clusters")


@pytest.fixture
async def fleet(tmp_path):
    async with warm_fleet(with_roles(tmp_path), tmp_path / "data") as handle:
        yield handle


def spec(user: str, request_id: str | None = None, **kw) -> pb.SessionSpec:
    return pb.SessionSpec(request_id=request_id or f"r-{time.monotonic_ns()}", user_id=user, accelerator="gpu-p100",
                          image="gpu:latest", **kw)


async def test_anonymous_and_forged_callers_are_refused_on_every_front_rpc(fleet):
    data_dir = fleet.data_dir
    rpcs = every_rpc("provisioner.v1.SessionService", "provisioner.v1.AdminService")
    other_key = data_dir.parent / "other-key"
    ensure_local_key(other_key)
    forged = mint((other_key / "token-key.pem").read_bytes(), "local-operator")  # right claims, wrong key
    expired = mint((data_dir / "auth" / "token-key.pem").read_bytes(), "local-operator", ttl_s=60,
                   now=time.time() - 3600)
    wrong_issuer = mint((data_dir / "auth" / "token-key.pem").read_bytes(), "local-operator", issuer="elsewhere")
    ca = (data_dir / "tls" / "ca.pem").read_bytes()
    async with grpc.aio.secure_channel(fleet.front_address, grpc.ssl_channel_credentials(ca)) as bare:
        async def refused_every_way(method: str, streaming: bool) -> None:
            assert await call_raw(bare, method, streaming) == C.UNAUTHENTICATED, method
            for token in (forged, expired, wrong_issuer, "not-a-jwt"):
                code = await call_raw(bare, method, streaming, metadata=(("authorization", f"Bearer {token}"),))
                assert code == C.UNAUTHENTICATED, (method, token[:20])

        # Every RPC at once: the front holds each refusal a quarter second (common/pacing.py).
        await asyncio.gather(*(refused_every_way(method, streaming) for method, streaming in rpcs))
        # Health and reflection stay anonymous.
        resp = await health_pb2_grpc.HealthStub(bare).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    # Plaintext is not spoken at all.
    async with grpc.aio.insecure_channel(fleet.front_address) as plain:
        assert await call_raw(plain, rpcs[0][0], False) == C.UNAVAILABLE


async def test_a_user_acts_only_as_itself(fleet):
    async with fleet.front_channel(dev_token(fleet.data_dir, "alice")) as a, \
            fleet.front_channel(dev_token(fleet.data_dir, "bob")) as b:
        alice, bob = s_grpc.SessionServiceStub(a), s_grpc.SessionServiceStub(b)
        # A user's own sessions: the user id may be left out, it is the token's subject.
        mine = (await alice.CreateSession(s_pb.CreateSessionRequest(spec=spec("", "shared-rid")), timeout=10)).session
        assert mine.spec.user_id == "alice"
        assert (await alice.GetSession(s_pb.GetSessionRequest(session_id=mine.id), timeout=5)).session.id == mine.id
        listed = (await alice.ListSessions(s_pb.ListSessionsRequest(), timeout=5)).sessions
        assert [s.id for s in listed] == [mine.id]
        assert (await alice.GetQuota(s_pb.GetQuotaRequest(), timeout=5)).quota.user_id == "alice"
        await alice.TouchSession(s_pb.TouchSessionRequest(session_id=mine.id), timeout=5)

        # Another user's session does not exist, whatever bob does with its id.
        for rpc, req in ((bob.GetSession, s_pb.GetSessionRequest(session_id=mine.id)),
                         (bob.TouchSession, s_pb.TouchSessionRequest(session_id=mine.id)),
                         (bob.StopSession, s_pb.StopSessionRequest(session_id=mine.id))):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await rpc(req, timeout=5)
            assert e.value.code() == C.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await bob.WatchSession(s_pb.WatchSessionRequest(session_id=mine.id), timeout=5).read()
        assert e.value.code() == C.NOT_FOUND
        # Naming another user is refused outright.
        for rpc, req in ((bob.ListSessions, s_pb.ListSessionsRequest(user_id="alice")),
                         (bob.GetQuota, s_pb.GetQuotaRequest(user_id="alice")),
                         (bob.CreateSession, s_pb.CreateSessionRequest(spec=spec("alice")))):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await rpc(req, timeout=5)
            assert e.value.code() == C.PERMISSION_DENIED
        # The same request id is bob's own key: it never returns alice's session.
        theirs = (await bob.CreateSession(s_pb.CreateSessionRequest(spec=spec("", "shared-rid")), timeout=10)).session
        assert theirs.id != mine.id and theirs.spec.user_id == "bob"
        # No AdminService, no ClusterService.
        for method, streaming in every_rpc("provisioner.v1.AdminService"):
            assert await call_raw(b, method, streaming) == C.PERMISSION_DENIED, method
        assert (await alice.StopSession(s_pb.StopSessionRequest(session_id=mine.id), timeout=5)).session.id == mine.id


async def test_a_service_acts_for_any_user_and_an_admin_reads_and_operates(fleet):
    async with fleet.front_channel(dev_token(fleet.data_dir, "notebook-backend")) as svc_ch, \
            fleet.front_channel(dev_token(fleet.data_dir, "ops")) as ops_ch:
        svc, ops = s_grpc.SessionServiceStub(svc_ch), s_grpc.SessionServiceStub(ops_ch)
        made = [(await svc.CreateSession(s_pb.CreateSessionRequest(spec=spec(user)), timeout=10)).session
                for user in ("carol", "dave")]
        assert [s.spec.user_id for s in made] == ["carol", "dave"]
        for s in made:
            assert (await svc.GetSession(s_pb.GetSessionRequest(session_id=s.id), timeout=5)).session.id == s.id
            assert (await ops.GetSession(s_pb.GetSessionRequest(session_id=s.id), timeout=5)).session.id == s.id
        listed = (await ops.ListSessions(s_pb.ListSessionsRequest(user_id="carol"), timeout=5)).sessions
        assert [s.id for s in listed] == [made[0].id]
        # A service has no AdminService; an admin changes no session.
        assert await call_raw(svc_ch, "/provisioner.v1.AdminService/DrainCluster", False) == C.PERMISSION_DENIED
        for rpc, req in ((ops.CreateSession, s_pb.CreateSessionRequest(spec=spec("erin"))),
                         (ops.StopSession, s_pb.StopSessionRequest(session_id=made[0].id))):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await rpc(req, timeout=5)
            assert e.value.code() == C.PERMISSION_DENIED
        # An admin drains; the audit log says who.
        admin = admin_grpc.AdminServiceStub(ops_ch)
        await admin.DrainCluster(admin_pb.DrainClusterRequest(cluster="asia-east1"), timeout=10)
        records = (await admin.ListAuditRecords(admin_pb.ListAuditRecordsRequest(rpc="DrainCluster"),
                                                timeout=5)).records
        assert [(r.identity, r.outcome) for r in records][:1] == [("ops", "ok")]
        denied = (await admin.ListAuditRecords(admin_pb.ListAuditRecordsRequest(outcome="denied"), timeout=5)).records
        assert {r.identity for r in denied} >= {"notebook-backend", "ops"}


async def test_an_admins_drain_survives_a_restart_of_the_fleet(tmp_path):
    config = with_roles(tmp_path)
    handle = await start_fleet(config, tmp_path / "data")
    try:
        async with handle.front_channel(dev_token(handle.data_dir, "ops")) as ch:
            await admin_grpc.AdminServiceStub(ch).DrainCluster(admin_pb.DrainClusterRequest(cluster="europe-west4"),
                                                               timeout=10)
    finally:
        await handle.channel.close()
        await handle.fleet.stop(0.5)
    again = await start_fleet(config, tmp_path / "data")
    try:
        clusters = (await again.admin.ListClusters(admin_pb.ListClustersRequest(), timeout=10)).clusters
        assert {c.name: c.draining for c in clusters} == {"us-central1": False, "europe-west4": True,
                                                          "asia-east1": False}
        s = await again.create(region_hint="europe-west4")  # not required: goes elsewhere
        assert s.cluster != "europe-west4"
    finally:
        await again.channel.close()
        await again.fleet.stop(0.5)


async def test_a_cluster_answers_the_fronts_certificate_only(fleet):
    name = "us-central1"
    address = fleet.cluster(name).address
    rpcs = every_rpc("provisioner.v1.ClusterService", "provisioner.v1.AdminService")
    ca = (fleet.data_dir / "tls" / "ca.pem").read_bytes()
    server_name = (("grpc.ssl_target_name_override", fleet.security.cluster_name(name)),)
    token = (("authorization", f"Bearer {dev_token(fleet.data_dir)}"),)
    # No client certificate (with or without the operator's token): the handshake itself fails.
    async with grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(ca), options=server_name) as no_cert, \
            grpc.aio.insecure_channel(address) as plain:
        for method, streaming in rpcs:
            assert await call_raw(no_cert, method, streaming, metadata=token) == C.UNAVAILABLE, method
            assert await call_raw(plain, method, streaming) == C.UNAVAILABLE, method
    # A certificate of the fleet's CA that is not the front's (another cluster's): refused.
    async with fleet.cluster_channel(name, as_process="cluster-asia-east1") as other:
        for method, streaming in rpcs:
            assert await call_raw(other, method, streaming) == C.PERMISSION_DENIED, method
    # The front's certificate: served.
    async with fleet.cluster_channel(name) as front:
        stub_get = front.unary_unary("/provisioner.v1.ClusterService/Get",
                                     request_serializer=cluster_pb.GetRequest.SerializeToString,
                                     response_deserializer=cluster_pb.GetResponse.FromString)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub_get(cluster_pb.GetRequest(session_id=f"{name}.s-00000000ff"), timeout=5)
        assert e.value.code() == C.NOT_FOUND
        assert await call_raw(front, "/provisioner.v1.AdminService/ListPools", False) == C.OK


async def test_discard_ends_a_session_but_keeps_its_record(fleet):
    s = await fleet.create(user_id="frank", request_id="dup-1", region_hint="us-central1", region_required=True)
    async with fleet.cluster_channel("us-central1") as ch:
        discard = ch.unary_unary("/provisioner.v1.ClusterService/Discard",
                                 request_serializer=cluster_pb.DiscardRequest.SerializeToString,
                                 response_deserializer=cluster_pb.DiscardResponse.FromString)
        resp = await discard(cluster_pb.DiscardRequest(request_id="dup-1", user_id="frank", reason="test"), timeout=5)
        assert resp.discarded
    got = (await fleet.sessions.GetSession(s_pb.GetSessionRequest(session_id=s.id), timeout=5)).session
    assert got.reason == "discarded: test" and got.state in (pb.SESSION_STATE_STOPPING, pb.SESSION_STATE_STOPPED)
    # The request id still names it: a retry gets the ended session, not NOT_FOUND.
    again = await fleet.create(user_id="frank", request_id="dup-1")
    assert again.id == s.id


async def test_a_user_holds_a_bounded_number_of_open_streams(fleet):
    async with fleet.front_channel(dev_token(fleet.data_dir, "gina")) as ch:
        stub = s_grpc.SessionServiceStub(ch)
        s = (await stub.CreateSession(s_pb.CreateSessionRequest(spec=spec("")), timeout=10)).session
        cap = fleet.security.max_streams["user"]
        watches = [stub.WatchSession(s_pb.WatchSessionRequest(session_id=s.id)) for _ in range(cap)]
        for w in watches:
            await asyncio.wait_for(w.read(), 5)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.WatchSession(s_pb.WatchSessionRequest(session_id=s.id)).read()
        assert e.value.code() == C.RESOURCE_EXHAUSTED
        watches[0].cancel()
        await asyncio.sleep(0.2)
        more = stub.WatchSession(s_pb.WatchSessionRequest(session_id=s.id))
        assert (await asyncio.wait_for(more.read(), 5)).session.id == s.id  # a freed slot is reusable
        for w in [*watches, more]:
            w.cancel()


async def test_a_service_watching_for_its_users_is_held_to_each_users_cap(fleet):
    # The notebook backend (a service, with a far larger cap of its own) opens the watches for its
    # users: each user's sessions are still watched by at most the user's cap at a time.
    async with fleet.front_channel(dev_token(fleet.data_dir, "notebook-backend")) as ch:
        stub = s_grpc.SessionServiceStub(ch)
        hers, his = [(await stub.CreateSession(s_pb.CreateSessionRequest(spec=spec(user)), timeout=10)).session
                     for user in ("hana", "ivan")]
        cap = fleet.security.max_streams["user"]
        watches = [stub.WatchSession(s_pb.WatchSessionRequest(session_id=hers.id)) for _ in range(cap)]
        for w in watches:
            await asyncio.wait_for(w.read(), 5)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.WatchSession(s_pb.WatchSessionRequest(session_id=hers.id)).read()
        assert e.value.code() == C.RESOURCE_EXHAUSTED and "hana" in e.value.details()
        other = stub.WatchSession(s_pb.WatchSessionRequest(session_id=his.id))
        assert (await asyncio.wait_for(other.read(), 5)).session.id == his.id  # another user's: not held back
        watches[0].cancel()
        await asyncio.sleep(0.2)
        more = stub.WatchSession(s_pb.WatchSessionRequest(session_id=hers.id))
        assert (await asyncio.wait_for(more.read(), 5)).session.id == hers.id
        for w in [*watches, other, more]:
            w.cancel()


async def test_who_may_call_is_decided_before_the_request_is_decoded(fleet):
    garbage = b"\xff\xff\xff\xff"
    ca = (fleet.data_dir / "tls" / "ca.pem").read_bytes()
    async with grpc.aio.secure_channel(fleet.front_address, grpc.ssl_channel_credentials(ca)) as bare, \
            fleet.front_channel(dev_token(fleet.data_dir, "alice")) as user, \
            fleet.cluster_channel("us-central1", as_process="cluster-asia-east1") as other_cluster:
        assert await call_raw(bare, "/provisioner.v1.SessionService/GetSession", False, garbage) == C.UNAUTHENTICATED
        assert await call_raw(user, "/provisioner.v1.AdminService/DrainCluster", False, garbage) == \
            C.PERMISSION_DENIED
        assert await call_raw(other_cluster, "/provisioner.v1.ClusterService/Get", False, garbage) == \
            C.PERMISSION_DENIED
        # A caller allowed to call it gets told the request is malformed.
        assert await call_raw(user, "/provisioner.v1.SessionService/GetSession", False, garbage) == \
            C.INVALID_ARGUMENT
