"""The cluster core's pools: counts kept as VMs change, and autoscaling (which images idle VMs hold is
decide/prewarming.py's).

Part of ClusterCore (provisioner/decide/core.py), split out by concern; pure like the rest.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from provisioner.config import PoolConfig
from provisioner.decide.autoscale import (
    PREDICTIVE_STABILIZATION_S,
    SCALE_DOWN_IDLE_S,
    STABILIZATION_S,
    STANDBY_HOLD_S,
    PoolSnapshot,
    WindowMax,
    desired_vms,
    pick_deletions,
    plan_scale,
    standby_target,
)
from provisioner.decide.assignment import QueueOrder, choose_standby
from provisioner.decide.deadlines import CREATE_ESTIMATE_S
from provisioner.decide.forecast import Forecast
from provisioner.decide.prewarm import Demand
from provisioner.model.states import VM_ACTIVE, VmState
from provisioner.model.errors import NotFound, quote
from provisioner.model.records import Vm

V = VmState
# Read on every tick: an Enum's attribute lookup (V.WARM) goes through its metaclass's __getattr__.
_WARM, _CREATING, _BOOTING, _STARTING, _ASSIGNED, _RECYCLING = (
    V.WARM, V.CREATING, V.BOOTING, V.STARTING, V.ASSIGNED, V.RECYCLING)
_STANDBY, _STOPPING_STANDBY = V.STANDBY, V.STOPPING_STANDBY

# How often the image ranking is recomputed from the decaying demand.
RANKING_REFRESH_S = 300.0
# Idle VMs re-follow the ranking when its set of images changes or its order changes among the
# first few (what a fresh VM pulls first); reshuffles further down are not worth a rescan.
RANKING_ORDER_MATTERS = 3
# How often the predictive autoscaler redoes its forecast.
FORECAST_REFRESH_S = 60.0
# With a standby tier, the warm VMs bridge a standby start of up to this many times its median
# (about the 94th percentile of the start's lognormal at sigma 0.6); a session that arrives later
# in a longer start waits for it. Chosen on openb, rollout and genai at --scale 50: at 4 (the
# start's p99, the deadline's multiple) every trace paid for 99.9% fast starts and openb 1.16x
# its assigned cost; at 2 rollout's fast starts fell to 99.59% (docs/simulator.md: Results).
STANDBY_START_COVER = 2.5
# A pool whose VMs and queue did not change is reconsidered this often (for what only time
# changes: VMs idle long enough to go, the peak window, the forecast).
AUTOSCALE_QUIET_S = 30.0


def forecast_due(now: float, forecast_at: float, forecast_warm: int, ready: int) -> bool:
    """The forecast is redone every FORECAST_REFRESH_S, and at once when a burst has taken every
    warm VM it kept: the recent rate already counts the burst's arrivals, so the redone forecast
    wants more VMs and the autoscaler starts standby VMs for the burst's next sessions now."""
    if now - forecast_at >= FORECAST_REFRESH_S:
        return True
    return ready == 0 and forecast_warm > 0 and now > forecast_at


@dataclass
class PoolState:
    """One pool's VMs and queue, with counts and indexes kept as VMs change (read every tick)."""

    config: PoolConfig  # as the config file has it
    policy: PoolConfig  # as operators left it: the file's, with their overrides
    # Dicts, not sets: iteration follows insertion, so runs are the same in every process.
    vms: dict[str, Vm] = field(default_factory=dict)  # every VM of the pool not yet deleted
    queue: dict[str, None] = field(default_factory=dict)  # queued session ids
    order: QueueOrder = field(default_factory=QueueOrder)  # the queue's order, kept between changes
    ready: dict[str, Vm] = field(default_factory=dict)  # assignable: warm and healthy
    standby: dict[str, Vm] = field(default_factory=dict)  # stopped, startable
    count: dict[VmState, int] = field(default_factory=lambda: defaultdict(int))  # VMs by state
    per_zone: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    stocked_out_until: dict[str, float] = field(default_factory=dict)
    demand: Demand = field(default_factory=Demand)
    peak: WindowMax = field(default_factory=lambda: WindowMax(STABILIZATION_S))  # of VMs wanted
    day_peak: WindowMax = field(default_factory=lambda: WindowMax(STANDBY_HOLD_S))  # of VMs wanted
    forecast: Forecast = field(default_factory=Forecast)
    forecast_warm: int = 0
    forecast_cover: int = 0  # warm and standby VMs together, for what arrives over a new VM's lead time
    forecast_at: float = -FORECAST_REFRESH_S
    changed: bool = True  # VMs or queue changed since the autoscaler last looked
    scaled_at: float = -AUTOSCALE_QUIET_S
    ranking: tuple[str, ...] = ()  # images idle VMs should hold, best first (prewarm.holdable)
    keep_layers: frozenset[str] = frozenset()  # their layers, spared by eviction while others exist
    ranking_gen: int = 0  # bumped when idle VMs must re-follow the ranking
    ranking_at: float = -RANKING_REFRESH_S

    def count_in(self, vm: Vm) -> None:
        self.changed = True
        self.vms[vm.id] = vm
        self.count[vm.state] += 1
        self.per_zone[vm.zone] += 1
        if vm.state is V.WARM and vm.healthy:
            self.ready[vm.id] = vm
        elif vm.state is V.STANDBY:
            self.standby[vm.id] = vm

    def count_out(self, vm: Vm) -> None:
        self.changed = True
        del self.vms[vm.id]
        self.count[vm.state] -= 1
        self.per_zone[vm.zone] -= 1
        self.ready.pop(vm.id, None)
        self.standby.pop(vm.id, None)

    @property
    def total(self) -> int:
        return sum(self.count[state] for state in VM_ACTIVE)

    @property
    def standby_total(self) -> int:
        count = self.count
        return count[_STANDBY] + count[_STOPPING_STANDBY]


class Pools:
    """ClusterCore's pool side: scaling, operators' pool actions, estimates."""

    # ---- reads ---------------------------------------------------------------------------

    def pool(self, name: str) -> PoolState:
        if name not in self.pools:
            raise NotFound(f"cluster {self.name} has no pool {quote(name)}", field="pool")
        return self.pools[name]

    def snapshot(self, pool: PoolState) -> PoolSnapshot:
        c, p = pool.count, pool.policy
        return PoolSnapshot(  # by position, in PoolSnapshot's order: made for every pool every tick
            c[_WARM], c[_CREATING] + c[_BOOTING] + c[_STARTING], c[_ASSIGNED], c[_RECYCLING], len(pool.queue),
            p.min_vms, p.max_vms, p.headroom_fraction, p.autoscaler, p.warm_vms, pool.forecast_warm, p.standby,
            pool.standby_total, pool.forecast_cover, self._queued_demand(pool))

    def assignable(self, pool: PoolState) -> list[Vm]:
        """Assignable VMs: warm and healthy, even while a prewarm pull runs (a session beats it)."""
        return list(pool.ready.values())

    def cold_start_s(self) -> float:
        return self._cold_start_s(self.catalog.latest)

    def _bandwidth(self) -> float:
        return self.config.sim.pull_bytes_per_s

    def _start_estimate_s(self, pool: PoolState) -> float:
        """A standby VM's start, its median (the core's estimate, like boot_s for a create)."""
        sim = self.config.sim
        return sim.pool_start_median_s.get(pool.config.name, sim.start_median_s)

    def _cold_start_s(self, image: str) -> float:
        return CREATE_ESTIMATE_S + self.config.sim.boot_s + self.catalog.size_bytes(image) / self._bandwidth()

    # ---- scaling -------------------------------------------------------------------------

    def _tick_pools(self, now: float) -> None:
        for pool in self.pools.values():
            if now - pool.ranking_at >= RANKING_REFRESH_S:
                self.prewarming.refresh_ranking(pool, now)
            if pool.queue:
                self._dispatch_queue(pool, now)
            if pool.changed or pool.queue or now - pool.scaled_at >= AUTOSCALE_QUIET_S:
                self._autoscale(pool, now)

    def _autoscale(self, pool: PoolState, now: float) -> None:
        pool.changed, pool.scaled_at = False, now
        policy = pool.policy
        due = forecast_due(now, pool.forecast_at, pool.forecast_warm, len(pool.ready))
        if policy.autoscaler == "predictive" and due:
            self._forecast(pool, now)
        snap = self.snapshot(pool)
        pool.peak.window_s = PREDICTIVE_STABILIZATION_S if policy.autoscaler == "predictive" else STABILIZATION_S
        wanted = desired_vms(snap)
        hold = pool.peak.add(now, wanted)
        # An upper bound on the VMs idle long enough: the real list is made only to delete some.
        plan = plan_scale(snap, hold, len(pool.ready))
        launch = plan.launch
        # Standby VMs first: running in under a minute, their disks holding the pool's images.
        image = pool.ranking[0] if pool.ranking else self.catalog.latest
        while launch > 0 and self._can_start(pool):
            vm = choose_standby(image, pool.standby.values(), self.catalog,
                                lambda v: pool.stocked_out_until.get(v.zone, 0.0) <= now)
            if vm is None:
                break
            self._start(vm, now)
            launch -= 1
        for _ in range(launch):
            if self._launch(pool, now, images=pool.ranking[:1]) is None:
                break
        keep = standby_target(snap, pool.day_peak.add(now, wanted)) if policy.standby else 0
        if plan.delete:
            # A prewarm under way does not save a surplus VM.
            idle = [vm for vm in pool.ready.values() if now - vm.warm_since >= SCALE_DOWN_IDLE_S]
            stopping = pool.standby_total
            for vm in pick_deletions(idle, plan.delete, lambda v: self.prewarming.held_of_ranking(pool, v)):
                if stopping < keep:  # the most valuable surplus VMs are kept last: stop them
                    self._to_standby(vm, "scale-down: surplus warm VM kept stopped", now)
                    stopping += 1
                else:
                    self._delete(vm, "scale-down: surplus warm VM", now)
        if (extra := len(pool.standby) - keep) > 0:
            for vm in pick_deletions(list(pool.standby.values()), extra, lambda v: self.prewarming.held_of_ranking(pool, v)):
                self._delete(vm, "standby beyond the pool's standby target", now)

    def _forecast(self, pool: PoolState, now: float) -> None:
        """The warm VMs that cover what arrives while a VM is made ready, and (with a standby
        tier) the warm and standby VMs together that cover what arrives while a new one is."""
        policy = pool.policy
        cold_s = self._cold_start_s(pool.ranking[0] if pool.ranking else self.catalog.latest)
        cover = pool.forecast.warm_needed(now, cold_s, policy.wait_probability)
        if policy.standby:
            # A started standby VM is ready after its start (its disk holds the pool's images);
            # the start's tail is what the warm VMs must bridge.
            warm = pool.forecast.warm_needed(now, self._start_estimate_s(pool) * STANDBY_START_COVER,
                                             policy.wait_probability)
            pool.forecast_warm = max(warm, cover - len(pool.standby))
        else:
            pool.forecast_warm = cover
        pool.forecast_cover = cover
        pool.forecast_at = now

    def _set_policy(self, name: str, policy: PoolConfig) -> PoolConfig:
        pool = self.pool(name)
        pool.policy = policy
        pool.changed = True
        return policy
