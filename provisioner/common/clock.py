"""Time, injected. Model time (when a session started, idle timeouts, budgets, ticks, boots) comes
from a Clock given by the process entry point, so the simulator and the tests run the same code
at their own speed.

`now()` is seconds since the Unix epoch in the clock's own time. A scaled clock runs faster than
the wall (time_scale=60: a 90 s boot takes 1.5 s), so a demo does not wait ten real minutes.

Some places read the wall clock on purpose, where real time is what counts whatever the model's
speed, and say so at the spot: lease terms and grace periods held against the database
(cluster/leader.py); retry backoff, ride-outs and deadlines of calls to a database or another
process (front/retry.py, client/, store/outage.py, store/group_commit.py, cluster/writer.py);
commit batching (store/group_commit.py); pacing what real consumers bear (a watch's reports of
queue moves, rate limits, the metrics scrape: cluster/watchers.py, api/guard.py, front/rates.py,
observability/metrics.py); measuring the process itself (latencies, event-loop lag, GC pauses:
observability/, common/gc_freeze.py); and credentials' validity (token and TLS certificate
expiry, security/).
"""

from __future__ import annotations

import asyncio
import fcntl
import heapq
import itertools
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Wall time, optionally sped up by `time_scale`: at the wall time `origin` (default: now) the
    model time is `origin_model` (default: `origin`), and it runs `time_scale` times as fast.

    Processes that share an anchor share one model time, so a sped-up fleet's timestamps stay
    consistent across its processes and their restarts (see `fleet_anchor`)."""

    def __init__(self, time_scale: float = 1.0, origin: float | None = None, origin_model: float | None = None):
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.time_scale = time_scale
        wall, mono = time.time(), time.monotonic()
        self._origin_wall = wall if origin is None else origin
        self._origin_model = self._origin_wall if origin_model is None else origin_model
        # The wall time since the origin, then carried on the monotonic clock.
        self._origin_mono = mono - (wall - self._origin_wall)

    def now(self) -> float:
        return self._origin_model + (time.monotonic() - self._origin_mono) * self.time_scale

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.time_scale)


@dataclass(frozen=True)
class Anchor:
    """The model time `model` at the wall time `wall`, from which it runs `scale` times as fast."""

    wall: float
    model: float
    scale: float

    def model_at(self, wall: float) -> float:
        return self.model + (wall - self.wall) * self.scale


def next_anchor(previous: Anchor | None, scale: float, wall: float) -> Anchor:
    """The anchor a process starting at `wall` with `scale` runs from. The same scale keeps the
    fleet's anchor (processes of one fleet agree); another scale starts a new one from the model
    time the old one has reached, so the fleet's model clock never runs backwards across restarts
    at different speeds. The first start's model time is the wall time."""
    if previous is None:
        return Anchor(wall, wall, scale)
    if previous.scale == scale:
        return previous
    return Anchor(wall, previous.model_at(wall), scale)


ANCHOR_FILE = "clock.json"
LEGACY_ORIGIN_FILE = "clock-origin"  # a wall time, from before the anchor recorded its scale


def fleet_anchor(data_dir: Path, scale: float, wall: float | None = None) -> Anchor:
    """The model clock's anchor for a process of the fleet using `data_dir`, kept in the data dir."""
    data_dir = Path(data_dir)
    wall = time.time() if wall is None else wall
    path = data_dir / ANCHOR_FILE
    with open(data_dir / "clock.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # processes starting at once agree on one anchor
        previous = None
        if path.exists():
            previous = Anchor(**json.loads(path.read_text()))
        elif (legacy := data_dir / LEGACY_ORIGIN_FILE).exists():
            origin = float(legacy.read_text())
            previous = Anchor(origin, origin, scale)
        anchor = next_anchor(previous, scale, wall)
        if anchor != previous or not path.exists():
            tmp = path.with_name(f"{ANCHOR_FILE}.{os.getpid()}")
            tmp.write_text(json.dumps(asdict(anchor)))
            os.replace(tmp, path)
    return anchor


def fleet_clock(data_dir: Path, scale: float) -> RealClock:
    """The clock of a process of the fleet using `data_dir`, running `scale` times the wall."""
    anchor = fleet_anchor(data_dir, scale)
    return RealClock(scale, anchor.wall, anchor.model)


class ManualClock:
    """A clock that moves only when told to: `await clock.advance(s)` wakes every sleeper due."""

    def __init__(self, start: float = 1_700_000_000.0):
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    async def advance(self, seconds: float) -> None:
        """Moves time forward, waking sleepers in deadline order and letting each run."""
        await self._settle()  # work started at the current instant begins before time moves
        target = self._now + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            due, _, fut = heapq.heappop(self._sleepers)
            self._now = max(self._now, due)
            if not fut.done():
                fut.set_result(None)
            await self._settle()
        self._now = target
        await self._settle()

    @staticmethod
    async def _settle() -> None:
        for _ in range(5):  # let the woken tasks and what they schedule run
            await asyncio.sleep(0)
