"""The CLI tests' front: fake SessionService and AdminService servicers over real loopback gRPC
with TLS, the messages they answer with, and the fixtures that run `provisioner session|admin`
against them. A test module takes the fixtures by naming them (see test_cli_session.py)."""

from __future__ import annotations

import types
from concurrent import futures

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry import trace
from opentelemetry.util._once import Once

from provisioner import cli
from provisioner.security.pki import ensure_local_pki, local_files
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import session_service_pb2 as session_pb
from provisioner.v1 import session_service_pb2_grpc as session_grpc
from provisioner.v1 import types_pb2

S = types_pb2.SessionState
NOW = 1_700_000_000


def make_session(id="us-central1.s1", state=S.SESSION_STATE_QUEUED, revision=1, **kw) -> types_pb2.Session:
    s = types_pb2.Session(
        id=id, state=state, cluster="us-central1", pool="gpu-p100", image="gpu:v154",
        revision=revision,
        spec=types_pb2.SessionSpec(user_id="ada", image="gpu:latest", request_id="r1",
                                   kind=types_pb2.SESSION_KIND_INTERACTIVE),
        **kw)
    s.create_time.FromSeconds(NOW)
    return s


def with_eta(s: types_pb2.Session, seconds: int) -> types_pb2.Session:
    s.estimated_ready_time.FromSeconds(NOW + seconds)
    return s


DIGEST = "sha256:" + "5e" * 32
SECRET = "the-sessions-secret"


class FakeSessions(session_grpc.SessionServiceServicer):
    def __init__(self):
        self.requests: list = []
        self.metadata: list = []
        self.break_watch_once = False
        self.next_id = "us-central1.s1"

    def CreateSession(self, request, context):
        self.requests.append(request)
        if request.spec.user_id == "unlucky":
            context.abort(grpc.StatusCode.UNAVAILABLE, "front restarting")
        if not request.spec.user_id:
            detail = any_pb2.Any()
            detail.Pack(error_details_pb2.BadRequest(field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field="spec.user_id",
                                                            description="must not be empty")]))
            context.abort_with_status(rpc_status.to_status(status_pb2.Status(
                code=code_pb2.INVALID_ARGUMENT, message="no user given", details=[detail])))
        s = with_eta(make_session(self.next_id, queue_position=2), 300)
        s.spec.CopyFrom(request.spec)
        return session_pb.CreateSessionResponse(session=s)

    def WatchSession(self, request, context):
        self.requests.append(request)
        doomed = request.session_id.endswith("doomed")
        steps = [
            with_eta(make_session(request.session_id, queue_position=1, revision=1), 120),
            with_eta(make_session(request.session_id, S.SESSION_STATE_PULLING_IMAGE, 2,
                          pull=types_pb2.PullProgress(bytes_total=20_000_000_000,
                                                      bytes_done=5_000_000_000)), 60),
            with_eta(make_session(request.session_id, S.SESSION_STATE_PULLING_IMAGE, 3,
                          pull=types_pb2.PullProgress(bytes_total=20_000_000_000,
                                                      bytes_done=15_000_000_000)), 20),
            make_session(request.session_id, S.SESSION_STATE_FAILED, 4, reason="image pull failed")
            if doomed else
            make_session(request.session_id, S.SESSION_STATE_RUNNING, 4, start=types_pb2.START_KIND_PARTIAL,
                     endpoint="https://k.example/s1", reason="image pulled"),
        ]
        for s in steps:
            if s.revision <= request.after_revision:
                continue
            if self.break_watch_once and s.revision == 3:
                self.break_watch_once = False
                context.abort(grpc.StatusCode.UNAVAILABLE, "cluster restarting")
            yield session_pb.WatchSessionResponse(session=s)

    def GetSession(self, request, context):
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        if request.session_id == "missing":
            context.abort(grpc.StatusCode.NOT_FOUND, "no session missing")
        session = make_session(request.session_id)
        session.image_digest, session.access_token = DIGEST, SECRET  # as the front answers its owner
        return session_pb.GetSessionResponse(session=session)

    def ListSessions(self, request, context):
        self.requests.append(request)
        all_ = [make_session(f"us-central1.s{i}", S.SESSION_STATE_RUNNING) for i in range(5)]
        start = int(request.page_token or 0)
        end = start + (request.page_size or 2)
        token = str(end) if end < len(all_) else ""
        return session_pb.ListSessionsResponse(sessions=all_[start:end], next_page_token=token)

    def TouchSession(self, request, context):
        self.requests.append(request)
        if request.session_id.endswith("ended"):
            return session_pb.TouchSessionResponse(session=make_session(
                request.session_id, S.SESSION_STATE_STOPPED, reason="idle for 1h0m"))
        return session_pb.TouchSessionResponse(session=make_session(request.session_id))

    def StopSession(self, request, context):
        self.requests.append(request)
        s = make_session(request.session_id, S.SESSION_STATE_STOPPED, reason=request.reason)
        return session_pb.StopSessionResponse(session=s)

    def GetQuota(self, request, context):
        self.requests.append(request)
        q = types_pb2.Quota(user_id=request.user_id, gpu_hours_limit=30, gpu_hours_used=12.5,
                            max_active_sessions=2, active_sessions=1)
        q.reset_time.FromSeconds(NOW + 86400)
        return session_pb.GetQuotaResponse(quota=q)


def make_pool(policy: types_pb2.PoolPolicy | None = None) -> types_pb2.Pool:
    return types_pb2.Pool(
        cluster="us-central1", name="gpu-p100", accelerator="gpu-p100", zones=["us-central1-a"],
        policy=policy or types_pb2.PoolPolicy(min_vms=1, max_vms=8),
        capacity=types_pb2.PoolCapacity(pool="gpu-p100", warm=3, assigned=2,
                                        warm_by_image=[types_pb2.ImageCount(image="gpu:v154", count=3)]))


def make_cluster(draining=False) -> types_pb2.Cluster:
    return types_pb2.Cluster(name="us-central1", region="us-central1", address="10.0.0.1:50052",
                             healthy=True, draining=draining, pools=[make_pool()])


def make_vm(state=types_pb2.VM_STATE_WARM) -> types_pb2.Vm:
    return types_pb2.Vm(id="vm-1", cluster="us-central1", pool="gpu-p100", zone="us-central1-a",
                        state=state, images=["gpu:v154"], healthy=True)


class FakeAdmin(admin_grpc.AdminServiceServicer):
    def __init__(self):
        self.requests: list = []

    def ListClusters(self, request, context):
        self.requests.append(request)
        return admin_pb.ListClustersResponse(clusters=[make_cluster()])

    def ListPools(self, request, context):
        self.requests.append(request)
        return admin_pb.ListPoolsResponse(pools=[make_pool()])

    def DrainCluster(self, request, context):
        self.requests.append(request)
        return admin_pb.DrainClusterResponse(cluster=make_cluster(draining=True))

    def UndrainCluster(self, request, context):
        self.requests.append(request)
        return admin_pb.UndrainClusterResponse(cluster=make_cluster())

    def SetPoolPolicy(self, request, context):
        self.requests.append(request)
        return admin_pb.SetPoolPolicyResponse(pool=make_pool(request.policy))

    def PrewarmImage(self, request, context):
        self.requests.append(request)
        return admin_pb.PrewarmImageResponse(vm_ids=[f"vm-{i}" for i in range(request.count)])

    def ListVms(self, request, context):
        self.requests.append(request)
        return admin_pb.ListVmsResponse(vms=[make_vm()])

    def EvictVm(self, request, context):
        self.requests.append(request)
        return admin_pb.EvictVmResponse(vm=make_vm(types_pb2.VM_STATE_DELETING))


@pytest.fixture(autouse=True)
def credentials(tmp_path, monkeypatch):
    """A local CA under a data dir, as `up` makes it, and a token in the environment."""
    ensure_local_pki(tmp_path / "tls", {"front": ["front.provisioner.internal"]})
    monkeypatch.setenv("PROVISIONER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("PROVISIONER_TOKEN", "token-of-the-test")
    monkeypatch.delenv("PROVISIONER_CA", raising=False)
    return local_files(tmp_path / "tls", "front")


@pytest.fixture
def front(credentials):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    sessions, admin = FakeSessions(), FakeAdmin()
    session_grpc.add_SessionServiceServicer_to_server(sessions, server)
    admin_grpc.add_AdminServiceServicer_to_server(admin, server)
    _, chain, key = credentials.read()
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, chain)]))
    server.start()
    yield types.SimpleNamespace(addr=f"127.0.0.1:{port}", sessions=sessions, admin=admin)
    server.stop(None)


@pytest.fixture(autouse=True)
def own_tracing_globals(monkeypatch):
    # Each CLI run sets up (and shuts down) tracing; keep that from leaking into other tests'
    # global tracer provider.
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.delenv("PROVISIONER_TRACES", raising=False)


@pytest.fixture
def run(front, capsys):

    def run(*argv: str):
        group, *rest = argv
        rc = cli.main([group, "--front", front.addr, *rest])
        out, err = capsys.readouterr()
        return rc, out, err

    return run
