"""What a session runs, as the agent reports it (guest attribute `usage`) for abuse detection.

Pure (standard library only): the cluster side decodes it without the agent's I/O. A report is
bounded: at most MAX_PROCESSES process names, MAX_GPU_PROCESSES names of GPU users and
MAX_CONNECTIONS connections, names cut to MAX_NAME characters, so that its JSON always fits in
one guest attribute (4 KB); what was left out is counted.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Iterable

MAX_PROCESSES = 48
MAX_GPU_PROCESSES = 16
MAX_CONNECTIONS = 24
MAX_GPUS = 16
MAX_NAME = 32


@dataclass(frozen=True, slots=True, order=True)
class Connection:
    """An outbound TCP connection: the remote end."""

    address: str  # IPv4 dotted or IPv6 compressed; an IPv4-mapped IPv6 address is given as IPv4
    port: int

    @property
    def is_public(self) -> bool:
        """A globally routed address (not loopback, private, link-local such as the metadata server)."""
        try:
            return ipaddress.ip_address(self.address).is_global
        except ValueError:
            return False

    def __str__(self) -> str:
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"


@dataclass(frozen=True, slots=True)
class Usage:
    gpu_utilization_pct: tuple[int, ...] = ()  # per GPU, NVML's reading when the report was made
    gpu_processes: tuple[str, ...] = ()  # names of the processes using a GPU, distinct, sorted
    processes: tuple[str, ...] = ()  # names of the session's processes, distinct, sorted
    connections: tuple[Connection, ...] = ()  # the session's outbound TCP, public addresses first
    omitted_processes: int = 0  # distinct names beyond the caps, not listed
    omitted_connections: int = 0

    @property
    def gpu_busiest_pct(self) -> int:
        """The busiest GPU's utilization (a session may mine on one GPU of several); 0 without GPUs."""
        return max(self.gpu_utilization_pct, default=0)

    def to_json(self) -> str:
        return json.dumps({
            "gpu_utilization_pct": list(self.gpu_utilization_pct),
            "gpu_processes": list(self.gpu_processes),
            "processes": list(self.processes),
            "connections": [[c.address, c.port] for c in self.connections],
            "omitted_processes": self.omitted_processes,
            "omitted_connections": self.omitted_connections,
        }, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> Usage:
        """Decodes a report, applying the same caps (the sender is a VM a user controls);
        raises ValueError on anything malformed."""
        try:
            d = json.loads(raw)
            return cls(
                gpu_utilization_pct=tuple(min(100, max(0, int(u))) for u in d.get("gpu_utilization_pct", ())[:MAX_GPUS]),
                gpu_processes=tuple(name(str(n)) for n in d.get("gpu_processes", ())[:MAX_GPU_PROCESSES]),
                processes=tuple(name(str(n)) for n in d.get("processes", ())[:MAX_PROCESSES]),
                connections=tuple(Connection(str(a)[:64], int(p)) for a, p in d.get("connections", ())[:MAX_CONNECTIONS]),
                omitted_processes=int(d.get("omitted_processes", 0)),
                omitted_connections=int(d.get("omitted_connections", 0)),
            )
        except (TypeError, AttributeError, ValueError) as err:
            raise ValueError(f"malformed usage report: {err}") from err


def parse(raw: str | None) -> Usage | None:
    """A report as read from the VM; None when there is none or it is malformed."""
    if raw is None:
        return None
    try:
        return Usage.from_json(raw)
    except ValueError:
        return None


def name(raw: str) -> str:
    """A process name as reported: its base name (NVML may give a path), cut to MAX_NAME."""
    return raw.strip().rsplit("/", 1)[-1][:MAX_NAME]


def collect(utilization_pct: Iterable[int], gpu_processes: Iterable[str], processes: Iterable[str],
            connections: Iterable[Connection]) -> Usage:
    """One bounded report from what the agent read."""
    gpu_names = sorted({name(n) for n in gpu_processes if n.strip()})
    names = sorted({name(n) for n in processes if n.strip()})
    # Public addresses first: a cap must not hide a pool behind local connections.
    conns = sorted(set(connections), key=lambda c: (not c.is_public, c))
    return Usage(tuple(utilization_pct)[:MAX_GPUS], tuple(gpu_names[:MAX_GPU_PROCESSES]), tuple(names[:MAX_PROCESSES]),
                 tuple(conns[:MAX_CONNECTIONS]),
                 max(0, len(names) - MAX_PROCESSES) + max(0, len(gpu_names) - MAX_GPU_PROCESSES),
                 max(0, len(conns) - MAX_CONNECTIONS))
