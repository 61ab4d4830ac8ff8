"""The agent's real implementations where this machine has the real thing: the host (/proc,
directories, statvfs), and the container runtime's pure parts (its request bodies, its reading
of the engine's pull stream; the engine itself is in test_engine.py)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from provisioner.agent.runtime import (ContainerError, ImageRef, NotebookSpec, Placement, PullBytes,
                                       create_body)
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
def test_user_processes_are_found_and_checked_alive():
    proc = subprocess.Popen(["sleep", "60"],
                            preexec_fn=lambda: os.setuid(UID))
    try:
        host = LocalHost()
        deadline = time.monotonic() + 5
        while not any(p.pid == proc.pid for p in host.user_processes(UID)):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert [(p.uid, p.name) for p in host.user_processes(UID) if p.pid == proc.pid] == [(UID, "sleep")]
        assert [p.name for p in host.alive([proc.pid])] == ["sleep"]
        assert host.in_namespace(proc.pid) == []  # the host's own pid namespace: no container's
        proc.kill()
        proc.wait(5)
        assert host.alive([proc.pid]) == []
    finally:
        proc.kill()


IMAGE = ImageRef("us-docker.pkg.dev/p/notebooks/gpu", "sha256:" + "ab" * 32)


def test_the_create_body_asks_for_gpus_only_when_the_pool_has_them():
    spec = NotebookSpec("s-1", "ada", "us-central1", IMAGE, "tok", cpus=11.5, memory_bytes=85 << 30, gpus=1)
    body = create_body(spec, Placement("/var/lib/ws/s-1"))
    host = body["HostConfig"]
    assert body["Image"] == f"us-docker.pkg.dev/p/notebooks/gpu@sha256:{'ab' * 32}"
    assert host["DeviceRequests"] == [{"Driver": "nvidia", "Count": 1, "Capabilities": [["gpu"]]}]
    assert host["NanoCpus"] == 11_500_000_000 and host["Memory"] == 85 << 30
    assert host["Binds"] == ["/var/lib/ws/s-1:/home/jovyan/work"]
    assert host["PortBindings"] == {"8888/tcp": [{"HostIp": "0.0.0.0", "HostPort": "8888"}]}
    assert body["Env"] == ["NOTEBOOK_TOKEN=tok"]
    assert body["Labels"] == {"provisioner.session": "s-1", "provisioner.user": "ada",
                              "provisioner.cluster": "us-central1"}
    named = create_body(NotebookSpec("s-1", "ada", "c", IMAGE, "t", gpu_ids=("GPU-1", "GPU-3")),
                        Placement("/w", host_port=0))
    assert named["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == ["GPU-1", "GPU-3"]
    assert named["HostConfig"]["PortBindings"]["8888/tcp"][0]["HostPort"] == ""  # the engine picks
    cpu_only = create_body(NotebookSpec("s-2", "bob", "c", IMAGE, "t"), Placement("/w"))["HostConfig"]
    assert "DeviceRequests" not in cpu_only and "NanoCpus" not in cpu_only and "Memory" not in cpu_only


def test_pull_bytes_follow_the_stream_per_layer():
    a, b, c = "sha256:" + "a" * 64, "sha256:" + "b" * 64, "sha256:" + "c" * 64
    counted = PullBytes({a: 1000, b: 500, c: 300})
    stream = [
        {"status": "Already exists", "id": "c" * 12},  # held: nothing downloaded
        {"status": "Pulling fs layer", "id": "a" * 12, "progressDetail": {}},
        {"status": "Downloading", "id": "a" * 12, "progressDetail": {"current": 400, "total": 1000}},
        {"status": "Downloading", "id": "a" * 12, "progressDetail": {"current": 900, "total": 1000}},
        {"status": "Download complete", "id": "b" * 12, "progressDetail": {}},  # podman says only this
        {"status": "Pull complete", "id": "a" * 12, "progressDetail": {}},
    ]
    assert [counted.feed(m) for m in stream] == [0, 0, 400, 900, 1400, 1500]
    with pytest.raises(ContainerError, match="unauthorized"):
        counted.feed({"errorDetail": {"message": "unauthorized: authentication required"}, "error": "x"})
