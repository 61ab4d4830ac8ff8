"""Quotas, decided purely: weekly GPU-seconds metered from session records, and who may start more.

Usage is never accumulated in memory: it is recomputed from each session's durable times
(ready, end, or `now` while it runs), so a restart of any process loses no metered time and
counts none twice. The front gathers the records (front/weeks.py), decides with these functions
(front/admission.py) and enforces what they decide; the budget sweep (front/budget_enforcer.py)
and the simulator's meter (sim/quotas.py) use the same arithmetic.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterable, Protocol

WEEK_S = 7 * 24 * 3600.0


class Limits(Protocol):
    """What the arithmetic reads of a user's quotas (config_policy.QuotaConfig, overrides applied)."""

    gpu_hours_per_week: float
    reset_weekday: int
    reset_hour_utc: int


def week_window(now: float, reset_weekday: int = 0, reset_hour_utc: int = 0) -> tuple[float, float]:
    """The quota week holding `now`: (its start, the next reset), in epoch seconds. The week resets
    on `reset_weekday` (0 is Monday) at `reset_hour_utc`:00 UTC."""
    last = _last_window.get((reset_weekday, reset_hour_utc))
    if last is not None and last[0] <= now < last[1]:  # a create asks several times a second
        return last
    window = _week_window(now, reset_weekday, reset_hour_utc)
    _last_window[(reset_weekday, reset_hour_utc)] = window
    return window


_last_window: dict[tuple[int, int], tuple[float, float]] = {}


def _week_window(now: float, reset_weekday: int, reset_hour_utc: int) -> tuple[float, float]:
    at = datetime.fromtimestamp(now, timezone.utc)
    start = (at - timedelta(days=(at.weekday() - reset_weekday) % 7)).replace(
        hour=reset_hour_utc, minute=0, second=0, microsecond=0)
    if start > at:  # the reset day is today, but its hour has not come yet
        start -= timedelta(days=7)
    begin = start.timestamp()
    return begin, begin + WEEK_S


def week_start(now: float, q: Limits) -> float:
    """When the quota week holding `now` began: sessions that ended before it meter nothing."""
    return week_window(now, q.reset_weekday, q.reset_hour_utc)[0]


@dataclass(frozen=True)
class Metered:
    """What metering needs of one session: its GPUs (count x weight) and its running interval."""

    gpus: float  # accelerator_count x the accelerator's weight
    ready_at: float | None  # None: it never ran
    ended_at: float | None  # None: still running (or about to be)


def gpu_seconds(s: Metered, window: tuple[float, float], now: float) -> float:
    """The weighted GPU-seconds `s` ran within `window`, up to `now`."""
    if s.ready_at is None:
        return 0.0
    end = now if s.ended_at is None else min(s.ended_at, now)
    lo, hi = max(s.ready_at, window[0]), min(end, window[1])
    return max(0.0, hi - lo) * s.gpus


@dataclass(frozen=True)
class Usage:
    used_s: float  # weighted GPU-seconds this week
    limit_s: float
    reset_time: float
    active: dict[str, int]  # live sessions by kind
    running_gpus: float = 0.0  # weighted GPUs of the sessions running now: GPU-seconds per second

    @property
    def left_s(self) -> float:
        return max(0.0, self.limit_s - self.used_s)


def usage(sessions: list[tuple[Metered, str, bool]], now: float, limit_s: float,
          window: tuple[float, float]) -> Usage:
    """A user's week from their sessions: (metered, kind, live) each."""
    active: dict[str, int] = {}
    for _, kind, live in sessions:
        if live:
            active[kind] = active.get(kind, 0) + 1
    used = sum(gpu_seconds(m, window, now) for m, _, _ in sessions)
    running = sum(m.gpus for m, _, _ in sessions if m.ready_at is not None and m.ended_at is None)
    return Usage(used_s=used, limit_s=limit_s, reset_time=window[1], active=active, running_gpus=running)


@dataclass(frozen=True, slots=True)
class Row:
    """One session of a user's week, as metering counts it."""

    metered: Metered
    kind: str  # "interactive" or "batch"
    request_id: str
    live: bool = False  # counts against the cap on active sessions


def user_usage(rows: Iterable[Row], now: float, q: Limits) -> Usage:
    """A user's week from the rows of their sessions (the ended ones remembered, then those the
    clusters list). Two live sessions of one request (a duplicate the resolver is discarding) are
    one session to the user; both meter, as both held a GPU."""
    window = week_window(now, q.reset_weekday, q.reset_hour_utc)
    counted, live_requests = [], set()
    for r in rows:
        live = r.live and r.request_id not in live_requests
        if live:
            live_requests.add(r.request_id)
        counted.append((r.metered, r.kind, live))
    return usage(counted, now, q.gpu_hours_per_week * 3600, window)


def with_placing(u: Usage, kind: str, placing: int) -> Usage:
    """`u` with `placing` more live sessions of `kind`: placements whose sessions no list shows
    yet (or made at a cluster that did not list), each counted as one more."""
    if not placing:
        return u
    return dataclasses.replace(u, active=u.active | {kind: u.active.get(kind, 0) + placing})


def exhaustion_time(u: Usage, now: float) -> float | None:
    """When the budget runs out if the sessions running now keep running (None if none runs, or
    if they cannot use up a week's budget): `now` plus what is left over their GPU rate, or, when
    the week resets first, the reset plus the fresh budget over that rate. Running-session
    enforcement would stop them then."""
    if u.running_gpus <= 0:
        return None
    at = now + u.left_s / u.running_gpus
    if at < u.reset_time:
        return at
    at = u.reset_time + u.limit_s / u.running_gpus
    return at if at < u.reset_time + WEEK_S else None


@dataclass(frozen=True)
class Refusal:
    field: str  # the QuotaFailure subject
    message: str
    reset_time: float | None  # when waiting helps: the budget's reset


def check_create(u: Usage, kind: str, max_active: int, min_budget_s: float) -> Refusal | None:
    """Whether one more session of `kind` may start: None if so, else why not."""
    if u.active.get(kind, 0) >= max_active:
        return Refusal("max_active_sessions", f"{u.active.get(kind, 0)} active {kind} sessions, at most "
                       f"{max_active} per user: stop one first", None)
    if u.left_s < min_budget_s:
        return Refusal("gpu_hours_per_week", f"{u.used_s / 3600:.2f} of {u.limit_s / 3600:g} GPU hours used this "
                       f"week, {u.left_s:.0f} s left (a session needs {min_budget_s:g} s to start)", u.reset_time)
    return None
