"""Where a new session should go. A pure function of the request and the clusters' capacity.

Clusters are ranked by expected seconds until the session runs: a warm VM with the exact image,
then a partial pull, then a cold start, then a queue; a cluster outside the user's home region
pays a fixed penalty; ties go to the less loaded cluster, then to the name. The front tries the
candidates one at a time in this order (ordered spillover, never a fan-out to every cluster).

While the project's GPU quota is exhausted (front/project_quota.py), no cluster can add a VM: a
cold start is no candidate, and a queue is one only where the pool has VMs that will come free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A rough share of a full pull that a partial pull costs (consecutive versions share most layers).
PARTIAL_PULL_SHARE = 0.2
# Seconds to hand over a warm VM that already holds the image.
WARM_START_S = 1.0


@dataclass(frozen=True, slots=True)
class PoolView:
    warm_by_image: dict[str, int]
    warm: int
    booting: int
    assigned: int
    queued: int
    max_vms: int
    cold_start_s: float

    @property
    def room(self) -> int:
        return self.max_vms - (self.warm + self.booting + self.assigned)


@dataclass(frozen=True, slots=True)
class ClusterView:
    name: str
    region: str
    healthy: bool
    draining: bool
    pools: dict[str, PoolView] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Candidate:
    cluster: str
    expected_s: float
    how: str  # warm, partial, cold, queue
    region_penalty_s: float
    load: float

    @property
    def score(self) -> tuple:
        return (self.expected_s + self.region_penalty_s, self.load, self.cluster)


def expected_start(pool: PoolView, image: str, new_vms: bool = True) -> tuple[float, str] | None:
    """Seconds until a session would run here and how; None if it cannot (no VM can be added,
    and none will come free). `new_vms`: whether the cloud may be asked for a VM."""
    if pool.warm_by_image.get(image, 0) > 0:
        return WARM_START_S, "warm"
    if pool.warm > 0:
        return pool.cold_start_s * PARTIAL_PULL_SHARE, "partial"
    if new_vms and pool.room > 0:
        return pool.cold_start_s, "cold"
    if not new_vms and pool.booting + pool.assigned == 0:
        return None
    # Queued: wait behind those already queued for VMs to come free.
    return pool.cold_start_s * (2 + pool.queued), "queue"


def rank(clusters: list[ClusterView], accelerator: str, image: str, region_hint: str,
         region_required: bool, inter_region_penalty_s: float, new_vms: bool = True) -> list[Candidate]:
    """Usable clusters, best first. A drained or unhealthy cluster is never a candidate, nor one
    that could only add a VM while `new_vms` is false (the project's GPU quota is exhausted)."""
    out = []
    for c in clusters:
        if not c.healthy or c.draining or accelerator not in c.pools:
            continue
        if region_required and c.region != region_hint:
            continue
        pool = c.pools[accelerator]
        if (start := expected_start(pool, image, new_vms)) is None:
            continue
        seconds, how = start
        penalty = inter_region_penalty_s if region_hint and c.region != region_hint else 0.0
        load = (pool.assigned + pool.queued) / max(1, pool.max_vms)
        out.append(Candidate(c.name, seconds, how, penalty, load))
    out.sort(key=lambda cand: cand.score)
    return out


def why_none(clusters: list[ClusterView], accelerator: str, region_hint: str, region_required: bool,
             no_new_vms: str = "") -> str:
    """Why `rank` found no candidate, naming each cluster that could have served (for the caller).
    `no_new_vms`: why no VM can be added now ("" if one can)."""
    eligible = [c for c in clusters if accelerator in c.pools and (not region_required or c.region == region_hint)]
    where = f" in {region_hint}" if region_required else ""
    if not eligible:
        return f"no cluster{where} has a {accelerator} pool"
    if no_new_vms and (up := [c.name for c in eligible if c.healthy and not c.draining]):
        return (f"{no_new_vms}, and no {accelerator} VM of {', '.join(up)} is free or will come free to queue for "
                f"(none is warm, starting or in use)")
    states = ", ".join(f"{c.name} is {'draining' if c.draining else 'unreachable'}" for c in eligible)
    return f"no cluster{where} can take {accelerator} sessions now: {states}"


_HOW = {"warm": "a warm VM with the image", "partial": "a warm VM that would pull part of the image",
        "cold": "a new VM (cold start)", "queue": "a place in the queue (no VM free)"}


def hint_note(clusters: list[ClusterView], candidates: list[Candidate], region_hint: str, placed: str) -> str:
    """Why a session with a region hint went to `placed` in another region ("" when the hint was
    followed or there was none): the hinted region could not take it, or another was expected to
    start it sooner even after the penalty for leaving the user's region."""
    region_of = {c.name: c.region for c in clusters}
    if not region_hint or region_of.get(placed) == region_hint:
        return ""
    where = f"placed in {placed}, not in the hinted region {region_hint}"
    chosen = next((c for c in candidates if c.cluster == placed), None)
    hinted = [c for c in candidates if region_of.get(c.cluster) == region_hint]
    if not hinted:
        states = [("draining" if c.draining else "unreachable" if not c.healthy else "without this pool")
                  for c in clusters if c.region == region_hint]
        return f"{where}: it is {' and '.join(states) or 'not in the fleet'}"
    best = hinted[0]
    if chosen is None or candidates.index(best) < candidates.index(chosen):
        return f"{where}: {best.cluster} was tried first and could not take the session"
    return (f"{where}: {placed} offered {_HOW[chosen.how]} (about {chosen.expected_s:.0f} s, "
            f"+{chosen.region_penalty_s:.0f} s for another region), {best.cluster} only "
            f"{_HOW[best.how]} (about {best.expected_s:.0f} s)")
