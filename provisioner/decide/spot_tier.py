"""An on-demand pool's Spot tier (`spot_tier: true`): which VMs a session may take, and how many of
the pool's VMs are Spot. Pure.

Spot VMs cost a fraction of the running price but the cloud may take one back at any time. An
interactive session never runs on one: a preemption ends a user's notebook. A batch session is
queued again when its VM is preempted (and runs what it had left), so it may: it takes a warm
Spot VM holding its image, else an on-demand one holding it (a batch session waiting for a Spot
VM would be a slow start, and the pool replaces the on-demand VM it took), else the VM missing
the fewest bytes, Spot first on a tie. A batch session that must wait for a VM to be made or
started gets a Spot one.

The pool's Spot part: with the `predictive` autoscaler, the warm VMs it keeps for all arrivals
less those the interactive arrivals alone call for (`split_warm`); with the others, the batch share
of recent arrivals of its warm VMs (rounded down: an on-demand VM serves either kind). New VMs go
to the Spot part up to its shortfall, and scale-down takes the Spot VMs over their part first.
"""

from __future__ import annotations

from typing import Callable, Iterable

from provisioner.decide.assignment import Choice, choose_standby, choose_vm
from provisioner.decide.forecast import Rate
from provisioner.model.images import ImageCatalog
from provisioner.model.records import StartKind, Vm

# The batch share of arrivals forgets with this half-life: the mix of a few hours, so warm Spot VMs
# follow the day's batch submissions without swinging with each burst.
BATCH_SHARE_HALF_LIFE_S = 3 * 3600.0


class BatchShare:
    """The share of batch sessions among a pool's recent arrivals (exponentially decayed)."""

    __slots__ = ("_batch", "_all")

    def __init__(self) -> None:
        self._batch = Rate(BATCH_SHARE_HALF_LIFE_S)
        self._all = Rate(BATCH_SHARE_HALF_LIFE_S)

    def arrival(self, now: float, batch: bool) -> None:
        self._all.add(now)
        self._batch.add(now, 1.0 if batch else 0.0)  # both told at each arrival: they decay alike

    def share(self, now: float) -> float:
        total = self._all.per_s(now)
        return min(1.0, self._batch.per_s(now) / total) if total > 0 else 0.0


def split_warm(all_arrivals: int, interactive: int) -> tuple[int, int]:
    """The pool's warm VMs and the Spot tier's part of them (`predictive`), from the warm VMs the
    forecast of all arrivals asks and those of the interactive arrivals alone: the on-demand ones
    cover the interactive arrivals (those sessions cannot take a Spot VM), the Spot ones the rest.
    Never more than without the tier, unless the interactive arrivals alone ask more."""
    warm = max(all_arrivals, interactive)
    return warm, warm - interactive


def spot_target(wanted: int, batch_share: float) -> int:
    """The pool's VMs to hold on Spot: the batch share of what it wants, rounded down."""
    return int(wanted * batch_share)


def spot_launches(launch: int, spot_active: int, target: int) -> int:
    """Of `launch` VMs to add (started or made), how many Spot ones: up to the Spot part's shortfall."""
    return max(0, min(launch, target - spot_active))


def split_deletions(surplus: int, spot_idle: int, on_demand_idle: int, spot_over: int) -> tuple[int, int]:
    """Of `surplus` idle VMs to let go, how many Spot and how many on-demand ones: the Spot VMs
    over the tier's part (`spot_over`) first, then on-demand ones, then Spot ones if those run out."""
    spot = min(spot_idle, max(0, spot_over), surplus)
    on_demand = min(on_demand_idle, surplus - spot)
    return spot + min(spot_idle - spot, surplus - spot - on_demand), on_demand


def choose_in_tier(image: str, ready: Iterable[Vm], catalog: ImageCatalog, batch: bool) -> Choice:
    """The warm VM a session takes in a pool with a Spot tier (cold: none), by the rules above."""
    if not batch:
        return choose_vm(image, (vm for vm in ready if not vm.spot), catalog)
    ready = list(ready)
    spot = choose_vm(image, (vm for vm in ready if vm.spot), catalog)
    if spot.start is StartKind.WARM and spot.vm_id:
        return spot
    on_demand = choose_vm(image, (vm for vm in ready if not vm.spot), catalog)
    if on_demand.vm_id and (not spot.vm_id or on_demand.missing_bytes < spot.missing_bytes):
        return on_demand
    return spot


def standby_in_tier(image: str, standby: Iterable[Vm], catalog: ImageCatalog, usable: Callable[[Vm], bool],
                    spot: bool, either: bool) -> Vm | None:
    """The stopped VM to start: one of the tier asked for (`spot`), else, if `either`, one of the
    other. An interactive session asks for an on-demand one only; a batch session for a Spot one,
    either; the autoscaler for the tier short of its part, either (a start, about a minute, beats
    a create of either tier)."""
    standby = list(standby)
    if (vm := choose_standby(image, (v for v in standby if v.spot == spot), catalog, usable)) is not None:
        return vm
    return choose_standby(image, (v for v in standby if v.spot != spot), catalog, usable) if either else None
