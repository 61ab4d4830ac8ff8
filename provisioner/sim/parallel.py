"""Replays groups of clusters in separate processes and adds up what they measured.

In a replay every session goes to the cluster of its home region and clusters share nothing, so
each group of clusters is an independent run over its own sessions (with quotas, only when each
user's sessions are in one region; otherwise one process replays all). Each group keeps its own
seeded physics and ids, so the sum of the groups' tallies is exactly the one-process result.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

from provisioner.config import FleetConfig, load_fleet
from provisioner.sim.policies import with_policy, with_priority
from provisioner.sim.replay import Replay
from provisioner.sim.tally import Tally
from provisioner.sim.trace import TraceRow, first_days, peak_concurrency, read_trace, superimpose, trace_end, with_flood
from provisioner.sim.spot import with_spot, with_spot_tier

# Progress of each worker (fraction done), shared with the parent. Set in each worker process.
_progress = None


class Inputs(NamedTuple):
    """What a run reads from files: the fleet (parsed and validated) and the base trace (its window,
    before the copies and the flood). Read once, for the replay and for the results alike."""

    fleet: FleetConfig
    base_rows: list[TraceRow]


@dataclass(frozen=True, slots=True)
class Run:
    """One simulation, described so that a fresh process can rebuild it."""

    trace: str
    scale: int = 1
    seed: int = 0
    clusters_dir: str | None = None
    policy: str | None = None
    headroom_fraction: float | None = None
    warm_vms: int | None = None
    wait_probability: float | None = None
    quotas: bool = False  # check each create as the front does
    flood: int = 0  # one user's creates added halfway through
    standby: bool | None = None  # the standby tier on or off in every pool (None: the policy's default)
    max_vms: int | None = None  # every pool's ceiling (None: each pool's own)
    share_gpus: int | None = None  # GPUs guaranteed to each user in every pool (None: the fleet's)
    grace_period_s: float | None = None  # a preemption's grace period (None: the fleet's)
    requeue: bool = False  # batch sessions ask to be queued again if preempted
    spot_preemptions_per_hour: float | None = None  # every pool on Spot VMs, preempted this often (None: as configured)
    spot_tier: float | None = None  # a Spot tier in every pool, its VMs preempted this often (None: as configured)
    days: float | None = None  # only the sessions arriving in the trace's first days (None: all)

    def fleet(self) -> FleetConfig:
        fleet = with_policy(load_fleet(self.clusters_dir), self.policy, self.headroom_fraction, self.warm_vms,
                            self.wait_probability, self.standby, self.max_vms)
        fleet = with_spot(with_priority(fleet, self.share_gpus, self.grace_period_s), self.spot_preemptions_per_hour)
        return with_spot_tier(fleet, self.spot_tier)

    def base_rows(self) -> list[TraceRow]:
        return first_days(read_trace(self.trace), self.days)

    def inputs(self) -> Inputs:
        return Inputs(self.fleet(), self.base_rows())

    def rows(self, base_rows: list[TraceRow] | None = None) -> list[TraceRow]:
        """The rows replayed: K shifted copies of the base rows (read from the trace unless given), and the flood."""
        base_rows = self.base_rows() if base_rows is None else base_rows
        return with_flood(superimpose(base_rows, self.scale, self.seed), self.flood)

    def command(self) -> str:
        """The `provisioner simulate` command line that makes this run (the defaults left out)."""
        trace = os.path.relpath(self.trace)
        flags = [("--trace", trace if not trace.startswith("..") else self.trace), ("--scale", self.scale),
                 ("--seed", self.seed or None), ("--days", self.days), ("--clusters", self.clusters_dir),
                 ("--policy", self.policy), ("--headroom", self.headroom_fraction), ("--warm-vms", self.warm_vms),
                 ("--wait-probability", self.wait_probability), ("--flood", self.flood or None),
                 ("--max-vms", self.max_vms), ("--share-gpus", self.share_gpus), ("--grace", self.grace_period_s),
                 ("--spot", self.spot_preemptions_per_hour), ("--spot-tier", self.spot_tier)]
        parts = ["provisioner simulate", *(f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"
                                           for flag, value in flags if value is not None)]
        parts += [flag for flag, on in (("--quotas", self.quotas), ("--requeue", self.requeue)) if on]
        if self.standby is not None:
            parts.append("--standby" if self.standby else "--no-standby")
        return " ".join(parts)

    def scaled_peak_vms(self, inputs: Inputs | None = None) -> int:
        """K times the base trace's peak (per region and pool): a fixed fleet sized the way the
        base trace would size it, grown with the workload. The superimposed copies' own peak,
        which random offsets flatten, is the harder baseline (`fixed_peak_vms`). From `inputs`
        where given, else read anew."""
        fleet, base_rows = self.inputs() if inputs is None else inputs
        return self.scale * sum(peak_concurrency(base_rows, fleet.settings.sessions.idle_timeout_s).values())


def results(run: Run, tally: Tally, inputs: Inputs | None = None) -> dict:
    """The tally's results plus the fixed fleet sized at K times the base trace's peak (`inputs`:
    the run's, as `simulate` was given them; read anew if None)."""
    out = tally.results()
    out["command"] = run.command()
    out["days"] = run.days
    out["scaled_peak_vms"] = run.scaled_peak_vms(inputs)
    out["scaled_peak_vm_hours"] = round(out["scaled_peak_vms"] * out["model_hours"], 3)
    return out


def split(sessions_per_cluster: dict[str, int], jobs: int) -> list[list[str]]:
    """Clusters in at most `jobs` groups of similar total load (largest first, each to the
    lightest group), in a deterministic order."""
    groups: list[tuple[int, list[str]]] = [(0, []) for _ in range(max(1, min(jobs, len(sessions_per_cluster))))]
    for name, n in sorted(sessions_per_cluster.items(), key=lambda kv: (-kv[1], kv[0])):
        i = min(range(len(groups)), key=lambda g: (groups[g][0], g))
        groups[i] = (groups[i][0] + n, groups[i][1] + [name])
    return [names for _, names in groups if names]


def simulate(run: Run, jobs: int = 1, progress: Callable[[float], None] | None = None,
             inputs: Inputs | None = None) -> Tally:
    """Replays the run, over `jobs` processes when there is more than one cluster to share out
    (`inputs`: the run's, if already read)."""
    fleet, base_rows = run.inputs() if inputs is None else inputs
    rows = run.rows(base_rows)
    replay = Replay(fleet, rows, seed=run.seed, quotas=run.quotas, requeue=run.requeue)  # checks every row has a home cluster and pool
    region_of = {c.name: c.region for c in fleet.clusters}
    counts = {c.name: 0 for c in fleet.clusters}
    by_region = {c.region: c.name for c in fleet.clusters}
    for r in rows:
        counts[by_region[r.region]] += 1
    if run.quotas and _users_span_regions(rows):
        jobs = 1  # a user's quota counts sessions in every region: one process sees them all
    groups = split(counts, jobs)
    if len(groups) == 1:
        replay.run(progress)
        return replay.tally()
    del replay
    end_s = trace_end(rows, fleet.settings.sessions.idle_timeout_s)
    return _in_processes(run, [[region_of[n] for n in names] for names in groups], end_s, progress)


def _in_processes(run: Run, groups: list[list[str]], end_s: float, progress: Callable[[float], None] | None) -> Tally:
    """Each group of regions replayed in a process of its own; the sum of their tallies."""
    # Imported here: a run in one process (`--jobs 1`, one cluster) starts without them.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    shared = multiprocessing.get_context("spawn").Array("d", len(groups), lock=False)
    with ProcessPoolExecutor(len(groups), mp_context=multiprocessing.get_context("spawn"),
                             initializer=_init_worker, initargs=(shared,)) as pool:
        futures = [pool.submit(_replay_part, run, regions, end_s, i) for i, regions in enumerate(groups)]
        while not all(f.done() for f in futures):
            if progress is not None:
                progress(min(shared))
            time.sleep(0.2)
        tallies = [f.result() for f in futures]
    if progress is not None:
        progress(1.0)
    total = tallies[0]
    for t in tallies[1:]:
        total = total + t
    return total


def _users_span_regions(rows) -> bool:
    region: dict[str, str] = {}
    return any(region.setdefault(r.user, r.region) != r.region for r in rows)


def _init_worker(shared) -> None:
    global _progress
    _progress = shared


def _replay_part(run: Run, regions: list[str], end_s: float, index: int) -> Tally:
    fleet = run.fleet()
    fleet = fleet.model_copy(update={"clusters": tuple(c for c in fleet.clusters if c.region in regions)})
    rows = [r for r in run.rows() if r.region in regions]
    replay = Replay(fleet, rows, seed=run.seed, end_s=end_s, quotas=run.quotas, requeue=run.requeue)

    def progress(done: float) -> None:
        _progress[index] = done

    replay.run(progress)
    return replay.tally()
