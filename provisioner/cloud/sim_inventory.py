"""The simulated cloud's VMs: what each holds, kept in memory or, given a path, in SQLite so they
outlive the process that made them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.cloud.base import CloudVm, HealthReport


@dataclass(slots=True)
class SimVm:
    """One VM as the simulated cloud holds it."""

    vm_id: str
    zone: str
    cluster: str
    labels: dict[str, str]
    endpoint: str
    ready_at: float  # boot runs whether or not anyone waits for it
    status: str = "provisioning"
    health: HealthReport | None = None  # set by mark_unhealthy
    usage: str | None = None  # what its session runs, as JSON (set_usage, mark_miner); a wipe clears it
    layers: list[str] = dataclasses.field(default_factory=list)  # image layers on its disk, by id
    spot: bool = False  # made as a Spot VM

    def snapshot(self) -> CloudVm:
        return CloudVm(self.vm_id, self.zone, self.status, dict(self.labels), self.endpoint,  # type: ignore[arg-type]
                       self.spot)

    def to_json(self) -> str:
        d = {f: getattr(self, f) for f in self.__slots__}
        d["health"] = dataclasses.asdict(self.health) if self.health else None
        return json.dumps(d)

    @classmethod
    def from_json(cls, body: str) -> SimVm:
        d = json.loads(body)
        d["health"] = HealthReport(**d["health"]) if d["health"] else None
        return cls(**d)


class Inventory(dict):
    """The cloud's VMs by id. Given a path, also kept in SQLite: VMs then outlive the process that
    made them, as a real cloud's do, and every replica of a cluster sees one cloud. The file
    also logs each call with the calling process, to show who acted when (for a day)."""

    CALLS_KEPT_S = 86_400.0
    PRUNE_EVERY = 10_000  # calls

    def __init__(self, path: str | Path | None = None):
        super().__init__()
        self._db: sqlite3.Connection | None = None
        if path is None:
            return
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # Survives a killed process, as the cloud must; a simulation need not survive power loss.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._calls = 0
        self._db.execute("CREATE TABLE IF NOT EXISTS vms (id TEXT PRIMARY KEY, body TEXT NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS calls (wall REAL NOT NULL, pid INTEGER NOT NULL, "
                         "op TEXT NOT NULL, vm_id TEXT NOT NULL, zone TEXT NOT NULL)")
        for vm_id, body in self._db.execute("SELECT id, body FROM vms"):
            super().__setitem__(vm_id, SimVm.from_json(body))

    def __setitem__(self, vm_id: str, vm: SimVm) -> None:
        super().__setitem__(vm_id, vm)
        self.save(vm)

    def __delitem__(self, vm_id: str) -> None:
        super().__delitem__(vm_id)
        if self._db is not None:
            self._db.execute("DELETE FROM vms WHERE id = ?", (vm_id,))

    def pop(self, vm_id: str, default: Any = None) -> Any:
        if vm_id not in self:
            return default
        vm = self[vm_id]
        del self[vm_id]
        return vm

    def save(self, vm: SimVm) -> None:
        """Writes a VM whose fields changed."""
        if self._db is not None:
            self._db.execute("INSERT INTO vms VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET body = excluded.body",
                             (vm.vm_id, vm.to_json()))

    def log_call(self, op: str, vm_id: str, zone: str) -> None:
        if self._db is not None:
            now = time.time()
            self._db.execute("INSERT INTO calls VALUES (?, ?, ?, ?, ?)", (now, os.getpid(), op, vm_id, zone))
            self._calls += 1
            if self._calls % self.PRUNE_EVERY == 0:
                self._db.execute("DELETE FROM calls WHERE wall < ?", (now - self.CALLS_KEPT_S,))

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
