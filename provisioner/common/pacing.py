"""Refusals answered after a pause, as a mail server pauses before an error reply.

A call refused because its caller has no credential that checks out, or is over its rate, costs the
serving process most of what an answered one does (gRPC's own work per call, the guard, the
status): about 0.8 ms of the front's CPU on the 2-core benchmark machine. A client that sends the
next call the moment it hears no could spend the serving loop on refusals at whatever rate it liked
(four loops of calls with a bad token made 340 a second and took another user's create p50 from 24
to 103 ms, on a machine at a load of 19). Held for a pause instead, each call the client keeps open
buys it a few refusals a second at most. Pauses held at once are bounded; past the bound a refusal
is answered at once, so the pauses cost memory within a bound and never CPU.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

REFUSAL_PAUSE_S = 0.25
MAX_PAUSED = 2000


class Pacer:
    def __init__(self, pause_s: float = REFUSAL_PAUSE_S, max_paused: int = MAX_PAUSED,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        """`sleep` waits wall time, on purpose: it paces callers outside the process."""
        self.pause_s, self.max_paused, self._sleep = pause_s, max_paused, sleep
        self.paused = 0  # refusals held now

    async def pause(self) -> None:
        """Before a refusal is answered."""
        if not self.pause_s or self.paused >= self.max_paused:
            return
        self.paused += 1
        try:
            await self._sleep(self.pause_s)
        finally:
            self.paused -= 1
