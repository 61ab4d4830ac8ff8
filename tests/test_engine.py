"""The agent's container runtime against a real engine and a real registry: podman serving the
Docker Engine API, docker-registry with TLS and htpasswd, images built here FROM scratch."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import urllib.error
import urllib.request

import pytest

from oci import NOTEBOOK_USER, TOKEN_ENV, push_versions, require_tools, start_registry
from podman import skip_or_fail, start_podman

from provisioner.agent.engine import DockerEngine
from provisioner.agent.host import LocalHost
from provisioner.agent.runtime import (CLUSTER_LABEL, SESSION_LABEL, USER_LABEL, ContainerError, Credentials,
                                       ImageRef, NotebookSpec, Placement)


pytestmark = pytest.mark.timeout(300)  # the module's registry and engine start with its first test


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """A registry holding three versions of the notebook stand-in (each shares its lower layers
    with the one before) and an engine that trusts the registry's CA."""
    require_tools()
    registry = start_registry(tmp_path_factory.mktemp("registry"))
    try:
        engine = start_podman({"SSL_CERT_FILE": str(registry.ca_file)})
    except RuntimeError as err:
        registry.stop()
        skip_or_fail(str(err))
    try:
        yield registry, engine, push_versions(registry)
    finally:
        engine.stop()
        registry.stop()


def ref(rig, version: str) -> ImageRef:
    registry, _, images = rig
    image = images[version]
    return ImageRef(f"{registry.host}/nb", image.digest, tuple((b.digest, len(b.data)) for b in image.layers))


def creds(rig) -> Credentials:
    return Credentials(rig[0].username, rig[0].password)


async def test_a_pull_by_digest_reports_bytes_and_fetches_no_shared_layer_twice(rig):
    registry, engine, _ = rig
    runtime = DockerEngine(engine.url)
    seen: list[int] = []
    v1, v2 = ref(rig, "v1"), ref(rig, "v2")
    await runtime.pull(v1, creds(rig), seen.append)
    await asyncio.sleep(0)  # progress is handed over from the pull's thread
    assert seen and seen[-1] == sum(size for _, size in v1.layers) and seen == sorted(seen)
    await runtime.pull(v2, creds(rig), lambda n: None)  # fetches only its top layer
    await runtime.pull(v2, creds(rig), lambda n: None)  # held already: nothing fetched
    assert {d: registry.blob_gets(d) for d, _ in v1.layers + v2.layers} == {d: 1 for d, _ in v1.layers + v2.layers}
    with pytest.raises(ContainerError):
        await runtime.pull(ref(rig, "v3"), Credentials(registry.username, "wrong"), lambda n: None)
    await runtime.close()


def get(port: int, secret: str | None) -> int:
    auth = base64.b64encode(f"{NOTEBOOK_USER}:{secret}".encode()).decode()
    headers = {"Authorization": f"Basic {auth}"} if secret else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/", headers=headers),
                                    timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


async def until_answers(port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"nothing answers on port {port}")


async def test_a_session_runs_its_digest_with_its_secret_limits_labels_and_workspace(rig, tmp_path):
    _, engine, images = rig
    runtime = DockerEngine(engine.url)
    image = ref(rig, "v2")
    await runtime.pull(image, creds(rig), lambda n: None)
    workspace = tmp_path / "s-1"
    workspace.mkdir()
    spec = NotebookSpec("s-1", "alice", "us-central1", image, "s3cret", cpus=0.5, memory_bytes=64 << 20)
    placement = Placement(str(workspace), host_ip="127.0.0.1", host_port=0, secret_env=TOKEN_ENV)
    running = await runtime.start(spec, placement)
    assert await runtime.start(spec, placement) == running  # a second start is a no-op
    await until_answers(running.host_port)
    assert get(running.host_port, None) == 401 and get(running.host_port, "wrong") == 401
    assert get(running.host_port, "s3cret") == 200
    info = json.loads(engine.cli("container", "inspect", running.container_id))[0]
    assert info["Config"]["Labels"][SESSION_LABEL] == "s-1" and info["Config"]["Labels"][USER_LABEL] == "alice"
    assert info["Config"]["Labels"][CLUSTER_LABEL] == "us-central1"
    assert info["HostConfig"]["NanoCpus"] == 500_000_000 and info["HostConfig"]["Memory"] == 64 << 20
    assert info["ImageName"] == image.pinned and f"{TOKEN_ENV}=s3cret" in info["Config"]["Env"]
    assert any(m["Source"] == str(workspace) and m["Destination"] == "/home/jovyan/work" for m in info["Mounts"])
    [found] = await runtime.session_containers()
    assert found.id == running.container_id and found.session_id == "s-1" and found.pid > 0
    processes = LocalHost().in_namespace(found.pid)
    assert found.pid in processes and [p.name for p in LocalHost().alive(processes)] == ["busybox"]
    assert await runtime.exited(running.container_id) is None
    # httpd as the container's first process ignores SIGTERM: the grace runs out, SIGKILL ends it.
    await runtime.stop(running.container_id, grace_s=1)
    assert await runtime.session_containers() == []
    assert engine.cli("ps", "--all", "--quiet").split() == [] and LocalHost().alive(processes) == []
    await runtime.stop(running.container_id, grace_s=1)  # gone already: fine
    await runtime.close()


async def test_a_container_that_exits_fails_its_start_with_the_reason(rig, tmp_path):
    _, engine, _ = rig
    runtime = DockerEngine(engine.url)
    image = ref(rig, "v1")
    await runtime.pull(image, creds(rig), lambda n: None)
    spec = NotebookSpec("s-2", "bob", "us-central1", image, "")  # no secret: the stand-in refuses to serve
    reason = None
    try:
        running = await runtime.start(spec, Placement(str(tmp_path), host_ip="127.0.0.1", host_port=0,
                                                      secret_env=TOKEN_ENV))
    except ContainerError as err:  # it ended before the start looked at it
        reason = str(err)
    else:
        for _ in range(200):
            if (reason := await runtime.exited(running.container_id)) is not None:
                break
            await asyncio.sleep(0.05)
    assert reason == f"container exited 64: {TOKEN_ENV} is not set: refusing to serve without a secret"
    [left] = await runtime.session_containers()
    await runtime.stop(left.id, grace_s=0)
    assert await runtime.session_containers() == []
    await runtime.close()
