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

from podman import build_busybox_image, skip_or_fail, start_podman
from registry import PASSWORD, USER, start_registry

from provisioner.agent.engine import DockerEngine
from provisioner.agent.host import LocalHost
from provisioner.agent.runtime import (CLUSTER_LABEL, SESSION_LABEL, USER_LABEL, ContainerError, Credentials,
                                       ImageRef, NotebookSpec, Placement)

CREDS = Credentials(USER, PASSWORD)
# The notebook's stand-in: busybox httpd serving the workspace, demanding the session's secret
# (basic auth, user "jovyan"), as Jupyter demands its token.
NOTEBOOK = ["/bin/sh", "-c", 'echo "/:jovyan:$JUPYTER_TOKEN" > /etc/httpd.conf && '
            'exec httpd -f -p 8888 -h /home/jovyan/work -c /etc/httpd.conf']


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    try:
        registry = start_registry()
    except RuntimeError as err:
        skip_or_fail(str(err))
    try:
        engine = start_podman({"SSL_CERT_FILE": str(registry.ca_file)})
    except RuntimeError as err:
        registry.stop()
        skip_or_fail(str(err))
    images = {}
    try:
        # Three versions: each adds a layer on top of the one before (they share lower layers).
        files: dict[str, str] = {}
        for v in (1, 2, 3):
            files[f"/etc/version-{v}"] = f"v{v}\n"
            local = f"localhost/nb:{v}"
            build_busybox_image(engine, local, NOTEBOOK, dict(files))
            digest_file = engine.root / f"digest-{v}"
            engine.cli("push", "--quiet", "--creds", f"{USER}:{PASSWORD}", "--digestfile", str(digest_file),
                       local, f"{registry.host}/nb:{v}")
            images[v] = digest_file.read_text().strip()
        engine.cli("rmi", "--all", "--force")
        yield registry, engine, images
    finally:
        engine.stop()
        registry.stop()


def manifest_layers(registry, digest: str) -> tuple[tuple[str, int], ...]:
    ctx = ssl.create_default_context(cafile=str(registry.ca_file))
    req = urllib.request.Request(f"https://{registry.host}/v2/nb/manifests/{digest}", headers={
        "Accept": "application/vnd.oci.image.manifest.v1+json",
        "Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()})
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        return tuple((layer["digest"], layer["size"]) for layer in json.load(resp)["layers"])


def ref(rig, v: int) -> ImageRef:
    registry, _, images = rig
    return ImageRef(f"{registry.host}/nb", images[v], manifest_layers(registry, images[v]))


async def test_a_pull_by_digest_reports_bytes_and_fetches_no_shared_layer_twice(rig):
    registry, engine, _ = rig
    runtime = DockerEngine(engine.url)
    seen: list[int] = []
    await runtime.pull(ref(rig, 1), CREDS, seen.append)
    await asyncio.sleep(0)  # progress is handed over from the pull's thread
    v1 = ref(rig, 1)
    assert seen and seen[-1] == sum(size for _, size in v1.layers) and seen == sorted(seen)
    await runtime.pull(ref(rig, 2), CREDS, lambda n: None)
    await runtime.pull(ref(rig, 2), CREDS, lambda n: None)  # held already: nothing fetched
    fetched = registry.blob_fetches()
    layers = {d for v in (1, 2) for d, _ in ref(rig, v).layers}
    assert layers <= set(fetched)
    assert [d for d in fetched if d in layers and fetched.count(d) > 1] == []
    with pytest.raises(ContainerError):
        await runtime.pull(ref(rig, 3), Credentials(USER, "wrong"), lambda n: None)
    await runtime.close()


def get(port: int, secret: str | None) -> int:
    headers = {"Authorization": "Basic " + base64.b64encode(f"jovyan:{secret}".encode()).decode()} if secret else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/hello.txt", headers=headers),
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
    image = ref(rig, 2)
    await runtime.pull(image, CREDS, lambda n: None)
    workspace = tmp_path / "s-1"
    workspace.mkdir()
    (workspace / "hello.txt").write_text("hello\n")
    spec = NotebookSpec("s-1", "alice", "us-central1", image, "s3cret", cpus=0.5, memory_bytes=64 << 20)
    placement = Placement(str(workspace), host_ip="127.0.0.1", host_port=0)
    running = await runtime.start(spec, placement)
    assert await runtime.start(spec, placement) == running  # a second start is a no-op
    await until_answers(running.host_port)
    assert get(running.host_port, None) == 401 and get(running.host_port, "wrong") == 401
    assert get(running.host_port, "s3cret") == 200
    info = json.loads(engine.cli("container", "inspect", running.container_id))[0]
    assert info["Config"]["Labels"][SESSION_LABEL] == "s-1" and info["Config"]["Labels"][USER_LABEL] == "alice"
    assert info["Config"]["Labels"][CLUSTER_LABEL] == "us-central1"
    assert info["HostConfig"]["NanoCpus"] == 500_000_000 and info["HostConfig"]["Memory"] == 64 << 20
    assert images[2] in info["ImageName"] or info["Image"] == engine.cli(
        "image", "inspect", "--format", "{{.Id}}", image.pinned).strip()
    [found] = await runtime.session_containers()
    assert found.id == running.container_id and found.session_id == "s-1" and found.pid > 0
    processes = LocalHost().in_namespace(found.pid)
    assert found.pid in processes and [p.name for p in LocalHost().alive(processes)] == ["httpd"]
    assert await runtime.exited(running.container_id) is None
    # httpd as the container's first process ignores SIGTERM: the grace runs out, SIGKILL ends it.
    await runtime.stop(running.container_id, grace_s=1)
    assert await runtime.session_containers() == []
    assert engine.cli("ps", "--all", "--quiet").split() == [] and LocalHost().alive(processes) == []
    await runtime.stop(running.container_id, grace_s=1)  # gone already: fine
    await runtime.close()


async def test_a_container_that_exits_fails_its_start_with_the_reason(rig, tmp_path):
    _, engine, _ = rig
    build_busybox_image(engine, "localhost/broken:1", ["/bin/sh", "-c", "echo no GPU found >&2; exit 3"])
    runtime = DockerEngine(engine.url)
    broken = ImageRef("localhost/broken", "sha256:" + engine.cli(
        "image", "inspect", "--format", "{{.Digest}}", "localhost/broken:1").strip().removeprefix("sha256:"))
    spec = NotebookSpec("s-2", "bob", "us-central1", broken, "x")
    running = None
    try:
        running = await runtime.start(spec, Placement(str(tmp_path), host_ip="127.0.0.1", host_port=0))
    except ContainerError as err:  # it ended before the start was looked at
        reason = str(err)
    else:
        for _ in range(100):
            if (reason := await runtime.exited(running.container_id)) is not None:
                break
            await asyncio.sleep(0.05)
    assert reason == "container exited 3: no GPU found"
    [left] = await runtime.session_containers()
    await runtime.stop(left.id, grace_s=0)
    await runtime.close()
