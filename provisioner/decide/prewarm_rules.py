"""Which images idle warm VMs should hold, so almost every session starts on its exact image. Pure.

A VM's disk caches many versions (consecutive versions share most layers: 250 GB holds about
the last 40 releases), so every warm VM can serve nearly any recent image exactly. Images are
ranked by recent demand; the best-ranked ones that fit on a disk together are the pool's target
set, and an idle VM pulls, one after the other, the target images it lacks.
"""

from __future__ import annotations

import functools
from typing import Callable, Mapping, Sequence

# Images whose demand is below this are not worth pulling ahead of a request: nobody uses them
# any more, and their layers are left for the disk's LRU eviction to drop.
MIN_DEMAND = 0.2


def rank_images(demand: Mapping[str, float], age: Mapping[str, int]) -> tuple[str, ...]:
    """Images worth holding, most demanded first; ties go to the newer (smaller `age`)."""
    # Sorted as tuples, calling no key per image (images are unique, so no tie reaches a later field).
    ranked = sorted([(-d, age.get(i, 0), i) for i, d in demand.items() if d >= MIN_DEMAND])
    return tuple([i for _, _, i in ranked])


def holdable(ranking: Sequence[str], layers: Callable[[str], Mapping[str, int]], capacity_bytes: int) -> tuple[str, ...]:
    """The longest prefix of the ranking whose layers fit on one disk together: what every idle
    VM should hold. Pulls of these never evict each other, so the disk settles instead of churning
    as the ranking shuffles.

    Each pool asks at every ranking refresh, mostly with a ranking it asked about before, so the
    answers are remembered: `layers` must answer the same for as long as it lives (a catalog's
    sizes_of: a catalog never changes, a new one is a new object)."""
    return _holdable(tuple(ranking), layers, capacity_bytes)


@functools.lru_cache(maxsize=256)
def _holdable(ranking: Sequence[str], layers: Callable[[str], Mapping[str, int]], capacity_bytes: int) -> tuple[str, ...]:
    used: set[str] = set()
    total = 0
    for n, image in enumerate(ranking):
        sizes = layers(image)
        extra = sizes.keys() - used  # consecutive versions share most layers: a few are new
        total += sum(sizes[lid] for lid in extra)
        if total > capacity_bytes:
            return tuple(ranking[:n])
        used |= extra
    return tuple(ranking)


def next_pull(target: Sequence[str], has: Callable[[str], bool], start: int = 0) -> int:
    """Where in the target the VM's next pull is: the first image from `start` on that it lacks,
    or len(target) when it holds them all. Layers are only added while a VM fills, so a caller
    that remembers the answer can start there next time."""
    for k in range(start, len(target)):
        if not has(target[k]):
            return k
    return len(target)


# Demand counts per image decay with this half-life, so the warm mix follows recent requests.
DEMAND_HALF_LIFE_S = 6 * 3600.0
# Each of the newest releases counts as this much demand, so each is kept on an idle VM.
RECENT_RELEASES = 40
RECENT_RELEASE_DEMAND = 0.25


class Demand:
    """A pool's requests per image, decaying with DEMAND_HALF_LIFE_S: what rank_images ranks."""

    def __init__(self) -> None:
        self.counts: dict[str, float] = {}
        self.at = 0.0

    def count(self, image: str, now: float) -> None:
        counts = self.decayed(now)
        counts[image] = counts.get(image, 0.0) + 1.0

    def decayed(self, now: float) -> dict[str, float]:
        # Decayed a minute at a time: the half-life is hours, and requests come many a minute.
        if now - self.at >= 60.0:
            factor = 0.5 ** ((now - self.at) / DEMAND_HALF_LIFE_S)
            self.counts = {i: c * factor for i, c in self.counts.items() if c * factor > 0.01}
            self.at = now
        return self.counts

    def wanted(self, now: float, newest: Sequence[str]) -> dict[str, float]:
        """Recent demand by image, plus a baseline for each of the newest releases: notebooks stay
        pinned to the version they were made with, so the first request for a recent version in
        a while should still find it warm."""
        wanted = dict(self.decayed(now))
        for version in newest[:RECENT_RELEASES]:
            wanted[version] = wanted.get(version, 0.0) + RECENT_RELEASE_DEMAND
        return wanted
