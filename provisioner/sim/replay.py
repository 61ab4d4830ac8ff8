"""Replays a session trace through the real cluster cores on the simulator engine.

One core per cluster of the fleet; each session goes to the cluster in its home region. A
session is allocated at its arrival; it is stopped `duration_s` after the arrival, or, if the
user abandoned it, left to the idle timeout. In-use interactive sessions are touched just
before each idle deadline, so culling never stops a session that is in use.
"""

from __future__ import annotations

import csv
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

from provisioner.decide.core import ClusterCore
from provisioner.decide.budgets import USED_UP
from provisioner.cloud.base import PREEMPTED as SPOT_PREEMPTED
from provisioner.decide.preempt import STOP_REASON as PREEMPTED
from provisioner.decide.events import BudgetSet, SessionForgotten, SessionRequested, SessionTouched, StopRequested
from provisioner.decide.ids import IdSource
from provisioner.config import FleetConfig
from provisioner.model.records import Session, SessionKind, SessionSpec, StartKind, Vm, cluster_of
from provisioner.sim.cost import Price, PoolKey, VmTime, costs, prices
from provisioner.sim.quotas import QuotaMeter
from provisioner.sim.engine import Engine
from provisioner.model.states import SESSION_TERMINAL, VM_ACTIVE, SessionState, VmState

HEADER = ["arrival_s", "user", "kind", "accelerator", "image", "region_hint", "duration_s", "abandon"]
FAST_START_S = 60.0
# Touch this long before the idle deadline, well over a tick, so the cull never sees it idle.
TOUCH_MARGIN_S = 60.0
# Model time past the last session's end, so wipes and deletes finish inside the run.
TAIL_S = 600.0
# Pool sizes are sampled this often for the plot.
SAMPLE_S = 600.0
POLICIES = ("fixed", "headroom", "predictive")

V = VmState
_RUNNING = SessionState.RUNNING
# Billed at the running price: a VM stopping into standby runs until it is stopped.
BILLED_RUNNING = VM_ACTIVE | {V.STOPPING_STANDBY}


class TraceError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class TraceRow:
    arrival_s: float
    user: str
    kind: SessionKind
    accelerator: str
    image: str
    region: str
    duration_s: float
    abandon: bool


def read_trace(path: str | Path) -> list[TraceRow]:
    rows: list[TraceRow] = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != HEADER:
            raise TraceError(f"{path}:1: expected header {','.join(HEADER)}, got {','.join(header or [])!r}")
        for line, rec in enumerate(reader, start=2):
            if not rec:
                continue
            try:
                if len(rec) != len(HEADER):
                    raise ValueError(f"expected {len(HEADER)} fields, got {len(rec)}")
                arrival, user, kind, acc, image, region, duration, abandon = rec
                row = TraceRow(float(arrival), user, SessionKind(kind), acc, image, region, float(duration),
                               {"0": False, "1": True}[abandon])
                if row.arrival_s < 0 or row.duration_s <= 0 or not user:
                    raise ValueError("need arrival_s >= 0, duration_s > 0 and a user")
            except (ValueError, KeyError) as e:
                raise TraceError(f"{path}:{line}: bad row {','.join(rec)!r}: {e}") from None
            rows.append(row)
    if not rows:
        raise TraceError(f"{path}: no sessions")
    return rows


def with_policy(fleet: FleetConfig, policy: str | None = None, headroom_fraction: float | None = None,
                warm_vms: int | None = None, wait_probability: float | None = None,
                standby: bool | None = None, max_vms: int | None = None) -> FleetConfig:
    """The fleet with every pool's autoscaler settings replaced where given. `fixed` and
    `headroom`, the baselines, run without a standby tier unless `standby` says otherwise.
    `max_vms` caps every pool (its minimum too, if above)."""
    if standby is None and policy in ("fixed", "headroom"):
        standby = False
    update = {k: v for k, v in {"autoscaler": policy, "headroom_fraction": headroom_fraction, "warm_vms": warm_vms,
                                "wait_probability": wait_probability, "standby": standby,
                                "max_vms": max_vms}.items() if v is not None}
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if not update:
        return fleet
    def pool(p):
        changed = p.model_copy(update=update)
        return changed.model_copy(update={"min_vms": min(changed.min_vms, changed.max_vms)})

    clusters = tuple(c.model_copy(update={"pools": tuple(pool(p) for p in c.pools)}) for c in fleet.clusters)
    return fleet.model_copy(update={"clusters": clusters})


def with_priority(fleet: FleetConfig, share_gpus: int | None = None, grace_period_s: float | None = None) -> FleetConfig:
    """The fleet with the GPUs guaranteed to each user in every pool, and the grace period of a
    preemption, replaced where given."""
    update = {k: v for k, v in {"share_gpus_per_user": share_gpus, "grace_period_s": grace_period_s,
                                "pool_share_gpus_per_user": {} if share_gpus is not None else None}.items()
              if v is not None}
    if not update:
        return fleet
    priority = fleet.settings.priority.model_copy(update=update)
    return fleet.model_copy(update={"settings": fleet.settings.model_copy(update={"priority": priority})})


def peak_concurrency(rows: list[TraceRow], idle_timeout_s: float) -> dict[tuple[str, str], int]:
    """The most sessions open at once per (region, accelerator): what a fixed pool must hold so
    that no session ever waits for a VM."""
    edges: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for r in rows:
        end = r.arrival_s + r.duration_s + (idle_timeout_s if r.abandon else 0.0)
        edges[(r.region, r.accelerator)] += [(r.arrival_s, 1), (end, -1)]
    peaks = {}
    for key, points in edges.items():
        points.sort()  # at equal times, ends (-1) before starts
        level = peak = 0
        for _, step in points:
            level += step
            peak = max(peak, level)
        peaks[key] = peak
    return peaks


class Sample(NamedTuple):
    """Fleet-wide counts at one moment, for plots."""

    t_s: float
    demand: int  # sessions assigned or waiting
    assigned: int  # VMs serving sessions
    warm: int  # idle VMs ready for a session
    starting: int  # VMs being created or booting
    total: int  # every VM that is billed


class PoolSample(NamedTuple):
    """One pool's counts at one moment, for the per-pool panels of a plot."""

    t_s: float
    assigned: int  # VMs serving sessions
    warm: int  # idle VMs ready for a session
    starting: int  # VMs being created, booting or started
    standby: int  # VMs stopped (or stopping), their disks kept
    queued: int  # sessions waiting for a VM
    wait_max_s: float  # the longest wait of the sessions that started since the previous sample
    cost_usd_per_h: float  # what the pool's billed VMs cost now


def first_days(rows: list[TraceRow], days: float | None) -> list[TraceRow]:
    """The sessions that arrive within the trace's first `days` (all of them for None): a quick run."""
    if days is None or not rows:
        return rows
    t0 = min(r.arrival_s for r in rows)
    return [r for r in rows if r.arrival_s - t0 < days * 86400]


def superimpose(rows: list[TraceRow], scale: int, seed: int) -> list[TraceRow]:
    """K copies with distinct users, each shifted by a random offset modulo the trace span."""
    if scale < 1:
        raise ValueError("scale must be >= 1")
    if scale == 1:
        return sorted(rows, key=lambda r: r.arrival_s)
    rng = random.Random(seed)
    t0 = min(r.arrival_s for r in rows)
    span = max(r.arrival_s for r in rows) - t0 + 1.0
    out = []
    for k in range(scale):
        offset = rng.uniform(0, span)
        for r in rows:
            arrival = t0 + (r.arrival_s - t0 + offset) % span
            out.append(TraceRow(arrival, f"{r.user}-{k}", r.kind, r.accelerator, r.image, r.region,
                                r.duration_s, r.abandon))
    out.sort(key=lambda r: r.arrival_s)
    return out


FLOOD_USER, FLOOD_S, FLOOD_SESSION_S = "flooder", 10.0, 3600.0


def with_flood(rows: list[TraceRow], creates: int) -> list[TraceRow]:
    """`rows` plus one user sending `creates` interactive sessions of an hour within FLOOD_S,
    halfway through the trace, in its commonest region and pool with its commonest image."""
    if creates <= 0:
        return rows

    def commonest(values) -> str:
        counts: dict[str, int] = defaultdict(int)
        for v in values:
            counts[v] += 1
        return max(sorted(counts), key=counts.__getitem__)

    region, pool = commonest(r.region for r in rows), commonest(r.accelerator for r in rows)
    image = commonest(r.image for r in rows)
    start = (rows[0].arrival_s + rows[-1].arrival_s) / 2
    flood = [TraceRow(start + FLOOD_S * i / creates, FLOOD_USER, SessionKind.INTERACTIVE, pool, image, region,
                      FLOOD_SESSION_S, False) for i in range(creates)]
    return sorted(rows + flood, key=lambda r: r.arrival_s)


@dataclass
class Tally:
    """What a replay measured, in raw sums, so runs over parts of a fleet add up to the whole."""

    end_s: float
    sessions: int = 0
    waits: list[float] = field(default_factory=list)
    starts: dict[str, int] = field(default_factory=dict)
    vm_s: float = 0.0
    assigned_vm_s: float = 0.0
    bytes_pulled: int = 0
    events: int = 0
    fixed_peak_vms: int = 0
    fixed_peak_price: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    pools: dict[str, list[PoolSample]] = field(default_factory=dict)  # "cluster/pool" -> samples
    pool_time: dict[PoolKey, VmTime] = field(default_factory=dict)
    price: dict[PoolKey, Price] = field(default_factory=dict)
    # Sessions that ended without running, by what they were doing and why they ended.
    never_started: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)  # creates refused by quota, by subject
    user_wait_max: dict[str, float] = field(default_factory=dict)  # each user's longest wait to run
    stopped_for_budget: int = 0  # running sessions stopped as their owner's weekly budget ran out
    interactive_waits: list[float] = field(default_factory=list)  # of the interactive sessions that ran
    preempted: int = 0  # sessions stopped with reason preempted
    requeued: int = 0  # preempted sessions queued again as new ones (not counted in `sessions`)
    requeued_started: int = 0  # of those, how many ran
    spot_preemptions: int = 0  # Spot VMs the cloud took back
    spot_preempted: int = 0  # sessions ended by it (batch ones queued again)

    def __add__(self, other: Tally) -> Tally:
        if self.end_s != other.end_s or len(self.samples) != len(other.samples) or self.pools.keys() & other.pools:
            raise ValueError("tallies of different runs cannot be added")
        return Tally(
            self.end_s, self.sessions + other.sessions, self.waits + other.waits,
            {k: self.starts.get(k, 0) + other.starts.get(k, 0) for k in {**self.starts, **other.starts}},
            self.vm_s + other.vm_s, self.assigned_vm_s + other.assigned_vm_s,
            self.bytes_pulled + other.bytes_pulled, self.events + other.events,
            self.fixed_peak_vms + other.fixed_peak_vms, self.fixed_peak_price + other.fixed_peak_price,
            [Sample(a.t_s, *(x + y for x, y in zip(a[1:], b[1:]))) for a, b in zip(self.samples, other.samples)],
            {**self.pools, **other.pools}, {**self.pool_time, **other.pool_time}, {**self.price, **other.price},
            {k: self.never_started.get(k, 0) + other.never_started.get(k, 0)
             for k in {**self.never_started, **other.never_started}},
            {k: self.refused.get(k, 0) + other.refused.get(k, 0) for k in {**self.refused, **other.refused}},
            {u: max(self.user_wait_max.get(u, 0.0), other.user_wait_max.get(u, 0.0))
             for u in {**self.user_wait_max, **other.user_wait_max}},
            self.stopped_for_budget + other.stopped_for_budget, self.interactive_waits + other.interactive_waits,
            self.preempted + other.preempted, self.requeued + other.requeued,
            self.requeued_started + other.requeued_started,
            self.spot_preemptions + other.spot_preemptions, self.spot_preempted + other.spot_preempted,
        )

    def results(self) -> dict:
        waits = sorted(self.waits)
        n = self.sessions
        started = len(waits)
        hours = self.end_s / 3600.0
        starts = {k.value: self.starts.get(k.value, 0) for k in StartKind}
        return {
            "sessions": n,
            "started": started,
            "never_started": n - started,
            "never_started_reasons": dict(sorted(self.never_started.items(), key=lambda kv: (-kv[1], kv[0]))),
            "starts": starts,
            "model_hours": round(hours, 3),
            "vm_hours": round(self.vm_s / 3600.0, 3),
            "assigned_vm_hours": round(self.assigned_vm_s / 3600.0, 3),
            "fixed_peak_vm_hours": round(self.fixed_peak_vms * hours, 3),
            "fixed_peak_vms": self.fixed_peak_vms,
            "idle_vm_hours": round((self.vm_s - self.assigned_vm_s) / 3600.0, 3),
            **costs(self.pool_time, self.price),
            "pools": {f"{c}/{p}": {"assigned_vm_hours": round(t.assigned_s / 3600.0, 3),
                                   "idle_vm_hours": round((t.running_s - t.assigned_s) / 3600.0, 3),
                                   "standby_vm_hours": round(t.standby_s / 3600.0, 3)}
                      for (c, p), t in sorted(self.pool_time.items())},
            "fixed_peak_cost_usd": round(self.fixed_peak_price * hours, 2),
            "bytes_pulled": self.bytes_pulled,
            "fast_start_ratio": round(sum(1 for w in waits if w <= FAST_START_S) / n, 4) if n else 0.0,
            "exact_start_ratio": round(starts[StartKind.WARM.value] / n, 4) if n else 0.0,
            "wait_p50_s": _pct(waits, 50),
            "wait_p95_s": _pct(waits, 95),
            "wait_p99_s": _pct(waits, 99),
            "wait_max_s": round(waits[-1], 1) if waits else 0.0,
            "refused_for_quota": dict(sorted(self.refused.items())),
            "stopped_for_budget": self.stopped_for_budget,
            "interactive": _waits(self.interactive_waits),
            "preempted": self.preempted,
            "requeued": self.requeued,
            "requeued_started": self.requeued_started,
            "spot_preemptions": self.spot_preemptions,
            "spot_preempted_sessions": self.spot_preempted,
            "users": _users(self.user_wait_max),
            "events": self.events,
        }


def _waits(waits: list[float]) -> dict:
    """How long the sessions that ran waited."""
    waits = sorted(waits)
    return {"started": len(waits), "wait_p50_s": _pct(waits, 50), "wait_p99_s": _pct(waits, 99),
            "wait_max_s": round(waits[-1], 1) if waits else 0.0,
            "fast_start_ratio": round(sum(1 for w in waits if w <= FAST_START_S) / len(waits), 4) if waits else 0.0}


def _users(wait_max: dict[str, float]) -> dict:
    """The users whose sessions ran, by the longest any of theirs waited."""
    longest = sorted(wait_max.values())
    return {"count": len(longest), "wait_max_p50_s": _pct(longest, 50), "wait_max_p99_s": _pct(longest, 99),
            "waited_over_fast_start": sum(1 for w in longest if w > FAST_START_S)}


def trace_end(rows: list[TraceRow], idle_timeout_s: float) -> float:
    """When a replay of these rows stops: the last session's end, plus time for the last wipes."""
    return max(r.arrival_s + r.duration_s + (idle_timeout_s if r.abandon else 0.0) for r in rows) + TAIL_S


class Replay(Engine):
    def __init__(self, fleet: FleetConfig, rows: list[TraceRow], seed: int = 0, end_s: float | None = None,
                 quotas: bool = False, requeue: bool = False):
        """`quotas`: each create is checked against the fleet's quotas as the front checks it.
        `requeue`: batch sessions ask to be queued again if preempted; a requeued session runs
        for what its trace length had left when it was stopped."""
        if fleet.catalog is None:
            raise ValueError("the simulator replays the synthetic catalog of images.yaml, not a registry's")
        settings = fleet.settings.sessions
        cores = [ClusterCore(c, fleet.catalog, settings, IdSource(c.name, seed), priority=fleet.settings.priority,
                             abuse=fleet.settings.abuse) for c in fleet.clusters]
        super().__init__(cores, seed=seed)
        self.rows = rows
        self.by_region = {c.config.region: c for c in cores}
        for i, r in enumerate(rows):
            core = self.by_region.get(r.region)
            if core is None:
                raise TraceError(f"session {i + 1}: no cluster in region {r.region!r}; "
                                 f"regions: {', '.join(sorted(self.by_region))}")
            if r.accelerator not in core.pools:
                raise TraceError(f"session {i + 1}: cluster {core.name} has no pool {r.accelerator!r}")
        self.idle_timeout_s = settings.idle_timeout_s
        self.end_s = trace_end(rows, self.idle_timeout_s) if end_s is None else end_s
        # Each cluster has its own chain of arrivals, so its events interleave the same way
        # whether or not other clusters are replayed alongside (see sim.parallel).
        self._rows_of: dict[str, list[int]] = {c.name: [] for c in cores}
        for i, r in enumerate(rows):
            self._rows_of[self.by_region[r.region].name].append(i)
        # Results.
        self.sessions = 0
        self.waits: list[float] = []
        self.starts = {k.value: 0 for k in StartKind}
        self._started: set[str] = set()  # running or stopping sessions already counted
        # VM counts, integrated over time on each change: live VMs, assigned ones, and the
        # price per hour of the live ones.
        self._vm_state: dict[str, VmState] = {}
        self.price = prices(fleet)
        self._price = {key: p.running_usd_per_h for key, p in self.price.items()}
        self._live = self._assigned = 0
        # Per pool: [running, assigned, standby] VMs now, and their VM-seconds so far.
        self._counts: dict[PoolKey, list[int]] = {key: [0, 0, 0] for key in self.price}
        self._seconds: dict[PoolKey, list[float]] = {key: [0.0, 0.0, 0.0] for key in self.price}
        self._t = 0.0
        self.vm_s = self.assigned_vm_s = 0.0
        self.never_started: dict[str, int] = {}
        self.user_wait_max: dict[str, float] = {}
        q = fleet.settings.quotas
        self.quotas = QuotaMeter(q, {(c.name, p.name): p.accelerator_count * q.weight(p.accelerator)
                                     for c in fleet.clusters for p in c.pools}) if quotas else None
        self._core_named = {c.name: c for c in cores}
        self._budget_moved: set[str] = set()  # users whose budget end is recomputed at this instant
        self.stopped_for_budget = 0
        self.requeue = requeue
        self.interactive_waits: list[float] = []
        self.preempted = self.requeued = self.requeued_started = self.spot_preempted = 0
        self._ends: dict[str, float] = {}  # batch sessions that may be requeued -> when their trace ends them
        self._left: dict[str, float] = {}  # requeued sessions -> how long they run once started
        self.samples: list[Sample] = []
        self.pool_samples: dict[str, list[PoolSample]] = {f"{c.name}/{p}": [] for c in cores for p in c.pools}
        self._wait_max: dict[str, float] = {}  # per pool, since the last sample
        peaks = peak_concurrency(rows, self.idle_timeout_s)
        self.fixed_peak_vms = sum(peaks.values())
        self.fixed_peak_price = sum(n * self._price[(self.by_region[region].name, pool)]
                                    for (region, pool), n in peaks.items())

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
        self._integrate(self.now)

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
                self.pool_samples[key].append(PoolSample(
                    now, c[V.ASSIGNED], c[V.WARM], c[V.CREATING] + c[V.BOOTING] + c[V.STARTING],
                    stopped + c[V.STOPPING_STANDBY], len(pool.queue), self._wait_max.pop(key, 0.0),
                    (billed + c[V.STOPPING_STANDBY]) * price.running_usd_per_h + stopped * price.stopped_usd_per_h))
        self.samples.append(Sample(now, demand, assigned, warm, starting, self._live))
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
                    why = _never_started(s)
                    self.never_started[why] = self.never_started.get(why, 0) + 1
                started.discard(s.id)
                core.handle(SessionForgotten(self.now, s.id))  # or the cull would scan every session ever made
        if vms:
            self._vms_changed(core, vms)

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

    def _vms_changed(self, core: ClusterCore, vms: list[Vm]) -> None:
        self._integrate(self.now)
        known = self._vm_state
        for vm in vms:
            old, new = known.get(vm.id), vm.state
            if old is new:
                continue
            counts = self._counts[(core.name, vm.pool)]
            was, now = old in BILLED_RUNNING, new in BILLED_RUNNING
            self._live += now - was
            counts[0] += now - was
            assigned = (new is V.ASSIGNED) - (old is V.ASSIGNED)
            self._assigned += assigned
            counts[1] += assigned
            counts[2] += (new is V.STANDBY) - (old is V.STANDBY)
            if new is V.DELETED:
                known.pop(vm.id, None)
            else:
                known[vm.id] = new

    def _integrate(self, now: float) -> None:
        dt = now - self._t
        if dt > 0:
            self.vm_s += self._live * dt
            self.assigned_vm_s += self._assigned * dt
            for key, (running, assigned, standby) in self._counts.items():
                if running or standby:
                    acc = self._seconds[key]
                    acc[0] += running * dt
                    acc[1] += assigned * dt
                    acc[2] += standby * dt
            self._t = now

    # ---- results ------------------------------------------------------------------------

    def tally(self) -> Tally:
        return Tally(self.now, self.sessions, list(self.waits), dict(self.starts), self.vm_s, self.assigned_vm_s,
                     self.bytes_pulled, self.events, self.fixed_peak_vms, self.fixed_peak_price,
                     list(self.samples), {k: list(v) for k, v in self.pool_samples.items()},
                     {k: VmTime(*v) for k, v in self._seconds.items()}, dict(self.price), dict(self.never_started),
                     dict(self.quotas.refused) if self.quotas else {}, dict(self.user_wait_max),
                     self.stopped_for_budget, list(self.interactive_waits), self.preempted, self.requeued,
                     self.requeued_started, self.spot_preemptions, self.spot_preempted)

    def results(self) -> dict:
        return self.tally().results()


def _never_started(s: Session) -> str:
    """What a session that ended without running was doing, and why it ended."""
    doing = next((h.state for h in reversed(s.history)
                  if h.state not in SESSION_TERMINAL and h.state != SessionState.STOPPING), "new")
    return f"{s.state} while {doing}: {s.reason}"


def _pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values."""
    if not values:
        return 0.0
    k = max(0, min(len(values) - 1, int(-(-p * len(values) // 100)) - 1))
    return round(values[k], 1)
