"""The VM and session state machines: every allowed edge in one table, with why it exists.

An edge missing from a table is a bug, and taking it raises IllegalTransition (checked on every
change, in production too). Every edge is taken by some scenario (tests/test_state_edges.py), so
the tables list what the code does, no more. Objects keep their status history (state, reason,
time), which the API returns and operators read.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from provisioner.model.errors import IllegalTransition


class VmState(StrEnum):
    CREATING = "creating"
    BOOTING = "booting"
    WARM = "warm"
    ASSIGNED = "assigned"
    RECYCLING = "recycling"
    STOPPING_STANDBY = "stopping_standby"
    STANDBY = "standby"
    STARTING = "starting"
    DELETING = "deleting"
    DELETED = "deleted"
    FAILED = "failed"


class SessionState(StrEnum):
    QUEUED = "queued"
    PROVISIONING = "provisioning"
    PULLING_IMAGE = "pulling_image"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


V = VmState
VM_TRANSITIONS: dict[VmState | None, dict[VmState, str]] = {
    None: {
        V.CREATING: "record written before the cloud is asked for the VM",
    },
    V.CREATING: {
        V.BOOTING: "the cloud accepted the create; the VM is starting",
        V.FAILED: "the create failed (stockout, quota, error), never answered, or left nothing in the cloud",
    },
    V.BOOTING: {
        V.WARM: "booted and its agent answers",
        V.FAILED: "the VM vanished, did not boot, or did not report ready by its deadline",
    },
    V.WARM: {
        V.ASSIGNED: "given to a session",
        V.STOPPING_STANDBY: "idle beyond the warm target: stopped into standby, its disk (image cache) kept",
        V.DELETING: "scale-down, eviction or unhealthy",
        V.FAILED: "the VM vanished (preempted, deleted outside)",
    },
    V.STOPPING_STANDBY: {
        V.STANDBY: "stopped: it bills for its disk alone",
        V.DELETING: "the stop failed or never answered: a VM in an unknown state is not kept",
        V.FAILED: "the VM vanished while stopping",
    },
    V.STANDBY: {
        V.STARTING: "a session (or the warm target) needs it: started, its image cache intact",
        V.DELETING: "standby beyond the pool's standby target, or evicted",
        V.FAILED: "the VM vanished (deleted outside)",
    },
    V.STARTING: {
        V.WARM: "started and its agent answers",
        V.STANDBY: "the start failed with a stockout: the VM stays stopped, its disk kept",
        V.DELETING: "the start failed otherwise, or never answered",
        V.FAILED: "the VM vanished while starting",
    },
    V.ASSIGNED: {
        V.RECYCLING: "the session ended; wipe user data, keep the image cache",
        V.DELETING: "the session ended and the pool deletes used VMs, or the VM is unhealthy",
        V.FAILED: "the VM vanished under its session",
    },
    V.RECYCLING: {
        V.WARM: "wiped: safe for the next user",
        V.DELETING: "the wipe failed or the pool is shrinking: never reuse an unwiped VM",
        V.FAILED: "the VM vanished during the wipe",
    },
    V.DELETING: {
        V.DELETED: "the cloud no longer has it",
        V.FAILED: "the delete failed for good, or never answered; the reconciler retries",
    },
    V.DELETED: {},
    V.FAILED: {
        V.DELETING: "clean up whatever is left of a failed VM",
        V.DELETED: "nothing was left in the cloud",
    },
}

S = SessionState
SESSION_TRANSITIONS: dict[SessionState | None, dict[SessionState, str]] = {
    None: {
        S.QUEUED: "nothing fits now: the pool is at its maximum or stocked out",
        S.PROVISIONING: "a new VM is being created, or a standby VM started, for the session",
        S.PULLING_IMAGE: "a warm VM lacking some layers was assigned (partial hit)",
        S.STARTING: "a warm VM holding the exact image was assigned (warm hit): its notebook starts",
    },
    S.QUEUED: {
        S.PROVISIONING: "capacity came back and a VM is being created",
        S.PULLING_IMAGE: "a VM freed up and lacks some layers",
        S.STARTING: "a VM with the exact image freed up: its notebook starts",
        S.STOPPED: "stopped before it got a VM",
        S.FAILED: "waited longer than the queue allows (sessions.queue_timeout_s)",
    },
    S.PROVISIONING: {
        S.PROVISIONING: "the VM could not be created or started; another is (e.g. in another zone)",
        S.PULLING_IMAGE: "the VM booted and pulls the image (or its launch failed and a warm VM was free)",
        S.STARTING: "a started standby VM held the image, or its launch failed and a warm VM holding it was free",
        S.QUEUED: "the VM could not be created; wait for capacity",
        S.STOPPED: "stopped before the VM was ready; the VM joins the pool",
        S.FAILED: "its VMs failed too many times (decide.sessions.PLACEMENT_ATTEMPTS)",
    },
    S.PULLING_IMAGE: {
        S.STARTING: "every layer is on disk: its notebook starts",
        S.PULLING_IMAGE: "the pull failed; another warm VM pulls the image instead",
        S.PROVISIONING: "the pull failed and no warm VM is left: a new VM is being created",
        S.QUEUED: "the pull failed and nothing is free or can be launched: wait for capacity",
        S.STOPPING: "stopped during the pull",
        S.FAILED: "its VMs failed too many times, or the VM died or was evicted mid-pull",
    },
    S.STARTING: {
        S.RUNNING: "its notebook container runs and its endpoint answers",
        S.STOPPING: "stopped while its notebook started",
        S.FAILED: "its notebook did not start (the runtime's reason), or the VM died, turned unhealthy or was evicted",
    },
    S.RUNNING: {
        S.STOPPING: "stopped by the user, idle timeout or max runtime",
        S.FAILED: "the VM died or turned unhealthy under the session",
    },
    S.STOPPING: {
        S.STOPPED: "the VM is wiped or deleted (or its wipe or delete failed: the session is over all the same)",
    },
    S.STOPPED: {},
    S.FAILED: {},
}

# Running (or about to run) VMs: they count against max_vms and bill at the running price.
VM_ACTIVE = frozenset({V.CREATING, V.BOOTING, V.STARTING, V.WARM, V.ASSIGNED, V.RECYCLING})
# The standby tier: stopped (or being stopped), disk kept, billed for the disk alone.
VM_STANDBY = frozenset({V.STOPPING_STANDBY, V.STANDBY})
SESSION_TERMINAL = frozenset({S.STOPPED, S.FAILED})
# States in which a session holds (or is about to hold) a VM of its pool.
SESSION_HOLDS_VM = frozenset({S.PROVISIONING, S.PULLING_IMAGE, S.STARTING, S.RUNNING, S.STOPPING})


@dataclass(frozen=True, slots=True)
class StateChange:
    state: str
    reason: str
    time: float


def check_transition(table: dict, kind: str, obj_id: str, old, new) -> None:
    if new not in table.get(old, {}):
        allowed = ", ".join(sorted(str(s) for s in table.get(old, {}))) or "none"
        raise IllegalTransition(f"{kind} {obj_id}: {old} -> {new} is not allowed (from {old}: {allowed})")
