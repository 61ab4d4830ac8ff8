"""The cluster core's pools: each pool's record (PoolState, with counts and indexes kept as VMs
change), the estimates made from the pools' settings, the zones stocked out and the project's GPU
quota held. Scaling them is decide/scaling.py's; which images idle VMs hold, decide/prewarming.py's.
Pure.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from provisioner.config import PoolConfig
from provisioner.decide.autoscale import STABILIZATION_S, STANDBY_HOLD_S, WindowMax
from provisioner.decide.assignment import QueueOrder
from provisioner.decide.forecast import Forecast
from provisioner.decide.prewarm_rules import Demand
from provisioner.decide.spot_tier import BatchShare
from provisioner.model.states import VM_ACTIVE, VmState
from provisioner.model.records import Vm

V = VmState
# Read on every tick: an Enum's attribute lookup (V.WARM) goes through its metaclass's __getattr__.
_STANDBY, _STOPPING_STANDBY = V.STANDBY, V.STOPPING_STANDBY
_MAKING = frozenset({V.CREATING, V.BOOTING, V.STARTING})

# How often the image ranking is recomputed from the decaying demand.
RANKING_REFRESH_S = 300.0
# Idle VMs re-follow the ranking when its set of images changes or its order changes among the
# first few (what a fresh VM pulls first); reshuffles further down are not worth a rescan.
RANKING_ORDER_MATTERS = 3
# How often the predictive autoscaler redoes its forecast.
FORECAST_REFRESH_S = 60.0
# With a standby tier, the warm VMs bridge a standby start of up to this many times its median; a
# session that arrives later waits for a start. It is served by the first of two (a second VM
# holding its image is started beside its own: assignment.hedge_worth), whose median is about 0.72
# times one start's (lognormal, sigma 0.6), so the warm VMs cover about that median. Chosen on
# the tuning traces' asia-east1 cluster, whole, at --scale 50 (docs/economics.md): with the hedge
# and assignment.standby_sooner, 1.0 and 0.7 kept fast starts within 0.05 points of 2.5's (a
# single start's 94th percentile) and cut openb's cost there from 1.157x the assigned to 1.126x
# and 1.122x; the whole fleet's openb then cost 1.094x, against 1.124x with 2.5.
STANDBY_START_COVER = 0.7
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
    """One pool's VMs and queue, with counts and indexes kept as VMs change (read every tick).

    Each field has one writer: the queue and its order decide/queue.py (a user's queued sessions
    move in the order as what the user holds changes: decide/holdings.py), the ranking of images
    to hold (ranking, keep_layers, ranking_gen, ranking_at) decide/prewarming.py, the rest
    decide/sizing.py."""

    config: PoolConfig  # as the config file has it
    policy: PoolConfig  # as operators left it: the file's, with their overrides
    # Dicts, not sets: iteration follows insertion, so runs are the same in every process.
    vms: dict[str, Vm] = field(default_factory=dict)  # every VM of the pool not yet deleted
    queue: dict[str, None] = field(default_factory=dict)  # queued session ids
    order: QueueOrder = field(default_factory=QueueOrder)  # the queue's order, kept between changes
    ready: dict[str, Vm] = field(default_factory=dict)  # assignable: warm and healthy
    standby: dict[str, Vm] = field(default_factory=dict)  # stopped, startable
    # Being made or started for a session (whose it is, vm.reserved_for, may have changed since).
    awaited: dict[str, Vm] = field(default_factory=dict)
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
    # The Spot tier (config.spot_tier): its Spot VMs by state, the batch share of arrivals, the
    # interactive sessions' own forecast, and the warm VMs (of forecast_warm) left to the Spot tier.
    spot_count: dict[VmState, int] = field(default_factory=lambda: defaultdict(int))
    batch_share: BatchShare | None = None
    interactive_forecast: Forecast | None = None
    forecast_spot_warm: int = 0

    def count_in(self, vm: Vm) -> None:
        self.changed = True
        self.vms[vm.id] = vm
        self.count[vm.state] += 1
        self.per_zone[vm.zone] += 1
        if vm.spot:
            self.spot_count[vm.state] += 1
        if vm.state is V.WARM and vm.healthy:
            self.ready[vm.id] = vm
        elif vm.state is V.STANDBY:
            self.standby[vm.id] = vm
        elif vm.reserved_for and vm.state in _MAKING:
            self.awaited[vm.id] = vm

    def count_out(self, vm: Vm) -> None:
        self.changed = True
        del self.vms[vm.id]
        self.count[vm.state] -= 1
        self.per_zone[vm.zone] -= 1
        if vm.spot:
            self.spot_count[vm.state] -= 1
        self.ready.pop(vm.id, None)
        self.standby.pop(vm.id, None)
        self.awaited.pop(vm.id, None)

    @property
    def total(self) -> int:
        return sum(self.count[state] for state in VM_ACTIVE)

    @property
    def spot_idle(self) -> int:
        """Spot VMs warm or on their way to it (made or started)."""
        count = self.spot_count
        return count[V.WARM] + count[V.CREATING] + count[V.BOOTING] + count[V.STARTING]

    @property
    def standby_total(self) -> int:
        count = self.count
        return count[_STANDBY] + count[_STOPPING_STANDBY]
