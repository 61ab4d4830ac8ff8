"""Replays a session trace through the real cluster cores on the simulator engine.

One core per cluster of the fleet; each session goes to the cluster in its home region. A
session is allocated at its arrival; it is stopped `duration_s` after the arrival, or, if the
user abandoned it, left to the idle timeout. In-use interactive sessions are touched just
before each idle deadline, so culling never stops a session that is in use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from provisioner.cloud.base import PREEMPTED as SPOT_PREEMPTED
from provisioner.config import FleetConfig
from provisioner.decide.budgets import USED_UP
from provisioner.decide.core import ClusterCore
from provisioner.decide.events import BudgetSet, SessionForgotten, SessionRequested, SessionTouched, StopRequested
from provisioner.decide.ids import IdSource
from provisioner.decide.preemption_rules import STOP_REASON as PREEMPTED
from provisioner.model.states import VM_ACTIVE, SessionState, VmState
from provisioner.model.records import Session, SessionKind, SessionSpec, StartKind, Vm, cluster_of
from provisioner.sim.cost import prices
from provisioner.sim.engine import Engine
from provisioner.sim.never_started import cause as never_started_cause
from provisioner.sim.tally import PoolSample, Sample, Tally
from provisioner.sim.trace import TraceError, TraceRow, peak_concurrency, trace_end
from provisioner.sim.vm_time import BILLED_RUNNING, VmMeter

if TYPE_CHECKING:
    from provisioner.sim.quotas import QuotaMeter

# Touch this long before the idle deadline, well over a tick, so the cull never sees it idle.
TOUCH_MARGIN_S = 60.0
# Pool sizes are sampled this often for the plot.
SAMPLE_S = 600.0

V = VmState
_RUNNING = SessionState.RUNNING


def _quota_meter(fleet: FleetConfig) -> QuotaMeter:
    """The fleet's quotas, kept as the front keeps them (weighted GPU-seconds per pool)."""
    from provisioner.sim.quotas import QuotaMeter  # here: a replay without --quotas starts without it

    q = fleet.settings.quotas
    return QuotaMeter(q, {(c.name, p.name): p.accelerator_count * q.weight(p.accelerator)
                          for c in fleet.clusters for p in c.pools})


class Replay(Engine):
    def __init__(self, fleet: FleetConfig, rows: list[TraceRow], seed: int = 0, end_s: float | None = None,
                 quotas: bool = False, requeue: bool = False):
        """`quotas`: each create is checked against the fleet's quotas as the front checks it.
        `requeue`: batch sessions ask to be queued again if preempted; a requeued session runs
        for what its trace length had left when it was stopped."""
        if fleet.catalog is None:
            raise ValueError("the simulator replays the synthetic catalog of images.yaml, not a registry's")
        settings = fleet.settings.sessions
        # The records themselves, not frozen values: what changed is read at once (changes()) and
        # no record is kept past its step.
        cores = [ClusterCore(c, fleet.catalog, settings, IdSource(c.name, seed), priority=fleet.settings.priority,
                             abuse=fleet.settings.abuse, live_records=True) for c in fleet.clusters]
        super().__init__(cores, seed=seed)
        self.rows = rows
        self.by_region = {c.config.region: c for c in cores}
        self._core_named = {c.name: c for c in cores}
        self._rows_of = self._rows_by_cluster(rows)
        self.idle_timeout_s = settings.idle_timeout_s
        self.end_s = trace_end(rows, self.idle_timeout_s) if end_s is None else end_s
        self.price = prices(fleet)
        self._image_bytes = fleet.catalog.size_bytes
        self.vm_time = VmMeter(self.price, [(c.name, p.name) for c in fleet.clusters for p in c.pools
                                            if p.spot or p.spot_tier])
        self.quotas = _quota_meter(fleet) if quotas else None
        self._budget_moved: set[str] = set()  # users whose budget end is recomputed at this instant
        self.requeue = requeue
        self._ends: dict[str, float] = {}  # batch sessions that may be requeued -> when their trace ends them
        self._left: dict[str, float] = {}  # requeued sessions -> how long they run once started
        self._started: set[str] = set()  # running or stopping sessions already counted
        # Results.
        self.sessions = self.stopped_for_budget = 0
        self.preempted = self.requeued = self.requeued_started = self.spot_preempted = 0
        self.waits: list[float] = []
        self.interactive_waits: list[float] = []
        self.starts = {k.value: 0 for k in StartKind}
        self.never_started: dict[str, int] = {}
        self.user_wait_max: dict[str, float] = {}
        self.samples: list[Sample] = []
        self.pool_samples: dict[str, list[PoolSample]] = {f"{c.name}/{p}": [] for c in cores for p in c.pools}
        self._wait_max: dict[str, float] = {}  # per pool, since the last sample
        peaks = peak_concurrency(rows, self.idle_timeout_s)
        self.fixed_peak_vms = sum(peaks.values())
        self.fixed_peak_price = sum(n * self.price[(self.by_region[region].name, pool)].running_usd_per_h
                                    for (region, pool), n in peaks.items())

    def _rows_by_cluster(self, rows: list[TraceRow]) -> dict[str, list[int]]:
        """Each cluster's rows, by index. Each cluster has its own chain of arrivals, so its events
        interleave the same way whether or not other clusters are replayed alongside (see
        sim.parallel)."""
        mine: dict[str, list[int]] = {c.name: [] for c in self.cores}
        for i, r in enumerate(rows):
            core = self.by_region.get(r.region)
            if core is None:
                raise TraceError(f"session {i + 1}: no cluster in region {r.region!r}; "
                                 f"regions: {', '.join(sorted(self.by_region))}")
            if r.accelerator not in core.pools:
                raise TraceError(f"session {i + 1}: cluster {core.name} has no pool {r.accelerator!r}")
            mine[core.name].append(i)
        return mine

    # ---- running ----------------------------------------------------------------------

    def run(self, progress: Callable[[float], None] | None = None, chunk_s: float = 3600.0) -> None:
        for core in self.cores:
            if rows := self._rows_of[core.name]:
                self.at(self.rows[rows[0]].arrival_s, self._arrive, core, 0)
        self.at(0.0, self._sample)
        while self.now < self.end_s:
            self.run_to(min(self.end_s, self.now + chunk_s))
            if progress is not None:
                progress(self.now / self.end_s)
        self.vm_time.integrate(self.now)

    def _arrive(self, core: ClusterCore, k: int, now: float) -> None:
        """Allocates the core's k-th session and schedules its next (so the heap stays small)."""
        mine = self._rows_of[core.name]
        i = mine[k]
        r = self.rows[i]
        if k + 1 < len(mine):
            self.at(self.rows[mine[k + 1]].arrival_s, self._arrive, core, k + 1)
        if self.quotas is not None and not self.quotas.admit(r.user, r.kind.value, now):
            return
        requeue = self.requeue and r.kind is SessionKind.BATCH
        spec = SessionSpec(request_id=f"r{i}", user_id=r.user, accelerator=r.accelerator, image=r.image, kind=r.kind,
                           requeue=requeue)
        s = self.handle(core, SessionRequested(now, spec)).reply
        if self.quotas is not None:
            self.quotas.created(s)
        self.sessions += 1
        end = now + r.duration_s
        interactive = r.kind is SessionKind.INTERACTIVE
        if interactive:
            self._schedule_touch(core, s.id, now, end)
        if interactive and r.abandon:
            self.at(end, self._touch_last, core, s.id)  # the user's last activity; the cull does the rest
        else:
            self.at(end, self._stop, core, s.id)
            if r.kind is SessionKind.BATCH:  # queued again if preempted (asked for, or by a Spot VM's end)
                self._ends[s.id] = end

    def _sample(self, now: float) -> None:
        demand = assigned = warm = starting = 0
        for core in self.cores:
            for name, pool in core.pools.items():
                c = pool.count
                demand += c[V.ASSIGNED] + len(pool.queue)
                assigned += c[V.ASSIGNED]
                warm += c[V.WARM]
                starting += c[V.CREATING] + c[V.BOOTING] + c[V.STARTING]
                key = f"{core.name}/{name}"
                billed = sum(c[state] for state in VM_ACTIVE)
                price = self.price[(core.name, name)]
                stopped = c[V.STANDBY]
                usd = (billed + c[V.STOPPING_STANDBY]) * price.running_usd_per_h + stopped * price.stopped_usd_per_h
                if pool.config.spot_tier:  # its Spot VMs run at the Spot price
                    spot = sum(pool.spot_count[state] for state in BILLED_RUNNING)
                    usd -= spot * (price.running_usd_per_h - price.spot_usd_per_h)
                self.pool_samples[key].append(PoolSample(
                    now, c[V.ASSIGNED], c[V.WARM], c[V.CREATING] + c[V.BOOTING] + c[V.STARTING],
                    stopped + c[V.STOPPING_STANDBY], len(pool.queue), self._wait_max.pop(key, 0.0), usd))
        self.samples.append(Sample(now, demand, assigned, warm, starting, self.vm_time.live))
        if now + SAMPLE_S <= self.end_s:
            self.at(now + SAMPLE_S, self._sample)

    def _schedule_touch(self, core: ClusterCore, sid: str, now: float, end: float) -> None:
        t = now + self.idle_timeout_s - TOUCH_MARGIN_S
        if t < end:
            self.at(t, self._touch, core, sid, end)

    def _touch(self, core: ClusterCore, sid: str, end: float, now: float) -> None:
        s = core.sessions.get(sid)
        if s is not None and not s.terminal:
            self.handle(core, SessionTouched(now, sid))
            self._schedule_touch(core, sid, now, end)

    def _touch_last(self, core: ClusterCore, sid: str, now: float) -> None:
        if sid in core.sessions:
            self.handle(core, SessionTouched(now, sid))

    def _stop(self, core: ClusterCore, sid: str, now: float) -> None:
        if sid in core.sessions:
            self.handle(core, StopRequested(now, sid, "the user is done"))

    def _budget_moves(self, user: str) -> None:
        """A session of `user` started or ended: the end of their budget moves. Recomputed once
        the current step is through, as the front's sweep would, and told to each running session."""
        if user not in self._budget_moved:
            self._budget_moved.add(user)
            self.at(self.now, self._set_budget_end, user)

    def _set_budget_end(self, user: str, now: float) -> None:
        self._budget_moved.discard(user)
        ends_at, running = self.quotas.budget_end(user, now)
        for sid in running:
            core = self._core_named[cluster_of(sid)]
            if sid in core.sessions:
                self.handle(core, BudgetSet(now, sid, ends_at))

    # ---- observing ----------------------------------------------------------------------

    def changes(self, core: ClusterCore, sessions: list[Session], vms: list[Vm]) -> None:
        started = self._started
        for s in sessions:
            if s.requeued_as and s.id in self._ends:  # preempted, and queued again
                self._left[s.requeued_as] = max(0.0, self._ends.pop(s.id) - self.now)
                self.requeued += 1
            if s.requeued_from:
                self._requeued_changed(core, s)
                continue
            if s.state is _RUNNING and s.id not in started:
                started.add(s.id)
                wait = s.ready_at - s.created_at
                if s.spec.kind is SessionKind.INTERACTIVE:
                    self.interactive_waits.append(wait)
                self.waits.append(wait)
                key = f"{core.name}/{s.pool}"
                self._wait_max[key] = max(self._wait_max.get(key, 0.0), wait)
                self.starts[s.start.value] += 1
                user = s.spec.user_id
                self.user_wait_max[user] = max(self.user_wait_max.get(user, 0.0), wait)
                if self.quotas is not None:
                    self.quotas.started(s)
                    self._budget_moves(user)
            elif s.terminal:
                if self.quotas is not None:
                    self.quotas.ended(s)
                    self._budget_moves(s.spec.user_id)
                    self.stopped_for_budget += s.id in started and s.reason.endswith(USED_UP)
                self.preempted += s.reason.startswith(PREEMPTED + ":")
                self.spot_preempted += s.reason == SPOT_PREEMPTED
                self._ends.pop(s.id, None)
                if s.id not in started:
                    why = never_started_cause(s, self._image_bytes(s.image))
                    self.never_started[why] = self.never_started.get(why, 0) + 1
                started.discard(s.id)
                core.handle(SessionForgotten(self.now, s.id))  # or the cull would scan every session ever made
        if vms:
            self.vm_time.changed(core.name, vms, self.now)

    def _requeued_changed(self, core: ClusterCore, s: Session) -> None:
        """A requeued session is not one of the trace's: it runs for what its original had left,
        and is counted apart."""
        if s.state is _RUNNING and s.id in self._left:
            end = self.now + self._left.pop(s.id)
            self.requeued_started += 1
            self.at(end, self._stop, core, s.id)
            self._ends[s.id] = end  # it may be preempted and requeued again
        elif s.terminal:
            self.preempted += s.reason.startswith(PREEMPTED + ":")
            self.spot_preempted += s.reason == SPOT_PREEMPTED
            self._left.pop(s.id, None)
            self._ends.pop(s.id, None)
            core.handle(SessionForgotten(self.now, s.id))

    # ---- results ------------------------------------------------------------------------

    def tally(self) -> Tally:
        vm_time = self.vm_time
        return Tally(self.now, self.sessions, list(self.waits), dict(self.starts), vm_time.vm_s, vm_time.assigned_vm_s,
                     self.bytes_pulled, self.events, self.fixed_peak_vms, self.fixed_peak_price,
                     list(self.samples), {k: list(v) for k, v in self.pool_samples.items()},
                     vm_time.pool_time(), dict(self.price), dict(self.never_started),
                     dict(self.quotas.refused) if self.quotas else {}, dict(self.user_wait_max),
                     self.stopped_for_budget, list(self.interactive_waits), self.preempted, self.requeued,
                     self.requeued_started, self.spot_preemptions, self.spot_preempted)

    def results(self) -> dict:
        return self.tally().results()
