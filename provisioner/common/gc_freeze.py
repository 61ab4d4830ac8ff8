"""Keeping a server's long-lived objects out of the garbage collector's way as they accumulate.

A cluster builds most of its heap after start-up: the VMs of a pool warming up, the sessions
of a day. Python's full collections walk every tracked object each time, and on a cluster with
a few thousand VMs they took 45-225 ms (a pause of every call in flight) and freed nothing. So
after a full collection that was slow and freed almost nothing, what survived it is moved out
of the collector's generations (`gc.freeze`): the next full collections walk only what was made
since. Frozen objects are still freed by reference counting when dropped (an ended session, a
deleted VM); only a reference cycle formed among them later would outlive its use, and the
state kept for long (sessions, VMs, their histories and caches) holds none.
"""

from __future__ import annotations

import gc
import time

SLOW_S = 0.01  # a full collection shorter than this is left alone
FREED_BELOW = 0.01  # of the objects it kept: what counts as freeing almost nothing


class LongLivedFreezer:
    """Watches full collections (a gc callback) and, once one has ended that was slow and freed
    almost nothing, freezes what it kept, from the callback: a burst of allocations inside one
    step of the event loop can run several full collections in a row."""

    def __init__(self, slow_s: float = SLOW_S, freed_below: float = FREED_BELOW):
        self.slow_s, self.freed_below = slow_s, freed_below
        self.freezes = 0
        self._started = 0.0

    def start(self) -> LongLivedFreezer:
        gc.callbacks.append(self._observe)
        return self

    def close(self) -> None:
        if self._observe in gc.callbacks:
            gc.callbacks.remove(self._observe)

    def __enter__(self) -> LongLivedFreezer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _observe(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()  # wall time: how long a collection held the process
        elif time.perf_counter() - self._started >= self.slow_s:
            if info["collected"] < self.freed_below * max(1, _tracked_old()):
                gc.freeze()  # the collection is over: its generations are whole lists again
                self.freezes += 1


def _tracked_old() -> int:
    """The objects in the oldest generation (what a full collection just kept)."""
    return len(gc.get_objects(generation=2))
