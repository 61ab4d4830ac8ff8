"""The test registry and images of tests/oci.py do what the catalog and agent tests rely on."""

from __future__ import annotations

import base64
import gzip
import io
import os
import subprocess
import tarfile
import time
import urllib.error
import urllib.request

import pytest

from oci import NOTEBOOK_USER, build_image, push_versions, registry  # noqa: F401 (fixture)
from provisioner.perf.fleet import free_port


def test_the_registry_demands_credentials_and_holds_three_versions_sharing_lower_layers(registry):
    assert registry.request("GET", "/v2/", auth=False)[0] == 401
    images = push_versions(registry)
    status, _, body = registry.request("GET", "/v2/nb/tags/list")
    assert status == 200 and b'"v1","v2","v3"' in body
    v1, v2, v3 = (images[t] for t in ("v1", "v2", "v3"))
    assert v1.layer_digests[:2] == v2.layer_digests[:2] == v3.layer_digests[:2]
    assert len({v1.layer_digests[2], v2.layer_digests[2], v3.layer_digests[2]}) == 3
    assert len({v1.digest, v2.digest, v3.digest}) == 3
    # The access log counts blob GETs per digest.
    shared = v1.layer_digests[0]
    assert registry.blob_gets(shared) == 0
    assert registry.request("GET", f"/v2/nb/blobs/{shared}")[0] == 200
    assert registry.blob_gets(shared) == 1


def test_images_are_reproducible():
    assert build_image("nb:v1").digest == build_image("nb:v1").digest
    assert build_image("nb:v1").digest != build_image("nb:v1", page="rebuilt").digest


def _unpack(image, root):
    for layer in image.layers:
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer.data))) as tar:
            tar.extractall(root, filter="tar")


def _get(port: int, auth: str | None) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/")
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")
def test_the_notebook_stand_in_answers_only_with_the_secret(tmp_path):
    """The image's own start script and busybox, run from its unpacked layers in a chroot."""
    from oci import require_tools

    require_tools()
    root = tmp_path / "rootfs"
    _unpack(build_image("nb:v2"), root)
    def enter():
        os.chroot(root)
        os.chdir("/")

    refused = subprocess.run(["/bin/sh", "/notebook/start.sh"], preexec_fn=enter, capture_output=True,
                             text=True, env={"PATH": "/bin"}, timeout=10)
    assert refused.returncode == 64 and "NOTEBOOK_TOKEN" in refused.stderr
    port = free_port()
    server = subprocess.Popen(["/bin/sh", "/notebook/start.sh"], preexec_fn=enter,
                              env={"PATH": "/bin", "NOTEBOOK_TOKEN": "s3cret-token", "NOTEBOOK_PORT": str(port)})
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                status = _get(port, None)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        assert status == 401
        assert _get(port, f"{NOTEBOOK_USER}:wrong") == 401
        assert _get(port, f"{NOTEBOOK_USER}:s3cret-token") == 200
    finally:
        server.terminate()
        server.wait(10)
