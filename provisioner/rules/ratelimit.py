"""Token buckets, decided purely: how many calls a key (a user, a calling service) may make.

Each key's bucket holds up to `burst` tokens and regains `rate_per_s` tokens a second; a call
takes one. A refused call is told how long until a token is back. Time is passed in, so the same
buckets run live and in tests.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    at: float  # when `tokens` was counted


class TokenBuckets:
    def __init__(self, rate_per_s: float, burst: int, max_keys: int = 100_000):
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"need rate_per_s > 0 and burst >= 1, got {rate_per_s} and {burst}")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: dict[str, _Bucket] = {}

    def wait_s(self, key: str, now: float) -> float:
        """Seconds until `key` has a token (0: it has one now)."""
        return max(0.0, (1.0 - self._tokens(key, now)) / self.rate_per_s)

    def take(self, key: str, now: float) -> None:
        """Takes a token from `key` (which must have one: see wait_s)."""
        self._buckets[key] = _Bucket(self._tokens(key, now) - 1.0, now)
        if len(self._buckets) > self.max_keys:
            self._forget_full(now)

    def _tokens(self, key: str, now: float) -> float:
        b = self._buckets.get(key)
        if b is None:
            return float(self.burst)
        return min(float(self.burst), b.tokens + max(0.0, now - b.at) * self.rate_per_s)

    def _forget_full(self, now: float) -> None:
        """A full bucket is the same as none: dropped, so memory follows the keys recently active."""
        for key in [k for k in self._buckets if self._tokens(k, now) >= self.burst]:
            del self._buckets[key]


def take_all(buckets: list[tuple[TokenBuckets, str]], now: float) -> tuple[float, int]:
    """One token from each (buckets, key), or none at all (a call refused by one limit spends
    nothing of the others): (0.0, -1) if taken, else (the seconds until every key has a token,
    the index of the pair that waits longest)."""
    waits = [b.wait_s(key, now) for b, key in buckets]
    if not any(waits):
        for b, key in buckets:
            b.take(key, now)
        return 0.0, -1
    longest = max(range(len(waits)), key=waits.__getitem__)
    return waits[longest], longest
