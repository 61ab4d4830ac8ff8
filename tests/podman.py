"""A real container engine for tests: podman serving the Docker Engine API on a socket.

Each engine has its own configuration, storage root and run root in a temporary directory, so
tests share no containers or images. podman runs its containers with runc (crun and the default
ulimits fail in this sandbox). Without podman the tests that need it skip with the reason,
unless PROVISIONER_REQUIRE_PODMAN is set (CI), where they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

CONTAINERS_CONF = """\
[containers]
default_ulimits = []
[engine]
runtime = "runc"
"""


@dataclass
class Podman:
    root: Path
    process: subprocess.Popen
    env: dict[str, str]

    @property
    def socket(self) -> Path:
        return self.root / "engine.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def cli(self, *argv: str, check: bool = True) -> str:
        """The podman command line on the same storage (to build images, or to look behind the API)."""
        out = subprocess.run(["podman", *argv], env=self.env, capture_output=True, text=True, timeout=300)
        if check and out.returncode != 0:
            raise RuntimeError(f"podman {' '.join(argv)}: {out.stderr.strip()}")
        return out.stdout

    def stop(self) -> None:
        self.cli("rm", "--all", "--force", "--time", "0", check=False)
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def start_podman(extra_env: dict[str, str] | None = None) -> Podman:
    """Starts `podman system service` on a socket in a new directory; raises RuntimeError saying
    why it cannot. `extra_env`: e.g. SSL_CERT_FILE, for a registry with a test CA."""
    missing = [tool for tool in ("podman", "runc") if not shutil.which(tool)]
    if missing:
        raise RuntimeError(f"{' and '.join(missing)} not found on PATH (apt-get install podman runc)")
    root = Path(tempfile.mkdtemp(prefix="provisioner-podman-"))
    (root / "containers.conf").write_text(CONTAINERS_CONF)
    # vfs: no overlay mounts, which a nested sandbox may refuse.
    (root / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{root}/storage"\nrunroot = "{root}/run"\n')
    (root / "registries.conf").write_text('unqualified-search-registries = []\n')
    env = {**os.environ, "CONTAINERS_CONF": str(root / "containers.conf"),
           "CONTAINERS_STORAGE_CONF": str(root / "storage.conf"),
           "CONTAINERS_REGISTRIES_CONF": str(root / "registries.conf"), **(extra_env or {})}
    sock = root / "engine.sock"
    process = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{sock}"], env=env,
                               stdout=subprocess.DEVNULL, stderr=open(root / "service.log", "wb"))
    engine = Podman(root, process, env)
    deadline = time.monotonic() + 30  # wall clock: a real process starting
    while not sock.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            log = (root / "service.log").read_text(errors="replace")[-500:]
            engine.stop()
            raise RuntimeError(f"podman system service did not start: {log}")
        time.sleep(0.05)
    return engine


def skip_or_fail(reason: str) -> None:
    if os.environ.get("PROVISIONER_REQUIRE_PODMAN"):
        pytest.fail(f"podman is required here but cannot start: {reason}")
    pytest.skip(f"NO PODMAN: {reason}")

