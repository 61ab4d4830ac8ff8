"""Which process listens on a TCP port, for error messages: read from Linux's /proc (the socket's
inode in /proc/net/tcp*, then the process with that inode among its open files). Standard library
only; elsewhere, or without the rights to look, the answer is simply unknown."""

from __future__ import annotations

import os
from pathlib import Path

LISTEN = "0A"  # the TCP state of a listening socket in /proc/net/tcp


class PortTaken(OSError):
    """A server could not bind its port because another socket listens there."""

    def __init__(self, address: str, what: str = "server"):
        self.address = address
        port = int(address.rsplit(":", 1)[1])
        holder = describe_holder(port)
        super().__init__(f"cannot listen on {address} ({what}): the port is taken"
                         + (f" by {holder}" if holder else "")
                         + "; stop that process or choose another address")


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def holders(port: int, proc: Path = Path("/proc")) -> list[tuple[int, str]]:
    """(pid, command line) of each process with a socket listening on `port`."""
    wanted = {f"socket:[{inode}]" for inode in listening_inodes(port, proc)}
    found = []
    if not wanted:
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(entry / "fd")
            if not any(os.readlink(entry / "fd" / fd) in wanted for fd in fds):
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found.append((int(entry.name), cmdline))
    return sorted(found)


def describe_holder(port: int) -> str:
    """`pid 123 (provisioner up ...)`, or "" when it cannot be found."""
    return ", ".join(f"pid {pid} ({cmd})" if cmd else f"pid {pid}" for pid, cmd in holders(port))
