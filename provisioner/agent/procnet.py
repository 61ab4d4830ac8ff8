"""The outbound TCP connections of a set of processes, from Linux's /proc.

A process's sockets are the `socket:[inode]` links among its /proc/<pid>/fd; the TCP tables of
its network namespace (/proc/<pid>/net/tcp and tcp6) give each inode's ends and state. Read
this way, a session in its own namespace and a session on the host's network (GKE nodes run
hostNetwork pods) are alike, and only the session's own sockets count, never the agent's.
Outbound means connecting or established from a port nothing listens on in that namespace: a
connection accepted by the notebook server (local port 8888) is inbound and left out.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from provisioner.agent.usage import Connection

ESTABLISHED, SYN_SENT, LISTEN = 0x01, 0x02, 0x0A


@dataclass(frozen=True, slots=True)
class Socket:
    local: Connection
    remote: Connection
    state: int
    inode: int


def _address(hex_addr: str, byteorder: str) -> str:
    """An address as the kernel prints it: 32-bit words in host byte order, each as 8 hex digits."""
    raw = b"".join(int(hex_addr[i:i + 8], 16).to_bytes(4, byteorder) for i in range(0, len(hex_addr), 8))
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw))
    ip = ipaddress.IPv6Address(raw)
    return str(ip.ipv4_mapped or ip)


def _end(field: str, byteorder: str) -> Connection:
    addr, port = field.split(":")
    return Connection(_address(addr, byteorder), int(port, 16))


def parse_tcp(text: str, byteorder: str = sys.byteorder) -> list[Socket]:
    """The sockets of a /proc/net/tcp or tcp6 table; lines that do not parse are skipped."""
    out = []
    for line in text.splitlines()[1:]:
        f = line.split()
        try:
            out.append(Socket(_end(f[1], byteorder), _end(f[2], byteorder), int(f[3], 16), int(f[9])))
        except (IndexError, ValueError):
            continue
    return out


def outbound(table: Iterable[Socket], inodes: set[int]) -> list[Connection]:
    """The remote ends of the sockets among `inodes` that connect out (see the module's doc)."""
    table = list(table)
    listening = {s.local.port for s in table if s.state == LISTEN}
    return [s.remote for s in table
            if s.inode in inodes and s.state in (ESTABLISHED, SYN_SENT) and s.local.port not in listening]


def _socket_inodes(fd_dir: Path) -> set[int]:
    out = set()
    try:
        fds = os.listdir(fd_dir)
    except OSError:  # ended, or not ours to read
        return out
    for fd in fds:
        try:
            link = os.readlink(fd_dir / fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def connections(pids: Iterable[int], proc: Path = Path("/proc")) -> list[Connection]:
    """The outbound TCP connections of these processes (duplicates kept; processes that end
    while being read are skipped). Each network namespace's tables are read once."""
    by_netns: dict[str, tuple[int, set[int]]] = {}  # namespace -> (a pid in it, the pids' socket inodes)
    for pid in pids:
        try:
            netns = os.readlink(proc / str(pid) / "ns" / "net")
        except OSError:
            continue
        inodes = _socket_inodes(proc / str(pid) / "fd")
        if inodes:
            by_netns.setdefault(netns, (pid, set()))[1].update(inodes)
    out = []
    for pid, inodes in by_netns.values():
        table = []
        for name in ("tcp", "tcp6"):
            try:
                table += parse_tcp((proc / str(pid) / "net" / name).read_text())
            except OSError:
                continue  # no IPv6, or the process ended
        out += outbound(table, inodes)
    return out
