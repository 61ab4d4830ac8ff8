"""A record of the events a core handled, to replay an incident exactly. Pure.

Off by default in production (ClusterCore(event_log=None)); the tests keep one. It holds the
events of the last `keep_s` seconds (of the core's time): replaying a log into a fresh core gives
the same state when the log starts where the core started (a Restored event, or nothing).
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

from provisioner.decide.events import Event
from provisioner.model.errors import ProvisionerError


class EventLog:
    def __init__(self, keep_s: float = 24 * 3600.0):
        self.keep_s = keep_s
        self.events: deque[Event] = deque()

    def record(self, event: Event) -> None:
        # Kept as it is: the core changes only records of its own, copied from a Restored's.
        self.events.append(event)
        while self.events[0].at < event.at - self.keep_s:
            self.events.popleft()


def replay(events: Iterable[Event], core) -> None:
    """Feeds `events` to `core` as they were handled (a refused request is refused again)."""
    for event in events:
        try:
            core.handle(event)
        except ProvisionerError:
            pass
