"""Which zones a pool skips after the cloud said no: as far as the failure reaches.

A stockout is one zone's (Karpenter's 3 minutes), and its hint of the zones that have the shape
now steers the next attempt there: the pool's other zones, not named, are skipped as well. A quota
is not a zone's: a regional one (NVIDIA_T4_GPUS in us-central1) refuses every zone of the region,
so every pool of that GPU in this cluster (one cluster is one region) skips all its zones; a
project-wide one (GPUS_ALL_REGIONS) refuses every pool. A quota does not come back in minutes
(someone must raise it or free GPUs), so it is remembered longer.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from provisioner.cloud.base import CloudFailure
from provisioner.decide.autoscale import STOCKOUT_MEMORY_S
from provisioner.decide.pools import PoolState

QUOTA_MEMORY_S = 900.0


def _skip(pool: PoolState, zones: Iterable[str], until: float) -> None:
    for zone in zones:
        pool.stocked_out_until[zone] = max(pool.stocked_out_until.get(zone, 0.0), until)


def remember(pools: Mapping[str, PoolState], pool: PoolState, failure: CloudFailure, zone: str, now: float) -> None:
    """Records a stockout or quota failure of `pool` in `zone` (the cloud's word on where first)."""
    zone = failure.zone or zone
    if failure.code == "quota" and failure.scope != "zone":
        until = now + QUOTA_MEMORY_S
        for other in pools.values():
            if failure.scope == "project" or not failure.shared_by or other.config.accelerator == failure.shared_by:
                _skip(other, other.config.zones, until)
        return
    until = now + STOCKOUT_MEMORY_S
    _skip(pool, (zone,), until)
    if failure.zones_available:
        _skip(pool, (z for z in pool.config.zones if z not in failure.zones_available), until)
