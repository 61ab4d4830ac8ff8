"""The cluster core's prewarming: which images each pool's idle VMs should hold (a ranking of the
decaying demand, refreshed now and then), and each idle VM pulling the next it lacks, as far as
its filling went. Pure.
"""

from __future__ import annotations

from typing import Callable, Mapping

from provisioner.decide.pools import RANKING_ORDER_MATTERS, PoolState
from provisioner.decide.prewarm_rules import RECENT_RELEASES, holdable, next_pull, rank_images
from provisioner.model.errors import NotFound, quote
from provisioner.model.images import ImageCatalog
from provisioner.model.records import Vm
from provisioner.model.states import VmState as V


class Prewarming:
    def __init__(self, cluster: str, pools: Mapping[str, PoolState], catalog: Callable[[], ImageCatalog],
                 pull: Callable[[Vm, str, tuple, float], None], demanded: Callable[[PoolState, str, float], None]):
        self._cluster = cluster
        self._pools = pools  # the core's
        self._pull = pull  # pulls an image's missing layers onto an idle VM (decide/vms.py)
        self._demanded = demanded  # counts demand for an image in a pool (decide/sizing.py)
        self._catalog = catalog  # the core's current catalog
        self.catalog_changed()
        # vm id -> (ranking_gen, position in the ranking up to which the VM holds every image).
        self._filled: dict[str, tuple[int, int]] = {}

    def catalog_changed(self) -> None:
        """The versions' order, newest first, for ranking: taken when a new catalog is rolled out."""
        catalog = self._catalog()
        self._age = {v: i for i, v in enumerate(catalog.newest(len(catalog)))}

    def forget(self, vm_id: str) -> None:
        """What the VM holds changed (an eviction) or it is gone: its filling starts again."""
        self._filled.pop(vm_id, None)

    def refresh_ranking(self, pool: PoolState, now: float) -> None:
        """Re-ranks the images idle VMs should hold; when the ranking moved, idle VMs follow it."""
        pool.ranking_at = now
        catalog = self._catalog()
        ranking = holdable(rank_images(pool.demand.wanted(now, catalog.newest(RECENT_RELEASES)), self._age),
                           catalog.sizes_of, pool.config.disk_cache_bytes)
        n = RANKING_ORDER_MATTERS
        if set(ranking) == set(pool.ranking) and ranking[:n] == pool.ranking[:n]:
            return
        pool.ranking = ranking
        pool.keep_layers = frozenset().union(*(catalog.layer_ids(i) for i in ranking))
        pool.ranking_gen += 1
        for vm in _idle_settled(pool):
            self.fill(vm, now)

    def held_of_ranking(self, pool: PoolState, vm: Vm) -> int:
        """How many of the pool's ranked images the VM holds, as far as its filling went."""
        gen, k = self._filled.get(vm.id, (-1, 0))
        return k if gen == pool.ranking_gen else 0

    def fill(self, vm: Vm, now: float) -> None:
        """An idle warm VM pulls the next image its pool wants it to hold, if any."""
        if vm.state is not V.WARM or vm.pulling or vm.session_id or not vm.healthy:
            return
        pool, cache, catalog = self._pools[vm.pool], vm.cache, self._catalog()
        gen, start = self._filled.get(vm.id, (-1, 0))
        k = next_pull(pool.ranking, lambda i: cache.has_image(i, catalog),
                      start if gen == pool.ranking_gen else 0)
        self._filled[vm.id] = (pool.ranking_gen, k)
        if k < len(pool.ranking):
            self._prewarm(vm, pool.ranking[k], now)

    def _prewarm(self, vm: Vm, image: str, now: float) -> None:
        """Pulls an image onto an idle warm VM ahead of demand."""
        if vm.state is not V.WARM or vm.pulling or vm.session_id:
            return
        missing = tuple(vm.cache.missing(image, self._catalog()))
        if missing:
            self._pull(vm, image, missing, now)

    def request(self, name: str, image: str, count: int, now: float) -> list[str]:
        """An operator's prewarm: pulls `image` onto up to `count` idle warm VMs (those missing
        the fewest bytes)."""
        pool = self._pools.get(name)
        if pool is None:
            raise NotFound(f"cluster {self._cluster} has no pool {quote(name)}", field="pool")
        catalog = self._catalog()
        version = catalog.resolve(image)
        have = sum(1 for vm in pool.ready.values() if vm.cache.has_image(version, catalog))
        candidates = sorted((vm for vm in _idle_settled(pool) if not vm.cache.has_image(version, catalog)),
                            key=lambda vm: (catalog.missing_bytes(version, vm.cache.layer_ids), vm.id))
        chosen = candidates[:max(0, count - have)]
        for vm in chosen:
            self._prewarm(vm, version, now)
        self._demanded(pool, version, now)
        return [vm.id for vm in chosen]


def _idle_settled(pool: PoolState) -> list[Vm]:
    """Idle warm VMs with no pull under way: candidates for prewarming and scale-down."""
    return [vm for vm in pool.ready.values() if not vm.pulling]
