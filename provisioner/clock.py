"""Time, injected. Nothing below the process entry point reads the wall clock or sleeps directly.

`now()` is seconds since the Unix epoch in the clock's own time. A scaled clock runs faster than
the wall (time_scale=60: a 90 s boot takes 1.5 s), so a demo does not wait ten real minutes.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import time
from pathlib import Path
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Wall time, optionally sped up by `time_scale` from `origin` (a wall time; default: now).

    Processes that share an origin share one model time, so a sped-up fleet's timestamps stay
    consistent across its processes and their restarts (see `shared_origin`)."""

    def __init__(self, time_scale: float = 1.0, origin: float | None = None):
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.time_scale = time_scale
        wall, mono = time.time(), time.monotonic()
        self._origin_wall = wall if origin is None else origin
        # The model time now, from the origin, then carried on the monotonic clock.
        self._origin_mono = mono - (wall - self._origin_wall)

    def now(self) -> float:
        return self._origin_wall + (time.monotonic() - self._origin_mono) * self.time_scale

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.time_scale)


def shared_origin(data_dir: Path) -> float:
    """The wall time the fleet using `data_dir` first started, written there on first use."""
    path = Path(data_dir) / "clock-origin"
    if not path.exists():
        # Written whole, then linked into place: the first of several processes starting at once
        # wins, and nobody reads a half-written file.
        tmp = path.with_name(f"clock-origin.{os.getpid()}")
        tmp.write_text(repr(time.time()))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return float(path.read_text())


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
