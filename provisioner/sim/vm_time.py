"""VM-time of a replay: the fleet's VMs by state, integrated over model time at each change, for
the VM-hours and the cost of each pool.
"""

from __future__ import annotations

from typing import Iterable

from provisioner.model.states import VM_ACTIVE, VmState
from provisioner.model.records import Vm
from provisioner.sim.cost import PoolKey, VmTime

V = VmState
# Billed at the running price: a VM stopping into standby runs until it is stopped.
BILLED_RUNNING = VM_ACTIVE | {V.STOPPING_STANDBY}
# Read at every change: an Enum's attribute lookup goes through its metaclass.
_ASSIGNED, _STANDBY, _DELETED = V.ASSIGNED, V.STANDBY, V.DELETED


class VmMeter:
    def __init__(self, pools: Iterable[PoolKey], spot_pools: Iterable[PoolKey] = ()):
        """`spot_pools`: the pools that may have Spot VMs (a Spot pool, or one with a Spot tier)."""
        self._state: dict[str, VmState] = {}  # each VM not deleted -> its state as last reported
        self.live = 0  # VMs billed at the running price now
        self._assigned = 0
        # Per pool: [running, assigned, standby] VMs now, and their VM-seconds so far; the Spot
        # VMs of a pool that may have them apart.
        self._counts: dict[PoolKey, list[int]] = {key: [0, 0, 0] for key in pools}
        self._seconds: dict[PoolKey, list[float]] = {key: [0.0, 0.0, 0.0] for key in self._counts}
        self._spot_counts: dict[PoolKey, list[int]] = {key: [0, 0, 0] for key in spot_pools}
        self._spot_seconds: dict[PoolKey, list[float]] = {key: [0.0, 0.0, 0.0] for key in self._spot_counts}
        self._pairs = [(self._counts[key], self._seconds[key]) for key in self._counts]  # integrated at every change
        self._pairs += [(self._spot_counts[key], self._spot_seconds[key]) for key in self._spot_counts]
        self._t = 0.0
        self.vm_s = self.assigned_vm_s = 0.0

    def changed(self, cluster: str, vms: Iterable[Vm], now: float) -> None:
        """The VMs' states as of `now` (the time up to it is counted at their previous states)."""
        self.integrate(now)
        known = self._state
        for vm in vms:
            old, new = known.get(vm.id), vm.state
            if old is new:
                continue
            counts = (self._spot_counts if vm.spot else self._counts)[(cluster, vm.pool)]
            was, is_ = old in BILLED_RUNNING, new in BILLED_RUNNING
            self.live += is_ - was
            counts[0] += is_ - was
            assigned = (new is _ASSIGNED) - (old is _ASSIGNED)
            self._assigned += assigned
            counts[1] += assigned
            counts[2] += (new is _STANDBY) - (old is _STANDBY)
            if new is _DELETED:
                known.pop(vm.id, None)
            else:
                known[vm.id] = new

    def integrate(self, now: float) -> None:
        dt = now - self._t
        if dt > 0:
            self.vm_s += self.live * dt
            self.assigned_vm_s += self._assigned * dt
            for (running, assigned, standby), acc in self._pairs:
                if running or standby:
                    acc[0] += running * dt
                    acc[1] += assigned * dt
                    acc[2] += standby * dt
            self._t = now

    def pool_time(self) -> dict[PoolKey, VmTime]:
        """Each pool's VM time; a pool's Spot VMs' time is in its totals and apart."""
        spot = self._spot_seconds
        return {k: VmTime(*v) if k not in spot else VmTime(*(a + b for a, b in zip(v, spot[k])), *spot[k])
                for k, v in self._seconds.items()}
