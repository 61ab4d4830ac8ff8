"""The cluster core's culling: a running session is stopped once idle for its idle timeout (an
interactive one) or past its max runtime. Each running session has an entry in a heap at its
next deadline, checked lazily by the tick. Pure.
"""

from __future__ import annotations

import heapq
from typing import Callable, Mapping

from provisioner.model.records import Session, SessionKind
from provisioner.model.states import SessionState as S


class Culling:
    def __init__(self, sessions: Mapping[str, Session], stop: Callable[[str, str, float], object]):
        self._sessions = sessions  # the core's, read only
        self._stop = stop  # stops a session (id, reason, now) as a user's stop does
        self._due: list[tuple[float, str]] = []  # (time, session id) when a running session may need culling

    def watch(self, s: Session) -> None:
        """The session runs (or runs again after a restore): its deadlines are watched."""
        heapq.heappush(self._due, (cull_at(s), s.id))

    def due(self, now: float) -> bool:
        """Whether a running session is due for culling; entries cull() would pass over (the
        session ended, or touched since: its deadline moved) are dealt with here, as it would."""
        heap, sessions = self._due, self._sessions
        while heap and heap[0][0] <= now:
            s = sessions.get(heap[0][1])
            if s is None or s.state is not S.RUNNING:
                heapq.heappop(heap)
            elif (due := cull_at(s)) > now:
                heapq.heapreplace(heap, (due, s.id))
            else:
                return True
        return False

    def cull(self, now: float) -> None:
        """Stops sessions idle too long or past their max runtime. A touch moves a deadline
        later without touching the heap: an entry found early is pushed back at the new time."""
        heap = self._due
        while heap and heap[0][0] <= now:
            _, sid = heapq.heappop(heap)
            s = self._sessions.get(sid)
            if s is None or s.state is not S.RUNNING:
                continue
            if (due := cull_at(s)) > now:
                heapq.heappush(heap, (due, sid))
            elif s.spec.kind is SessionKind.INTERACTIVE and now - s.last_activity_at >= s.idle_timeout_s:
                self._stop(s.id, f"idle for {minutes(s.idle_timeout_s)}", now)
            else:
                self._stop(s.id, f"reached its max runtime of {minutes(s.max_runtime_s)}", now)


def cull_at(s: Session) -> float:
    """When a running session is next due for culling, as things stand."""
    due = s.ready_at + s.max_runtime_s if s.max_runtime_s else float("inf")
    if s.spec.kind is SessionKind.INTERACTIVE:
        due = min(due, s.last_activity_at + s.idle_timeout_s)
    return due


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f}m" if seconds < 7200 else f"{seconds / 3600:.0f}h"
