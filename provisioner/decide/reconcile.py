"""Records against the cloud's inventory: what to adopt, what is gone, what nobody claims.

Pure. A VM's record is written before the cloud is asked for it, so every VM of ours in the cloud
should have a record, and every live record a VM:

- a record with its VM: adopted as it is (the restored core carries on with it);
- a warm, assigned or recycling record whose VM is gone: lost, the core fails it and any
  session on it; if the VM is there but terminated (it still bills for its disk, and may be
  restarted), the same, and the core deletes it;
- a standby record (stopping, stopped or starting on purpose): adopted while its VM is there,
  terminated or not (a stopped VM is terminated in the cloud's words); lost if it is gone;
- a deleting or failed record whose VM is gone: the delete is done;
- a booting record whose VM is gone (or terminated): lost like a live one; the session waiting
  for it gets another VM;
- a creating record whose VM is not there after `create_grace_s` in that state: lost too (its
  create left nothing); before that, its launch may still be on the way;
- a VM carrying our labels that no live record claims: leaked, deleted once it has been seen
  unclaimed for `grace_s` (in case a record and the inventory were read a moment apart);
- a failed record whose VM is still there: its delete is retried.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from provisioner.cloud.base import CloudVm
from provisioner.model.records import Vm
from provisioner.model.states import VmState

V = VmState
LIVE = frozenset({V.BOOTING, V.WARM, V.ASSIGNED, V.RECYCLING})
ENDING = frozenset({V.DELETING, V.FAILED})
# Stopped on purpose, or on the way to or from it: "terminated" is expected, not a loss.
STOPPED = frozenset({V.STOPPING_STANDBY, V.STANDBY, V.STARTING})
GRACE_S = 60.0
# A create's VM is in the cloud's inventory within seconds of the insert being accepted.
CREATE_GRACE_S = 300.0


@dataclass(frozen=True)
class Plan:
    adopted: list[str] = field(default_factory=list)  # records whose VM is there
    lost: list[str] = field(default_factory=list)  # live records whose VM is gone
    terminated: list[str] = field(default_factory=list)  # live records whose VM is there, terminated
    preempted: frozenset[str] = frozenset()  # of those, the Spot VMs: the cloud took them back
    deleted: list[str] = field(default_factory=list)  # ending records whose VM is gone
    retry_delete: list[str] = field(default_factory=list)  # failed records whose VM is still there
    strays: list[CloudVm] = field(default_factory=list)  # unclaimed long enough: delete
    # Unclaimed VMs not yet old enough, with when each was first seen unclaimed.
    unclaimed_since: dict[str, float] = field(default_factory=dict)

    @property
    def changes(self) -> int:
        return len(self.lost) + len(self.terminated) + len(self.deleted) + len(self.retry_delete) + len(self.strays)


def reconcile(records: Iterable[Vm], cloud: Iterable[CloudVm], now: float,
              unclaimed_since: dict[str, float] | None = None, grace_s: float = GRACE_S,
              create_grace_s: float = CREATE_GRACE_S) -> Plan:
    cloud = list(cloud)
    present = {c.vm_id for c in cloud if c.status != "terminated"}
    terminated = {c.vm_id for c in cloud if c.status == "terminated"}
    plan = Plan(preempted=frozenset(c.vm_id for c in cloud if c.status == "terminated" and c.spot))
    claimed = set()
    for vm in records:
        if vm.state is V.DELETED:
            continue
        claimed.add(vm.id)
        there = vm.id in present
        if vm.state in STOPPED:
            (plan.adopted if there or vm.id in terminated else plan.lost).append(vm.id)
        elif vm.state in LIVE:
            (plan.adopted if there else plan.terminated if vm.id in terminated else plan.lost).append(vm.id)
        elif vm.state in ENDING and not there:
            plan.deleted.append(vm.id)
        elif vm.state is V.FAILED:
            plan.retry_delete.append(vm.id)
        elif there:
            plan.adopted.append(vm.id)
        elif vm.state is V.CREATING and now - _since(vm) >= create_grace_s:
            (plan.terminated if vm.id in terminated else plan.lost).append(vm.id)
    seen = unclaimed_since or {}
    for c in cloud:
        if c.vm_id in claimed:
            continue
        since = seen.get(c.vm_id, now)
        if now - since >= grace_s:
            plan.strays.append(c)
        else:
            plan.unclaimed_since[c.vm_id] = since
    return plan


def _since(vm: Vm) -> float:
    """When the record entered its state."""
    return vm.history[-1].time if vm.history else vm.created_at
