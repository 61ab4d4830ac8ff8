"""A network namespace joined to this one by a veth pair, for partitions between real processes:
a process started with `prefix` listens at `address`, reachable from here until `cut()`, and
again after `mend()`. Needs root and iproute2; skipped without them, unless
PROVISIONER_REQUIRE_NETNS is set (CI sets it, and installs iproute2), in which case it fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass

import pytest


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class Netns:
    name: str
    host_if: str
    host_ip: str
    inner_ip: str

    @property
    def prefix(self) -> list[str]:
        """Runs a command inside the namespace (`ip netns exec` execs it: the pid is the command's)."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        """Partitions the namespace: its link goes down on this side, both directions drop."""
        _ip("link", "set", "dev", self.host_if, "down")

    def mend(self) -> None:
        _ip("link", "set", "dev", self.host_if, "up")

    def remove(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)


def make_netns() -> Netns:
    if os.geteuid() != 0 or not shutil.which("ip"):
        if os.environ.get("PROVISIONER_REQUIRE_NETNS"):  # CI sets it
            pytest.fail("network namespaces are required here: run as root, with iproute2 installed")
        pytest.skip("NO NETWORK NAMESPACES: they need root and iproute2")
    tag = uuid.uuid4().hex[:6]
    subnet = int(tag, 16) % 250 + 1  # 10.231.<subnet>.0/30, unlikely to meet another test's
    ns = Netns(f"prov-{tag}", f"prov-h-{tag}", f"10.231.{subnet}.1", f"10.231.{subnet}.2")
    try:
        _ip("netns", "add", ns.name)
        _ip("link", "add", ns.host_if, "type", "veth", "peer", "name", f"prov-c-{tag}")
        _ip("link", "set", f"prov-c-{tag}", "netns", ns.name)
        _ip("addr", "add", f"{ns.host_ip}/30", "dev", ns.host_if)
        _ip("link", "set", ns.host_if, "up")
        for args in (("addr", "add", f"{ns.inner_ip}/30", "dev", f"prov-c-{tag}"),
                     ("link", "set", f"prov-c-{tag}", "up"), ("link", "set", "lo", "up")):
            _ip("netns", "exec", ns.name, "ip", *args)
    except subprocess.CalledProcessError as e:  # as root this is a failure, not a skip
        ns.remove()
        raise RuntimeError(f"cannot make a network namespace: {e.stderr.decode().strip()}") from None
    return ns
