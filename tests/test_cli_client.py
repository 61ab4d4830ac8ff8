"""The `provisioner session|admin` client against fake servicers over real loopback gRPC."""

from __future__ import annotations

import json
import socket
import sys
import types
import uuid
from concurrent import futures

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from provisioner import cli
from provisioner.cli import client, render
from provisioner.client import _base
from provisioner.security.pki import ensure_local_pki, local_files
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import session_service_pb2 as session_pb
from provisioner.v1 import session_service_pb2_grpc as session_grpc
from provisioner.v1 import types_pb2

S = types_pb2.SessionState
NOW = 1_700_000_000


def _session(id="us-central1.s1", state=S.SESSION_STATE_QUEUED, revision=1, **kw) -> types_pb2.Session:
    s = types_pb2.Session(
        id=id, state=state, cluster="us-central1", pool="gpu-p100", image="gpu:v154",
        revision=revision,
        spec=types_pb2.SessionSpec(user_id="ada", image="gpu:latest", request_id="r1",
                                   kind=types_pb2.SESSION_KIND_INTERACTIVE),
        **kw)
    s.create_time.FromSeconds(NOW)
    return s


def _eta(s: types_pb2.Session, seconds: int) -> types_pb2.Session:
    s.estimated_ready_time.FromSeconds(NOW + seconds)
    return s


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
        s = _eta(_session(self.next_id, queue_position=2), 300)
        s.spec.CopyFrom(request.spec)
        return session_pb.CreateSessionResponse(session=s)

    def WatchSession(self, request, context):
        self.requests.append(request)
        doomed = request.session_id.endswith("doomed")
        steps = [
            _eta(_session(request.session_id, queue_position=1, revision=1), 120),
            _eta(_session(request.session_id, S.SESSION_STATE_PULLING_IMAGE, 2,
                          pull=types_pb2.PullProgress(bytes_total=20_000_000_000,
                                                      bytes_done=5_000_000_000)), 60),
            _eta(_session(request.session_id, S.SESSION_STATE_PULLING_IMAGE, 3,
                          pull=types_pb2.PullProgress(bytes_total=20_000_000_000,
                                                      bytes_done=15_000_000_000)), 20),
            _session(request.session_id, S.SESSION_STATE_FAILED, 4, reason="image pull failed")
            if doomed else
            _session(request.session_id, S.SESSION_STATE_RUNNING, 4, start=types_pb2.START_KIND_PARTIAL,
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
        return session_pb.GetSessionResponse(session=_session(request.session_id))

    def ListSessions(self, request, context):
        self.requests.append(request)
        all_ = [_session(f"us-central1.s{i}", S.SESSION_STATE_RUNNING) for i in range(5)]
        start = int(request.page_token or 0)
        end = start + (request.page_size or 2)
        token = str(end) if end < len(all_) else ""
        return session_pb.ListSessionsResponse(sessions=all_[start:end], next_page_token=token)

    def TouchSession(self, request, context):
        self.requests.append(request)
        if request.session_id.endswith("ended"):
            return session_pb.TouchSessionResponse(session=_session(
                request.session_id, S.SESSION_STATE_STOPPED, reason="idle for 1h0m"))
        return session_pb.TouchSessionResponse(session=_session(request.session_id))

    def StopSession(self, request, context):
        self.requests.append(request)
        s = _session(request.session_id, S.SESSION_STATE_STOPPED, reason=request.reason)
        return session_pb.StopSessionResponse(session=s)

    def GetQuota(self, request, context):
        self.requests.append(request)
        q = types_pb2.Quota(user_id=request.user_id, gpu_hours_limit=30, gpu_hours_used=12.5,
                            max_active_sessions=2, active_sessions=1)
        q.reset_time.FromSeconds(NOW + 86400)
        return session_pb.GetQuotaResponse(quota=q)


def _pool(policy: types_pb2.PoolPolicy | None = None) -> types_pb2.Pool:
    return types_pb2.Pool(
        cluster="us-central1", name="gpu-p100", accelerator="gpu-p100", zones=["us-central1-a"],
        policy=policy or types_pb2.PoolPolicy(min_vms=1, max_vms=8),
        capacity=types_pb2.PoolCapacity(pool="gpu-p100", warm=3, assigned=2,
                                        warm_by_image=[types_pb2.ImageCount(image="gpu:v154", count=3)]))


def _cluster(draining=False) -> types_pb2.Cluster:
    return types_pb2.Cluster(name="us-central1", region="us-central1", address="10.0.0.1:50052",
                             healthy=True, draining=draining, pools=[_pool()])


def _vm(state=types_pb2.VM_STATE_WARM) -> types_pb2.Vm:
    return types_pb2.Vm(id="vm-1", cluster="us-central1", pool="gpu-p100", zone="us-central1-a",
                        state=state, images=["gpu:v154"], healthy=True)


class FakeAdmin(admin_grpc.AdminServiceServicer):
    def __init__(self):
        self.requests: list = []

    def ListClusters(self, request, context):
        self.requests.append(request)
        return admin_pb.ListClustersResponse(clusters=[_cluster()])

    def ListPools(self, request, context):
        self.requests.append(request)
        return admin_pb.ListPoolsResponse(pools=[_pool()])

    def DrainCluster(self, request, context):
        self.requests.append(request)
        return admin_pb.DrainClusterResponse(cluster=_cluster(draining=True))

    def UndrainCluster(self, request, context):
        self.requests.append(request)
        return admin_pb.UndrainClusterResponse(cluster=_cluster())

    def SetPoolPolicy(self, request, context):
        self.requests.append(request)
        return admin_pb.SetPoolPolicyResponse(pool=_pool(request.policy))

    def PrewarmImage(self, request, context):
        self.requests.append(request)
        return admin_pb.PrewarmImageResponse(vm_ids=[f"vm-{i}" for i in range(request.count)])

    def ListVms(self, request, context):
        self.requests.append(request)
        return admin_pb.ListVmsResponse(vms=[_vm()])

    def EvictVm(self, request, context):
        self.requests.append(request)
        return admin_pb.EvictVmResponse(vm=_vm(types_pb2.VM_STATE_DELETING))


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


# --- session commands ----------------------------------------------------------------------


def test_create_json_sends_the_spec(run, front):
    rc, out, err = run("session", "create", "--user", "ada", "--accelerator", "gpu-p100",
                       "--image", "gpu:latest", "--kind", "batch", "--region", "europe-west4",
                       "--require-region", "--max-runtime", "90m", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["id"] == "us-central1.s1"
    assert data["state"] == "queued"
    assert data["cluster"] == "us-central1"
    assert data["image"] == "gpu:v154" and data["image_requested"] == "gpu:latest"
    assert data["start"] == ""
    assert data["kind"] == "batch"
    assert data["estimated_ready_time"] == "2023-11-14T22:18:20Z"
    spec = front.sessions.requests[0].spec
    uuid.UUID(spec.request_id)  # a fresh uuid4 by default
    assert spec.max_runtime.seconds == 5400
    assert spec.region_hint == "europe-west4" and spec.region_required
    assert spec.kind == types_pb2.SESSION_KIND_BATCH
    assert "request id" not in err  # --json keeps stderr quiet


def test_create_human_shows_the_request_id(run, front):
    rc, out, err = run("session", "create", "--user", "ada", "--accelerator", "gpu-p100",
                       "--image", "gpu:v154")
    assert rc == 0
    assert f"{front.sessions.requests[0].spec.request_id}\n" in out and "request id" not in err
    assert "state:" in out and "queued" in out

    rc, _, err = run("session", "create", "--user", "ada", "--accelerator", "gpu-p100",
                     "--image", "gpu:v154", "--request-id", "retry-me")
    assert rc == 0 and "request id" not in err
    assert front.sessions.requests[-1].spec.request_id == "retry-me"
    assert not front.sessions.requests[-1].spec.HasField("max_runtime")


def test_create_wait_shows_progress_until_running(run, front):
    rc, out, err = run("session", "create", "--user", "ada", "--accelerator", "gpu-p100",
                       "--image", "gpu:v154", "--wait", "--json")
    assert rc == 0, err
    assert json.loads(out)["state"] == "running"
    assert json.loads(out)["start"] == "partial"
    lines = err.strip().splitlines()
    assert "queued" in lines[0] and "queue #1" in lines[0] and "ready in ~" in lines[0]
    assert any("pull 25% of 20.0 GB" in line for line in lines)
    assert any("pull 75%" in line for line in lines)
    assert "running" in lines[-1] and "https://k.example/s1" in lines[-1]
    watch = front.sessions.requests[1]
    assert watch.session_id == "us-central1.s1" and watch.after_revision == 0


def test_create_wait_exits_1_when_the_session_fails(run, front):
    front.sessions.next_id = "us-central1.doomed"
    rc, out, err = run("session", "create", "--user", "ada", "--accelerator", "gpu-p100",
                       "--image", "gpu:v154", "--wait")
    assert rc == 1
    assert "failed" in err.splitlines()[-1] and "image pull failed" in err
    assert "failed" in out


def test_watch_json_lines_and_resume_after_unavailable(run, front, monkeypatch):
    monkeypatch.setattr(_base, "WATCH_RESUMES", 1)
    front.sessions.break_watch_once = True
    rc, out, err = run("session", "watch", "us-central1.s1", "--json")
    assert rc == 0, err
    states = [json.loads(line)["state"] for line in out.splitlines()]
    assert states == ["queued", "pulling_image", "pulling_image", "running"]
    assert [r.after_revision for r in front.sessions.requests] == [0, 2]


def test_watch_human_ends_on_failed(run):
    rc, out, _ = run("session", "watch", "us-central1.doomed", "--after-revision", "2")
    assert rc == 1
    assert out.splitlines()[0].startswith("us-central1.doomed pulling_image pull 75%")
    assert out.splitlines()[-1] == "us-central1.doomed failed: image pull failed"


def test_list_all_follows_pages(run, front):
    rc, out, err = run("session", "list", "--user", "ada", "--all", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert [s["id"] for s in data["sessions"]] == [f"us-central1.s{i}" for i in range(5)]
    assert data["next_page_token"] == ""
    assert [r.page_token for r in front.sessions.requests] == ["", "2", "4"]


def test_list_one_page_with_states(run, front):
    rc, out, err = run("session", "list", "--user", "ada", "--state", "running", "queued",
                       "--page-size", "3")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "STATE", "CLUSTER", "IMAGE", "START", "AGE/READY-IN", "REASON"]
    assert len(lines) == 4
    assert "--page-token 3" in err
    req = front.sessions.requests[0]
    assert list(req.states) == [S.SESSION_STATE_RUNNING, S.SESSION_STATE_QUEUED]
    assert req.page_size == 3


def test_get_touch_stop_quota(run, front):
    assert run("session", "get", "us-central1.s9")[0] == 0
    assert run("session", "touch", "us-central1.s9")[0] == 0
    rc, out, _ = run("session", "stop", "us-central1.s9", "--reason", "done", "--json")
    assert rc == 0 and json.loads(out)["state"] == "stopped"
    assert front.sessions.requests[2].reason == "done"
    rc, out, _ = run("session", "quota", "--user", "ada")
    assert rc == 0
    assert "12.5 / 30.0 (42%)" in out and "1 / 2" in out


def test_invalid_argument_names_the_field(run):
    rc, out, err = run("session", "create", "--user", "", "--accelerator", "gpu-p100",
                       "--image", "gpu:v154", "--json")
    assert rc == 1 and out == ""
    assert err.strip() == "error: INVALID_ARGUMENT: no user given (field spec.user_id: must not be empty)"


def test_not_found_is_one_line(run):
    rc, _, err = run("session", "get", "missing")
    assert rc == 1
    assert err == "error: NOT_FOUND: no session missing\n"


def test_every_call_is_tls_with_the_bearer_token(run, front, monkeypatch):
    assert run("session", "get", "us-central1.s1", "--json")[0] == 0
    assert front.sessions.metadata[-1]["authorization"] == "Bearer token-of-the-test"
    monkeypatch.delenv("PROVISIONER_TOKEN")
    rc, _, err = run("session", "get", "us-central1.s1")  # no token, and no local key to mint one
    assert rc == 1 and err.startswith("error: no credentials: give --token")


def test_a_dev_token_is_minted_from_the_local_key(run, front, monkeypatch, tmp_path):
    from provisioner.security.tokens import ensure_local_key

    monkeypatch.delenv("PROVISIONER_TOKEN")
    ensure_local_key(tmp_path / "auth")
    assert run("session", "get", "us-central1.s1")[0] == 0
    header = front.sessions.metadata[-1]["authorization"]
    assert header.startswith("Bearer ey") and header != "Bearer token-of-the-test"


def test_front_from_env(front, capsys, monkeypatch):
    monkeypatch.setenv("PROVISIONER_FRONT", front.addr)
    assert cli.main(["session", "get", "us-central1.s1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == "us-central1.s1"
    assert front.sessions.requests[0].session_id == "us-central1.s1"


def test_unreachable_front(capsys, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("PROVISIONER_FRONT", f"127.0.0.1:{port}")
    assert cli.main(["session", "get", "x", "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: UNAVAILABLE: ")
    assert f"hint: nothing answers at 127.0.0.1:{port}: start the local fleet with `provisioner up`" in err


def test_usage_errors_exit_2(run, capsys):
    assert run("session", "list", "--user", "ada", "--state", "sleeping")[0] == 2
    assert run("session", "create", "--user", "a", "--accelerator", "g", "--image", "i",
               "--max-runtime", "soon")[0] == 2
    rc, _, err = run("session", "create", "--user", "a", "--accelerator", "g", "--image", "i",
                     "--require-region")
    assert rc == 2 and "--region" in err
    assert cli.main(["session"]) == 2
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0


def test_ctrl_c_exits_130(run, monkeypatch):
    def interrupted(c, args):
        raise KeyboardInterrupt

    monkeypatch.setattr(client, "session_get", interrupted)
    assert run("session", "get", "x")[0] == 130


def test_tracing_root_span_parents_the_call(run, front, monkeypatch):
    finished = InMemorySpanExporter()
    calls = []

    def setup_tracing(service_name, exporter=None, endpoint=None, file_path=None):
        calls.append((service_name, exporter))
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(finished))
        return provider

    fake = types.SimpleNamespace(setup_tracing=setup_tracing,
                                 shutdown_tracing=lambda provider: calls.append("shutdown"))
    monkeypatch.setitem(sys.modules, "provisioner.telemetry", fake)

    rc, _, err = run("session", "get", "us-central1.s1", "--traces", "console")
    assert rc == 0
    assert calls == [("provisioner-cli", "console"), "shutdown"]
    spans = {s.name: s for s in finished.get_finished_spans()}
    root = spans["cli session get"]
    rpc = spans["/provisioner.v1.SessionService/GetSession"]
    assert rpc.parent.span_id == root.context.span_id
    trace_id = format(root.context.trace_id, "032x")
    assert f"trace: {trace_id}" in err
    assert trace_id in front.sessions.metadata[0]["traceparent"]


# --- admin commands ------------------------------------------------------------------------


def test_set_policy_sends_only_given_fields(run, front):
    rc, out, err = run("admin", "set-policy", "--cluster", "us-central1", "--pool", "gpu-p100",
                       "--min", "2", "--no-recycle", "--json")
    assert rc == 0, err
    req = front.admin.requests[0]
    assert (req.cluster, req.pool) == ("us-central1", "gpu-p100")
    p = req.policy
    assert p.HasField("min_vms") and p.min_vms == 2
    assert p.HasField("recycle") and p.recycle is False
    assert not p.HasField("max_vms")
    assert not p.HasField("headroom_fraction")
    assert not p.HasField("autoscaler")
    assert json.loads(out)["policy"] == {"min_vms": 2, "max_vms": None, "headroom_fraction": None,
                                         "autoscaler": None, "recycle": False}


def test_set_policy_needs_a_field(run, front):
    rc, _, err = run("admin", "set-policy", "--cluster", "c", "--pool", "p")
    assert rc == 2 and "nothing to set" in err
    assert front.admin.requests == []


@pytest.mark.parametrize("argv, key", [
    (["clusters"], "clusters"),
    (["pools", "--cluster", "us-central1"], "pools"),
    (["drain", "us-central1"], "draining"),
    (["undrain", "us-central1"], "draining"),
    (["prewarm", "--cluster", "c", "--pool", "p", "--image", "gpu:v155", "--count", "2"], "vm_ids"),
    (["vms", "--state", "warm", "booting"], "vms"),
    (["evict", "--cluster", "c", "vm-1", "--reason", "bad gpu"], "state"),
])
def test_admin_commands(run, front, argv, key):
    rc, out, err = run("admin", *argv, "--json")
    assert rc == 0, err
    assert key in json.loads(out)
    rc, out, err = run("admin", *argv)
    assert rc == 0 and out.strip()


def test_admin_requests(run, front):
    run("admin", "vms", "--cluster", "c", "--state", "warm", "--state", "booting")
    run("admin", "evict", "--cluster", "c", "vm-1", "--reason", "bad gpu")
    run("admin", "prewarm", "--cluster", "c", "--pool", "p", "--image", "gpu:v155")
    vms, evict, prewarm = front.admin.requests
    assert list(vms.states) == [types_pb2.VM_STATE_WARM, types_pb2.VM_STATE_BOOTING]
    assert (evict.cluster, evict.vm_id, evict.reason) == ("c", "vm-1", "bad gpu")
    assert prewarm.count == 1


def test_admin_tables(run):
    _, out, _ = run("admin", "clusters")
    assert out.splitlines()[1].split() == ["us-central1", "us-central1", "10.0.0.1:50052", "yes",
                                           "no", "1"]
    _, out, _ = run("admin", "drain", "us-central1")
    assert "draining: yes" in out


def test_json_before_the_command(front, capsys):
    assert cli.main(["--json", "--front", front.addr, "session", "list", "--user", "ada"]) == 0
    assert len(json.loads(capsys.readouterr().out)["sessions"]) == 2


def test_touching_an_ended_session_fails(run):
    rc, out, err = run("session", "touch", "us-central1.ended")
    assert rc == 1 and "stopped" in out
    assert err == "error: session us-central1.ended is stopped (idle for 1h0m): touching it keeps nothing alive\n"


def test_a_create_names_its_request_id_only_when_its_outcome_is_unknown(run, front):
    rc, _, err = run("session", "create", "--user", "unlucky", "--accelerator", "gpu-p100",
                     "--image", "gpu:v154", "--timeout", "2")
    request_ids = {r.spec.request_id for r in front.sessions.requests}
    assert rc == 1 and len(request_ids) == 1 and len(front.sessions.requests) > 1  # retried, same id
    assert f"retry with --request-id {request_ids.pop()}" in err
    rc, _, err = run("session", "create", "--user", "", "--accelerator", "gpu-p100", "--image", "gpu:v154")
    assert rc == 1 and "request id" not in err  # refused: nothing was made, nothing to retry


def test_headroom_without_the_headroom_autoscaler_warns(run):
    rc, _, err = run("admin", "set-policy", "--cluster", "us-central1", "--pool", "gpu-p100", "--headroom", "0.3")
    assert rc == 0 and "warning: headroom is kept but has no effect" in err
    rc, _, err = run("admin", "set-policy", "--cluster", "us-central1", "--pool", "gpu-p100",
                     "--autoscaler", "headroom", "--headroom", "0.3")
    assert rc == 0 and "warning" not in err


def test_list_by_cluster_without_a_user(run, front):
    rc, _, err = run("session", "list", "--cluster", "us-central1", "--state", "running")
    assert rc == 0, err
    req = front.sessions.requests[-1]
    assert (req.user_id, req.cluster, list(req.states)) == ("", "us-central1", [S.SESSION_STATE_RUNNING])


# --- render --------------------------------------------------------------------------------


def _versions(lo: int, hi: int) -> list[str]:
    return [f"gpu:v{n}" for n in range(hi, lo - 1, -1)]


def test_many_images_are_summarised_unless_wide():
    vm = types_pb2.Vm(id="vm-1", state=types_pb2.VM_STATE_WARM, images=_versions(99, 136), healthy=True)
    line = render.vm_table([vm], NOW).splitlines()[1]
    assert "38: gpu:v99..gpu:v136" in line and len(line) < 120
    assert ",".join(_versions(99, 136)[::-1]) in render.vm_table([vm], NOW, wide=True)
    pool = _pool()
    del pool.capacity.warm_by_image[:]
    pool.capacity.warm_by_image.extend(types_pb2.ImageCount(image=i, count=1) for i in _versions(121, 160))
    pool.capacity.warm_by_image[5].count = 3
    detail = render.pool_detail(pool)
    assert "warm by image: gpu:v155=3, gpu:v160=1, gpu:v159=1 and 37 more (--wide lists all)" in detail
    assert "gpu:v121=1" in render.pool_detail(pool, wide=True)
    assert "images:  38 versions, gpu:v99..gpu:v136 (--wide lists all)" in render.vm_detail(vm)
    assert "gpu:v99, gpu:v100, gpu:v101" in render.vm_detail(vm, wide=True)


def test_model_time_is_labelled():
    s = _session(start=types_pb2.START_KIND_PARTIAL, pull=types_pb2.PullProgress(bytes_total=24_600_000_000,
                                                                              bytes_done=24_600_000_000))
    s.read_time.FromSeconds(NOW + 3 * 3600)
    detail = render.session_detail(s, NOW)
    assert "clock:" in detail and "model time, 3h ahead of the wall clock" in detail
    assert "start:      partial (a warm VM pulled the layers it lacked)" in detail
    assert "pull:       100% of 24.6 GB (the layers the VM lacked)" in detail
    s.read_time.FromSeconds(NOW + 5)
    assert "clock:" not in render.session_detail(s, NOW)
    assert render.clock_note([s], NOW) is None


def test_trace_view_rounds_floats():
    from provisioner.traceview import render_tree

    span = {"trace_id": "t", "span_id": "a", "name": "SessionService/CreateSession", "start_ns": 0, "end_ns": 2_000_000,
            "attributes": {}, "events": [{"name": "candidate", "time_ns": 1_000_000,
                                          "attributes": {"expected_s": 41.39999999999999, "how": "warm"}}]}
    assert "* candidate @+1.0 ms expected_s=41.4 how=warm" in render_tree([span], "t")


def test_table_aligns_columns():
    text = render.table([("a", "long value", 1), ("bbbb", "x", None)], ("ID", "V", "N"))
    lines = text.splitlines()
    assert lines == ["ID    V           N", "a     long value  1", "bbbb  x"]
    for col in ("V", "N"):
        assert lines[0].index(col) == lines[1].index("long value" if col == "V" else "1")


def test_kv_skips_empty_values():
    assert render.kv([("id", "s1"), ("endpoint", ""), ("queue position", 3)]) == (
        "id:             s1\nqueue position: 3")


@pytest.mark.parametrize("text, seconds", [
    ("2h", 7200), ("90m", 5400), ("3600s", 3600), ("3600", 3600), ("1h30m", 5400),
    ("1.5h", 5400), ("1d", 86400), (" 45S ", 45),
])
def test_parse_duration(text, seconds):
    assert render.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "2x", "1h-5m", "30 m", "5m3"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        render.parse_duration(text)


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (45, "45s"), (90, "1m30s"), (120, "2m"), (3600, "1h"), (7530, "2h5m"),
    (90000, "1d1h"), (-5, "0s"), (59.9, "59s"),
])
def test_format_duration(seconds, text):
    assert render.format_duration(seconds) == text


def test_enum_short_names():
    assert render.enum_short(types_pb2.SessionState, S.SESSION_STATE_PULLING_IMAGE) == "pulling_image"
    assert render.enum_short(types_pb2.StartKind, types_pb2.START_KIND_WARM) == "warm"
    assert render.enum_short(types_pb2.VmState, types_pb2.VM_STATE_RECYCLING) == "recycling"
    assert render.enum_short(types_pb2.SessionState, 0) == ""
    assert render.enum_short(types_pb2.SessionState, 99) == "99"
    assert render.enum_value(types_pb2.SessionState, "Running") == S.SESSION_STATE_RUNNING
    assert render.enum_value(types_pb2.SessionState, "SESSION_STATE_RUNNING") == S.SESSION_STATE_RUNNING
    assert render.enum_value(types_pb2.SessionState, "pulling-image") == S.SESSION_STATE_PULLING_IMAGE
    with pytest.raises(ValueError, match="queued"):
        render.enum_value(types_pb2.SessionState, "unspecified")


def test_session_to_json_nulls_and_history():
    s = _session(state=S.SESSION_STATE_RUNNING, start=types_pb2.START_KIND_WARM)
    s.history.add(state="queued", reason="no warm VM")
    s.history[0].time.FromSeconds(NOW)
    data = render.session_to_json(s)
    assert data["state"] == "running" and data["start"] == "warm" and data["kind"] == "interactive"
    assert data["create_time"] == "2023-11-14T22:13:20Z"
    assert data["ready_time"] is None and data["estimated_ready_time"] is None
    assert data["pull"] is None
    assert data["user"] == "ada" and data["request_id"] == "r1"
    assert data["history"] == [{"state": "queued", "reason": "no warm VM",
                                "time": "2023-11-14T22:13:20Z"}]
    json.dumps(data)


def test_session_table_timing_column():
    waiting = _eta(_session("a"), 90)
    running = _session("b", S.SESSION_STATE_RUNNING, start=types_pb2.START_KIND_COLD)
    running.ready_time.FromSeconds(NOW + 60)
    lines = render.session_table([waiting, running], now=NOW + 660).splitlines()
    assert lines[1].split() == ["a", "queued", "us-central1", "gpu:v154", "-", "in", "0s"]  # late
    assert lines[2].split()[-1] == "10m"  # running for 10m
    lines = render.session_table([waiting, running], now=NOW).splitlines()
    assert "in 1m30s" in lines[1]
    assert lines[2].split()[4] == "cold"


def test_vm_pool_cluster_quota_json():
    vm = render.vm_to_json(_vm())
    assert vm["state"] == "warm" and vm["images"] == ["gpu:v154"] and vm["create_time"] is None
    pool = render.pool_to_json(_pool())
    assert pool["policy"]["min_vms"] == 1 and pool["policy"]["autoscaler"] is None
    assert pool["capacity"]["warm_by_image"] == [{"image": "gpu:v154", "count": 3}]
    cluster = render.cluster_to_json(_cluster())
    assert cluster["pools"][0]["name"] == "gpu-p100"
    quota = render.quota_to_json(types_pb2.Quota(user_id="ada", gpu_hours_limit=30))
    assert quota == {"user": "ada", "gpu_hours_limit": 30.0, "gpu_hours_used": 0.0, "gpu_hours_left": 0.0,
                     "reset_time": None, "max_active_sessions": 0, "active_sessions": 0,
                     "max_active_batch_sessions": 0, "active_batch_sessions": 0, "exhaustion_time": None}


def test_front_flag_beats_env_at_any_level(front, capsys, monkeypatch):
    monkeypatch.setenv("PROVISIONER_FRONT", "127.0.0.1:1")
    assert cli.main(["session", "get", "us-central1.s1", "--front", front.addr]) == 0
    assert cli.main(["admin", "--front", front.addr, "clusters"]) == 0


def test_real_telemetry_file_exporter(run, tmp_path, monkeypatch):
    telemetry = pytest.importorskip("provisioner.telemetry")
    path = tmp_path / "traces.jsonl"
    monkeypatch.setenv(getattr(telemetry, "ENV_FILE", "PROVISIONER_TRACES_FILE"), str(path))
    monkeypatch.setenv("PROVISIONER_TRACES", "file")
    rc, _, err = run("session", "get", "us-central1.s1")
    assert rc == 0, err
    names = [json.loads(line)["name"] for line in path.read_text().splitlines()]
    assert "cli session get" in names
    assert "/provisioner.v1.SessionService/GetSession" in names


def test_server_commands_register_alongside(monkeypatch, capsys):
    seen = []

    def register(subparsers):
        p = subparsers.add_parser("up")
        p.set_defaults(func=lambda args: seen.append(getattr(args, "traces", None)) or 3)

    monkeypatch.setitem(sys.modules, "provisioner.cli.servers", types.SimpleNamespace(register=register))
    assert cli.main(["--traces", "file", "up"]) == 3
    assert seen == ["file"]
    assert "session" in cli.build_parser().format_help()
