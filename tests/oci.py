"""A real image registry and small real images, for the tests of the catalog and the agent.

`start_registry` runs Debian's `docker-registry` (the CNCF distribution registry) on a loopback
port chosen by the OS, serving TLS with a certificate from a throwaway CA (the project's local CA
code, provisioner/security/pki.py) and demanding htpasswd (bcrypt) authentication. Its access log
is captured, so a test counts the blob GETs of each digest (`blob_gets`).

`build_image` makes an OCI image without a container daemon: every layer is a tar built here,
gzipped deterministically, so the same content always has the same digest:

  1. a static busybox (Debian's busybox-static) with /bin/sh and the directories the image needs;
  2. the notebook stand-in's start script, the same in every version by default (a shared layer);
  3. a page naming the version: the only layer that differs from one version to the next.

`push_image` uploads blobs and manifest over the Docker Registry HTTP API v2 (monolithic blob
uploads), skipping blobs the registry already holds.

The notebook stand-in, and the scheme the product documents for its notebook images
(docs/images-and-secrets.md): the container gets the session's secret in the environment
variable NOTEBOOK_TOKEN, and the server on port 8888 demands it as HTTP basic authentication with
user name `notebook` and the secret as password (`Authorization: Basic base64("notebook:" +
secret)`, `curl -u notebook:SECRET`). Here that is `busybox httpd -f -p 8888` with a
`/:notebook:<secret>` line in its config: 401 without the secret, 200 with it. The start script
refuses to serve at all without a secret.

When the tools are missing, tests that need them skip with the reason, unless
PROVISIONER_REQUIRE_REGISTRY is set (CI sets it), in which case they fail.
"""

from __future__ import annotations

import base64
import functools
import gzip
import io
import json
import os
import re
import shutil
import ssl
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from provisioner.perf.fleet import free_port
from provisioner.registry.client import content_digest
from provisioner.security.pki import CA_CERT, ensure_local_pki, local_files

REQUIRE_ENV = "PROVISIONER_REQUIRE_REGISTRY"
TOOLS = {"docker-registry": "docker-registry", "htpasswd": "apache2-utils"}
BUSYBOX = Path("/bin/busybox")  # busybox-static installs the static build here

TOKEN_ENV = "NOTEBOOK_TOKEN"
NOTEBOOK_USER = "notebook"
NOTEBOOK_PORT = 8888

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"

START_SCRIPT = f"""#!/bin/sh
# The notebook stand-in: serves /www on port {NOTEBOOK_PORT} (or $NOTEBOOK_PORT) to requests presenting
# the session's secret (HTTP basic auth, user {NOTEBOOK_USER}), and never without one.
if [ -z "${TOKEN_ENV}" ]; then
  echo "{TOKEN_ENV} is not set: refusing to serve without a secret" >&2
  exit 64
fi
echo "/:{NOTEBOOK_USER}:${TOKEN_ENV}" > /etc/httpd.conf
exec /bin/busybox httpd -f -p "${{NOTEBOOK_PORT:-{NOTEBOOK_PORT}}}" -h /www -c /etc/httpd.conf
"""


def missing_tools() -> list[str]:
    """The Debian packages this module needs that are not installed."""
    missing = [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]
    if not BUSYBOX.is_file() or not _static(BUSYBOX):
        missing.append("busybox-static")
    return missing


def _static(path: Path) -> bool:
    """No ELF interpreter named near the start of the file: a static executable (a dynamic one
    names ld-linux in its .interp section, which comes first)."""
    with open(path, "rb") as f:
        return b"ld-linux" not in f.read(8192)


def skip_or_fail(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{REQUIRE_ENV} is set but {reason}")
    pytest.skip(reason)


def require_tools() -> None:
    if missing := missing_tools():
        skip_or_fail(f"missing Debian packages: {', '.join(missing)}")


# ---- the registry ------------------------------------------------------------------------

@dataclass
class RegistryServer:
    """A running docker-registry. `host` is what image references start with (`127.0.0.1:PORT`)."""

    host: str
    ca_file: Path
    username: str
    password: str
    access_log: Path
    process: subprocess.Popen
    root: Path

    @property
    def url(self) -> str:
        return f"https://{self.host}"

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def basic_auth(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None, auth: bool = True) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of one call to the registry; HTTP errors are returned, not raised."""
        headers = {**(headers or {}), **({"Authorization": self.basic_auth()} if auth else {})}
        req = urllib.request.Request(self.url + path if path.startswith("/") else path, data=body, method=method,
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=30) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def blob_gets(self, digest: str) -> int:
        """Successful GETs of the blob `digest` (any repository) in the access log so far."""
        pattern = re.compile(r'"GET /v2/[^ ]+/blobs/' + re.escape(digest) + r' HTTP/[0-9.]+" (200|206) ')
        return sum(1 for line in self.access_log.read_text(errors="replace").splitlines() if pattern.search(line))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def start_registry(root: Path, username: str = "pusher", password: str = "registry-password") -> RegistryServer:
    """A registry serving TLS on a free loopback port, its files under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    tls_dir = root / "tls"
    ensure_local_pki(tls_dir, {"registry": ["registry.provisioner.test"]})
    files = local_files(tls_dir, "registry")
    htpasswd = subprocess.run(["htpasswd", "-nbB", username, password], capture_output=True, text=True, check=True)
    (root / "htpasswd").write_text(htpasswd.stdout.strip() + "\n")
    port = free_port()
    config = {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "test-only-secret",
                 "tls": {"certificate": str(files.cert), "key": str(files.key)}},
        "auth": {"htpasswd": {"realm": "provisioner-test", "path": str(root / "htpasswd")}},
    }
    (root / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    log = root / "registry.log"
    out = open(log, "ab")
    process = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=out, stderr=out)
    out.close()
    server = RegistryServer(f"127.0.0.1:{port}", tls_dir / CA_CERT, username, password, log, process, root)
    wait_up(server)
    return server


def wait_up(server: RegistryServer, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"docker-registry exited: {server.access_log.read_text()[-2000:]}")
        try:
            if server.request("GET", "/v2/", auth=False)[0] == 401:
                return
        except OSError:
            pass
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"docker-registry did not answer in {timeout_s} s: {server.access_log.read_text()[-2000:]}")


# ---- images ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Blob:
    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return content_digest(self.data)

    def descriptor(self) -> dict:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data)}


@dataclass(frozen=True)
class Image:
    """One image version as pushed: its layers bottom first, config and manifest."""

    layers: tuple[Blob, ...]
    config: Blob
    manifest: Blob

    @property
    def digest(self) -> str:
        return self.manifest.digest

    @property
    def layer_digests(self) -> tuple[str, ...]:
        return tuple(layer.digest for layer in self.layers)


@dataclass
class _Tar:
    entries: list[tarfile.TarInfo] = field(default_factory=list)
    contents: dict[str, bytes] = field(default_factory=dict)

    def dir(self, name: str) -> _Tar:
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        self.entries.append(info)
        return self

    def file(self, name: str, data: bytes, mode: int = 0o644) -> _Tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), mode
        self.entries.append(info)
        self.contents[name] = data
        return self

    def symlink(self, name: str, target: str) -> _Tar:
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
        self.entries.append(info)
        return self

    def tar(self) -> bytes:
        """Deterministic: owner root, mtime 0, entries in the order given."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for info in self.entries:
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = 0
                data = self.contents.get(info.name)
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
        return buf.getvalue()


@functools.lru_cache(maxsize=None)
def _gzip(tar: bytes) -> bytes:
    return gzip.compress(tar, mtime=0)


@functools.lru_cache(maxsize=1)
def busybox_layer() -> bytes:
    t = _Tar().dir("bin").file("bin/busybox", BUSYBOX.read_bytes(), 0o755).symlink("bin/sh", "busybox")
    return t.dir("etc").dir("www").dir("tmp").tar()


def start_layer(variant: str = "1") -> bytes:
    """The start script; `variant` changes the layer's bytes (not its behaviour) to make a new one."""
    script = START_SCRIPT + (f"# variant {variant}\n" if variant != "1" else "")
    return _Tar().dir("notebook").file("notebook/start.sh", script.encode(), 0o755).tar()


def page_layer(version: str) -> bytes:
    return _Tar().dir("www").file("www/index.html", f"<h1>notebook {version}</h1>\n".encode()).tar()


def build_image(version: str, middle: str = "1", docker_format: bool = False, page: str | None = None) -> Image:
    """The notebook stand-in at `version`: busybox, start script (`middle` picks its variant), page
    (`page`, default the version: a rebuild with another page is a re-push with new content)."""
    tars = [busybox_layer(), start_layer(middle), page_layer(page or version)]
    layer_type = DOCKER_LAYER if docker_format else OCI_LAYER
    layers = tuple(Blob(layer_type, _gzip(t)) for t in tars)
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/bin/sh", "/notebook/start.sh"], "Env": ["PATH=/bin"],
                   "ExposedPorts": {f"{NOTEBOOK_PORT}/tcp": {}}, "WorkingDir": "/",
                   "Labels": {"org.opencontainers.image.version": version}},
        "rootfs": {"type": "layers", "diff_ids": [content_digest(t) for t in tars]},
    }
    config_blob = Blob(DOCKER_CONFIG if docker_format else OCI_CONFIG, json.dumps(config, sort_keys=True).encode())
    manifest = {"schemaVersion": 2, "mediaType": DOCKER_MANIFEST if docker_format else OCI_MANIFEST,
                "config": config_blob.descriptor(), "layers": [layer.descriptor() for layer in layers]}
    return Image(layers, config_blob, Blob(manifest["mediaType"], json.dumps(manifest, indent=2).encode()))


def push_image(registry: RegistryServer, repository: str, tag: str, image: Image) -> str:
    """Uploads the image's blobs (those the registry lacks) and its manifest under `tag`; returns
    the manifest digest the registry reports."""
    for blob in (*image.layers, image.config):
        if registry.request("HEAD", f"/v2/{repository}/blobs/{blob.digest}")[0] == 200:
            continue
        status, headers, body = registry.request("POST", f"/v2/{repository}/blobs/uploads/", b"")
        if status != 202:
            raise RuntimeError(f"starting an upload: {status} {body[:300]!r}")
        location = headers["Location"]
        location = location if location.startswith("http") else registry.url + location
        sep = "&" if "?" in location else "?"
        status, _, body = registry.request("PUT", f"{location}{sep}digest={blob.digest}", blob.data,
                                           {"Content-Type": "application/octet-stream"})
        if status != 201:
            raise RuntimeError(f"uploading {blob.digest}: {status} {body[:300]!r}")
    status, headers, body = registry.request("PUT", f"/v2/{repository}/manifests/{tag}", image.manifest.data,
                                             {"Content-Type": image.manifest.media_type})
    if status != 201:
        raise RuntimeError(f"putting the manifest {repository}:{tag}: {status} {body[:300]!r}")
    return headers.get("Docker-Content-Digest", image.digest)


def push_versions(registry: RegistryServer, repository: str = "nb", versions: tuple[str, ...] = ("v1", "v2", "v3"),
                  **build) -> dict[str, Image]:
    """Builds and pushes each version as `repository:version`; consecutive versions share their
    lower layers (all but the page). Returns the images by tag."""
    images = {}
    for version in versions:
        images[version] = build_image(f"{repository}:{version}", **build)
        push_image(registry, repository, version, images[version])
    return images


@pytest.fixture
def registry(tmp_path):
    """A running registry (TLS, htpasswd) for one test."""
    require_tools()
    server = start_registry(tmp_path / "registry")
    yield server
    server.stop()
