"""A replayed session that never ran is counted by what it waited for, in classes an operator can
act on, and the classes do not name users, VMs or sizes (they are keys of a count)."""

from __future__ import annotations

from provisioner.model.records import Session, SessionSpec, StartKind
from provisioner.model.states import SessionState as S
from provisioner.model.states import StateChange
from provisioner.sim.never_started import cause

IMAGE_BYTES = 25_000_000_000


def ended(*steps: tuple[S, str], pulled: int = 0, start: StartKind | None = None) -> Session:
    s = Session(id="c.s-001", spec=SessionSpec(request_id="r1", user_id="u7", accelerator="p", image="gpu:v160"),
                cluster="c", pool="p", image="gpu:v160", created_at=0.0, idle_timeout_s=3600.0,
                max_runtime_s=86400.0, start=start, pull_bytes_total=pulled)
    s.history = [StateChange(state, why, float(t)) for t, (state, why) in enumerate(steps)]
    s.state, s.reason = steps[-1]
    return s


def test_a_pull_of_most_of_the_image_is_told_from_a_few_missing_layers():
    most = ended((S.PULLING_IMAGE, "pulling 7 layers (24.1 GB) on VM vm-1"), (S.STOPPING, "the user is done"),
                 (S.STOPPED, "the user is done"), pulled=24_100_000_000, start=StartKind.PARTIAL)
    few = ended((S.PULLING_IMAGE, "pulling 2 layers (3.0 GB) on VM vm-2"), (S.STOPPED, "the user is done"),
                pulled=3_000_000_000, start=StartKind.PARTIAL)
    assert cause(most, IMAGE_BYTES) == ("pulling its image onto a VM that held little of it (a VM still filling "
                                        "its disk); ended: the user is done")
    assert cause(few, IMAGE_BYTES).startswith("pulling the layers its warm VM lacked")


def test_waits_for_a_vm_say_which_kind_of_vm():
    standby = ended((S.PROVISIONING, "starting standby VM vm-3 in zone-a"), (S.STOPPED, "the user is done"))
    new = ended((S.PROVISIONING, "creating VM vm-4 in zone-b"), (S.STOPPED, "the user is done"),
                start=StartKind.COLD)
    assert cause(standby, IMAGE_BYTES).startswith("waiting for a standby VM to start")
    assert cause(new, IMAGE_BYTES).startswith("waiting for a new VM")


def test_queued_sessions_are_told_apart_by_what_held_them_without_naming_the_user():
    ceiling = ended((S.QUEUED, "waiting for one of its user's sessions to end: user 'u7' holds the pool's "
                               "per-user ceiling of 2 VMs"), (S.STOPPED, "the user is done"))
    full = ended((S.QUEUED, "waiting for capacity: the pool is at its maximum of 600 VMs"),
                 (S.STOPPED, "the user is done"))
    stockout = ended((S.QUEUED, "waiting for capacity: every zone of the pool is stocked out"),
                     (S.STOPPED, "the user is done"))
    failed = ended((S.QUEUED, "VM creation failed in zone-a (quota); waiting for capacity"),
                   (S.STOPPED, "the user is done"))
    preempting = ended((S.QUEUED, "waiting for 2 preempted sessions to give back their GPUs (grace period 120 s)"),
                       (S.STOPPED, "the user is done"))
    assert cause(ceiling, IMAGE_BYTES) == "queued: its user held the pool's per-user ceiling; ended: the user is done"
    assert cause(full, IMAGE_BYTES).startswith("queued: the pool at its maximum (max_vms)")
    assert cause(stockout, IMAGE_BYTES).startswith("queued: every zone of the pool stocked out")
    assert cause(failed, IMAGE_BYTES).startswith("queued: its VM's create or start failed")
    assert cause(preempting, IMAGE_BYTES).startswith("queued: waiting for preempted sessions")
    assert not any("u7" in cause(s, IMAGE_BYTES) for s in (ceiling, full, stockout, failed, preempting))
