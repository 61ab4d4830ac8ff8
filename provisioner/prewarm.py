"""Which images idle warm VMs should pull, so the warm pool's image mix follows demand. Pure.

A VM's disk caches many versions (consecutive versions share most layers), so one warm VM can
serve several images exactly. Each image with recent demand gets a target number of idle warm VMs
holding it, in proportion to its share of demand (at least one while it is wanted at all); the
plan pulls under-covered images onto the VMs where that is cheapest and costs least coverage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from provisioner.images import ImageCatalog

# Images whose decayed demand is below this get no target: nobody uses them any more, and their
# layers are left for the disk's LRU eviction to drop.
MIN_DEMAND = 0.2


@dataclass(frozen=True, slots=True)
class IdleVm:
    id: str
    layer_ids: frozenset[str]
    images: frozenset[str]  # versions fully on disk
    free_bytes: int


def targets(demand: Mapping[str, float], idle: int) -> dict[str, int]:
    """Idle warm VMs that should hold each image: demand share of the idle pool, at least one."""
    wanted = {i: d for i, d in demand.items() if d >= MIN_DEMAND}
    total = sum(wanted.values())
    if not wanted or idle <= 0:
        return {}
    return {i: max(1, math.ceil(idle * d / total)) for i, d in wanted.items()}


def plan_prewarm(idle: Sequence[IdleVm], demand: Mapping[str, float], catalog: ImageCatalog,
                 max_pulls: int) -> list[tuple[str, str]]:
    """Up to `max_pulls` (vm_id, image) pulls, the most under-covered demanded images first.

    For each, the VM missing the fewest bytes, preferring VMs with room on disk (nothing useful
    evicted) and never one whose images would fall below their own target.
    """
    goal = targets(demand, len(idle))
    have = {i: sum(1 for vm in idle if i in vm.images) for i in goal}
    busy: set[str] = set()
    plan: list[tuple[str, str]] = []
    while len(plan) < max_pulls:
        short = [(have[i] - goal[i], -demand[i], i) for i in goal if have[i] < goal[i]]
        if not short:
            break
        _, _, image = min(short)
        best = None
        for vm in idle:
            if vm.id in busy or image in vm.images:
                continue
            missing = catalog.missing_bytes(image, vm.layer_ids)
            evicts = missing > vm.free_bytes
            # Evicting could drop an image that is at or below its target: not worth it.
            if evicts and any(have.get(i, 0) <= goal.get(i, 0) for i in vm.images if i in goal):
                continue
            key = (evicts, missing, vm.id)
            if best is None or key < best[0]:
                best = (key, vm)
        if best is None:
            goal.pop(image)  # no VM can take it this round
            continue
        vm = best[1]
        busy.add(vm.id)
        have[image] += 1
        plan.append((vm.id, image))
    return plan
