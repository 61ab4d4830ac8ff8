"""What a replay measured, in raw sums that add up over parts of a fleet (sim/parallel.py), and
the results computed from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from provisioner.model.records import StartKind
from provisioner.sim.cost import Price, PoolKey, VmTime, costs, spot_costs

FAST_START_S = 60.0


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
            **spot_costs(self.pool_time, self.price),
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


def _pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values."""
    if not values:
        return 0.0
    k = max(0, min(len(values) - 1, int(-(-p * len(values) // 100)) - 1))
    return round(values[k], 1)
