"""The machine itself: its users' processes and their connections, its directories and its disks."""

from __future__ import annotations

import os
import shutil
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
    def user_processes(self, uid_min: int) -> list[Process]: ...

    def connections(self, pids: Iterable[int]) -> list[Connection]:
        """The outbound TCP connections of these processes (remote ends)."""
        ...

    def signal(self, pid: int, sig: int) -> None:
        """Sends a signal; a process already gone is fine."""
        ...

    def clear(self, path: Path) -> None:
        """Deletes everything inside `path` (which stays)."""
        ...

    def entries(self, path: Path) -> list[str]: ...

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

    def signal(self, pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def clear(self, path: Path) -> None:
        if not path.exists():
            return
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()

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
