"""What the fake Compute server (tests/fake_compute.py) keeps: each call it answered, and each
instance with its life on wall time (boot, stop, and the VM agent it emulates)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field


@dataclass
class Call:
    method: str  # HTTP verb
    op: str  # insert, get, delete, list, setMetadata, getGuestAttributes, operations.get, ...
    project: str
    zone: str
    instance: str
    query: dict
    body: dict
    status: int = 200
    at: float = field(default_factory=time.time)  # wall time


@dataclass
class Instance:
    name: str
    zone: str
    body: dict
    created: float
    status: str = "PROVISIONING"
    guest: dict[str, str] = field(default_factory=dict)  # key under provisioner/ -> value
    stopping_since: float = 0.0
    maintenance_event: str = "NONE"  # as its metadata server tells the VM
    preempted: str = "FALSE"

    def advance(self, now: float, fake) -> None:
        """Moves the instance on to wall time `now`: boot, stop, and the emulated agent's commands
        (the timings and the agent mode are the fake's, FakeCompute)."""
        inst = self
        if inst.status == "STOPPING" and now - inst.stopping_since >= fake.stop_s:
            inst.status = "TERMINATED"
            inst.guest.clear()  # the agent stopped with the VM; it reports afresh on the next boot
        if inst.status == "PROVISIONING" and now - inst.created >= fake.boot_s:
            inst.status = "RUNNING"
            if fake.agents == "external":
                return
            inst.guest["ready"] = "1"
        if fake.agents == "external":
            return
        pending = inst.guest.get("_pending")
        if pending and inst.status == "RUNNING":
            cmd = json.loads(pending)
            done_at = cmd["_at"] + fake.command_s
            if now >= done_at:
                inst.guest.pop("_pending")
                if fake.drop_done:  # written beyond the rate: gone without a word
                    fake.drop_done -= 1
                else:
                    inst.guest[f"done-{cmd['id']}"] = "ok"
                inst.guest[f"progress-{cmd['id']}"] = str(cmd.get("bytes", 0))
            else:
                share = max(0.0, (now - cmd["_at"]) / fake.command_s)
                inst.guest[f"progress-{cmd['id']}"] = str(int(cmd.get("bytes", 0) * share))
