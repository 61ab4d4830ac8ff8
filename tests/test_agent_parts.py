"""The agent's real implementations where this machine has the real thing: the host (/proc,
signals, directories, statvfs) and the container runtimes' command-line tools (stand-ins for
`ctr` and `docker` on the PATH that record how they are called)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from provisioner.agent.containers import ContainerError, Containerd, Docker, detect
from provisioner.agent.host import LocalHost

UID = 64123  # a user no one else on this machine runs as


def test_clear_empties_a_directory_without_following_links(tmp_path):
    home, cache = tmp_path / "home", tmp_path / "cache"
    (home / "proj" / "data").mkdir(parents=True)
    (home / "proj" / "data" / "x.bin").write_bytes(b"1")
    (home / ".bashrc").write_text("")
    cache.mkdir()
    (cache / "layer").write_text("kept")
    (home / "cache-link").symlink_to(cache)  # a user's link to something that is not theirs
    host = LocalHost()
    assert host.entries(home) == [".bashrc", "cache-link", "proj"]
    host.clear(home)
    assert host.entries(home) == [] and home.is_dir()
    assert (cache / "layer").read_text() == "kept"
    host.clear(tmp_path / "missing")  # nothing to clear
    assert host.entries(tmp_path / "missing") == []


def test_disk_reports_free_space_and_read_only(tmp_path):
    disk = LocalHost().disk(tmp_path)
    assert disk is not None and 0.0 < disk.free_fraction <= 1.0 and not disk.read_only
    assert LocalHost().disk(tmp_path / "missing") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another user needs root")
def test_user_processes_are_found_and_ended():
    proc = subprocess.Popen(["sleep", "60"],
                            preexec_fn=lambda: os.setuid(UID))
    try:
        host = LocalHost()
        deadline = time.monotonic() + 5
        while not any(p.pid == proc.pid for p in host.user_processes(UID)):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert [(p.uid, p.name) for p in host.user_processes(UID) if p.pid == proc.pid] == [(UID, "sleep")]
        host.signal(proc.pid, signal.SIGTERM)
        proc.wait(5)
        host.signal(proc.pid, signal.SIGKILL)  # gone already: fine
    finally:
        proc.kill()


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """`ctr` and `docker` that log their arguments and answer as the real ones would."""
    log = tmp_path / "calls.log"
    script = f"""#!/bin/sh
echo "$(basename "$0") $*" >> {log}
case "$*" in
  *"images ls --quiet"*) echo "reg/layers:os-v100" ;;
  *"containers ls"*) printf 'c1\\nc2\\n' ;;
  *"images --format"*reg/layers:os-v100*) echo '{{"Repository":"reg/layers","Tag":"os-v100"}}' ;;
  *"ps --all"*) echo c9 ;;
  *"pull"*bad*) echo "not found" >&2; exit 1 ;;
esac
"""
    for name in ("ctr", "docker"):
        (tmp_path / name).write_text(script)
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    return log


async def test_containerd_commands(tools):
    rt = detect("auto", "reg/layers", "provisioner-session")
    assert isinstance(rt, Containerd)
    assert await rt.has_layer("os-v100") and not await rt.has_layer("app-v101")
    seen = []
    await rt.pull_layer("app-v101", 500, seen.append)
    assert seen == [500]
    assert await rt.session_containers() == ["c1", "c2"]
    await rt.stop("c1")
    with pytest.raises(ContainerError, match="exit 1"):
        await rt.pull_layer("bad", 1, seen.append)
    calls = tools.read_text().splitlines()
    assert "ctr --namespace k8s.io images pull reg/layers:app-v101" in calls
    assert 'ctr --namespace k8s.io containers ls --quiet labels."provisioner-session"' in calls
    assert "ctr --namespace k8s.io tasks kill --signal SIGKILL c1" in calls
    assert "ctr --namespace k8s.io containers delete c1" in calls


async def test_docker_commands(tools):
    rt = detect("docker", "reg/layers", "provisioner-session")
    assert isinstance(rt, Docker)
    assert await rt.has_layer("os-v100") and not await rt.has_layer("app-v101")
    await rt.pull_layer("app-v101", 500, lambda n: None)
    assert await rt.session_containers() == ["c9"]
    await rt.stop("c9")
    calls = tools.read_text().splitlines()
    assert "docker pull --quiet reg/layers:app-v101" in calls
    assert "docker ps --all --quiet --filter label=provisioner-session" in calls
    assert "docker rm --force c9" in calls
