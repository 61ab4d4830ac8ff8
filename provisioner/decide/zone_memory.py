"""Which zones a pool skips after the cloud said no: as far as the failure reaches.

A stockout is one zone's (Karpenter's 3 minutes), and its hint of the zones that have the shape
now steers the next attempt there: the pool's other zones, not named, are skipped as well. A quota
is not a zone's: a regional one (NVIDIA_T4_GPUS in us-central1) refuses every zone of the region,
so every pool of that GPU in this cluster (one cluster is one region) skips all its zones; a
project-wide one (GPUS_ALL_REGIONS) refuses every pool. A quota does not come back in minutes
(someone must raise it or free GPUs), so it is remembered longer.

A project-wide quota is every cluster's (one project, every region): what one cluster learns, the
fronts relay to the others (ProjectQuota, ClusterService.SetProjectQuota), which hold it alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from provisioner.cloud.base import CloudFailure
from provisioner.decide.autoscale import STOCKOUT_MEMORY_S
from provisioner.decide.pools import PoolState

QUOTA_MEMORY_S = 900.0


@dataclass(frozen=True, slots=True)
class ProjectQuota:
    """The project-wide GPU quota found exhausted: no cluster inserts or starts a GPU VM until
    `until` (the fleet's clock), when it may have been freed."""
    until: float
    metric: str  # as the cloud named it (GPUS_ALL_REGIONS)
    cluster: str  # whose insert was refused


def project_quota_of(failure: CloudFailure, cluster: str, now: float) -> ProjectQuota | None:
    """The project-wide quota `failure` says is exhausted, or None (not a project-wide quota)."""
    if failure.code != "quota" or failure.scope != "project":
        return None
    return ProjectQuota(now + QUOTA_MEMORY_S, failure.metric or "GPUS_ALL_REGIONS", cluster)


def told(quota: ProjectQuota, now: float) -> ProjectQuota:
    """A quota another cluster learned, as this one holds it: never longer than the memory from
    now (a front's word is not a licence to stop the fleet for longer)."""
    if quota.until <= now + QUOTA_MEMORY_S:
        return quota
    return ProjectQuota(now + QUOTA_MEMORY_S, quota.metric, quota.cluster)


def hold_project_quota(pools: Mapping[str, PoolState], quota: ProjectQuota) -> None:
    """Every pool skips every zone until the quota may have been freed."""
    for pool in pools.values():
        _skip(pool, pool.config.zones, quota.until)


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
