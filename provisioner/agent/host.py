"""The machine itself: its processes and their connections, its directories and its disks."""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol

from provisioner.agent import procnet
from provisioner.agent.usage import Connection


@dataclass(frozen=True, slots=True)
class Process:
    pid: int
    uid: int
    name: str


@dataclass(frozen=True, slots=True)
class Disk:
    free_fraction: float
    read_only: bool


class Host(Protocol):
    def user_processes(self, uid_min: int) -> list[Process]:
        """Processes of users with uid >= uid_min (what a session runs, for its usage report)."""
        ...

    def connections(self, pids: Iterable[int]) -> list[Connection]:
        """The outbound TCP connections of these processes (remote ends)."""
        ...

    def in_namespace(self, pid: int) -> list[int]:
        """The processes sharing `pid`'s pid namespace (a container's, when `pid` is its first)."""
        ...

    def alive(self, pids: Iterable[int]) -> list[Process]:
        """Those of `pids` still running."""
        ...

    def answers(self, port: int) -> bool:
        """Whether something accepts TCP connections on this host's `port`."""
        ...

    def clear(self, path: Path) -> None:
        """Deletes everything inside `path` (which stays)."""
        ...

    def entries(self, path: Path) -> list[str]: ...

    def make_dir(self, path: Path) -> None:
        """Creates `path` (and its parents) if missing."""
        ...

    def disk(self, path: Path) -> Disk | None:
        """The file system holding `path`; None if there is no such path."""
        ...


class LocalHost:
    def __init__(self, proc: Path = Path("/proc")):
        self.proc = proc

    def user_processes(self, uid_min: int) -> list[Process]:
        out = []
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                uid = next(int(line.split()[1]) for line in (entry / "status").read_text().splitlines()
                           if line.startswith("Uid:"))
                name = (entry / "comm").read_text().strip()
            except (OSError, StopIteration):
                continue  # it ended meanwhile
            if uid >= uid_min:
                out.append(Process(int(entry.name), uid, name))
        return out

    def connections(self, pids: Iterable[int]) -> list[Connection]:
        return procnet.connections(pids, self.proc)

    def _pid_ns(self, pid: int | str) -> str | None:
        try:
            return os.readlink(self.proc / str(pid) / "ns" / "pid")
        except OSError:
            return None

    def in_namespace(self, pid: int) -> list[int]:
        ns = self._pid_ns(pid) if pid else None
        if ns is None or ns == self._pid_ns("self"):  # gone, or the agent's (host's) own: no container's
            return []
        return sorted(int(e.name) for e in self.proc.iterdir() if e.name.isdigit() and self._pid_ns(int(e.name)) == ns)

    def alive(self, pids: Iterable[int]) -> list[Process]:
        out = []
        for pid in pids:
            try:
                name = (self.proc / str(pid) / "comm").read_text().strip()
                status = (self.proc / str(pid) / "status").read_text()
            except OSError:
                continue
            if "\nState:\tZ" in status:
                continue  # ended, waiting for its parent to reap it
            uid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:"))
            out.append(Process(pid, uid, name))
        return out

    def answers(self, port: int) -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return True
        except OSError:
            return False

    def clear(self, path: Path) -> None:
        if not path.exists():
            return
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()

    def make_dir(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)

    def entries(self, path: Path) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def disk(self, path: Path) -> Disk | None:
        try:
            st = os.statvfs(path)
        except FileNotFoundError:
            return None
        free = st.f_bavail / st.f_blocks if st.f_blocks else 1.0
        return Disk(free, bool(st.f_flag & os.ST_RDONLY))
