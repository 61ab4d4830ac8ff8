"""The fleet's catalog from a real registry, through real gRPC: sessions pin digests, GetSession
shows tag, digest and (to whom it may) the session's secret, and a restart keeps both. The front
and clusters run on the simulated cloud; the registry is docker-registry with TLS and htpasswd."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import yaml

from conftest import fleet_config, quick_warm_up, warm_fleet
from oci import build_image, push_image, push_versions, registry  # noqa: F401 (fixture)
from provisioner.config import load_fleet
from provisioner.perf.fleet import free_port
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb


def registry_fleet(tmp_path, server):
    fleet_config(tmp_path, quick_warm_up)  # the shipped fleet, copied
    clusters = tmp_path / "clusters"
    (clusters / "registry-password").write_text(server.password + "\n")
    (clusters / "images.yaml").write_text(yaml.safe_dump({"registry": {
        "url": server.url, "repository": "nb", "refresh_s": 3600, "ca_file": str(server.ca_file),
        "auth": {"kind": "basic", "username": server.username, "password_file": "registry-password"}}}))
    return load_fleet(clusters)


async def get(handle, session_id: str, subject: str | None = None) -> pb.Session:
    channel = handle.front_channel(handle.token(subject) if subject else None)
    try:
        resp = await s_grpc.SessionServiceStub(channel).GetSession(s_pb.GetSessionRequest(session_id=session_id),
                                                                   timeout=10)
        return resp.session
    finally:
        await channel.close()


async def test_sessions_pin_digests_the_secret_is_the_owners_and_a_restart_keeps_both(tmp_path, registry):
    images = push_versions(registry)
    config = registry_fleet(tmp_path, registry)
    data = tmp_path / "data"
    async with warm_fleet(config, data) as fleet:
        assert fleet.fleet.catalog.current.versions() == ("nb:v1", "nb:v2", "nb:v3")
        created = await fleet.create(user_id="alice", image="nb:v2")
        assert created.image == "nb:v2" and created.image_digest == images["v2"].digest
        assert created.access_token == ""  # not in CreateSession's answer: GetSession alone has it
        latest = await fleet.create(user_id="alice", image="nb:latest")
        assert (latest.image, latest.image_digest) == ("nb:v3", images["v3"].digest)

        owner = await get(fleet, created.id, "alice")
        assert (owner.image, owner.image_digest) == ("nb:v2", images["v2"].digest)
        secret = owner.access_token
        assert len(secret) >= 43
        assert (await get(fleet, created.id)).access_token == secret  # the operator: service and admin
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await get(fleet, created.id, "bob")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        listed = await fleet.sessions.ListSessions(s_pb.ListSessionsRequest(user_id="alice"), timeout=10)
        assert {s.id for s in listed.sessions} == {created.id, latest.id}
        assert all(s.access_token == "" and s.image_digest for s in listed.sessions)
        async for update in fleet.sessions.WatchSession(s_pb.WatchSessionRequest(session_id=created.id)):
            assert update.session.access_token == "" and update.session.image_digest == images["v2"].digest
            break

        # The tag is pushed again: new sessions get the new digest, the running one keeps its own.
        rebuilt = build_image("nb:v2", page="v2, rebuilt")
        push_image(registry, "nb", "v2", rebuilt)
        assert await fleet.fleet.catalog.refresh()
        again = await fleet.create(user_id="carol", image="nb:v2")
        assert again.image_digest == rebuilt.digest != images["v2"].digest
        assert (await get(fleet, created.id)).image_digest == images["v2"].digest
        # The VMs' layer caches hold the registry's layer digests.
        core = fleet.cluster(created.cluster).runtime.core
        assert any(set(images["v3"].layer_digests) <= set(vm.cache.layer_ids) for vm in core.vms.values())

    async with warm_fleet(config, data) as fleet:
        after = await get(fleet, created.id, "alice")
        assert (after.image, after.image_digest, after.access_token) == ("nb:v2", images["v2"].digest, secret)


def test_a_cluster_without_a_readable_registry_does_not_start(tmp_path):
    config_dir = tmp_path / "clusters"
    fleet_config(tmp_path)
    (config_dir / "images.yaml").write_text(yaml.safe_dump({"registry": {
        "url": f"https://127.0.0.1:{free_port()}", "repository": "nb"}}))  # nothing listens there
    provisioner = str(Path(sys.executable).with_name("provisioner"))
    out = subprocess.run([provisioner, "serve", "cluster", "--name", "us-central1", "--clusters", str(config_dir),
                          "--data-dir", str(tmp_path / "data"),
                          "--address", "127.0.0.1:0", "--traces", "none"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("error: reading the image catalog: GET https://127.0.0.1:")
