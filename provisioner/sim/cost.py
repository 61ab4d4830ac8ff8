"""What a replay's VM time costs, per pool and for the fleet: a pure function of VM-seconds and
the pools' prices, so every report prices time the same way.

A running VM (booting, warm, assigned, recycling) bills at its pool's `hourly_price_usd` (a Spot
pool's at its discount: `running_usd_per_h`), a
stopped one (the standby tier) at its `disk_hourly_price_usd`. `assigned_cost_usd` is what the
time sessions held their VMs costs: the floor every policy pays, to which `cost_usd` compares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from provisioner.config import FleetConfig

HOUR_S = 3600.0

PoolKey = tuple[str, str]  # (cluster, pool)


@dataclass(frozen=True, slots=True)
class Price:
    running_usd_per_h: float
    stopped_usd_per_h: float


@dataclass(frozen=True, slots=True)
class VmTime:
    """One pool's VM-seconds over a replay."""

    running_s: float = 0.0  # billed at the running price, assigned time included
    assigned_s: float = 0.0  # of the running time, held by sessions
    standby_s: float = 0.0  # stopped, billed for the disk alone


def prices(fleet: FleetConfig) -> dict[PoolKey, Price]:
    return {(c.name, p.name): Price(p.running_usd_per_h, p.disk_hourly_price_usd) for c in fleet.clusters for p in c.pools}


def costs(time: Mapping[PoolKey, VmTime], price: Mapping[PoolKey, Price]) -> dict[str, float]:
    """The fleet's cost in USD and standby VM-hours, from each pool's VM time and price. `cost_usd`
    includes the standby tier; a pool with time but no price is an error, not free."""
    running = assigned = standby = standby_h = 0.0
    for key, t in time.items():
        if t.assigned_s > t.running_s or min(t.running_s, t.assigned_s, t.standby_s) < 0:
            raise ValueError(f"{key[0]}/{key[1]}: need 0 <= assigned_s <= running_s and standby_s >= 0, got {t}")
        p = price[key]
        running += t.running_s / HOUR_S * p.running_usd_per_h
        assigned += t.assigned_s / HOUR_S * p.running_usd_per_h
        standby += t.standby_s / HOUR_S * p.stopped_usd_per_h
        standby_h += t.standby_s / HOUR_S
    return {"cost_usd": round(running + standby, 2), "assigned_cost_usd": round(assigned, 2),
            "standby_vm_hours": round(standby_h, 3), "standby_cost_usd": round(standby, 2)}
