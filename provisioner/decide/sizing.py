"""The cluster core's pools and their sizing: the pools' records (decide/pools.py's PoolState) and
the counts kept in them as VMs change, the estimates made from the pools' settings, the zones
stocked out and the project's GPU quota held, operators' pool policies, and the autoscaler. Pure.

The only writer of the pools' VM counts, indexes, demand and scaling state; the queue of a pool is
the session side's (decide/sessions.py), the images its idle VMs should hold decide/prewarming.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple

from provisioner.cloud.base import CloudFailure
from provisioner.config import ClusterConfig, PoolConfig
from provisioner.decide.assignment import choose_standby
from provisioner.decide.autoscale import (
    PoolSnapshot,
    desired_vms,
    pick_deletions,
    plan_scale,
    scale_down_idle_s,
    stabilization_s,
    standby_target,
    zones_available,
)
from provisioner.decide.deadlines import CREATE_ESTIMATE_S
from provisioner.decide.forecast import Forecast
from provisioner.decide.pools import AUTOSCALE_QUIET_S, RANKING_REFRESH_S, STANDBY_START_COVER, PoolState, forecast_due
from provisioner.decide.spot_tier import (BatchShare, spot_launches, spot_target, split_deletions, split_warm,
                                          standby_in_tier)
from provisioner.decide.zone_memory import ProjectQuota, hold_project_quota, project_quota_of, remember
from provisioner.model.errors import NotFound, quote
from provisioner.model.images import ImageCatalog
from provisioner.model.records import Vm
from provisioner.model.states import VmState

if TYPE_CHECKING:
    from provisioner.decide.prewarming import Prewarming
    from provisioner.decide.vms import Vms

V = VmState
# Read on every tick: an Enum's attribute lookup (V.WARM) goes through its metaclass's __getattr__.
_WARM, _CREATING, _BOOTING, _STARTING, _ASSIGNED, _RECYCLING = (
    V.WARM, V.CREATING, V.BOOTING, V.STARTING, V.ASSIGNED, V.RECYCLING)


class IdleLook(NamedTuple):
    """What a look that asked for nothing read, and the most VMs its windows held to: the next
    look, if all of it is the same, asks for nothing too (Sizing._same_as_last_look)."""
    snap: PoolSnapshot
    ready: int
    standby: int
    wanted: int
    hold: int
    day_hold: int


class Sizing:
    """The pools: what they hold, what they cost in time, and how many VMs each should have."""

    def __init__(self, cluster: ClusterConfig, catalog: Callable[[], ImageCatalog]):
        self._name = cluster.name
        self._sim = cluster.sim  # the estimates' medians (boot, pull bandwidth, standby start)
        self._catalog = catalog  # the core's current catalog
        self.pools: dict[str, PoolState] = {
            p.name: PoolState(p, p, batch_share=BatchShare(), interactive_forecast=Forecast()) if p.spot_tier
            else PoolState(p, p) for p in cluster.pools}
        self.project_quota: ProjectQuota | None = None  # the project's GPU quota, last found exhausted
        # Per pool, the last look's inputs and windows' maxima if it asked for nothing (else None).
        self._idle_looks: dict[str, IdleLook | None] = {}

    def connect(self, vms: Vms, prewarming: Prewarming, queued_demand: Callable[[PoolState], int],
                dispatch: Callable[[PoolState, float], None]) -> None:
        """What the autoscaler asks of the other parts: VMs started, made, stopped or deleted
        (`vms`), the images idle VMs should hold (`prewarming`), the queued sessions it grows a
        pool for, and the queue served first on each tick."""
        self._vms, self._prewarming = vms, prewarming
        self._queued_demand, self._dispatch = queued_demand, dispatch

    # ---- reads ---------------------------------------------------------------------------

    def pool(self, name: str) -> PoolState:
        if name not in self.pools:
            raise NotFound(f"cluster {self._name} has no pool {quote(name)}", field="pool")
        return self.pools[name]

    def snapshot(self, pool: PoolState) -> PoolSnapshot:
        c, p = pool.count, pool.policy
        return PoolSnapshot(  # by position, in PoolSnapshot's order: made for every pool every tick
            c[_WARM], c[_CREATING] + c[_BOOTING] + c[_STARTING], c[_ASSIGNED], c[_RECYCLING], len(pool.queue),
            p.min_vms, p.max_vms, p.headroom_fraction, p.autoscaler, p.warm_vms, pool.forecast_warm, p.standby,
            pool.standby_total, pool.forecast_cover, self._queued_demand(pool) if pool.queue else 0)

    def can_launch(self, pool: PoolState, now: float) -> bool:
        return pool.total < pool.policy.max_vms and zones_available(pool.config.zones, pool.stocked_out_until, now)

    def can_start(self, pool: PoolState) -> bool:
        return bool(pool.standby) and pool.total < pool.policy.max_vms

    def bandwidth(self) -> float:
        return self._sim.pull_bytes_per_s

    def start_estimate_s(self, pool: PoolState) -> float:
        """A standby VM's start, its median (the core's estimate, like boot_s for a create)."""
        return self._sim.pool_start_median_s.get(pool.config.name, self._sim.start_median_s)

    def cold_start_s(self, image: str) -> float:
        return CREATE_ESTIMATE_S + self._sim.boot_s + self._catalog().size_bytes(image) / self.bandwidth()

    # ---- what the pools hold -------------------------------------------------------------

    def count_in(self, vm: Vm) -> None:
        self.pools[vm.pool].count_in(vm)

    def count_out(self, vm: Vm) -> None:
        self.pools[vm.pool].count_out(vm)

    def not_ready(self, vm: Vm) -> None:
        """The VM turned unhealthy: it is assignable no more."""
        self.pools[vm.pool].ready.pop(vm.id, None)

    def arrived(self, pool: PoolState, image: str, now: float, batch: bool = False) -> None:
        """A session asked for `image` in `pool`: demand for the image, an arrival for the forecast
        (and, with a Spot tier, for the batch share)."""
        self.demanded(pool, image, now)
        pool.forecast.arrival(now)
        if pool.interactive_forecast is not None:
            pool.batch_share.arrival(now, batch)
            if not batch:
                pool.interactive_forecast.arrival(now)

    def demanded(self, pool: PoolState, image: str, now: float) -> None:
        """Demand for `image` in `pool` (a session's, or an operator's prewarm)."""
        pool.demand.count(image, now)

    def departed(self, pool: PoolState, now: float, batch: bool = False) -> None:
        pool.forecast.departure(now)
        if pool.interactive_forecast is not None and not batch:
            pool.interactive_forecast.departure(now)

    def remember(self, pool: PoolState, failure: CloudFailure, zone: str, now: float) -> None:
        """A stockout or quota failure: the zones it reaches are skipped for a while, and a
        project-wide quota is held for the fleet too (the capacity stream reports it)."""
        remember(self.pools, pool, failure, zone, now)
        if (quota := project_quota_of(failure, self._name, now)) is not None:
            self.hold_project_quota(quota)

    def hold_project_quota(self, quota: ProjectQuota) -> bool:
        """Holds the later of the quota known and `quota` (learned here or told by a front);
        whether it changed."""
        if self.project_quota is not None and self.project_quota.until >= quota.until:
            return False
        self.project_quota = quota
        hold_project_quota(self.pools, quota)
        return True

    def set_policy(self, name: str, policy: PoolConfig) -> PoolConfig:
        pool = self.pool(name)
        pool.policy = policy
        pool.changed = True
        return policy

    # ---- scaling -------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        for pool in self.pools.values():
            if now - pool.ranking_at >= RANKING_REFRESH_S:
                self._prewarming.refresh_ranking(pool, now)
            if pool.queue:
                self._dispatch(pool, now)
            if pool.changed or pool.queue or now - pool.scaled_at >= AUTOSCALE_QUIET_S:
                self._autoscale(pool, now)

    def look_quietly(self, now: float) -> bool:
        """Makes the looks tick(now) would make at quiet pools (nothing changed since their last
        look, nothing queued) while they ask for nothing, in the pools' order, as tick() would.
        False at the first pool whose tick does more (a ranking to refresh, a queue to serve, a
        changed pool, a look that asks for something): that pool and those after it are left to
        tick(). True when tick(now) has nothing left to do."""
        for pool in self.pools.values():
            if now - pool.ranking_at >= RANKING_REFRESH_S or pool.queue or pool.changed:
                return False
            if now - pool.scaled_at >= AUTOSCALE_QUIET_S and not self._quiet_look(pool, now):
                return False
        return True

    def _autoscale(self, pool: PoolState, now: float) -> None:
        if not pool.changed and not pool.queue and self._quiet_look(pool, now):
            return
        pool.changed, pool.scaled_at = False, now
        policy, vms = pool.policy, self._vms
        self._forecast_if_due(pool, now)  # done already if the look began as a quiet one
        snap = self.snapshot(pool)
        pool.peak.window_s = stabilization_s(policy.autoscaler, policy.standby)
        wanted = desired_vms(snap)
        hold = pool.peak.add(now, wanted)
        # An upper bound on the VMs idle long enough: the real list is made only to delete some.
        plan = plan_scale(snap, hold, len(pool.ready), wanted)
        launch = plan.launch
        # The Spot tier's part of the VMs wanted; how many of those added are Spot.
        tier = self._spot_warm(pool, snap, wanted, now) if pool.interactive_forecast is not None else None
        spot = spot_launches(launch, pool.spot_idle, tier) if tier is not None else 0
        # Standby VMs first: running in under a minute, their disks holding the pool's images.
        catalog = self._catalog()
        image = pool.ranking[0] if pool.ranking else catalog.latest
        usable = lambda v: pool.stocked_out_until.get(v.zone, 0.0) <= now  # noqa: E731
        while launch > 0 and self.can_start(pool):
            vm = (choose_standby(image, pool.standby.values(), catalog, usable) if tier is None
                  else standby_in_tier(image, pool.standby.values(), catalog, usable, spot > 0, either=True))
            if vm is None:
                break
            vms.start(vm, now)
            launch, spot = launch - 1, spot - vm.spot
        for _ in range(launch):
            if vms.launch(pool, now, images=pool.ranking[:1], spot=spot > 0) is None:
                break
            spot -= 1
        day_hold = pool.day_peak.add(now, wanted) if policy.standby else 0
        keep = standby_target(snap, day_hold, wanted) if policy.standby else 0
        if plan.delete:
            self._scale_down(pool, plan.delete, keep, now, tier)
        if (extra := len(pool.standby) - keep) > 0:
            for vm in pick_deletions(list(pool.standby.values()), extra,
                                     lambda v: self._prewarming.held_of_ranking(pool, v)):
                vms.delete(vm, "standby beyond the pool's standby target", now)
        # A look that asked for nothing is remembered: the next, if nothing it reads has changed
        # but time, gives the same answer (_same_as_last_look). Whatever a look comes to read
        # must be compared there (tests/test_quiet_looks.py checks against looks made in full).
        nothing = plan.launch == 0 and plan.delete == 0 and extra <= 0 and (
            tier is None or policy.autoscaler == "predictive")  # else _spot_warm read (and decayed) rates
        self._idle_looks[pool.config.name] = IdleLook(snap, len(pool.ready), len(pool.standby), wanted, hold,
                                                       day_hold) if nothing else None

    def _quiet_look(self, pool: PoolState, now: float) -> bool:
        """A look at a quiet pool, its forecast redone if due: made (True) if it asks for nothing,
        as the last did; else the full look follows, its forecast up to date."""
        self._forecast_if_due(pool, now)
        if self._same_as_last_look(pool, now):
            pool.scaled_at = now
            return True
        return False

    def _forecast_if_due(self, pool: PoolState, now: float) -> None:
        if pool.policy.autoscaler != "predictive":
            return
        if pool.interactive_forecast is None:
            due = forecast_due(now, pool.forecast_at, pool.forecast_warm, len(pool.ready))
        else:  # a burst that took every warm VM of either tier
            spot_ready = sum(vm.spot for vm in pool.ready.values())
            due = (forecast_due(now, pool.forecast_at, pool.forecast_spot_warm, spot_ready)
                   or forecast_due(now, pool.forecast_at, pool.forecast_warm - pool.forecast_spot_warm,
                                   len(pool.ready) - spot_ready))
        if due:
            self._forecast(pool, now)

    def _same_as_last_look(self, pool: PoolState, now: float) -> bool:
        """Whether a look at a quiet pool would ask for nothing, as the last did: its snapshot is
        the last one's (its counts and policy are as they were, since whatever changes them marks
        the pool changed; its queue is empty now and was then; so only a forecast redone since can
        move it), as are its ready and standby VMs, and the most VMs wanted over the windows
        scale-down holds to (which time alone moves: an old peak leaves them). The windows take
        this look's value as the full look would. Decided exactly, so a quiet pool's looks (every
        AUTOSCALE_QUIET_S) cost little."""
        last = self._idle_looks.get(pool.config.name)
        if (last is None or last.snap.queued or last.snap.forecast_warm != pool.forecast_warm
                or last.snap.forecast_cover != pool.forecast_cover
                or last.ready != len(pool.ready) or last.standby != len(pool.standby)):
            return False
        hold = pool.peak.add(now, last.wanted)  # the full look adds the same value at the same time: no harm
        day_hold = pool.day_peak.add(now, last.wanted) if pool.policy.standby else 0  # likewise
        return hold == last.hold and day_hold == last.day_hold

    def _scale_down(self, pool: PoolState, surplus: int, keep: int, now: float, tier: int | None) -> None:
        """`tier`: the Spot tier's part (None: no tier), whose surplus tier goes first."""
        # A prewarm under way does not save a surplus VM; with a standby tier it waits the longer
        # idle time, so the disk it keeps stopped is filled (scale_down_idle_s).
        standby = pool.policy.standby
        idle = [vm for vm in pool.ready.values()
                if now - vm.warm_since >= scale_down_idle_s(standby, filling=bool(vm.pulling))]
        stopping = pool.standby_total
        value = lambda v: self._prewarming.held_of_ranking(pool, v)  # noqa: E731
        if tier is None:
            chosen = pick_deletions(idle, surplus, value)
        else:  # the Spot VMs over the tier's part go first
            spot = [vm for vm in idle if vm.spot]
            on_demand = [vm for vm in idle if not vm.spot]
            n_spot, n_on_demand = split_deletions(surplus, len(spot), len(on_demand), pool.spot_idle - tier)
            chosen = pick_deletions(spot, n_spot, value) + pick_deletions(on_demand, n_on_demand, value)
        # The most valuable of the surplus VMs (the last chosen) are stopped while the standby
        # target has room, the least valuable deleted.
        for vm in reversed(chosen):
            if stopping < keep:
                self._vms.to_standby(vm, "scale-down: surplus warm VM kept stopped", now)
                stopping += 1
            else:
                self._vms.delete(vm, "scale-down: surplus warm VM", now)

    def _spot_warm(self, pool: PoolState, snap: PoolSnapshot, wanted: int, now: float) -> int:
        """The idle VMs the Spot tier should hold: the forecast's for batch arrivals, or the
        batch share of the idle VMs wanted (the other autoscalers)."""
        if pool.policy.autoscaler == "predictive":
            return pool.forecast_spot_warm
        demand = snap.assigned + (snap.queued if snap.queued_demand is None else snap.queued_demand)
        return spot_target(max(0, wanted - demand), pool.batch_share.share(now))

    def _forecast(self, pool: PoolState, now: float) -> None:
        """The warm VMs that cover what arrives while a VM is made ready, and (with a standby
        tier) the warm and standby VMs together that cover what arrives while a new one is. With
        a Spot tier, the warm VMs interactive sessions may take (on demand) cover their arrivals
        alone."""
        if pool.interactive_forecast is None:
            pool.forecast_warm, pool.forecast_cover = self._warm_and_cover(pool, now, pool.forecast, len(pool.standby))
        else:
            # The on-demand VMs alone must cover the interactive arrivals; the Spot tier has the
            # rest of what all arrivals ask (never more VMs than without the tier, unless the
            # interactive ones alone need more).
            standby_on_demand = len(pool.standby) - pool.spot_count[VmState.STANDBY]
            total, total_cover = self._warm_and_cover(pool, now, pool.forecast, len(pool.standby))
            warm, cover = self._warm_and_cover(pool, now, pool.interactive_forecast, standby_on_demand)
            pool.forecast_warm, pool.forecast_spot_warm = split_warm(total, warm)
            pool.forecast_cover = max(total_cover, cover)
        pool.forecast_at = now

    def _warm_and_cover(self, pool: PoolState, now: float, forecast: Forecast, standby: int) -> tuple[int, int]:
        """The warm VMs, and the warm and standby VMs, for the arrivals `forecast` counts, with
        `standby` VMs stopped for them."""
        policy = pool.policy
        cold_s = self.cold_start_s(pool.ranking[0] if pool.ranking else self._catalog().latest)
        if not policy.standby:
            cover = forecast.warm_needed(now, cold_s, policy.wait_probability)
            return cover, cover
        # A started standby VM is ready after its start (its disk holds the pool's images); the
        # start's tail is what the warm VMs must bridge.
        cover, warm = forecast.warm_needed_each(now, (cold_s, self.start_estimate_s(pool) * STANDBY_START_COVER),
                                                policy.wait_probability)
        return max(warm, cover - standby), cover
