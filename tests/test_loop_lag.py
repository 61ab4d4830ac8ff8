"""The event loop's lag, as `provisioner_event_loop_lag_seconds` observes it (provisioner/observability/loop_lag.py):
a step that holds the loop shows as a timer that ran that much late."""

from __future__ import annotations

import asyncio
import time

from provisioner.observability.loop_lag import watch_lag


async def test_a_step_that_holds_the_loop_shows_as_lag():
    observed: list[float] = []
    watcher = asyncio.create_task(watch_lag(observed.append, interval_s=0.02))
    try:
        await asyncio.sleep(0.1)
        quiet = len(observed)
        time.sleep(0.3)  # one step holding the loop, as a long computation would
        await asyncio.sleep(0.1)
    finally:
        watcher.cancel()
    assert quiet >= 2 and all(lag >= 0 for lag in observed)
    assert max(observed[quiet - 1:]) >= 0.25  # the timer due during the block ran when it ended
