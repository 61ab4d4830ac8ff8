"""The VM startup script (provisioner/cloud/startup-script.sh), run by bash in a chroot whose
commands are stand-ins: each logs its call and leaves behind what the real one would (apt-get
installing docker.io leaves a `docker`, the venv a `pip`, pip the agent), so the script's own
logic runs for real: what it installs on a bare boot image, that a second boot installs nothing,
how it reads the agent package from the metadata server, and that it refuses to start without
an agent. Needs root (chroot) and busybox-static; skipped without them, unless
PROVISIONER_REQUIRE_CHROOT is set (CI sets it), in which case it fails."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from provisioner.cloud.gce_instance import startup_script

BUSYBOX = "/bin/busybox"
BUSYBOX_APPLETS = ("cat", "sed", "basename", "mkdir", "ln", "rm", "touch")
ALWAYS_THERE = ("curl", "apt-get", "python3", "gpg", "gcloud", "systemctl")  # on every boot image we expect
METADATA = "http://metadata.google.internal/computeMetadata/v1/instance/attributes"

# The stand-in for every command: logs the call, then leaves what the real command would.
STAND_IN = r"""#!/bin/bash
name=${0##*/}
echo "$name $*" >> /calls.log
appear() { ln -sf /stand-in "/usr/local/bin/$1"; }
case "$name" in
  curl)
    url=${*: -1}
    case "$url" in
      */attributes/*) key=${url##*/}; [ -f "/metadata/$key" ] || exit 22; cat "/metadata/$key" ;;
      *) out=""; prev=""
         for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done
         if [ -n "$out" ]; then echo payload > "$out"; else echo "deb https://nvidia.example/deb /"; fi ;;
    esac ;;
  apt-get)
    [ "$1" = install ] || exit 0
    for p in "$@"; do
      case "$p" in docker.io) appear docker ;; nvidia-container-toolkit) appear nvidia-ctk ;; esac
    done ;;
  python3)
    case "$*" in
      "/opt/cuda_installer.pyz install_driver") appear nvidia-smi ;;
      "-m venv /opt/provisioner") mkdir -p /opt/provisioner/bin && ln -s /stand-in /opt/provisioner/bin/pip ;;
    esac ;;
  pip) ln -s /stand-in /opt/provisioner/bin/provisioner ;;
  gpg) out=""; prev=""
       for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done
       cat > "$out" ;;
  gcloud) [ "$1 $2" = "storage cp" ] && touch "$4/${3##*/}" ;;
esac
"""


def _root(tmp_path: Path) -> Path:
    """A chroot with bash (and its libraries), busybox's few tools, and the stand-ins."""
    if os.geteuid() != 0 or not os.path.exists(BUSYBOX) or not shutil.which("chroot"):
        if os.environ.get("PROVISIONER_REQUIRE_CHROOT"):  # CI sets it
            pytest.fail("the startup script's test is required here: run as root, with busybox-static installed")
        pytest.skip("NO CHROOT: the startup script's test needs root and busybox-static")
    root = tmp_path / "root"
    for d in ("dev", "bin", "usr/local/bin", "stand-ins", "tmp", "opt", "metadata", "etc/systemd/system",
              "etc/apt/sources.list.d", "usr/share/keyrings"):
        (root / d).mkdir(parents=True)
    os.mknod(root / "dev/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # the script sends output there
    shutil.copy2("/bin/bash", root / "bin/bash")
    libs = subprocess.run(["ldd", "/bin/bash"], capture_output=True, text=True, check=True).stdout
    for lib in (word for line in libs.splitlines() for word in line.split() if word.startswith("/")):
        (root / lib.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, root / lib.lstrip("/"))
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    for applet in BUSYBOX_APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    (root / "stand-in").write_text(STAND_IN)
    (root / "stand-in").chmod(0o755)
    for name in ALWAYS_THERE:
        (root / "stand-ins" / name).symlink_to("/stand-in")
    (root / "startup-script.sh").write_text(startup_script())
    return root


def _boot(root: Path, **metadata: str) -> tuple[int, list[str], str]:
    """Runs the script as Compute Engine does at a boot; (exit code, the commands it ran, stderr)."""
    for key, value in metadata.items():
        (root / "metadata" / key).write_text(value)
    done = subprocess.run([shutil.which("chroot"), str(root), "/bin/bash", "/startup-script.sh"], capture_output=True, text=True,
                          env={"PATH": "/usr/local/bin:/stand-ins:/bin"}, timeout=60)
    log = root / "calls.log"
    calls = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return done.returncode, calls, done.stderr


START = ["systemctl daemon-reload", "systemctl enable --now provisioner-agent.service"]


def test_a_bare_image_gets_everything_once_and_a_second_boot_only_starts_the_agent(tmp_path):
    root = _root(tmp_path)
    rc, calls, err = _boot(root, **{"provisioner-agent-package": "provisioner[server]==1.0"})
    assert rc == 0, err
    key_pipe = {4, 5}  # curl | gpg: the two run at once, logged in either order
    assert {calls[i] for i in key_pipe} == {
        "curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey",
        "gpg --batch --yes --dearmor -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"}
    assert [c for i, c in enumerate(calls) if i not in key_pipe] == [
        "apt-get update -q", "apt-get install -yq docker.io",
        "curl -sfL -o /opt/cuda_installer.pyz "
        "https://storage.googleapis.com/compute-gpu-installation-us/installer/latest/cuda_installer.pyz",
        "python3 /opt/cuda_installer.pyz install_driver",
        "curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list",
        "apt-get update -q", "apt-get install -yq nvidia-container-toolkit",
        "nvidia-ctk runtime configure --runtime=docker", "systemctl restart docker",
        f"curl -sf -H Metadata-Flavor: Google {METADATA}/provisioner-agent-package",
        "python3 -m venv --help", "python3 -m venv /opt/provisioner",
        "pip install -q provisioner[server]==1.0",
        *START,
    ]
    # The toolkit's apt source is signed by the key it fetched.
    assert (root / "etc/apt/sources.list.d/nvidia-container-toolkit.list").read_text() == \
        "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://nvidia.example/deb /\n"
    unit = (root / "etc/systemd/system/provisioner-agent.service").read_text()
    assert "ExecStart=/opt/provisioner/bin/provisioner agent --config /etc/provisioner-agent.yaml" in unit
    assert (root / "etc/provisioner-agent.yaml").read_text() == "{}\n"  # every setting at its default

    (root / "etc/provisioner-agent.yaml").write_text("heartbeat_s: 5\n")  # an operator's config
    rc, calls, err = _boot(root)  # after a reboot (the driver's install may ask for one)
    assert (rc, calls) == (0, START), err
    assert (root / "etc/provisioner-agent.yaml").read_text() == "heartbeat_s: 5\n"  # kept


def test_a_wheel_in_cloud_storage_is_copied_onto_the_vm_and_installed_with_its_extras(tmp_path):
    root = _root(tmp_path)
    rc, calls, err = _boot(root, **{"provisioner-agent-package": "gs://bucket/provisioner-1.0-py3-none-any.whl[server]"})
    assert rc == 0, err
    assert calls[calls.index("python3 -m venv --help") - 2:-2] == [
        f"curl -sf -H Metadata-Flavor: Google {METADATA}/provisioner-agent-package",
        "gcloud storage cp gs://bucket/provisioner-1.0-py3-none-any.whl /opt/",
        "python3 -m venv --help", "python3 -m venv /opt/provisioner",
        "pip install -q /opt/provisioner-1.0-py3-none-any.whl[server]",
    ]
    assert (root / "opt/provisioner-1.0-py3-none-any.whl").exists()


@pytest.mark.parametrize("package", [None, "preinstalled"])
def test_without_an_agent_to_install_the_script_fails_and_starts_nothing(tmp_path, package):
    root = _root(tmp_path)
    rc, calls, err = _boot(root, **({"provisioner-agent-package": package} if package else {}))
    assert rc == 1
    assert "no agent in this image and no provisioner-agent-package to install" in err
    assert not any(c.startswith(("systemctl daemon-reload", "systemctl enable", "pip")) for c in calls)
