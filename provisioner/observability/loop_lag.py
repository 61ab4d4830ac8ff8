"""How late a process's event loop runs what is due: a timer set every `interval_s`, and how long
after its time it ran. While one step holds the loop (a long computation, a full garbage
collection, a burst handled at once) every call in flight waits, so this lateness is the latency
the process adds to all of them at that moment."""

from __future__ import annotations

import asyncio
from typing import Callable

INTERVAL_S = 0.25


async def watch_lag(observe: Callable[[float], None], interval_s: float = INTERVAL_S) -> None:
    """Calls `observe(seconds late)` once per `interval_s`, until cancelled. The loop's own time
    (wall time on purpose): lateness is what callers feel, whatever the model clock's speed."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        observe(max(0.0, loop.time() - due))
