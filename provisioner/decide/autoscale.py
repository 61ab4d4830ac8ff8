"""How many VMs a pool should have, and which to let go. Pure functions of a snapshot and `now`."""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

from provisioner.model.records import Vm

# A warm VM must have been idle this long before scale-down may take it (hysteresis).
SCALE_DOWN_IDLE_S = 600.0
# Scale-down goes no lower than the most VMs wanted over this window: a VM let go on a dip comes
# back on the next rise with an empty disk, many minutes of pulls away from useful.
STABILIZATION_S = 3600.0
# The predictive autoscaler sees rises coming, so it can let go of VMs sooner.
PREDICTIVE_STABILIZATION_S = 900.0
# With a standby tier a surplus VM is stopped, not deleted, and is back in about a minute with its
# disk: its stop and start bill about a minute of running (the sim's stop_s and start_median_s),
# so ten minutes idle before stopping it pays ten minutes to save one. It waits this long...
STANDBY_SCALE_DOWN_IDLE_S = 180.0
# ...and the pool goes no lower than the most VMs wanted over this window, long enough to ride out
# the forecast's minute-to-minute noise. Both chosen on the tuning traces (docs/economics.md): 2 and
# 5 minutes cost about 1.5 points less but started fewer of rollout's sessions in time (98.58%
# against 99.11% over the whole trace at --scale 10).
STANDBY_STABILIZATION_S = 450.0
# A stopped VM costs its disk alone (about a fiftieth of a running one): the standby tier keeps
# the VMs the pool wanted at its peak over this window, ready for the next day's peak.
STANDBY_HOLD_S = 86400.0
# A zone that answered "stocked out" or "no quota" is skipped this long (as Karpenter does).
STOCKOUT_MEMORY_S = 180.0


def scale_down_idle_s(standby: bool, filling: bool = False) -> float:
    """How long a warm VM must have been idle before scale-down may take it. One still pulling the
    pool's images (`filling`) waits as long as without the tier: stopped now, it would keep a
    half-filled disk, and a session it is started for later would wait for the rest."""
    return STANDBY_SCALE_DOWN_IDLE_S if standby and not filling else SCALE_DOWN_IDLE_S


def stabilization_s(autoscaler: str, standby: bool) -> float:
    """The window over whose most VMs wanted scale-down holds the pool."""
    window = PREDICTIVE_STABILIZATION_S if autoscaler == "predictive" else STABILIZATION_S
    return min(window, STANDBY_STABILIZATION_S) if standby else window


class PoolSnapshot(NamedTuple):
    """A pool's counts and policy, as the autoscaler reads them (a tuple: made every tick)."""

    warm: int  # idle, ready to assign
    starting: int  # creating or booting
    assigned: int
    recycling: int
    queued: int
    min_vms: int
    max_vms: int
    headroom_fraction: float
    autoscaler: str
    warm_vms: int = 0  # `fixed`: warm VMs kept above demand
    forecast_warm: int = 0  # `predictive`: warm VMs the forecast asks for (forecast.Forecast)
    standby: bool = False  # the pool keeps a standby tier (stopped VMs)
    standby_vms: int = 0  # stopped or stopping
    forecast_cover: int = 0  # `predictive`: warm and standby VMs for what arrives over a new VM's lead time
    queued_demand: int | None = None  # the queued sessions the pool grows for (None: all of them)


class ScalePlan(NamedTuple):
    launch: int = 0
    delete: int = 0


_NOTHING = ScalePlan()  # most looks' plan: made once (a NamedTuple by keyword is made slowly)


def queued_demand(queued: Mapping[str, int], holding: Mapping[str, int], ceiling: int) -> int:
    """Queued sessions counted as demand when no user may hold more than `ceiling` VMs of a pool:
    each user's queued sessions count up to the ceiling less the VMs the user holds (a flooder's
    queue waits for the flooder's own sessions to end instead of growing the pool)."""
    return sum(min(n, max(0, ceiling - holding.get(user, 0))) for user, n in queued.items())


def desired_vms(s: PoolSnapshot) -> int:
    """Demand plus warm VMs, within [min, max]. The policies differ in how many warm VMs:

    fixed       a constant number (warm_vms);
    headroom    a fraction of demand, at least one (the common practice);
    predictive  what the arrival forecast over a new VM's lead time calls for.
    """
    demand = s.assigned + (s.queued if s.queued_demand is None else s.queued_demand)
    if s.autoscaler == "fixed":
        want = demand + s.warm_vms
    elif s.autoscaler == "predictive":
        want = demand + s.forecast_warm
    else:
        want = demand + (max(1, math.ceil(demand * s.headroom_fraction)) if s.headroom_fraction > 0 else 0)
    return max(s.min_vms, min(s.max_vms, want))


def plan_scale(s: PoolSnapshot, hold: int, idle_long_enough: int, want: int | None = None) -> ScalePlan:
    """Launch up to the target now (VMs already starting count); delete surplus idle VMs, but
    only down to `hold`, the most VMs wanted over the stabilization window.

    `idle_long_enough` is how many warm VMs have been idle past scale_down_idle_s(); `want` is
    desired_vms(s), if the caller has it.
    """
    have = s.warm + s.starting + s.assigned + s.recycling
    if want is None:
        want = desired_vms(s)
    if have < want:
        return ScalePlan(want - have, 0)
    surplus = min(have - max(want, min(hold, s.max_vms)), idle_long_enough)
    return ScalePlan(0, surplus) if surplus > 0 else _NOTHING


def standby_target(s: PoolSnapshot, day_peak: int, want: int | None = None) -> int:
    """Stopped VMs to keep: what the pool wanted at its peak over STANDBY_HOLD_S beyond what it
    wants now (`want`, desired_vms(s) if the caller has it), and at least what the forecast's
    cover over a new VM's lead time asks beyond the warm VMs (a burst then starts stopped VMs, not
    new ones). Within max_vms."""
    if not s.standby:
        return 0
    burst = s.forecast_cover - s.forecast_warm if s.autoscaler == "predictive" else 0
    return max(0, min(s.max_vms, max(day_peak - (desired_vms(s) if want is None else want), burst)))


class WindowMax:
    """The maximum of the values seen over the last `window_s` seconds, in O(1) amortized."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()  # decreasing values, increasing times

    def add(self, now: float, value: int) -> int:
        samples = self._samples  # asked twice per pool at every autoscale
        while samples and samples[-1][1] <= value:
            samples.pop()
        samples.append((now, value))
        since = now - self.window_s
        while samples[0][0] < since:
            samples.popleft()
        return samples[0][1]


def pick_deletions(warm: Sequence[Vm], n: int, cache_value: Callable[[Vm], float]) -> list[Vm]:
    """The n least valuable idle VMs: least useful cache first, then longest idle, then id."""
    if n <= 0:
        return []
    return heapq.nsmallest(n, warm, key=lambda vm: (cache_value(vm), vm.warm_since, vm.id))


def pick_zone(zones: Sequence[str], stocked_out_until: Mapping[str, float], vms_per_zone: Mapping[str, int],
              now: float) -> str | None:
    """The usable zone with the fewest of the pool's VMs (spreads risk); None if all stocked out."""
    usable = [z for z in zones if stocked_out_until.get(z, 0.0) <= now]
    if not usable:
        return None
    return min(usable, key=lambda z: (vms_per_zone.get(z, 0), zones.index(z)))


def zones_available(zones: Iterable[str], stocked_out_until: Mapping[str, float], now: float) -> bool:
    return any(stocked_out_until.get(z, 0.0) <= now for z in zones)
