"""Pricing a replay's VM time: running at the pool's price, stopped at its disk's, assigned apart."""

from __future__ import annotations

import pytest

from provisioner.config import load_fleet
from provisioner.sim.cost import Price, VmTime, costs, prices

H = 3600.0
P100, T4 = ("us-central1", "gpu-p100"), ("europe-west4", "gpu-t4x2")
PRICE = {P100: Price(1.87, 0.03), T4: Price(1.57, 0.03)}


def test_running_standby_and_assigned_time_at_their_prices():
    out = costs({P100: VmTime(running_s=10 * H, assigned_s=8 * H, standby_s=100 * H),
                 T4: VmTime(running_s=2 * H, assigned_s=2 * H)}, PRICE)
    assert out == {"cost_usd": round(18.7 + 3.0 + 3.14, 2), "assigned_cost_usd": round(14.96 + 3.14, 2),
                   "standby_vm_hours": 100.0, "standby_cost_usd": 3.0}


def test_a_stopped_vm_costs_about_a_sixtieth_of_a_running_one_in_the_shipped_fleet():
    shipped = prices(load_fleet(None))
    assert {key[1] for key in shipped} == {"gpu-p100", "gpu-t4x2"} and len(shipped) == 6
    day = {key: VmTime(running_s=24 * H) for key in shipped}
    day_stopped = {key: VmTime(standby_s=24 * H) for key in shipped}
    ratio = costs(day, shipped)["cost_usd"] / costs(day_stopped, shipped)["cost_usd"]
    assert 45 < ratio < 75


def test_nothing_costs_nothing_and_bad_time_or_a_missing_price_is_refused():
    assert costs({}, PRICE) == {"cost_usd": 0.0, "assigned_cost_usd": 0.0, "standby_vm_hours": 0.0,
                                "standby_cost_usd": 0.0}
    with pytest.raises(ValueError, match="gpu-p100"):
        costs({P100: VmTime(running_s=H, assigned_s=2 * H)}, PRICE)
    with pytest.raises(ValueError):
        costs({P100: VmTime(standby_s=-1.0)}, PRICE)
    with pytest.raises(KeyError):
        costs({("asia-east1", "gpu-p100"): VmTime(running_s=H)}, PRICE)
