"""provisioner.client: installed alone in a fresh virtual environment it runs the README's example
against a real local fleet; its retries, request ids, watch resume and typed errors over real gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
from concurrent import futures
from datetime import datetime, timezone
from pathlib import Path

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from offline_wheels import build_own, repack, with_dependencies
from provisioner import client as api
from provisioner.client import _base
from provisioner.client.credentials import local_ca
from provisioner.v1 import session_service_pb2 as session_pb
from provisioner.v1 import session_service_pb2_grpc as session_grpc
from provisioner.v1 import types_pb2

ROOT = Path(__file__).resolve().parent.parent
# What `pip install provisioner` needs (pyproject.toml's dependencies): taken from this environment.
CLIENT_DEPENDENCIES = ("grpcio", "protobuf", "googleapis-common-protos")
SERVER_ONLY = ("pydantic", "jwt", "cryptography", "opentelemetry", "grpc_status", "yaml", "google.cloud.compute_v1")


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### From Python"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory) -> Path:
    """A fresh virtual environment with `pip install <this checkout>`, no extras, without a package
    index. The checkout is copied first, so that the build leaves nothing in the tree."""
    root = tmp_path_factory.mktemp("client-install")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "provisioner", src / "provisioner",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    # Offline: the wheels are built and packed here (tests/offline_wheels.py), not fetched.
    wheels = root / "wheels"
    wheels.mkdir()
    build_own(src, wheels)
    for name in with_dependencies(CLIENT_DEPENDENCIES):
        repack(name, wheels)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                          "--find-links", str(wheels), "provisioner"], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return venv


def test_the_client_installs_without_the_servers_packages(client_venv):
    python = client_venv / "bin" / "python"
    probe = ("import importlib.util, provisioner.client, provisioner.cli\n"
             f"print(','.join(m for m in {SERVER_ONLY!r} if importlib.util.find_spec(m) is None))")
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().split(",") == list(SERVER_ONLY)
    up = subprocess.run([str(client_venv / "bin" / "provisioner"), "up"], capture_output=True, text=True)
    assert up.returncode == 1 and "pip install 'provisioner[server]'" in up.stderr


async def test_the_readme_example_runs_from_a_client_only_install(client_venv, local_fleet, tmp_path):
    script = tmp_path / "backend.py"
    script.write_text(readme_example())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
    env.update(PROVISIONER_FRONT=local_fleet.front_address, PROVISIONER_CA=str(local_ca(local_fleet.data_dir)),
               PROVISIONER_TOKEN=local_fleet.token("local-operator"))
    proc = await asyncio.create_subprocess_exec(
        str(client_venv / "bin" / "python"), str(script), cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[-1].startswith("running on ") and "start)" in lines[-1]
    resp = await local_fleet.sessions.ListSessions(session_pb.ListSessionsRequest(user_id="alice"))
    [s] = resp.sessions
    assert s.spec.notebook_id == "nb-42" and s.spec.request_id
    assert s.state in (types_pb2.SESSION_STATE_STOPPING, types_pb2.SESSION_STATE_STOPPED)
    assert s.reason == "notebook closed"


# --- against the real fleet, in this process ------------------------------------------------


async def test_async_client_against_the_fleet(local_fleet):
    token = local_fleet.token("local-operator")
    async with api.AsyncClient(local_fleet.front_address, token=token, ca=local_ca(local_fleet.data_dir)) as c:
        s = await c.create_session(user_id="bob", accelerator="gpu-p100", image="gpu:latest")
        assert isinstance(s.state, api.SessionState) and s.request_id
        again = await c.create_session(user_id="bob", accelerator="gpu-p100", image="gpu:latest",
                                       request_id=s.request_id)
        assert again.id == s.id
        s = await c.wait_until_running(s.id, timeout=30)
        assert s.state is api.SessionState.RUNNING and s.start in api.StartKind
        assert (await c.touch_session(s.id)).state is api.SessionState.RUNNING
        assert [x.id for x in await c.list_sessions("bob", states=[api.SessionState.RUNNING])] == [s.id]
        stopped = await c.stop_session(s.id)
        assert stopped.state in (api.SessionState.STOPPING, api.SessionState.STOPPED)
        with pytest.raises(api.SessionEnded) as ended:
            await c.wait_until_running(s.id, timeout=30)
        assert ended.value.session.state.ended
        with pytest.raises(api.InvalidArgument) as bad:
            await c.create_session(user_id="bob", accelerator="gpu-h100", image="gpu:latest")
        assert bad.value.field == "spec.accelerator" and bad.value.request_id
        with pytest.raises(api.NotFound):
            await c.get_session("us-central1.s-0000000000")
        quota = await c.get_quota("bob")
        assert quota.user_id == "bob" and quota.gpu_hours_limit > 0
    async with api.AsyncClient(local_fleet.front_address, token="not-a-token",
                               ca=local_ca(local_fleet.data_dir)) as c:
        with pytest.raises(api.Unauthenticated):
            await c.get_session("us-central1.s-0000000000")
    async with api.AsyncClient(local_fleet.front_address, token=local_fleet.token("mallory"),
                               ca=local_ca(local_fleet.data_dir)) as c:
        with pytest.raises(api.PermissionDenied):
            await c.create_session(user_id="bob", accelerator="gpu-p100", image="gpu:latest")


async def test_sync_client_waits_with_progress(local_fleet):
    def backend() -> list[api.Session]:
        seen = []
        with api.Client(local_fleet.front_address, token=local_fleet.token("local-operator"),
                        ca=local_ca(local_fleet.data_dir)) as c:
            s = c.create_session(user_id="carol", accelerator="gpu-t4x2", image="gpu:v105", region="europe-west4")
            seen.append(c.wait_until_running(s.id, timeout=60, on_progress=seen.append))
            c.stop_session(s.id)
        return seen

    seen = await asyncio.to_thread(backend)
    assert seen[-1].state is api.SessionState.RUNNING and seen[-2] == seen[-1]
    assert any(s.state is api.SessionState.PULLING_IMAGE and s.pull and "pull" in s.progress for s in seen)


# --- retries, request ids, watch resume, error details (a scripted server) -------------------


def _status(code: int, message: str, *details) -> grpc.Status:
    packed = []
    for d in details:
        a = any_pb2.Any()
        a.Pack(d)
        packed.append(a)
    return rpc_status.to_status(status_pb2.Status(code=code, message=message, details=packed))


def _retry_info(seconds: float) -> error_details_pb2.RetryInfo:
    return error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=int(seconds),
                                                                         nanos=int(seconds % 1 * 1e9)))


class Scripted(session_grpc.SessionServiceServicer):
    """Fails each call with the next status of `failures`, then answers."""

    def __init__(self):
        self.failures: list[grpc.Status] = []
        self.requests: list = []

    def CreateSession(self, request, context):
        self.requests.append(request)
        if self.failures:
            context.abort_with_status(self.failures.pop(0))
        return session_pb.CreateSessionResponse(session=types_pb2.Session(
            id="us-central1.s1", spec=request.spec, state=types_pb2.SESSION_STATE_QUEUED))

    def WatchSession(self, request, context):
        self.requests.append(request)
        for rev in range(request.after_revision + 1, 5):
            state = types_pb2.SESSION_STATE_RUNNING if rev == 4 else types_pb2.SESSION_STATE_PROVISIONING
            yield session_pb.WatchSessionResponse(session=types_pb2.Session(
                id=request.session_id, state=state, revision=rev))
            if rev == 2 and request.after_revision == 0:
                context.abort(grpc.StatusCode.UNAVAILABLE, "cluster restarting")


@contextlib.contextmanager
def served(servicer):
    """A client of `servicer` on a local port; its sleeps are recorded (`slept`), not slept."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    session_grpc.add_SessionServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    c = api.Client(f"127.0.0.1:{port}", channel=channel)
    c.slept = []
    c.sleep = c.slept.append
    try:
        yield c
    finally:
        channel.close()
        server.stop(None)


@pytest.fixture
def scripted():
    servicer = Scripted()
    with served(servicer) as c:
        yield servicer, c


def test_retries_reuse_the_request_id_and_honour_retry_info(scripted):
    server, c = scripted
    server.failures = [_status(code_pb2.UNAVAILABLE, "front restarting"),
                       _status(code_pb2.RESOURCE_EXHAUSTED, "no capacity", _retry_info(2.5))]
    s = c.create_session(user_id="ada", accelerator="gpu-p100", image="gpu:v154")
    ids = {r.spec.request_id for r in server.requests}
    assert len(server.requests) == 3 and ids == {s.request_id} and s.request_id
    assert c.slept[0] < 1 and c.slept[1] >= 2.5  # backoff, then no sooner than the server said


def test_what_retrying_cannot_fix_is_raised_at_once(scripted):
    server, c = scripted
    violation = error_details_pb2.BadRequest.FieldViolation(field="spec.region_hint", description="unknown region")
    server.failures = [_status(code_pb2.INVALID_ARGUMENT, "unknown region 'mars-west1'",
                               error_details_pb2.BadRequest(field_violations=[violation]))]
    with pytest.raises(api.InvalidArgument) as e:
        c.create_session(user_id="ada", accelerator="gpu-p100", image="gpu:v154", region="mars-west1")
    assert e.value.field == "spec.region_hint" and len(server.requests) == 1
    assert str(e.value) == "INVALID_ARGUMENT: unknown region 'mars-west1' (field spec.region_hint)"

    info = error_details_pb2.ErrorInfo(reason="QUOTA_EXCEEDED", metadata={"reset_time": "2026-11-30T00:00:00Z"})
    server.failures = [_status(code_pb2.RESOURCE_EXHAUSTED, "30 GPU hours used this week", info,
                               error_details_pb2.QuotaFailure(), _retry_info(3600))]
    with pytest.raises(api.QuotaExceeded) as e:
        c.create_session(user_id="ada", accelerator="gpu-p100", image="gpu:v154", request_id="r-7")
    assert e.value.reset_time.isoformat() == "2026-11-30T00:00:00+00:00"
    assert e.value.request_id == "r-7" and len(server.requests) == 2


def test_unavailable_gives_up_with_the_request_id_and_advice(scripted):
    server, c = scripted
    server.failures = [_status(code_pb2.UNAVAILABLE, "down", _retry_info(1))] * _base.MAX_ATTEMPTS
    with pytest.raises(api.Unavailable) as e:
        c.create_session(user_id="ada", accelerator="gpu-p100", image="gpu:v154")
    assert e.value.retry_after.total_seconds() == 1 and not e.value.unreachable
    assert {r.spec.request_id for r in server.requests} == {e.value.request_id}
    assert len(server.requests) == _base.MAX_ATTEMPTS


def test_watch_resumes_after_the_last_revision(scripted):
    server, c = scripted
    s = c.wait_until_running("us-central1.s1", timeout=10)
    assert s.state is api.SessionState.RUNNING and s.revision == 4
    assert [r.after_revision for r in server.requests] == [0, 2]
    assert [x.revision for x in c.watch("us-central1.s1", after_revision=2)] == [3, 4]


class QueuedWatch(session_grpc.SessionServiceServicer):
    """A queued session moving up the queue (its place changes, its revision does not), the
    stream breaking once, then the session running."""

    def __init__(self):
        self.requests: list = []

    def WatchSession(self, request, context):
        self.requests.append(request)
        queued, running = types_pb2.SESSION_STATE_QUEUED, types_pb2.SESSION_STATE_RUNNING
        if request.after_revision == 0:
            reports, then_break = [(1, queued, 3), (1, queued, 3), (1, queued, 2)], True
        else:  # resumed: where it stands now first, as a cluster sends it
            reports, then_break = [(1, queued, 2), (1, queued, 1), (2, running, 0)], False
        for revision, state, place in reports:
            yield session_pb.WatchSessionResponse(session=types_pb2.Session(
                id=request.session_id, state=state, revision=revision, queue_position=place))
        if then_break:
            context.abort(grpc.StatusCode.UNAVAILABLE, "cluster restarting")


def test_watch_reports_each_move_in_the_queue_once_across_a_resume():
    servicer = QueuedWatch()
    with served(servicer) as c:
        seen = [(m.revision, m.queue_position) for m in c.watch_messages("us-central1.s1")]
    assert seen == [(1, 3), (1, 2), (1, 1), (2, 0)]
    assert [r.after_revision for r in servicer.requests] == [0, 1]


def test_an_unreachable_front_says_so():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = api.Client(f"127.0.0.1:{port}", channel=grpc.insecure_channel(f"127.0.0.1:{port}"), max_attempts=1)
    with pytest.raises(api.Unavailable) as e:
        c.get_session("us-central1.s1")
    assert e.value.unreachable


def test_credentials_from_the_environment(tmp_path, monkeypatch):
    (tmp_path / "ca.pem").write_bytes(b"PEM")
    monkeypatch.setenv("PROVISIONER_TOKEN", "t")
    monkeypatch.setenv("PROVISIONER_CA", str(tmp_path / "ca.pem"))
    assert api.resolve() == api.Credentials("t", b"PEM")
    assert api.resolve(token="given", ca=b"X") == api.Credentials("given", b"X")
    monkeypatch.delenv("PROVISIONER_TOKEN")
    monkeypatch.setenv("PROVISIONER_TOKEN_FILE", str(tmp_path / "none"))
    with pytest.raises(api.NoCredentials, match="cannot read the token file"):
        api.resolve()


def test_a_quota_error_from_the_server_edge_carries_its_reset_time(scripted):
    from provisioner.api.status import to_status
    from provisioner.model.errors import QuotaExceeded

    server, c = scripted
    reset = datetime(2026, 11, 30, tzinfo=timezone.utc)
    err = QuotaExceeded("30 of 30 GPU hours used this week", field="user_id", reset_time=reset.timestamp())
    server.failures = [rpc_status.to_status(to_status(err))]
    with pytest.raises(api.QuotaExceeded) as e:
        c.create_session(user_id="ada", accelerator="gpu-p100", image="gpu:v154")
    assert e.value.reset_time == reset and e.value.field == "user_id"


async def test_async_retries_and_watch_resume(scripted):
    server, sync_client = scripted
    server.failures = [_status(code_pb2.UNAVAILABLE, "front restarting", _retry_info(0.01))]
    async with api.AsyncClient(sync_client.target,
                               channel=grpc.aio.insecure_channel(sync_client.target)) as c:
        s = await c.create_session(user_id="ada", accelerator="gpu-p100", image="gpu:v154")
        assert [r.spec.request_id for r in server.requests] == [s.request_id] * 2
        s = await c.wait_until_running("us-central1.s1", timeout=10)
    assert s.state is api.SessionState.RUNNING
    assert [r.after_revision for r in server.requests[2:]] == [0, 2]


def test_the_license_pyproject_names_is_shipped(client_venv):
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()
    shipped = list(client_venv.glob("lib/python*/site-packages/provisioner-*.dist-info/licenses/LICENSE"))
    assert [p.read_text() for p in shipped] == [text]
