"""What a replay's VM time costs, per pool and for the fleet: a pure function of VM-seconds and
the pools' prices, so every report prices time the same way.

A running VM (booting, warm, assigned, recycling) bills at its pool's `hourly_price_usd`, a Spot
VM (a Spot pool's, or its Spot tier's) at its discount (`spot_usd_per_h`), a stopped one (the
standby tier) at its `disk_hourly_price_usd`. `assigned_cost_usd` is what the time sessions held
their VMs costs, each VM at its own price (a session on a Spot VM at the Spot price): the floor
every policy pays, to which `cost_usd` compares.
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
    spot_usd_per_h: float = 0.0  # a running Spot VM (a Spot pool's or its Spot tier's)
    on_demand_usd_per_h: float = 0.0  # a running on-demand VM: what any VM's time costs without Spot


@dataclass(frozen=True, slots=True)
class VmTime:
    """One pool's VM-seconds over a replay."""

    running_s: float = 0.0  # billed at the running price, assigned time included
    assigned_s: float = 0.0  # of the running time, held by sessions
    standby_s: float = 0.0  # stopped, billed for the disk alone
    # Of each, the Spot VMs' (billed running at the Spot price).
    spot_running_s: float = 0.0
    spot_assigned_s: float = 0.0
    spot_standby_s: float = 0.0


def prices(fleet: FleetConfig) -> dict[PoolKey, Price]:
    return {(c.name, p.name): Price(p.running_usd_per_h, p.disk_hourly_price_usd, p.spot_usd_per_h, p.hourly_price_usd)
            for c in fleet.clusters for p in c.pools}


def costs(time: Mapping[PoolKey, VmTime], price: Mapping[PoolKey, Price]) -> dict[str, float]:
    """The fleet's cost in USD and standby VM-hours, from each pool's VM time and price. `cost_usd`
    includes the standby tier; a pool with time but no price is an error, not free."""
    running = assigned = standby = standby_h = 0.0
    for key, t in time.items():
        if t.assigned_s > t.running_s or min(t.running_s, t.assigned_s, t.standby_s) < 0:
            raise ValueError(f"{key[0]}/{key[1]}: need 0 <= assigned_s <= running_s and standby_s >= 0, got {t}")
        p = price[key]
        if t.spot_running_s:  # Spot VMs at the Spot price, the others at the pool's running price
            running += _split(t.running_s, t.spot_running_s, p)
            assigned += _split(t.assigned_s, t.spot_assigned_s, p)
        else:
            running += t.running_s / HOUR_S * p.running_usd_per_h
            assigned += t.assigned_s / HOUR_S * p.running_usd_per_h
        standby += t.standby_s / HOUR_S * p.stopped_usd_per_h
        standby_h += t.standby_s / HOUR_S
    return {"cost_usd": round(running + standby, 2), "assigned_cost_usd": round(assigned, 2),
            "standby_vm_hours": round(standby_h, 3), "standby_cost_usd": round(standby, 2)}


def _split(total_s: float, spot_s: float, p: Price) -> float:
    return (total_s - spot_s) / HOUR_S * p.running_usd_per_h + spot_s / HOUR_S * p.spot_usd_per_h


def spot_costs(time: Mapping[PoolKey, VmTime], price: Mapping[PoolKey, Price]) -> dict:
    """Where Spot VMs ran: their VM-hours, the cost by tier (running on demand, running on Spot,
    stopped: together `cost_usd`), and the VM time sessions held priced as if all of it had been
    on on-demand VMs (`assigned_on_demand_cost_usd`: the floor of the same work without Spot).
    Empty when no Spot VM ran, so runs without Spot report what they always did."""
    if not any(t.spot_running_s or t.spot_standby_s for t in time.values()):
        return {}
    h = {"running": 0.0, "assigned": 0.0, "standby": 0.0}
    usd = {"on_demand": 0.0, "spot": 0.0, "standby": 0.0, "assigned_on_demand": 0.0}
    for key, t in time.items():
        p = price[key]
        h["running"] += t.spot_running_s / HOUR_S
        h["assigned"] += t.spot_assigned_s / HOUR_S
        h["standby"] += t.spot_standby_s / HOUR_S
        usd["on_demand"] += (t.running_s - t.spot_running_s) / HOUR_S * p.running_usd_per_h
        usd["spot"] += t.spot_running_s / HOUR_S * p.spot_usd_per_h
        usd["standby"] += t.standby_s / HOUR_S * p.stopped_usd_per_h
        usd["assigned_on_demand"] += t.assigned_s / HOUR_S * p.on_demand_usd_per_h
    return {"spot_vm_hours": round(h["running"], 3), "spot_assigned_vm_hours": round(h["assigned"], 3),
            "spot_standby_vm_hours": round(h["standby"], 3),
            "cost_by_tier_usd": {k: round(usd[k], 2) for k in ("on_demand", "spot", "standby")},
            "assigned_on_demand_cost_usd": round(usd["assigned_on_demand"], 2)}
