"""A circuit breaker per cluster: after repeated transport failures the front stops sending it
new sessions for a while, then lets one trial request through to see whether it recovered.

Pure: the caller passes the time. Only transport failures count (unreachable, timed out); a
cluster that answers "no capacity" is healthy and says so quickly.
"""

from __future__ import annotations

from dataclasses import dataclass

FAILURES_TO_OPEN = 3
OPEN_S = 5.0


@dataclass
class CircuitBreaker:
    failures_to_open: int = FAILURES_TO_OPEN
    open_s: float = OPEN_S
    failures: int = 0  # consecutive
    opened_at: float | None = None
    trial_at: float | None = None  # a half-open trial is out

    def state(self, now: float) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if now - self.opened_at >= self.open_s else "open"

    def allows(self, now: float) -> bool:
        """Whether a request may go now. Half-open: one trial at a time."""
        state = self.state(now)
        if state == "closed":
            return True
        if state == "open":
            return False
        return self.trial_at is None or now - self.trial_at >= self.open_s

    def attempt(self, now: float) -> None:
        if self.state(now) == "half-open":
            self.trial_at = now

    def success(self) -> None:
        self.failures, self.opened_at, self.trial_at = 0, None, None

    def failure(self, now: float) -> None:
        self.failures += 1
        if self.opened_at is not None or self.failures >= self.failures_to_open:
            self.opened_at, self.trial_at = now, None  # (re)open: a failed trial starts the wait again
