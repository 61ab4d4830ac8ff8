"""How many warm VMs a pool needs so that a request waits only rarely. Pure: fed events and `now`.

A VM launched now is useful only after its lead time (create, boot, pull the image), so the warm
VMs must cover what arrives within that lead time, less what the sessions ending meanwhile give
back. Arrivals are forecast as the higher of two rates:

- recent: an exponentially weighted rate over the last quarter hour, which follows bursts;
- seasonal: the arrivals seen in the same hour on earlier days (and the same hour a week ago
  when there is a week of history), which rises before the daily peak does.

Net demand over the lead time (arrivals minus departures) is treated as roughly normal; arrivals
come in bursts (rollouts, batch submissions), so their variance is the Poisson one times their
index of dispersion (variance over mean of the arrivals per minute, estimated online with
exponential decay), departures Poisson. The pool keeps its (1 - wait_probability) quantile warm.
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist

HOUR_S = 3600.0
DAY_H = 24
WEEK_H = 7 * DAY_H
# Recent rates forget with this half-life: long enough to smooth single requests, short enough
# to follow a burst within a few minutes.
RECENT_HALF_LIFE_S = 900.0
# Days of same-hour history averaged for the seasonal rate.
SEASONAL_DAYS = 7
# At most this much weight on the same hour a week ago (day of week), when it exists.
WEEKLY_WEIGHT = 0.5
# Arrivals are counted per minute for their dispersion, which forgets with a six-hour half-life:
# a burst raises it at once and it stays up through the bursts of the same day.
DISPERSION_WINDOW_S = 60.0
DISPERSION_HALF_LIFE_S = 6 * HOUR_S
DISPERSION_EMPTY_MAX = 2000
# A rate with less history than a few half-lives has counted only part of what its decay would
# hold at that rate, and reads low (a quarter hour after a cluster starts, half the true rate),
# so a fresh pool grows too late and its first sessions find VMs still pulling their image. The
# rate is read as the count over the history it had (the decay's correction); with less history
# than this, as if it had this much, so the first few arrivals are not read as a flood.
RATE_MIN_HISTORY_S = 300.0
_LN2 = math.log(2)


class Rate:
    """An exponentially decaying event count; `per_s` is the rate it implies, from the time it
    was first told or asked about (before which nothing is known, not none seen)."""

    __slots__ = ("half_life_s", "_level", "_at", "_since")

    def __init__(self, half_life_s: float):
        self.half_life_s = half_life_s
        self._level = 0.0
        self._at = 0.0
        self._since: float | None = None

    def _decay(self, now: float) -> None:
        if self._since is None:
            self._since = self._at = now
        elif now > self._at:
            self._level *= 0.5 ** ((now - self._at) / self.half_life_s)
            self._at = now

    def add(self, now: float, n: float = 1.0) -> None:
        self._decay(now)
        self._level += n

    def per_s(self, now: float) -> float:
        self._decay(now)
        history = max(now - self._since, RATE_MIN_HISTORY_S)
        if history >= 20 * self.half_life_s:  # the correction is below one part in a million
            return self._level * _LN2 / self.half_life_s
        return self._level * _LN2 / self.half_life_s / (1.0 - 0.5 ** (history / self.half_life_s))


class Dispersion:
    """The index of dispersion (variance / mean) of arrivals per `window_s`, exponentially
    decayed over windows: 1 for Poisson arrivals, more for bursty ones. Never below 1."""

    __slots__ = ("window_s", "_alpha", "_window", "_count", "_mean", "_var")

    def __init__(self, window_s: float = DISPERSION_WINDOW_S, half_life_s: float = DISPERSION_HALF_LIFE_S):
        self.window_s = window_s
        self._alpha = 1.0 - 0.5 ** (window_s / half_life_s)
        self._window = 0
        self._count = 0
        self._mean = 0.0
        self._var = 0.0

    def _close(self, n: float) -> None:
        a, d = self._alpha, n - self._mean
        self._mean += a * d
        self._var = (1.0 - a) * (self._var + a * d * d)

    def _roll(self, now: float) -> None:
        window = int(now // self.window_s)
        if window > self._window:
            self._close(self._count)
            # Empty windows since: past a few half-lives they change nothing that matters.
            for _ in range(min(window - self._window - 1, DISPERSION_EMPTY_MAX)):
                self._close(0.0)
            self._window, self._count = window, 0

    def add(self, now: float) -> None:
        self._roll(now)
        self._count += 1

    def index(self, now: float) -> float:
        self._roll(now)
        return max(1.0, self._var / self._mean) if self._mean > 0 else 1.0


class SeasonalCounts:
    """Arrivals per hour, kept for a week and a day, for 'the same hour on earlier days'."""

    __slots__ = ("_counts", "_since", "_rates")

    def __init__(self, since: float = 0.0):
        self._counts: dict[int, int] = {}
        self._since = math.ceil(since / HOUR_S)  # the first whole hour observed
        # (newest complete hour, {hour: rate}): a rate reads only complete hours, whose counts no
        # longer change, so it is worked out once per hour asked about until the next hour ends.
        self._rates: tuple[int, dict[int, float]] = (-1, {})

    def add(self, now: float) -> None:
        hour = int(now // HOUR_S)
        self._counts[hour] = self._counts.get(hour, 0) + 1
        if hour <= self._rates[0]:  # told late of an hour already complete: its rates are redone
            self._rates = (-1, {})
        if len(self._counts) > WEEK_H + DAY_H + 1:
            for h in [h for h in self._counts if h < hour - WEEK_H - DAY_H]:
                del self._counts[h]

    def per_s(self, at: float, now: float) -> float:
        """The seasonal rate for the hour containing `at`, from whole hours seen before `now`."""
        hour, last = int(at // HOUR_S), int(now // HOUR_S) - 1  # the newest complete hour
        if self._rates[0] != last:
            self._rates = (last, {})
        rates = self._rates[1]
        if (rate := rates.get(hour)) is None:
            rate = rates[hour] = self._per_s(hour, last)
        return rate

    def _per_s(self, hour: int, last: int) -> float:
        counts = self._counts
        days = [h for k in range(1, SEASONAL_DAYS + 1) if self._since <= (h := hour - DAY_H * k) <= last]
        if not days:
            return 0.0
        per_hour = sum(counts.get(h, 0) for h in days) / len(days)
        if self._since <= (week := hour - WEEK_H) <= last:
            per_hour = (1 - WEEKLY_WEIGHT) * per_hour + WEEKLY_WEIGHT * counts.get(week, 0)
        return per_hour / HOUR_S


class Forecast:
    """One pool's arrivals and departures, and the warm VMs they call for."""

    __slots__ = ("arrivals", "departures", "seasonal", "dispersion")

    def __init__(self, since: float = 0.0):
        self.arrivals = Rate(RECENT_HALF_LIFE_S)
        self.departures = Rate(RECENT_HALF_LIFE_S)
        self.seasonal = SeasonalCounts(since)
        self.dispersion = Dispersion()

    def arrival(self, now: float) -> None:
        self.arrivals.add(now)
        self.seasonal.add(now)
        self.dispersion.add(now)

    def departure(self, now: float) -> None:
        self.departures.add(now)

    def warm_needed(self, now: float, lead_s: float, wait_probability: float) -> int:
        return self.warm_needed_each(now, (lead_s,), wait_probability)[0]

    def warm_needed_each(self, now: float, leads_s: tuple[float, ...], wait_probability: float) -> list[int]:
        """The warm VMs needed for each lead time: the arrivals expected over [now, now + lead]
        at the higher of the recent rate and the seasonal rates at both ends."""
        recent, departures = self.arrivals.per_s(now), self.departures.per_s(now)
        dispersion = self.dispersion.index(now)
        seasonal = self.seasonal
        at_now = seasonal.per_s(now, now)
        needed = []
        for lead_s in leads_s:
            lam = max(recent, at_now, seasonal.per_s(now + lead_s, now))
            mu = min(departures, lam)  # departures never count for more than arrivals
            needed.append(warm_for(lam * lead_s, mu * lead_s, wait_probability, dispersion))
        return needed


def warm_for(arrivals: float, departures: float, wait_probability: float, dispersion: float = 1.0) -> int:
    """Warm VMs that cover net demand (arrivals - departures, with these means; departures
    Poisson, arrivals `dispersion` times as variable) with probability 1 - wait_probability."""
    if arrivals <= 0:
        return 0
    z = _quantile(wait_probability)
    need = max(0.0, arrivals - departures) + z * math.sqrt(arrivals * dispersion + departures)
    return math.ceil(need - 1e-9)


@functools.lru_cache(maxsize=64)
def _quantile(wait_probability: float) -> float:
    """The standard normal's quantile at 1 - wait_probability (a pool's policy has one: asked at
    every forecast, worked out once)."""
    return NormalDist().inv_cdf(1.0 - min(max(wait_probability, 1e-9), 0.5))
