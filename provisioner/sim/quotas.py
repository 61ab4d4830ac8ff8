"""Quotas in a replay, decided by the same code as the front's (`provisioner.rules.quota`).

The front meters a user's week from the session records its clusters return; a replay has no
front, so it keeps the same facts as the sessions change: each session's weighted GPUs, kind,
ready time and end. Only what can still count is kept: the live sessions and those that ended
within the current quota week, so memory follows the users active this week, not the trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from provisioner.rules import quota
from provisioner.config.policy import QuotaConfig
from provisioner.model.records import Session


@dataclass
class _Week:
    live: dict[str, tuple[float, str, float | None]] = field(default_factory=dict)  # id -> (gpus, kind, ready)
    ended: list[tuple[quota.Metered, str]] = field(default_factory=list)


class QuotaMeter:
    def __init__(self, config: QuotaConfig, gpus: dict[tuple[str, str], float]):
        """`gpus`: (cluster, pool) -> a session's weighted GPUs there (count x weight), as the front's."""
        self.config = config
        self.gpus = gpus
        self._users: dict[str, _Week] = {}
        self.refused: dict[str, int] = {}  # by the QuotaFailure subject, as the front answers

    def _usage(self, user: str, now: float) -> quota.Usage:
        window = quota.week_window(now, self.config.reset_weekday, self.config.reset_hour_utc)
        week = self._users.get(user) or _Week()
        week.ended = [(m, k) for m, k in week.ended if m.ended_at >= window[0]]
        rows = [(quota.Metered(g, ready, None), k, True) for g, k, ready in week.live.values()]
        rows += [(m, k, False) for m, k in week.ended]
        return quota.usage(rows, now, self.config.gpu_hours_per_week * 3600, window)

    def admit(self, user: str, kind: str, now: float) -> bool:
        """Whether a create of `user` passes the front's check now; a refusal is counted."""
        refusal = quota.check_create(self._usage(user, now), kind, self.config.max_active(kind),
                                     self.config.min_budget_to_start_s)
        if refusal is None:
            return True
        self.refused[refusal.field] = self.refused.get(refusal.field, 0) + 1
        return False

    def budget_end(self, user: str, now: float) -> tuple[float, list[str]]:
        """When `user`'s budget runs out at the rate of their running sessions (0: it does not),
        as the front's sweep computes it, and the ids of those sessions, which are told."""
        week = self._users.get(user)
        running = [sid for sid, (_, _, ready) in week.live.items() if ready is not None] if week else []
        return quota.exhaustion_time(self._usage(user, now), now) or 0.0, running

    def created(self, s: Session) -> None:
        """A live session (it may have started already: a warm start runs in the create's step)."""
        self._users.setdefault(s.spec.user_id, _Week()).live.setdefault(
            s.id, (self.gpus[(s.cluster, s.pool)], s.spec.kind.value, None))

    def started(self, s: Session) -> None:
        self._users.setdefault(s.spec.user_id, _Week()).live[s.id] = (
            self.gpus[(s.cluster, s.pool)], s.spec.kind.value, s.ready_at)

    def ended(self, s: Session) -> None:
        week = self._users.get(s.spec.user_id)
        if week is None or (entry := week.live.pop(s.id, None)) is None:
            return
        gpus, kind, ready = entry
        if ready is not None:  # a session that never ran metered nothing
            week.ended.append((quota.Metered(gpus, ready, s.ended_at), kind))
        if not week.live and not week.ended:
            del self._users[s.spec.user_id]
