"""Spot capacity in a replay: every pool's VMs as Spot VMs (`with_spot`), or every pool with a
Spot tier for its batch sessions (`with_spot_tier`, decide/spot_tier.py), preempted at a given rate.

What Spot saves is the discount on the running price (`spot_price_fraction`, the disk billed in
full); what it costs is the sessions a preemption ends (an interactive one ends, a batch one is
queued again and runs what it had left) and the VMs made again after it.
"""

from __future__ import annotations

from provisioner.config import FleetConfig


def with_spot(fleet: FleetConfig, preemptions_per_hour: float | None) -> FleetConfig:
    """The fleet with every pool on Spot VMs preempted at `preemptions_per_hour` (None: unchanged)."""
    return _every_pool(fleet, preemptions_per_hour, {"provisioning_model": "spot"})


def with_spot_tier(fleet: FleetConfig, preemptions_per_hour: float | None) -> FleetConfig:
    """The fleet with a Spot tier in every pool, its VMs preempted at `preemptions_per_hour`
    (None: unchanged)."""
    return _every_pool(fleet, preemptions_per_hour, {"provisioning_model": "standard", "spot_tier": True})


def _every_pool(fleet: FleetConfig, preemptions_per_hour: float | None, update: dict) -> FleetConfig:
    if preemptions_per_hour is None:
        return fleet
    update = {**update, "spot_preemptions_per_hour": preemptions_per_hour}
    clusters = tuple(c.model_copy(update={"pools": tuple(p.model_copy(update=update) for p in c.pools)})
                     for c in fleet.clusters)
    return fleet.model_copy(update={"clusters": clusters})
