"""A record of the events a core handled, to replay an incident exactly. Pure.

Off by default in production (ClusterCore(event_log=None)); the tests keep one. It holds the
events of the last `keep_s` seconds (of the core's time): replaying a log into a fresh core gives
the same state when the log starts where the core started (a Restored event, or nothing).
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

from provisioner.decide.events import Event, Restored
from provisioner.model.errors import ProvisionerError
from provisioner.model.records import Session, Vm


class EventLog:
    def __init__(self, keep_s: float = 24 * 3600.0):
        self.keep_s = keep_s
        self.events: deque[Event] = deque()

    def record(self, event: Event) -> None:
        if isinstance(event, Restored):  # the core goes on changing these objects: keep them as they were
            event = Restored(event.at, tuple(Session.from_dict(s.to_dict()) for s in event.sessions),
                             tuple(Vm.from_dict(v.to_dict()) for v in event.vms))
        self.events.append(event)
        while self.events[0].at < event.at - self.keep_s:
            self.events.popleft()


def replay(events: Iterable[Event], core) -> None:
    """Feeds `events` to `core` as they were handled (a refused request is refused again)."""
    for event in events:
        if isinstance(event, Restored):
            event = Restored(event.at, tuple(Session.from_dict(s.to_dict()) for s in event.sessions),
                             tuple(Vm.from_dict(v.to_dict()) for v in event.vms))
        try:
            core.handle(event)
        except ProvisionerError:
            pass
