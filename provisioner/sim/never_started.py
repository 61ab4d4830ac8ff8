"""Why a replayed session ended without running, in classes an operator can act on. Pure.

A replay stops a session its trace length after its arrival; one still waiting then never ran.
What it was waiting for says what would have served it: warm VMs holding more of the images
(a pull), more warm or standby VMs ahead of demand (a new VM, a standby start), or capacity (the
queue: the pool's maximum, a stockout, its user's ceiling, a preemption's grace period).
"""

from __future__ import annotations

from provisioner.model.records import Session
from provisioner.model.states import SESSION_TERMINAL, SessionState

S = SessionState

# A pull of at least this share of the image means its VM held little of it: a VM still filling
# its disk after it was made (or started with an old disk), not one missing a version's few layers.
MOST_OF_THE_IMAGE = 0.5


def cause(s: Session, image_bytes: int) -> str:
    """The class of what the session was doing when it ended, and why it ended.
    `image_bytes`: the size of its image, all layers."""
    last = next((h for h in reversed(s.history) if h.state not in SESSION_TERMINAL and h.state != S.STOPPING),
                None)
    if last is None:
        return f"ended before it was placed: {s.reason}"
    return f"{_waiting_for(s, last.state, last.reason, image_bytes)}; ended: {s.reason}"


def _waiting_for(s: Session, state: str, why: str, image_bytes: int) -> str:
    if state == S.PULLING_IMAGE:
        if s.pull_bytes_total >= MOST_OF_THE_IMAGE * image_bytes:
            return "pulling its image onto a VM that held little of it (a VM still filling its disk)"
        return "pulling the layers its warm VM lacked (a version no idle VM held)"
    if state == S.PROVISIONING:
        if why.startswith("starting standby"):
            return "waiting for a standby VM to start (no warm VM was free)"
        return "waiting for a new VM (no warm or standby VM was free)"
    if state == S.QUEUED:
        if why.startswith("waiting for one of its user's"):
            return "queued: its user held the pool's per-user ceiling"
        if "preempted" in why:
            return "queued: waiting for preempted sessions to give back their VMs"
        if "at its maximum" in why:
            return "queued: the pool at its maximum (max_vms)"
        if "stocked out" in why:
            return "queued: every zone of the pool stocked out"
        return "queued: its VM's create or start failed"
    if state == S.STARTING:
        return "waiting for its notebook to start"
    return f"{state}"
