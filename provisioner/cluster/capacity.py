"""What the capacity stream reports beyond the pools' own counts: assignable VMs by image and
unhealthy VMs, per pool. Kept up to date from the VMs each step changed, so a push reads a few
numbers instead of walking every warm VM and every image it holds."""

from __future__ import annotations

from typing import Iterable

from provisioner.decide.core import ClusterCore
from provisioner.model.records import Vm


class CapacityCounts:
    def __init__(self, core: ClusterCore):
        self.core = core
        # vm id -> (pool, images it could serve now (none unless assignable), unhealthy)
        self._held: dict[str, tuple[str, tuple[str, ...], bool]] = {}
        self.warm_by_image: dict[str, dict[str, int]] = {}  # pool -> image -> assignable VMs holding it
        self.unhealthy: dict[str, int] = {}  # pool -> VMs not healthy

    def recount(self) -> None:
        """From every VM the core holds (after a restore)."""
        self._held.clear()
        self.warm_by_image.clear()
        self.unhealthy.clear()
        self.changed(self.core.vms.values())

    def changed(self, vms: Iterable[Vm]) -> None:
        for vm in vms:
            before = self._held.pop(vm.id, None)
            if before is not None:
                self._add(*before, -1)
            now = self._part(vm)
            if now is not None:
                self._held[vm.id] = now
                self._add(*now, 1)

    def _part(self, vm: Vm) -> tuple[str, tuple[str, ...], bool] | None:
        pool = self.core.pools.get(vm.pool)
        if pool is None or vm.id not in pool.vms:  # deleted, or of a pool no longer configured
            return None
        images = vm.cache.images(self.core.catalog) if vm.id in pool.ready else ()
        return vm.pool, images, not vm.healthy

    def _add(self, pool: str, images: tuple[str, ...], unhealthy: bool, n: int) -> None:
        by_image = self.warm_by_image.setdefault(pool, {})
        for image in images:
            if (count := by_image.get(image, 0) + n) > 0:
                by_image[image] = count
            else:
                del by_image[image]
        if unhealthy:
            self.unhealthy[pool] = self.unhealthy.get(pool, 0) + n
