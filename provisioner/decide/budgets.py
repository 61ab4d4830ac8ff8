"""The cluster core's part in the weekly GPU budget: warn a running session's watchers ahead of the
end the front computed from all of its owner's sessions, then stop it.

The front knows a user's sessions on every cluster; a cluster knows only its own. So the front
says when the budget runs out (`BudgetSet`, again whenever it moves) and the cluster, which owns
the session and its watch stream, acts on the clock: a notice `budget_warnings_s` before the end,
each once, and a stop at the end.
"""

from __future__ import annotations

import heapq
from typing import Callable, Mapping, Sequence

from provisioner.model.states import SessionState as S
from provisioner.model.records import Notice, Session

GPU_BUDGET = "gpu_budget"
USED_UP = "weekly GPU budget is used up"  # the end of a stopped session's reason
# An end that moves later by more than this after a warning is warned of again.
RESET_S = 60.0


class Budgets:
    """The running sessions' budget ends, and when each is next warned of or stopped at."""

    def __init__(self, sessions: Mapping[str, Session], warnings_s: Sequence[float],
                 note: Callable[..., None], stop: Callable[[str, str, float], object]):
        self._sessions = sessions  # the core's, read only
        self._warnings_s = warnings_s
        self._note = note  # marks a session: a notice, a new end (decide/sessions.py: Sessions.note)
        self._stop = stop  # stops a session (id, reason, now) as a user's stop does
        self._due: list[tuple[float, str]] = []  # (next budget warning or stop, session id)

    def set(self, session_id: str, ends_at: float, now: float) -> Session | None:
        s = self._sessions.get(session_id)
        if s is None or s.terminal or s.budget_ends_at == ends_at:
            return s
        self._note(s, budget_ends_at=ends_at)
        self.watch(s, now)
        return s

    def watch(self, s: Session, now: float) -> None:
        """Schedules the session's next budget action; entries made stale by a later BudgetSet
        find nothing to do when due."""
        if s.budget_ends_at <= 0 or s.state is not S.RUNNING:
            return
        due = [max(now, t) for t in self._warnings_owed(s)]
        heapq.heappush(self._due, (min([*due, s.budget_ends_at]), s.id))

    def _warnings_owed(self, s: Session) -> list[float]:
        """When each warning not yet given for the current end is due. A notice given at time t
        covers every warning due by t, and by a little after (RESET_S): an end that moved by
        less (the front's and the cluster's clocks differ slightly) is not warned of again."""
        given = max((n.time for n in s.notices if n.kind == GPU_BUDGET), default=float("-inf"))
        return [t for t in (s.budget_ends_at - w for w in self._warnings_s) if t > given + RESET_S]

    def due(self, now: float) -> bool:
        return bool(self._due) and self._due[0][0] <= now

    def enforce(self, now: float) -> None:
        heap = self._due
        while heap and heap[0][0] <= now:
            _, sid = heapq.heappop(heap)
            s = self._sessions.get(sid)
            if s is None or s.state is not S.RUNNING or s.budget_ends_at <= 0:
                continue
            if now >= s.budget_ends_at:
                self._stop(s.id, f"user {s.spec.user_id}'s {USED_UP}", now)
                continue
            if any(t <= now for t in self._warnings_owed(s)):
                left = s.budget_ends_at - now
                self._note(s, Notice(GPU_BUDGET, f"the weekly GPU budget runs out in {_minutes(left)}: "
                                                 "the session stops then", now, s.budget_ends_at))
            self.watch(s, now)


def _minutes(seconds: float) -> str:
    return f"{max(1, round(seconds / 60))} minutes"
